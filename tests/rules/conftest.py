"""Shared helpers for the linter's tests: the fixtures folder and an in-process CLI run."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from accelify.rules.cli import run

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "fixtures" / "lint"
_EXPECT = re.compile(r"#\s*expect:\s*([A-Z0-9 ]+)")


@dataclass
class Outcome:
    code: int
    out: str
    err: str


@pytest.fixture
def lint_cli(capsys: pytest.CaptureFixture[str]):
    """Run ``accel-lint`` in this process (a subprocess costs a second of imports per call)."""

    def call(*argv: str) -> Outcome:
        code = run(list(argv))
        captured = capsys.readouterr()
        return Outcome(code, captured.out, captured.err)

    return call


def expected_marks(text: str) -> set[tuple[int, str]]:
    """``(line, code)`` for every ``# expect: CODE ...`` comment, line counted in ``text``."""
    return {
        (number, code)
        for number, line in enumerate(text.splitlines(), start=1)
        if (match := _EXPECT.search(line))
        for code in match.group(1).split()
    }
