"""The differential oracle on programs split over files (fixtures/project): the original on one
process against its conversion (the folder given to accel-convert) on one process, losses and
final weights bit-identical, and on two (forked by the zygote), ranks equal and shards distinct.
A program that distributes itself runs under torchrun against its conversion under accel-run."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from runner import (
    BIN,
    PROBE,
    Run,
    Zygote,
    _free_port,
    _load,
    _sharding,
    _subprocess,
    clean_env,
    compare,
    transient,
    two_rank_verdict,
    zygote_fixture,  # noqa: F401  (the module's zygote)
)

from accelify.transform.plan import Options
from accelify.transform.project import convert_program, programs

ROOT = Path(__file__).resolve().parents[2]
TRAIN_SIZE = 64  # every fixture trains on 64 samples and evaluates on another size
ACCEL_RUN = [str(BIN / "accel-run"), "--cpu", "--num-processes", "2"]
CONVERTED = [
    case
    for case in sorted((ROOT / "fixtures" / "project").iterdir())
    if any((case / "out" / p.name).read_text() != p.read_text() for p in (case / "in").glob("*.py"))
]
# Programs that distribute themselves: their original runs under torchrun only.
DDP = [c for c in CONVERTED if "DistributedDataParallel" in (c / "in" / "main.py").read_text()]
SINGLE = [c for c in CONVERTED if c not in DDP]


def _place(program: Path, where: Path) -> Path:
    """Copy ``program`` to ``where`` (a fixture's ``out`` with the folders of its ``in`` beside
    it, ``util/``), with an empty working directory and output folder; its main.py."""
    if program.name == "out":
        shutil.copytree(program.parent / "in", where / "program")
    shutil.copytree(program, where / "program", dirs_exist_ok=True)
    (where / "work").mkdir()
    (where / "out").mkdir()
    return where / "program" / "main.py"


def _run(program: Path, where: Path, launch: list[str]) -> Run:
    """Run ``program``'s main.py under the probe, launched by ``launch``."""
    script = _place(program, where)
    env = {**clean_env(), "ORACLE_OUT": str(where / "out")}
    command = [*launch, str(PROBE), str(script)]
    return Run(*_subprocess(command, where / "work", env, 300), _load(where / "out"))


def _forked(zygote: Zygote, program: Path, where: Path, ranks: int = 1) -> Run:
    """Run ``program``'s main.py on ``ranks`` processes forked by the zygote, with torch
    elastic's variables (no torch import; accel-run's own launch is tested in tests/launch)."""
    script = _place(program, where)
    return zygote.run(script, where / "work", where / "out", 120, ranks=ranks)


def _torchrun(program: Path, where: Path) -> Run:
    """A hand-written DDP original on two processes; one that failed for the machine runs
    again (the question is what it trains)."""
    for attempt in range(3):
        port = str(_free_port())
        torchrun = [str(BIN / "torchrun"), "--nproc-per-node", "2", "--master-port", port]
        run = _run(program, where / str(attempt), torchrun)
        if not transient(run.code, run.stderr):
            break
    return run


def _evaluated(record: dict) -> list[tuple[int, int, int]]:
    """The samples a rank fetched from datasets other than the training set."""
    return [fetch for fetch in record["fetches"] if fetch[0] != TRAIN_SIZE]


def _convert(program: Path, into: Path, target: str) -> Path:
    shutil.copytree(program, into)
    files = sorted(str(p) for p in into.glob("*.py"))
    for found in programs(files):
        for path, (_source, result) in convert_program(found, Options(target=target)).items():
            Path(path).write_text(result.code)
    return into


@pytest.mark.slow
@pytest.mark.parametrize("case", SINGLE, ids=lambda p: p.name)
def test_a_converted_program_trains_as_the_original(
    case: Path, tmp_path: Path, zygote: Zygote
) -> None:
    original = _forked(zygote, case / "in", tmp_path / "original")
    assert original.code == 0 and original.records, original.tail()
    for target in ("accelify", "accelerate"):
        converted = _convert(case / "in", tmp_path / target / "code", target)
        one = _forked(zygote, converted, tmp_path / target / "one")
        assert one.code == 0 and one.records, one.tail()
        assert compare(original.records[0], one.records[0]) == ("", ""), target
    two = _forked(zygote, case / "out", tmp_path / "two", ranks=2)
    notes = tuple((case / "notes.txt").read_text().splitlines())
    verdict = two_rank_verdict(original, two, notes, "2p", TRAIN_SIZE)
    assert verdict is None, verdict


@pytest.mark.slow
@pytest.mark.parametrize("case", DDP, ids=lambda p: p.name)
def test_a_converted_ddp_program_trains_as_the_original(case: Path, tmp_path: Path) -> None:
    """Under torchrun and under accel-run, the ranks share the same global batches (the
    fixtures do not shuffle): the same steps, weights equal up to the order of the gradient
    sums, each training sample once per pass."""
    original = _torchrun(case / "in", tmp_path / "original")
    assert original.code == 0 and len(original.records) == 2, original.tail()
    converted = _run(case / "out", tmp_path / "converted", ACCEL_RUN)
    assert converted.code == 0 and len(converted.records) == 2, converted.tail()
    for ours, theirs in zip(converted.records, original.records, strict=True):
        assert len(ours["losses"]) == len(theirs["losses"])
        for a, b in zip(ours["weights"], theirs["weights"], strict=True):
            assert torch.allclose(a, b, rtol=1e-5, atol=1e-6)
        # Each rank evaluates what it evaluated under torchrun: the same samples, in order.
        assert _evaluated(ours) == _evaluated(theirs)
    both = {"fetches": [f for record in original.records for f in record["fetches"]]}
    assert _sharding(both, converted.records, TRAIN_SIZE) == ""
