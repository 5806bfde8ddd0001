"""Silent divergence and uneven steps become one clear error on 2 gloo processes under accel-run.

Each script below trains a linear model on 2 processes with its own data per process. The broken
ones ran to exit 0 with different weights on each process (a forward through the bare model, a
module outside ``prepare``) or left one process waiting in the all-reduce (a stop on the process's
own loss, a loop of random length). The ``accel_run`` fixture's timeout is the "never a hang"
check.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from accelify.runtime import replicas

HEAD = """\
import random, sys, torch
from accelify.runtime import Accelerator

accelerator = Accelerator(cpu=True)
rank = accelerator.process_index
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
head = torch.nn.Linear(1, 1)
data = torch.Generator().manual_seed(rank)
"""

SCRIPTS = {
    "bare_model_forward": """\
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        prepared, optimizer = accelerator.prepare(model, optimizer)
        for step in range(4):
            loss = model(torch.randn(8, 4, generator=data)).pow(2).mean()  # not `prepared`
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
        """,
    "module_outside_prepare": """\
        optimizer = torch.optim.SGD([*model.parameters(), *head.parameters()], lr=0.1)
        model, optimizer = accelerator.prepare(model, optimizer)
        for step in range(4):
            loss = head(model(torch.randn(8, 4, generator=data))).pow(2).mean()
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
        """,
    "stop_on_own_loss": """\
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        model, optimizer = accelerator.prepare(model, optimizer)
        scale = float(rank)  # rank 0's loss is 0 at once, rank 1's never below 1
        for step in range(20):
            loss = (scale * model(torch.randn(8, 4, generator=data))).pow(2).mean() + scale
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            if loss.item() < 1e-3:
                break
        """,
    "random_episode_length": """\
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        model, optimizer = accelerator.prepare(model, optimizer)
        length = [3, 6][rank]  # what random.Random(rank).randint(...) drew, made certain
        for step in range(length):
            loss = model(torch.randn(8, 4, generator=data)).pow(2).mean()
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
        accelerator.end_training()
        """,
    "correct": """\
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        model, optimizer = accelerator.prepare(model, optimizer)
        for step in range(6):
            loss = model(torch.randn(8, 4, generator=data)).pow(2).mean()
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
        accelerator.save_state(sys.argv[1])
        accelerator.print("loss", loss.item(), "weights", model.module.weight.tolist())
        accelerator.end_training()
        """,
}


def _script(tmp_path: Path, name: str) -> str:
    path = tmp_path / f"{name}.py"
    path.write_text(HEAD + textwrap.dedent(SCRIPTS[name]), encoding="utf-8")
    return str(path)


def _report(stderr: str) -> list[str]:
    return stderr[stderr.index("accel-run: rank") :].splitlines()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "diagnosis"),
    [
        (
            "bare_model_forward",
            "ReplicaMismatchError: model 0 (Linear) is not the same on every process after "
            "optimizer step 1: rank 0 and rank 1 hold different weights",
        ),
        (
            "module_outside_prepare",
            "ReplicaMismatchError: what optimizer 0 steps outside the prepared models (2 tensors) "
            "is not the same on every process after optimizer step 1",
        ),
    ],
)
def test_replicas_that_drift_apart_stop_the_job_at_the_first_step(
    accel_run, tmp_path: Path, name: str, diagnosis: str
) -> None:
    done = accel_run("--cpu", "--num-processes", "2", _script(tmp_path, name), timeout=60)

    assert done.returncode == 1, done.stderr
    report = _report(done.stderr)
    assert "failed first" in report[0]  # both ranks see the mismatch; either may report first
    assert any(diagnosis in line for line in report), done.stderr


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "ended", "waiting"),
    [
        # Rank 0 stops after its first step; its script returns without end_training().
        (
            "stop_on_own_loss",
            "rank 0 ended after 1 backward passes (its script returned)",
            "the forward pass after backward pass 1",  # DDP rebuilds its buckets in forward 2
        ),
        (
            "random_episode_length",
            "rank 0 ended after 3 backward passes (end_training() at",
            "backward pass 4",
        ),
    ],
)
def test_a_process_that_trains_on_after_another_ended_stops_the_job(
    accel_run, tmp_path: Path, name: str, ended: str, waiting: str
) -> None:
    script = _script(tmp_path, name)
    done = accel_run("--cpu", "--num-processes", "2", script, timeout=60)

    assert done.returncode == 1, done.stderr
    report = _report(done.stderr)
    assert report[0].startswith("accel-run: rank 1 failed first (exit code 1")
    line = next(line for line in report if line.startswith("UnevenStepsError"))
    assert line.startswith("UnevenStepsError: rank 1 is still training after rank 0 ended: ")
    assert ended in line
    assert f"rank 1 waits for it in {waiting} at {Path(script).name}:" in line
    # The stack above it starts in the script, and ends in torch where the process waits.
    stack = report[1 : report.index(line)]
    assert stack[0].startswith(f'  File "{script}", line ')
    assert "torch" in stack[-2]
    assert report[-1].startswith("accel-run: rank 0 also failed")


@pytest.mark.slow
def test_a_correct_job_prints_nothing_more_and_trains_the_same_with_the_check_on_or_off(
    accel_run, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = _script(tmp_path, "correct")
    runs = {}
    for mode in ("every:1", "off"):
        monkeypatch.setenv(replicas.ENV, mode)
        done = accel_run("--cpu", "--num-processes", "2", script, str(tmp_path / mode))
        assert done.returncode == 0, done.stderr
        runs[mode] = done
    assert runs["every:1"].stdout == runs["off"].stdout
    assert runs["every:1"].stderr == runs["off"].stderr
    weights = [(tmp_path / mode / "model.safetensors").read_bytes() for mode in runs]
    assert weights[0] == weights[1]


@pytest.mark.parametrize(
    ("text", "every"), [("off", 0), ("first", None), ("every:25", 25), (" Every:3 ", 3)]
)
def test_the_schedule_reads_off_first_and_every_n(text: str, every: int | None) -> None:
    assert replicas.schedule(text).every == every


@pytest.mark.parametrize("text", ["every:0", "every:x", "sometimes", "every"])
def test_a_schedule_it_cannot_read_is_one_error_naming_the_variable(text: str) -> None:
    with pytest.raises(ValueError, match=r"ACCELIFY_SYNC_CHECK=.*expected off, first or every:N"):
        replicas.schedule(text)


def test_the_check_is_due_after_the_first_step_then_every_n() -> None:
    every_3 = replicas.schedule("every:3")
    assert [s for s in range(1, 10) if every_3.due(s)] == [1, 3, 6, 9]
    assert [s for s in range(1, 10) if replicas.schedule("first").due(s)] == [1]
    assert not any(replicas.schedule("off").due(s) for s in range(1, 10))
