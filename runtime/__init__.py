"""The bundled runtime: an Accelerate-compatible ``Accelerator`` and the ``accel-run`` launcher.

The public names load on first use, so ``accel-run --help`` and ``accel-run config`` answer
without importing torch, also where it is not installed (the light install, without the
``runtime`` extra, leaves it out); ``from accelify.runtime import Accelerator`` works as usual,
or says in one line what to install.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

NEEDS_TORCH = (
    "accelify.runtime needs torch: install the runtime extra "
    "(pip install -e '.[runtime]' in a checkout of accelify) or torch itself"
)

if TYPE_CHECKING:
    from .accelerator import Accelerator
    from .big_modeling import init_empty_weights, init_on_device
    from .checkpoint import load_checkpoint_in_model
    from .config import DataLoaderConfiguration, GradientAccumulationPlugin, ProjectConfiguration
    from .data import prepare_data_loader, send_to_device, skip_first_batches
    from .deepspeed_placeholders import DummyOptim, DummyScheduler
    from .handlers import (
        AutocastKwargs,
        DDPCommunicationHookType,
        DistributedDataParallelKwargs,
        GradScalerKwargs,
        InitProcessGroupKwargs,
        ProfileKwargs,
    )
    from .imports import (
        is_bf16_available,
        is_bnb_available,
        is_cuda_available,
        is_datasets_available,
        is_fp16_available,
        is_hpu_available,
        is_mps_available,
        is_pytest_available,
        is_rocm_available,
        is_schedulefree_available,
        is_xpu_available,
    )
    from .launch.notebook import debug_launcher, notebook_launcher
    from .local_sgd import LocalSGD
    from .logging import get_logger
    from .memory import find_executable_batch_size, release_memory
    from .ops import (
        DistributedOperationException,
        broadcast,
        broadcast_object_list,
        copy_tensor_to_devices,
        gather,
        gather_object,
        pad_across_processes,
        reduce,
    )
    from .parallelism import ParallelismConfig
    from .plugins import DeepSpeedPlugin, FullyShardedDataParallelPlugin
    from .properties import FP8BackendType
    from .rng import RNGType, set_seed, synchronize_rng_state, synchronize_rng_states
    from .sharding import SeedableRandomSampler
    from .state import AcceleratorState, DistributedType, GradientState, PartialState
    from .tracking import GeneralTracker, LoggerType

_HOMES = {
    "Accelerator": "accelerator",
    "AcceleratorState": "state",
    "AutocastKwargs": "handlers",
    "DDPCommunicationHookType": "handlers",
    "DataLoaderConfiguration": "config",
    "DeepSpeedPlugin": "plugins",
    "DistributedDataParallelKwargs": "handlers",
    "DistributedOperationException": "ops",
    "DistributedType": "state",
    "DummyOptim": "deepspeed_placeholders",
    "DummyScheduler": "deepspeed_placeholders",
    "FP8BackendType": "properties",
    "FullyShardedDataParallelPlugin": "plugins",
    "GeneralTracker": "tracking",
    "GradScalerKwargs": "handlers",
    "GradientAccumulationPlugin": "config",
    "GradientState": "state",
    "InitProcessGroupKwargs": "handlers",
    "LocalSGD": "local_sgd",
    "LoggerType": "tracking",
    "ParallelismConfig": "parallelism",
    "PartialState": "state",
    "ProfileKwargs": "handlers",
    "ProjectConfiguration": "config",
    "RNGType": "rng",
    "SeedableRandomSampler": "sharding",
    "broadcast": "ops",
    "broadcast_object_list": "ops",
    "copy_tensor_to_devices": "ops",
    "debug_launcher": "launch.notebook",
    "find_executable_batch_size": "memory",
    "gather": "ops",
    "gather_object": "ops",
    "get_logger": "logging",
    "init_empty_weights": "big_modeling",
    "init_on_device": "big_modeling",
    "is_bf16_available": "imports",
    "is_bnb_available": "imports",
    "is_cuda_available": "imports",
    "is_datasets_available": "imports",
    "is_fp16_available": "imports",
    "is_hpu_available": "imports",
    "is_mps_available": "imports",
    "is_pytest_available": "imports",
    "is_rocm_available": "imports",
    "is_schedulefree_available": "imports",
    "is_xpu_available": "imports",
    "load_checkpoint_in_model": "checkpoint",
    "notebook_launcher": "launch.notebook",
    "pad_across_processes": "ops",
    "prepare_data_loader": "data",
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
    "DeepSpeedPlugin",
    "DistributedDataParallelKwargs",
    "DistributedOperationException",
    "DistributedType",
    "DummyOptim",
    "DummyScheduler",
    "FP8BackendType",
    "FullyShardedDataParallelPlugin",
    "GeneralTracker",
    "GradScalerKwargs",
    "GradientAccumulationPlugin",
    "GradientState",
    "InitProcessGroupKwargs",
    "LocalSGD",
    "LoggerType",
    "ParallelismConfig",
    "PartialState",
    "ProfileKwargs",
    "ProjectConfiguration",
    "RNGType",
    "SeedableRandomSampler",
    "broadcast",
    "broadcast_object_list",
    "copy_tensor_to_devices",
    "debug_launcher",
    "find_executable_batch_size",
    "gather",
    "gather_object",
    "get_logger",
    "init_empty_weights",
    "init_on_device",
    "is_bf16_available",
    "is_bnb_available",
    "is_cuda_available",
    "is_datasets_available",
    "is_fp16_available",
    "is_hpu_available",
    "is_mps_available",
    "is_pytest_available",
    "is_rocm_available",
    "is_schedulefree_available",
    "is_xpu_available",
    "load_checkpoint_in_model",
    "notebook_launcher",
    "pad_across_processes",
    "prepare_data_loader",
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
