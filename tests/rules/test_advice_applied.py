"""Advice followed literally must not make a new bug (a NameError, a race, a hang).

Each rule's docs show an ``Example`` and what to ``Use instead``; each fix rewrites an INVALID
case. Applied as written, the advice must clear the finding and must not bring another rule's
finding (a guard around a collective, a download the others race) or a name the code did not
have before (a NameError at the first run).
"""

from __future__ import annotations

import ast
import builtins
import re
import textwrap

import pytest

from accelify.rules.checks import all_rules
from accelify.rules.engine import fix, lint
from accelify.rules.rule import Rule

RULES = all_rules()
_PRELUDE = "import torch\nfrom accelerate import Accelerator\n"


def _snippet(rule: type[Rule], section: str) -> str | None:
    """The first ``python`` block of a docs section, dedented."""
    part = rule.docs().split(f"## {section}", 1)[-1].split("\n## ", 1)[0]
    found = re.search(r"```python\n(.*?)```", part, re.S)
    return textwrap.dedent(found.group(1)) if found else None


def _program(snippet: str) -> str:
    """The snippet as a file: imports, and an accelerator where the snippet makes none."""
    accelerator = "" if "Accelerator(" in snippet else "accelerator = Accelerator()\n"
    return f"{_PRELUDE}{accelerator}{snippet}"


def _free_names(code: str) -> set[str]:
    """Names the code reads and never binds (anywhere in it)."""
    tree = ast.parse(code)
    bound: set[str] = set()
    read: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (read if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, ast.FunctionDef | ast.ClassDef):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.alias):
            bound.add((node.asname or node.name).split(".")[0])
    return read - bound - set(dir(builtins))


DOCUMENTED = [
    pytest.param(rule, id=rule.code)
    for rule in RULES
    if _snippet(rule, "Example") and _snippet(rule, "Use instead")
]


def test_every_rule_but_the_converters_notes_documents_its_advice_as_code() -> None:
    documented = {p.values[0].code for p in DOCUMENTED}
    assert {rule.code for rule in RULES} - documented == {"ACL210"}  # advice: accel-convert's


@pytest.mark.parametrize("rule", DOCUMENTED)
def test_use_instead_clears_the_finding_and_brings_no_other(rule: type[Rule]) -> None:
    example, advice = _snippet(rule, "Example"), _snippet(rule, "Use instead")
    assert example is not None and advice is not None
    before = {f.code for f in lint(_program(example), RULES)}
    after = {f.code for f in lint(_program(advice), RULES)}
    assert rule.code in before, "the docs' example is not flagged"
    assert rule.code not in after, "the advice is flagged by its own rule"
    assert after <= before, f"the advice brings {sorted(after - before)}"
    new = _free_names(_program(advice)) - _free_names(_program(example))
    assert not new, f"the advice reads {sorted(new)}, which nothing binds"


FIXED = [
    pytest.param(rule, case, id=f"{rule.code}-fix-{i}")
    for rule in RULES
    for i, case in enumerate(rule.INVALID)
    if case.fixed is not None
]


@pytest.mark.parametrize(("rule", "case"), FIXED)
def test_a_fix_brings_no_other_finding_and_no_unbound_name(rule: type[Rule], case) -> None:
    fixed, _notes = fix(case.code, [rule], unsafe=True)
    before = {f.code for f in lint(case.code, RULES)}
    after = {f.code for f in lint(fixed, RULES)}
    assert after <= before - {rule.code}, f"the fix brings {sorted(after - before)}"
    assert _free_names(fixed) <= _free_names(case.code)
