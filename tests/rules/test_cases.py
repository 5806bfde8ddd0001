"""Every rule's own VALID/INVALID lists, run as tests (Fixit-style: docs and tests cannot drift)."""

from __future__ import annotations

import pytest

from accelify.rules.checks import all_rules
from accelify.rules.engine import fix, lint
from accelify.rules.rule import Rule

RULES = all_rules()
VALID = [
    pytest.param(rule, case, id=f"{rule.code}-valid-{i}")
    for rule in RULES
    for i, case in enumerate(rule.VALID)
]
INVALID = [
    pytest.param(rule, case, id=f"{rule.code}-invalid-{i}")
    for rule in RULES
    for i, case in enumerate(rule.INVALID)
]


@pytest.mark.parametrize(("rule", "code"), VALID)
def test_valid_cases_give_no_finding(rule: type[Rule], code: str) -> None:
    assert lint(code, [rule]) == []


@pytest.mark.parametrize(("rule", "case"), INVALID)
def test_invalid_cases_give_one_finding_and_their_fix(rule: type[Rule], case) -> None:
    findings = lint(case.code, [rule])
    assert [f.code for f in findings] == [rule.code]
    fixed, notes = fix(case.code, [rule], unsafe=True)
    assert notes == []
    assert fixed == (case.fixed if case.fixed is not None else case.code)
    assert (findings[0].fix is not None) == (case.fixed is not None)
    if case.fixed is not None:
        assert lint(fixed, [rule]) == []
        assert fix(fixed, [rule], unsafe=True)[0] == fixed  # idempotent


def test_every_rule_has_docs_in_ruff_sections_and_cases() -> None:
    codes = [rule.code for rule in RULES]
    names = [rule.name for rule in RULES]
    assert len(set(codes)) == len(codes) and len(set(names)) == len(names)
    for rule in RULES:
        docs = rule.docs()
        for section in ("## What it does", "## Why is this bad?", "## Example", "## Use instead"):
            assert section in docs, (rule.code, section)
        assert "## Fix safety" in docs or not any(c.fixed for c in rule.INVALID), rule.code
        assert rule.VALID and rule.INVALID, rule.code
        assert rule.code.startswith("ACL") and rule.name == rule.name.lower(), rule.code


@pytest.mark.parametrize(
    ("rule", "case"),
    [p for p in INVALID if "## Fix safety\nUnsafe" in p.values[0].docs()],
)
def test_fixes_documented_unsafe_are_marked_unsafe(rule: type[Rule], case) -> None:
    """A fix that changes behaviour is never applied by a plain ``--fix``."""
    findings = lint(case.code, [rule])
    assert all(f.fix in (None, "unsafe") for f in findings)
    assert fix(case.code, [rule])[0] == case.code


def test_advice_never_puts_a_collective_under_a_main_process_guard() -> None:
    """A guard around `get_state_dict` hangs under DeepSpeed/FSDP; the advice keeps it outside."""
    save = next(rule for rule in RULES if rule.code == "ACL102")
    for line in (
        "torch.save(accelerator.get_state_dict(model), 'm.pt')",
        "save_file(accelerator.get_state_dict(model), 'm.safetensors')",
        "model.save_pretrained('out', state_dict=accelerator.get_state_dict(model))",
    ):
        [finding] = lint(f"accelerator = Accelerator()\n{line}\n", [save])
        assert "guard it" not in finding.message, line


def test_open_block_advice_keeps_a_forward_pass_on_every_process() -> None:
    """A `with open(...)` block that runs the prepared model: guarding the block would leave the
    other processes out of its forward pass (a hang under DeepSpeed/FSDP)."""
    save = next(rule for rule in RULES if rule.code == "ACL102")
    code = (
        "accelerator = Accelerator()\nmodel = accelerator.prepare(model)\n"
        "with open('preds.txt', 'w') as f:\n    f.write(str(model(x)))\n"
    )
    [finding] = lint(code, [save])
    assert "guard it" not in finding.message
    assert "`model(...)` on every process first" in finding.message


@pytest.mark.parametrize(
    ("line", "shared"),
    [
        ("save_image(model(z), 's.png')", True),
        ("save_image(model.generate(z), 's.png')", True),
        ("save_image(accelerator.gather(x), 's.png')", True),
        ("save_image(sample(model, z), 's.png')", True),  # a function of the script: may run it
        ("save_image(images.cpu(), os.path.join(out, 's.png'))", False),
    ],
)
def test_write_advice_never_puts_a_forward_pass_under_a_main_process_guard(
    line: str, shared: bool
) -> None:
    """Under DeepSpeed/FSDP (and DDP with buffers) every process must run the prepared model,
    as it must a collective: the advice computes first and guards only the write."""
    rule = next(rule for rule in RULES if rule.code == "ACL107")
    setup = (
        "import os\nfrom torchvision.utils import save_image\n\naccelerator = Accelerator()\n"
        "model = accelerator.prepare(model)\n"
    )
    [finding] = lint(f"{setup}{line}\n", [rule])
    assert ("first" in finding.message) == shared, finding.message
