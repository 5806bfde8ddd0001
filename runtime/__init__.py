"""The bundled runtime: an Accelerate-compatible ``Accelerator`` and the ``accel-run`` launcher.

The public names load on first use, so ``accel-run --help`` and ``accel-run config`` answer
without importing torch, also where it is not installed (``pip install accelify`` leaves it out);
``from accelify.runtime import Accelerator`` works as usual, or says in one line what to install.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

NEEDS_TORCH = "accelify.runtime needs torch: pip install 'accelify[runtime]' (or install torch)"

if TYPE_CHECKING:
    from .accelerator import Accelerator
    from .checkpoint import load_checkpoint_in_model
    from .config import DataLoaderConfiguration, GradientAccumulationPlugin, ProjectConfiguration
    from .data import send_to_device, skip_first_batches
    from .deepspeed_placeholders import DummyOptim, DummyScheduler
    from .handlers import (
        AutocastKwargs,
        DDPCommunicationHookType,
        DistributedDataParallelKwargs,
        GradScalerKwargs,
        InitProcessGroupKwargs,
        ProfileKwargs,
    )
    from .launch.notebook import debug_launcher, notebook_launcher
    from .local_sgd import LocalSGD
    from .logging import get_logger
    from .memory import find_executable_batch_size, release_memory
    from .ops import (
        DistributedOperationException,
        broadcast,
        broadcast_object_list,
        gather,
        gather_object,
        pad_across_processes,
        reduce,
    )
    from .properties import FP8BackendType
    from .rng import RNGType, set_seed, synchronize_rng_state, synchronize_rng_states
    from .state import AcceleratorState, DistributedType, PartialState
    from .tracking import GeneralTracker, LoggerType

_HOMES = {
    "Accelerator": "accelerator",
    "AcceleratorState": "state",
    "AutocastKwargs": "handlers",
    "DDPCommunicationHookType": "handlers",
    "DataLoaderConfiguration": "config",
    "DistributedDataParallelKwargs": "handlers",
    "DistributedOperationException": "ops",
    "DistributedType": "state",
    "DummyOptim": "deepspeed_placeholders",
    "DummyScheduler": "deepspeed_placeholders",
    "FP8BackendType": "properties",
    "GeneralTracker": "tracking",
    "GradScalerKwargs": "handlers",
    "GradientAccumulationPlugin": "config",
    "InitProcessGroupKwargs": "handlers",
    "LocalSGD": "local_sgd",
    "LoggerType": "tracking",
    "PartialState": "state",
    "ProfileKwargs": "handlers",
    "ProjectConfiguration": "config",
    "RNGType": "rng",
    "broadcast": "ops",
    "broadcast_object_list": "ops",
    "debug_launcher": "launch.notebook",
    "find_executable_batch_size": "memory",
    "gather": "ops",
    "gather_object": "ops",
    "get_logger": "logging",
    "load_checkpoint_in_model": "checkpoint",
    "notebook_launcher": "launch.notebook",
    "pad_across_processes": "ops",
    "reduce": "ops",
    "release_memory": "memory",
    "send_to_device": "data",
    "set_seed": "rng",
    "skip_first_batches": "data",
    "synchronize_rng_state": "rng",
    "synchronize_rng_states": "rng",
}
__all__ = [
    "Accelerator",
    "AcceleratorState",
    "AutocastKwargs",
    "DDPCommunicationHookType",
    "DataLoaderConfiguration",
    "DistributedDataParallelKwargs",
    "DistributedOperationException",
    "DistributedType",
    "DummyOptim",
    "DummyScheduler",
    "FP8BackendType",
    "GeneralTracker",
    "GradScalerKwargs",
    "GradientAccumulationPlugin",
    "InitProcessGroupKwargs",
    "LocalSGD",
    "LoggerType",
    "PartialState",
    "ProfileKwargs",
    "ProjectConfiguration",
    "RNGType",
    "broadcast",
    "broadcast_object_list",
    "debug_launcher",
    "find_executable_batch_size",
    "gather",
    "gather_object",
    "get_logger",
    "load_checkpoint_in_model",
    "notebook_launcher",
    "pad_across_processes",
    "reduce",
    "release_memory",
    "send_to_device",
    "set_seed",
    "skip_first_batches",
    "synchronize_rng_state",
    "synchronize_rng_states",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if importlib.util.find_spec("torch") is None:  # accel-convert and accel-lint install without it
        raise ModuleNotFoundError(NEEDS_TORCH, name="torch")
    value = getattr(importlib.import_module(f".{home}", __name__), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
