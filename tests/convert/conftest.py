"""Fixtures shared by the converter's tests: the before/after cases under fixtures/convert/."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CASES_DIR = ROOT / "fixtures" / "convert"


def cases() -> list[Path]:
    """Every ``<case>.in.py`` under fixtures/convert, the step folders included."""
    return sorted(CASES_DIR.rglob("*.in.py"))


def case_id(path: Path) -> str:
    return str(path.relative_to(CASES_DIR)).removesuffix(".in.py")
