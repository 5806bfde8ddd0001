"""Every line of accel-convert's report has a code: each step is in the registry, each refusal
names its family, and no refusal can be made without one."""

from __future__ import annotations

import re
from pathlib import Path

import libcst as cst
import pytest

from accelify.transform import codes
from accelify.transform.convert import convert
from accelify.transform.distributed import _REWRITES
from accelify.transform.refusals import CLOSURE, REFUSALS
from accelify.transform.setup import Refused
from accelify.transform.steps import STEPS

from .conftest import ROOT, case_id, cases

_CODE = re.compile(r"AC[CR][1-3]\d\d")


def test_a_refusal_without_a_family_cannot_be_made() -> None:
    node = cst.Name("x")
    with pytest.raises(TypeError):
        Refused(node, "the reason alone")  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="Refusal family"):
        Refused(node, "ACR201", "a code spelt by hand")  # type: ignore[arg-type]
    assert Refused(node, CLOSURE, "why").family is CLOSURE


def test_codes_are_unique_well_formed_and_documented() -> None:
    all_codes = [c.code for c in codes.CONVERSIONS] + [r.code for r in REFUSALS]
    assert len(set(all_codes)) == len(all_codes)
    assert all(_CODE.fullmatch(code) for code in all_codes)
    names = [r.name for r in REFUSALS] + [c.name for c in codes.CONVERSIONS]
    assert all(re.fullmatch(r"[a-z]+(-[a-z]+)*", name) for name in names)
    for refusal in REFUSALS:
        assert refusal.cause and refusal.example and refusal.fix, refusal.code


def test_every_step_and_rewrite_has_a_code() -> None:
    """A step is added by adding its module: the registry must name it, or the conversion
    fails (conversion_code raises) the first time the step runs."""
    for step in (*STEPS, *_REWRITES):
        assert codes.conversion_code(step.__module__).startswith("ACC")
    modules = {c.module for c in codes.CONVERSIONS}
    transform = ROOT / "transform"
    for folder in ("steps", "distributed"):
        for path in (transform / folder).glob("*.py"):
            source = path.read_text()
            reports = re.search(r"\.(changed|info|needs_human)\(", source) is not None
            module = f"accelify.transform.{folder}.{path.stem}"
            if reports and "def changed" not in source:
                assert module in modules, f"{module} writes notes but has no code"


@pytest.mark.parametrize("case", cases(), ids=case_id)
def test_every_note_of_every_case_has_a_code_with_a_page(case: Path) -> None:
    result = convert(case.read_text(), path=str(case))
    for note in result.notes:
        assert note.shown is not None, note
        assert codes.page(note.shown)
        if note.manual:  # a refusal's family, or the lint rule that flags what it leaves
            assert note.shown.startswith(("ACR", "ACL")), note
