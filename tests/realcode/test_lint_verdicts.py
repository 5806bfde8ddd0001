"""The reviewed verdicts on accel-lint's findings in real code: well-formed always, re-checked on
demand.

The checkouts are not part of the repository: set ``ACCELIFY_REALCODE`` to a folder of
``owner+name`` checkouts (``huggingface+accelerate``, ``huggingface+diffusers``,
``huggingface+peft``) to lint their examples again and compare with what was reviewed
(``tests/realcode/lint_check.py`` does the same from the command line and prints the table).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from lint_check import FOLDERS, VERDICTS, VERDICTS_ALLOWED, Row, check, load

from accelify.rules.checks import all_rules

ROWS = load(VERDICTS)


def test_every_row_is_a_reviewed_finding_that_is_not_false() -> None:
    codes = {rule.code for rule in all_rules()}  # off-by-default rules keep their verdicts too
    assert len(ROWS) >= 100
    assert len({r.key for r in ROWS}) == len(ROWS)
    for row in ROWS:
        assert row.verdict in VERDICTS_ALLOWED, row  # a false finding is fixed, never recorded
        assert row.code in codes, row  # a rule renamed or removed: review again
        assert row.path.startswith(FOLDERS) and row.line > 0, row
        assert len(row.reason) > 40, row


def test_both_corpora_are_covered() -> None:
    assert {row.path.split("/", 1)[0] for row in ROWS} == {f.split("/", 1)[0] for f in FOLDERS}


@pytest.mark.skipif(not os.environ.get("ACCELIFY_REALCODE"), reason="set ACCELIFY_REALCODE")
def test_the_linter_still_finds_what_was_reviewed() -> None:
    assert check(Path(os.environ["ACCELIFY_REALCODE"]), ROWS) == []


def test_a_new_or_vanished_finding_is_reported(tmp_path: Path) -> None:
    folder = tmp_path / "owner+repo" / "examples"
    folder.mkdir(parents=True)
    (folder / "train.py").write_text(
        "from accelerate import Accelerator\n\naccelerator = Accelerator()\n"
        "if accelerator.is_main_process:\n    accelerator.wait_for_everyone()\n"
    )
    moved = Row("owner+repo/examples/gone.py", 3, "ACL002", "true-bug", "moved elsewhere")
    problems = check(tmp_path, [moved], ("owner+repo/examples",))
    assert problems == [
        "owner+repo/examples/train.py:5: ACL002 not reviewed (1): judge it",
        "owner+repo/examples/gone.py:3: ACL002 reviewed but no longer found: review it again",
    ]
