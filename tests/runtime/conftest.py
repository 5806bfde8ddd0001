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
