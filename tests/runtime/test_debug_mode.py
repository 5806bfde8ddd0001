"""Debug mode (``accel-run --debug``): collectives refuse mismatched shapes, as HF Accelerate's.

Two gloo processes call ``gather``, ``reduce``, ``broadcast`` and ``pad_across_processes`` with
tensors whose shapes differ between them: each process gets ``DistributedOperationException``
with HF's message instead of gloo aborting the job. Without debug mode no check runs at all.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from accelify.runtime import DistributedOperationException, PartialState, ops

SCRIPT = """
import json, sys
import torch
import torch.distributed as dist
from accelify.runtime import (
    Accelerator, DistributedOperationException, broadcast, gather, pad_across_processes, reduce,
)

accelerator = Accelerator()
rank = accelerator.process_index
checks = []
all_gather_object = dist.all_gather_object


def counted(*args, **kwargs):
    checks.append(1)
    return all_gather_object(*args, **kwargs)


dist.all_gather_object = counted
agreeing = {"x": torch.ones(2, 3)}
for op in (gather, reduce, broadcast, pad_across_processes):
    op(agreeing)
record = {"debug": accelerator.state.debug, "checks": len(checks), "errors": {}}
if accelerator.state.debug:
    mismatched = {
        "gather": (gather, torch.zeros(rank + 1, 3)),
        "reduce": (reduce, {"x": torch.zeros(2, 2 + rank)}),
        "broadcast": (broadcast, [torch.zeros(3), torch.zeros(rank + 1)]),
        "pad_across_processes": (pad_across_processes, torch.zeros((1,) * (rank + 1))),
    }
    for name, (op, data) in mismatched.items():
        try:
            op(data)
        except DistributedOperationException as err:
            cause = err.__cause__
            record["errors"][name] = [str(err), None if cause is None else str(cause)]
    record["after"] = gather(torch.tensor([rank])).tolist()  # the processes are still in step
sys.stdout.write(json.dumps({"rank": rank, **record}) + "\\n")
accelerator.end_training()
"""
OPS = "accelify.runtime.ops"


def _message(operation: str, *shapes: object) -> str:
    """HF Accelerate's message (accelerate.utils.operations.verify_operation), with our op."""
    listed = "\n  - ".join(f"Process {i}: {shape}" for i, shape in enumerate(shapes))
    return (
        "Cannot apply desired operation due to shape mismatches. All shapes across devices must "
        f"be valid.\n\nOperation: `{OPS}.{operation}`\nInput shapes:\n  - {listed}"
    )


def _run(tmp_path: Path, *flags: str) -> list[dict]:
    script = tmp_path / "ops_script.py"
    script.write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ACCELERATE_", "WORLD_"))}
    env["OMP_NUM_THREADS"] = "1"
    command = [sys.executable, "-c", "from accelify.runtime.launch.cli import main; main()"]
    command += ["--num-processes", "2", "--cpu", *flags, str(script)]
    done = subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    records = [json.loads(line) for line in done.stdout.splitlines() if line.startswith('{"rank')]
    return sorted(records, key=lambda record: record["rank"])


@pytest.mark.slow
def test_debug_mode_raises_hfs_exception_on_every_process(tmp_path: Path) -> None:
    records = _run(tmp_path, "--debug")
    assert [record["debug"] for record in records] == [True, True]
    expected = {
        "gather": [_message("gather", [1, 3], [2, 3]), None],
        "reduce": [_message("reduce", {"x": [2, 2]}, {"x": [2, 3]}), None],
        "broadcast": [_message("broadcast", [[3], [1]], [[3], [2]]), None],
        "pad_across_processes": [
            f"Error found while calling `{OPS}.pad_across_processes`. Please see the earlier "
            "error for more details.",
            _message("pad_across_processes", [1], [1, 1]),
        ],
    }
    for record in records:
        assert record["errors"] == expected
        assert record["checks"] == 4  # one shape exchange per collective
        assert record["after"] == [0, 1]


@pytest.mark.slow
def test_without_debug_mode_no_check_runs(tmp_path: Path) -> None:
    records = _run(tmp_path)
    assert [(record["debug"], record["checks"]) for record in records] == [(False, 0)] * 2


@pytest.mark.parametrize(
    ("value", "debug"), [("1", True), ("true", True), ("yes", True), ("0", False), ("", False)]
)
def test_the_variable_sets_the_states_debug(
    monkeypatch: pytest.MonkeyPatch, value: str, debug: bool
) -> None:
    monkeypatch.setenv(ops.DEBUG_ENV, value)
    assert PartialState(cpu=True).debug is debug


def test_the_exception_is_public_where_scripts_import_the_ops() -> None:
    import accelify.runtime

    assert accelify.runtime.DistributedOperationException is DistributedOperationException
    assert "DistributedOperationException" in accelify.runtime.__all__
    assert issubclass(DistributedOperationException, Exception)
