"""The converter and the linter agree: what accel-convert writes, accel-lint finds nothing in.

Only cases the converter finished on its own count: where it left the training for a human, that
code may rightly be flagged; where it kept a manual accumulation (and said so), the linter's advice
to move it to ``accelerator.accumulate`` is still right, and is the one finding allowed.
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
    if result.manual or not result.changed:
        pytest.skip("the converter left the training as it was, for a human")
    # The noise rules (off by default) would also flag what the converter rightly leaves outside
    # the training: an inference function's print runs on every process, as it did before.
    findings = lint(result.code, [rule for rule in all_rules() if rule.enabled_by_default])
    kept = any("kept the manual gradient accumulation" in n.message for n in result.notes)
    expected = {"ACL203"} if kept else set()
    assert [f"{f.line}: {f.code} {f.message}" for f in findings if f.code not in expected] == []
