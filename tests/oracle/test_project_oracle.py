"""The differential oracle on programs split over files (fixtures/project): the original on one
process against its conversion (the folder given to accel-convert) on one process, losses and
final weights bit-identical, and on two (accel-run), ranks equal and shards distinct."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from runner import BIN, PROBE, Run, _load, _subprocess, clean_env, compare, two_rank_verdict

from accelify.transform.plan import Options
from accelify.transform.project import convert_program, programs

ROOT = Path(__file__).resolve().parents[2]
TRAIN_SIZE = 64  # every fixture trains on 64 samples and evaluates on another size
CONVERTED = [
    case
    for case in sorted((ROOT / "fixtures" / "project").iterdir())
    if any((case / "out" / p.name).read_text() != p.read_text() for p in (case / "in").glob("*.py"))
]


def _run(program: Path, where: Path, ranks: int) -> Run:
    """Run ``program``'s main.py under the probe, on one process or on two with accel-run."""
    shutil.copytree(program, where / "program")
    (where / "work").mkdir()
    (where / "out").mkdir()
    launch = [str(BIN / "accel-run"), "--cpu", "--num-processes", "2"]
    command = [*(launch if ranks > 1 else [sys.executable]), str(PROBE)]
    command.append(str(where / "program" / "main.py"))
    env = {**clean_env(), "ORACLE_OUT": str(where / "out")}
    return Run(*_subprocess(command, where / "work", env, 300), _load(where / "out"))


def _convert(program: Path, into: Path, target: str) -> Path:
    shutil.copytree(program, into)
    files = sorted(str(p) for p in into.glob("*.py"))
    for found in programs(files):
        for path, (_source, result) in convert_program(found, Options(target=target)).items():
            Path(path).write_text(result.code)
    return into


@pytest.mark.slow
@pytest.mark.parametrize("case", CONVERTED, ids=lambda p: p.name)
def test_a_converted_program_trains_as_the_original(case: Path, tmp_path: Path) -> None:
    original = _run(case / "in", tmp_path / "original", ranks=1)
    assert original.code == 0 and original.records, original.tail()
    for target in ("accelify", "accelerate"):
        converted = _convert(case / "in", tmp_path / target / "code", target)
        one = _run(converted, tmp_path / target / "one", ranks=1)
        assert one.code == 0 and one.records, one.tail()
        assert compare(original.records[0], one.records[0]) == ("", ""), target
    two = _run(case / "out", tmp_path / "two", ranks=2)
    notes = tuple((case / "notes.txt").read_text().splitlines())
    verdict = two_rank_verdict(original, two, notes, "2p", TRAIN_SIZE)
    assert verdict is None, verdict
