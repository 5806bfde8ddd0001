"""The bundled runtime: an Accelerate-compatible ``Accelerator`` and the ``accel-run`` launcher."""

from __future__ import annotations

from typing import Any

from .accelerator import Accelerator
from .checkpoint import load_checkpoint_in_model
from .config import ProjectConfiguration
from .data import skip_first_batches
from .handlers import AutocastKwargs, DistributedDataParallelKwargs, GradScalerKwargs
from .rng import set_seed
from .state import DistributedType

__all__ = [
    "Accelerator",
    "AutocastKwargs",
    "DistributedDataParallelKwargs",
    "DistributedType",
    "GradScalerKwargs",
    "ProjectConfiguration",
    "load_checkpoint_in_model",
    "notebook_launcher",
    "set_seed",
    "skip_first_batches",
]


def __getattr__(name: str) -> Any:
    # The launcher lives in launch/ and is only imported by the scripts that use it.
    if name == "notebook_launcher":
        from .launch.notebook import notebook_launcher

        return notebook_launcher
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
