"""Two real processes (torch.distributed.run, gloo on CPU) running fixtures/runtime/train_toy.py.

One module-wide set of runs serves every assertion: accelify on 2 processes (saving after epoch 0),
HF Accelerate on 2 processes, accelify resuming from that checkpoint in new processes, and both
runtimes on 1 process, in fp32 and (through ACCELERATE_MIXED_PRECISION) in bf16.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest
import torch

from .conftest import TEARDOWN_ABORT, run_past_teardown, torchrun

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).resolve().parents[2] / "fixtures" / "runtime" / "train_toy.py"
SAMPLES = 22


def _run(
    out: Path,
    *args: str,
    processes: int = 1,
    env: dict | None = None,
    script: Path = SCRIPT,
    launcher: list[str] | None = None,
) -> None:
    """``script OUT ARGS`` on ``processes`` processes under torchrun, or under ``launcher`` (a
    command that takes ``--num-processes``: accel-run).

    Under torchrun the interpreter's own teardown runs after the script, and torch's exit race
    (see TEARDOWN_ABORT) can abort a rank that finished its work: such a run is run again."""
    ours = launcher is not None
    command = [*launcher, "--num-processes", str(processes)] if ours else torchrun(processes)
    variables = {k: v for k, v in os.environ.items() if not k.startswith(("ACCELERATE_", "WORLD_"))}
    variables.update(OMP_NUM_THREADS="1", ACCELERATE_GRADIENT_ACCUMULATION_STEPS="2", **(env or {}))
    command += [str(script), str(out), *args]
    result = run_past_teardown(command, variables, retry=processes > 1 and not ours)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


def _records(out: Path, impl: str) -> list[dict]:
    return [json.loads(path.read_text()) for path in sorted(out.glob(f"{impl}_rank*.json"))]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict]]:
    two, resumed, one, bf16 = map(tmp_path_factory.mktemp, ("two", "resumed", "one", "bf16"))
    _run(two, "--save-after", "0", processes=2)
    # HF Accelerate only starts gloo on a CPU host when told to use the CPU.
    _run(two, "--impl", "hf", processes=2, env={"ACCELERATE_USE_CPU": "1"})
    shutil.copytree(two / "checkpoints", resumed / "checkpoints")
    _run(resumed, "--save-after", "0", "--resume", processes=2)
    _run(one)
    _run(one, "--impl", "hf")
    for impl in ("accelify", "hf"):
        _run(bf16, "--impl", impl, env={"ACCELERATE_MIXED_PRECISION": "bf16"})
    return {
        "two": _records(two, "accelify"),
        "two_hf": _records(two, "hf"),
        "resumed": _records(resumed, "accelify"),
        "one": _records(one, "accelify"),
        "one_hf": _records(one, "hf"),
        "bf16": _records(bf16, "accelify"),
        "bf16_hf": _records(bf16, "hf"),
        "saved": [torch.load(two / f"{impl}_saved.pt") for impl in ("accelify", "hf")],
    }


def test_processes_read_distinct_shards_that_cover_the_data(runs: dict) -> None:
    ranks = runs["two"]
    assert [r["num_processes"] for r in ranks] == [2, 2]
    for epoch in range(2):
        first, second = (r["seen"][epoch] for r in ranks)
        assert len(first) == len(second) == 12  # 22 samples + 2 repeated to even the last round
        assert set(first) | set(second) == set(range(SAMPLES))
        assert len(set(first) & set(second)) <= 2
    assert ranks[0]["seen"][0] != ranks[0]["seen"][1]  # reshuffled per epoch


def test_processes_end_with_identical_weights(runs: dict) -> None:
    first, second = runs["two"]
    assert first["params"] == second["params"]


def test_gradients_equal_one_process_over_the_gathered_batches(runs: dict) -> None:
    assert all(r["grad_diff"] < 1e-5 for r in runs["two"] + runs["one"])


def test_gather_for_metrics_counts_every_sample_once(runs: dict) -> None:
    for record in runs["two"] + runs["one"]:
        assert record["eval"] == list(range(SAMPLES))


@pytest.mark.parametrize("run", ["one", "two", "bf16"])
def test_same_losses_learning_rates_and_weights_as_hf_accelerate(runs: dict, run: str) -> None:
    ours, theirs = runs[run], runs[f"{run}_hf"]
    assert len(ours) == len(theirs) == (2 if run == "two" else 1)
    for mine, hf in zip(ours, theirs, strict=True):
        assert mine["losses"] == pytest.approx(hf["losses"], rel=1e-6)
        assert mine["lrs"] == pytest.approx(hf["lrs"])
        assert mine["params"] == pytest.approx(hf["params"], rel=1e-6, abs=1e-7)


def test_collectives_and_save_behave_like_hf_accelerate(runs: dict) -> None:
    expected = {
        "sum": 3.0,
        "mean": 1.5,
        "padded": [[0.0, 0.0], [1.0, 1.0], [1.0, 1.0], [1.0, 1.0]],  # rank 0's row padded first
        "objects": ["rank0", "rank1"],
        "shares": [0, 1, 2, 3, 4, 4],  # [0, 1, 2] and [3, 4] padded to [3, 4, 4]
    }
    for record in runs["two"] + runs["two_hf"]:
        assert record["collectives"] == expected
    assert runs["saved"] == [{"written_by": 0}, {"written_by": 0}]


def test_resuming_in_new_processes_equals_training_straight_through(runs: dict) -> None:
    for straight, resumed in zip(runs["two"], runs["resumed"], strict=True):
        assert resumed["seen"] == straight["seen"][1:]
        assert resumed["params"] == straight["params"]


def test_a_run_that_only_aborted_in_the_teardown_runs_again_from_an_empty_folder(
    tmp_path: Path,
) -> None:
    """The retry the torchrun runs above rely on: a failure that is not the teardown abort, or
    a launch told not to retry, is reported as it is."""
    out, tries = tmp_path / "out", tmp_path / "tries"
    out.mkdir()
    (out / "written").write_text("by the aborted try")
    code = (
        "import pathlib, sys\n"
        f"tries, out = pathlib.Path({str(tries)!r}), pathlib.Path({str(out)!r})\n"
        "n = int(tries.read_text()) if tries.exists() else 0\n"
        "tries.write_text(str(n + 1))\n"
        "assert n == 0 or not (out / 'written').exists()\n"
        f"sys.exit(0 if n else {TEARDOWN_ABORT!r})\n"
    )
    result = run_past_teardown([sys.executable, "-c", code], dict(os.environ), True, clear=out)
    assert result.returncode == 0 and tries.read_text() == "2" and out.is_dir()
    tries.unlink()
    once = run_past_teardown([sys.executable, "-c", code], dict(os.environ), False, clear=out)
    assert once.returncode == 1 and TEARDOWN_ABORT in once.stderr and tries.read_text() == "1"
