"""The converter and the linter agree: what accel-convert writes, accel-lint finds nothing in.

Only cases the converter finished on its own count: where it left code as it was, for a human or
with a reason (a manual accumulation it kept), that code may rightly be flagged.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from accelify.rules.checks import all_rules
from accelify.rules.engine import lint
from accelify.transform.convert import Options, convert

CASES = sorted((Path(__file__).parent.parent / "fixtures" / "convert").rglob("*.in.py"))


@pytest.mark.parametrize("case", CASES, ids=lambda p: p.name.removesuffix(".in.py"))
@pytest.mark.parametrize("target", ["accelify", "accelerate"])
def test_converted_scripts_are_lint_clean(case: Path, target: str) -> None:
    result = convert(case.read_text(), Options(target=target))
    if result.reasons:
        pytest.skip("the converter left code as it was, and said why")
    # The noise rules (off by default) would also flag what the converter rightly leaves outside
    # the training: an inference function's print runs on every process, as it did before.
    findings = lint(result.code, [rule for rule in all_rules() if rule.enabled_by_default])
    assert [f"{f.line}: {f.code} {f.message}" for f in findings] == []
