"""Golden before/after conversions: every fixtures/convert/**/<case>.in.py has a reviewed
``<case>.out.py`` and ``<case>.notes.txt`` (the report), and converting the output again changes
nothing."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from accelify.transform.convert import Options, Result, convert

from .conftest import CASES_DIR, case_id, cases


def _options(source: str) -> Options:
    """A case may start with ``# accel-convert: --flag value ...`` to convert with CLI options."""
    first = source.split("\n", 1)[0]
    if not first.startswith("# accel-convert:"):
        return Options()
    words = first.removeprefix("# accel-convert:").split()
    flags = dict(zip(words[::2], words[1::2], strict=True))
    steps = flags.get("--gradient-accumulation-steps")
    return Options(
        mixed_precision=flags.get("--mixed-precision"),  # type: ignore[arg-type]
        gradient_accumulation_steps=int(steps) if steps else None,
    )


def _report(result: Result) -> str:
    lines = [f"{n.line}: {'needs a human: ' if n.manual else ''}{n.message}" for n in result.notes]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("case", cases(), ids=case_id)
def test_conversion_matches_golden(case: Path, file_regression) -> None:
    source = case.read_text()
    result = convert(source, _options(source), path=str(case))
    stem = case.name.removesuffix(".in.py")
    file_regression.check(result.code, fullpath=case.with_name(f"{stem}.out.py"))
    file_regression.check(_report(result), fullpath=case.with_name(f"{stem}.notes.txt"))


@pytest.mark.parametrize("case", cases(), ids=case_id)
@pytest.mark.parametrize("target", ["accelify", "accelerate"])
def test_converting_twice_changes_nothing(case: Path, target: str) -> None:
    source = case.read_text()
    options = replace(_options(source), target=target)
    once = convert(source, options).code
    twice = convert(once, options)
    assert twice.code == once
    assert not [n for n in twice.notes if not (n.manual or n.info)]


def test_target_accelerate_imports_from_accelerate() -> None:
    source = (CASES_DIR / "seed" / "all_three.in.py").read_text()
    code = convert(source, Options(target="accelerate")).code
    assert "from accelerate import Accelerator\n" in code
    assert "from accelerate.utils import set_seed\n" in code
    assert "accelify" not in code


def test_flags_override_what_the_script_says() -> None:
    source = (CASES_DIR / "accumulate_clip.in.py").read_text()
    code = convert(source, Options(mixed_precision="bf16", gradient_accumulation_steps=8)).code
    assert 'Accelerator(gradient_accumulation_steps=8, mixed_precision="bf16")' in code
