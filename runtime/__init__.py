"""The bundled runtime: an Accelerate-compatible ``Accelerator`` and the ``accel-run`` launcher.

The public names load on first use, so ``accel-run --help`` and ``accel-run config`` answer
without importing torch; ``from accelify.runtime import Accelerator`` works as usual.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

if importlib.util.find_spec("torch") is None:  # accel-convert and accel-lint install without it
    raise ModuleNotFoundError(
        "accelify.runtime needs torch: pip install 'accelify[runtime]' (or install torch)",
        name="torch",
    )

if TYPE_CHECKING:
    from .accelerator import Accelerator
    from .checkpoint import load_checkpoint_in_model
    from .config import DataLoaderConfiguration, GradientAccumulationPlugin, ProjectConfiguration
    from .data import skip_first_batches
    from .deepspeed_placeholders import DummyOptim, DummyScheduler
    from .handlers import (
        AutocastKwargs,
        DistributedDataParallelKwargs,
        GradScalerKwargs,
        InitProcessGroupKwargs,
    )
    from .launch.notebook import notebook_launcher
    from .ops import broadcast, gather, gather_object, pad_across_processes, reduce
    from .rng import set_seed
    from .state import AcceleratorState, DistributedType, PartialState

_HOMES = {
    "Accelerator": "accelerator",
    "AcceleratorState": "state",
    "AutocastKwargs": "handlers",
    "DataLoaderConfiguration": "config",
    "DistributedDataParallelKwargs": "handlers",
    "DistributedType": "state",
    "DummyOptim": "deepspeed_placeholders",
    "DummyScheduler": "deepspeed_placeholders",
    "GradScalerKwargs": "handlers",
    "GradientAccumulationPlugin": "config",
    "InitProcessGroupKwargs": "handlers",
    "PartialState": "state",
    "ProjectConfiguration": "config",
    "broadcast": "ops",
    "gather": "ops",
    "gather_object": "ops",
    "load_checkpoint_in_model": "checkpoint",
    "notebook_launcher": "launch.notebook",
    "pad_across_processes": "ops",
    "reduce": "ops",
    "set_seed": "rng",
    "skip_first_batches": "data",
}
__all__ = [
    "Accelerator",
    "AcceleratorState",
    "AutocastKwargs",
    "DataLoaderConfiguration",
    "DistributedDataParallelKwargs",
    "DistributedType",
    "DummyOptim",
    "DummyScheduler",
    "GradScalerKwargs",
    "GradientAccumulationPlugin",
    "InitProcessGroupKwargs",
    "PartialState",
    "ProjectConfiguration",
    "broadcast",
    "gather",
    "gather_object",
    "load_checkpoint_in_model",
    "notebook_launcher",
    "pad_across_processes",
    "reduce",
    "set_seed",
    "skip_first_batches",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{home}", __name__), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
