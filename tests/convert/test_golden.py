"""Golden before/after conversions: every fixtures/convert/**/<case>.in.py has a reviewed
``<case>.out.py`` and ``<case>.notes.txt`` (the report), and converting the output again changes
nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from accelify.transform.convert import Options, Result, convert

from .conftest import case_id, cases


def _report(result: Result) -> str:
    lines = [f"{n.line}: {'needs a human: ' if n.manual else ''}{n.message}" for n in result.notes]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("case", cases(), ids=case_id)
def test_conversion_matches_golden(case: Path, file_regression) -> None:
    result = convert(case.read_text(), Options(), path=str(case))
    stem = case.name.removesuffix(".in.py")
    file_regression.check(result.code, fullpath=case.with_name(f"{stem}.out.py"))
    file_regression.check(_report(result), fullpath=case.with_name(f"{stem}.notes.txt"))


@pytest.mark.parametrize("case", cases(), ids=case_id)
@pytest.mark.parametrize("target", ["accelify", "accelerate"])
def test_converting_twice_changes_nothing(case: Path, target: str) -> None:
    options = Options(target=target)
    once = convert(case.read_text(), options).code
    twice = convert(once, options)
    assert twice.code == once
    assert not [n for n in twice.notes if not n.manual]


def test_target_accelerate_imports_from_accelerate() -> None:
    source = (Path(cases()[0]).parent / "mnist.in.py").read_text()
    code = convert(source, Options(target="accelerate")).code
    assert "from accelerate import Accelerator\n" in code
    assert "from accelerate.utils import set_seed\n" in code
    assert "accelify" not in code


def test_flags_override_what_the_script_says() -> None:
    source = (Path(cases()[0]).parent / "accumulate_clip.in.py").read_text()
    code = convert(source, Options(mixed_precision="bf16", gradient_accumulation_steps=8)).code
    assert 'Accelerator(gradient_accumulation_steps=8, mixed_precision="bf16")' in code
