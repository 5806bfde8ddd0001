"""Every rule's own VALID/INVALID lists, run as tests (Fixit-style: docs and tests cannot drift)."""

from __future__ import annotations

import ast
import re

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


# Advice that names an accelerator's method or test: `accelerator.is_main_process`, ...
_NAMED = re.compile(
    r"`[^`]*?([\w()]+)\.(is_main_process|is_local_main_process|main_process_first|"
    r"wait_for_everyone|save|print)\b"
)
# The same mistakes with the accelerator named otherwise, and with none in reach where they are.
_ELSEWHERE = [
    "acc = Accelerator()\ntorch.save(state, 'a.pt')\n",
    "acc = Accelerator()\nwriter = SummaryWriter('runs')\n",
    "acc = Accelerator()\nprint('hi')\n",
    "acc = Accelerator()\nfor b in tqdm(dl):\n    pass\n",
    "acc = Accelerator()\nurllib.request.urlretrieve(URL, 'data.tgz')\n",
    "acc = Accelerator()\ntrain = datasets.MNIST('data', download=True)\n",
    "acc = Accelerator()\nshutil.rmtree('out')\n",
    "acc = Accelerator()\nmodel.save_pretrained('out')\n",
    "torch.save(state, 'a.pt')\nwriter = SummaryWriter('runs')\nprint('hi')\n"
    "urllib.request.urlretrieve(URL, 'data.tgz')\nshutil.rmtree('out')\n"
    "train = datasets.MNIST('data', download=True)\nfor b in tqdm(dl):\n    pass\n\n\n"
    "def main():\n    accelerator = Accelerator()\n",
]


@pytest.mark.parametrize(
    "code", [case.code for rule in RULES for case in rule.INVALID] + _ELSEWHERE
)
def test_advice_names_only_an_accelerator_that_is_there(code: str) -> None:
    """Followed literally, advice must not raise a NameError: it names the accelerator bound
    where the finding is, or, where none is, ``PartialState()``, which needs none."""
    tree = ast.parse(code)
    for finding in lint(code, RULES):
        for name, _attribute in _NAMED.findall(finding.message):
            if name == "PartialState()":
                continue
            bound = _bound_names(tree, finding.line)
            assert name in bound, (finding.code, finding.message)


def _bound_names(tree: ast.Module, line: int) -> set[str]:
    """The names bound before ``line`` at module level, or in a function around that line."""
    found = {t for stmt in tree.body if stmt.lineno < line for t in _stmt_targets(stmt)}
    for function in ast.walk(tree):
        if isinstance(function, ast.FunctionDef) and function.lineno <= line <= (
            function.end_lineno or line
        ):
            found |= {a.arg for a in function.args.args}
            found |= {t for stmt in ast.walk(function) for t in _stmt_targets(stmt)}
    return found


def _stmt_targets(stmt: ast.AST) -> set[str]:
    if isinstance(stmt, ast.Assign):
        return {n.id for t in stmt.targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return set()
