"""notebook_launcher: forked CPU workers, and refusals that happen before anything is forked."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from accelify.runtime import notebook_launcher


def _report_world(folder: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo")
    total = torch.tensor([1.0])
    dist.all_reduce(total)
    line = f"{dist.get_world_size()} {total.item()} {os.environ['ACCELERATE_MIXED_PRECISION']}"
    Path(folder, f"rank{dist.get_rank()}").write_text(line)
    dist.destroy_process_group()


def _fail_on_rank_1() -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo")
    if dist.get_rank() == 1:
        raise ValueError("bad batch on rank 1")
    dist.all_reduce(torch.ones(1))


@pytest.mark.slow
def test_two_forked_cpu_workers_see_each_other(tmp_path: Path) -> None:
    notebook_launcher(_report_world, (str(tmp_path),), num_processes=2, use_port="0",
                      mixed_precision="bf16")  # fmt: skip
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rank0", "rank1"]
    assert {p.read_text() for p in tmp_path.iterdir()} == {"2 2.0 bf16"}


@pytest.mark.slow
def test_a_failing_worker_raises_with_its_traceback_first() -> None:
    with pytest.raises(RuntimeError) as err:
        notebook_launcher(_fail_on_rank_1, num_processes=2, use_port="0")
    lines = str(err.value).splitlines()
    assert lines[0].startswith("notebook_launcher: rank 1 failed first")
    assert lines[1] == "Traceback (most recent call last):"
    assert "in _fail_on_rank_1" in lines[2]  # starts at the user's function, not our wrapper
    assert "ValueError: bad batch on rank 1" in lines


def test_one_process_on_cpu_is_a_plain_call(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    calls = []
    notebook_launcher(lambda x: calls.append((x, os.getpid())), ("a",))
    assert calls == [("a", os.getpid())]


def _must_not_run() -> None:
    raise AssertionError("forked although the parent cannot be forked safely")


def test_refuses_before_forking_when_cuda_is_initialised(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    with pytest.raises(RuntimeError, match=r"CUDA is already initialised.*`\.cuda\(\)`"):
        notebook_launcher(_must_not_run, num_processes=2, use_port="0")


def test_refuses_when_an_accelerator_exists(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("accelify.runtime.state.is_initialized", lambda: True)
    with pytest.raises(RuntimeError, match="an Accelerator already exists in this process"):
        notebook_launcher(_must_not_run, num_processes=2, use_port="0")


def test_bad_arguments_are_value_errors() -> None:
    with pytest.raises(ValueError, match="must be one of no, fp16, bf16, got 'fp8'"):
        notebook_launcher(_must_not_run, num_processes=2, mixed_precision="fp8")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_real_cuda_initialisation_is_refused_before_forking() -> None:
    code = (
        "import torch; torch.zeros(1, device='cuda')\n"
        "from accelify.runtime import notebook_launcher\n"
        "notebook_launcher(print, num_processes=2, use_port='0')"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 1
    assert "RuntimeError: notebook_launcher: CUDA is already initialised" in done.stderr
