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
