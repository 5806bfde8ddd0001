"""Each runtime test starts without an Accelerator and without launcher variables."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from accelify.runtime import load_checkpoint_in_model, state

_LAUNCH_VARIABLES = (
    "WORLD_SIZE",
    "RANK",
    "LOCAL_RANK",
    "ACCELERATE_MIXED_PRECISION",
    "ACCELERATE_GRADIENT_ACCUMULATION_STEPS",
    "ACCELERATE_USE_CPU",
    "ACCELERATE_USE_DEEPSPEED",
    "ACCELERATE_USE_FSDP",
    "MASTER_ADDR",
)
_LAUNCHER_PREFIXES = ("ACCELERATE_", "FSDP_", "DS_", "WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_")

CUDA = pytest.param(
    "cuda",
    marks=[
        pytest.mark.gpu,
        pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
    ],
)


@pytest.fixture(autouse=True)
def fresh_process(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in _LAUNCH_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    state.reset()
    rng = torch.get_rng_state()
    yield
    state.reset()
    torch.set_rng_state(rng)


# --- scripts under torchrun --------------------------------------------------------------------

# What a rank prints when a gloo thread takes the GIL from the finalizing interpreter after the
# script has ended (pytorch#190489): accel-run's workers leave before that teardown, torchrun's
# do not (clean-clone CI runs died of it on fixtures/runtime/local_sgd_hooks.py, then on
# track_toy.py).
TEARDOWN_ABORT = "terminate called without an active exception"
TEARDOWN_TRIES = 3


def torchrun(processes: int) -> list[str]:
    """The command that runs a script on ``processes`` CPU processes under torchrun (the
    interpreter alone for one). ``--standalone`` lets the agent bind a free port itself: a port
    picked here could be taken by a parallel test before the agent binds it."""
    if processes == 1:
        return [sys.executable]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            "--nproc-per-node", str(processes)]  # fmt: skip


def run_past_teardown(
    command: list[str], env: dict[str, str], retry: bool, clear: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``command``; with ``retry`` (torchrun on several processes), again when a rank that
    finished its work only aborted in the interpreter's teardown (TEARDOWN_ABORT). ``clear``:
    a folder emptied before each new try, so no try reads what an aborted one wrote."""
    for attempt in range(TEARDOWN_TRIES if retry else 1):
        if attempt and clear is not None:
            shutil.rmtree(clear, ignore_errors=True)
            clear.mkdir(parents=True)
        result = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
        if result.returncode == 0 or TEARDOWN_ABORT not in result.stderr:
            break
    return result


# --- sharded backends: fixtures/runtime/train_sharded.py through the real accel-run -------------

SHARDED_SCRIPT = Path(__file__).resolve().parents[2] / "fixtures" / "runtime" / "train_sharded.py"
_LAUNCH = "from accelify.runtime.launch.cli import main; main()"


def run_sharded(
    out: Path, *flags: str, resume: bool = False, cpu: bool = True, script: tuple[str, ...] = ()
) -> dict[str, Any]:
    """Train under ``accel-run FLAGS`` (2 CPU processes, else one per GPU), saving after epoch 0
    (or resuming from there); ``script`` are more arguments for the script.

    Returns the main process's record, with the other ranks' as ``others``. The generous timeout
    covers DeepSpeed's first start, which builds a small op (cached in ~/.cache/torch_extensions).
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith(_LAUNCHER_PREFIXES)}
    env["OMP_NUM_THREADS"] = "1"
    processes = 2 if cpu else torch.cuda.device_count()
    command = [sys.executable, "-c", _LAUNCH, "--num-processes", str(processes)]
    command += ["--cpu"] if cpu else []
    command += ["--gradient-accumulation-steps", "2", *flags, str(SHARDED_SCRIPT), str(out)]
    command += ["--save-after", "0", *(["--resume"] if resume else []), *script]
    done = subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    first, *others = (json.loads((out / f"rank{r}.json").read_text()) for r in range(processes))
    return {**first, "others": others}


def resumed_run(
    straight: Path, resumed: Path, *flags: str, script: tuple[str, ...] = ()
) -> dict[str, Any]:
    """A new 2-process run that loads ``straight``'s checkpoint (saved after epoch 0)."""
    shutil.copytree(straight / "state", resumed / "state")
    return run_sharded(resumed, *flags, resume=True, script=script)


@pytest.fixture(scope="session")
def ddp_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The same script under plain DDP: the reference the sharded backends must match."""
    return run_sharded(tmp_path_factory.mktemp("ddp"))


def max_difference(first: dict[str, list], second: dict[str, list]) -> float:
    assert first.keys() == second.keys()
    return max(
        (torch.tensor(first[name]) - torch.tensor(second[name])).abs().max().item()
        for name in first
    )


def fresh_model_from(folder: Path) -> torch.nn.Module:
    """The fixture's model, built anew, with the weights ``save_model`` wrote (strictly)."""
    spec = importlib.util.spec_from_file_location("train_sharded", SHARDED_SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model = module.build_model()
    load_checkpoint_in_model(model, folder, strict=True)
    return model
