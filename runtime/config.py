"""Constructor options merged with the ``ACCELERATE_*`` variables a launcher sets.

Reading the same variables HF Accelerate reads lets one launcher (``accel-run`` or
``accelerate launch``) configure either runtime.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

MIXED_PRECISIONS = ("no", "fp16", "bf16")
_TRUE = frozenset({"1", "y", "yes", "t", "true", "on"})
_FALSE = frozenset({"0", "n", "no", "f", "false", "off"})


@dataclass
class ProjectConfiguration:
    """Where checkpoints go and how many are kept (HF Accelerate's fields and defaults)."""

    project_dir: str | None = None
    logging_dir: str | None = None
    automatic_checkpoint_naming: bool = False
    total_limit: int | None = None
    iteration: int = 0
    save_on_each_node: bool = False

    def set_directories(self, project_dir: str | None = None) -> None:
        self.project_dir = project_dir
        if self.logging_dir is None:
            self.logging_dir = project_dir

    def __post_init__(self) -> None:
        if self.logging_dir is None:
            self.logging_dir = self.project_dir


@dataclass
class DataLoaderConfiguration:
    """How ``prepare`` shards data loaders (HF Accelerate's fields and defaults).

    Read at ``prepare`` time, so assigning ``accelerator.dataloader_config`` affects the loaders
    prepared afterwards. Options accelify does not implement are refused there, not ignored
    (:func:`check_loader_config`).
    """

    split_batches: bool = False
    dispatch_batches: bool | None = None
    even_batches: bool = True
    use_seedable_sampler: bool = False
    data_seed: int | None = None
    non_blocking: bool = False
    use_stateful_dataloader: bool = False


@dataclass
class GradientAccumulationPlugin:
    """Gradient accumulation options (HF Accelerate's fields and defaults).

    ``adjust_scheduler`` is accepted and, as in HF Accelerate 1.15, has no effect: HF passes on
    only the fields that differ from their defaults, so its default ``True`` never arrives.
    """

    num_steps: int | None = None
    adjust_scheduler: bool = True
    sync_with_dataloader: bool = True
    sync_each_batch: bool = False


def check_loader_config(chosen: DataLoaderConfiguration) -> None:
    """Refuse the options accelify does not implement (works on HF's class too)."""
    unsupported = {"use_stateful_dataloader=True": chosen.use_stateful_dataloader}
    named = [name for name, used in unsupported.items() if used]
    if named:
        raise ValueError(
            f"DataLoaderConfiguration({', '.join(named)}) is not supported by accelify; "
            "leave it at its default"
        )


def env_flag(name: str, default: bool = False) -> bool:
    value = os.environ.get(name, "").strip().lower()
    if not value:
        return default
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(f"environment variable {name}={value!r} is not a boolean")


def mixed_precision(value: str | None) -> str:
    """The argument when given, else ``ACCELERATE_MIXED_PRECISION``, else ``"no"``."""
    chosen = value if value is not None else os.environ.get("ACCELERATE_MIXED_PRECISION", "no")
    chosen = str(chosen).lower()
    if chosen not in MIXED_PRECISIONS:
        raise ValueError(f"mixed_precision must be one of {MIXED_PRECISIONS}, not {chosen!r}")
    return chosen


def accumulation_steps(value: int) -> int:
    """The argument when not the default 1, else ``ACCELERATE_GRADIENT_ACCUMULATION_STEPS``."""
    raw = os.environ.get("ACCELERATE_GRADIENT_ACCUMULATION_STEPS", "") if value == 1 else value
    try:
        steps = int(raw) if raw != "" else 1
    except ValueError:
        steps = 0
    if steps < 1:
        raise ValueError(f"gradient_accumulation_steps must be a positive integer, not {raw!r}")
    return steps


def use_cpu(value: bool) -> bool:
    return value or env_flag("ACCELERATE_USE_CPU")
