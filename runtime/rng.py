"""Seeding, random states shared across processes, and those a checkpoint saves and restores.

States are stored as tensors and plain Python values only, so a checkpoint loads with
``torch.load(weights_only=True)``; numpy is optional and only touched when it is installed.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from enum import Enum
from typing import Any

import torch

from . import ops
from .state import PartialState, current


class RNGType(str, Enum):
    """HF Accelerate's ``accelerate.utils.RNGType``, every member (the values are HF's)."""

    TORCH = "torch"
    CUDA = "cuda"
    MLU = "mlu"
    SDAA = "sdaa"
    MUSA = "musa"
    NPU = "npu"
    XLA = "xla"
    XPU = "xpu"
    HPU = "hpu"
    NEURON = "neuron"
    GENERATOR = "generator"


def set_seed(seed: int, device_specific: bool = False, deterministic: bool = False) -> None:
    """Seed ``random``, numpy and torch (all devices), like HF Accelerate's ``set_seed``."""
    if device_specific:
        known = current()
        seed += known.process_index if known is not None else 0
    random.seed(seed)
    numpy = _numpy()
    if numpy is not None:
        numpy.random.seed(seed)
    torch.manual_seed(seed)  # also seeds every CUDA device
    if deterministic:
        torch.use_deterministic_algorithms(True)


def synchronize_rng_states(
    rng_types: Iterable[str | RNGType], generator: torch.Generator | None = None
) -> None:
    """Give every process process 0's random state for each of ``rng_types``.

    HF Accelerate's ``accelerate.utils.synchronize_rng_states``: ``"torch"`` (the CPU
    generator), a device's (``"cuda"``, ``"xpu"``, ...: its current device) or ``"generator"``
    (``generator``, which is then required).
    """
    for rng_type in rng_types:
        synchronize_rng_state(rng_type, generator=generator)


def synchronize_rng_state(
    rng_type: str | RNGType | None = None, generator: torch.Generator | None = None
) -> None:
    """:func:`synchronize_rng_states` for one random state (HF's name and signature)."""
    kind = RNGType(getattr(rng_type, "value", rng_type))  # HF's own RNGType members too
    if kind is RNGType.GENERATOR:
        if generator is None:
            raise ValueError("Need a generator to synchronize its seed.")
        get_state, set_state = generator.get_state, generator.set_state
    elif kind is RNGType.TORCH:
        get_state, set_state = torch.get_rng_state, torch.set_rng_state
    else:
        backend = getattr(torch, kind.value, None)
        if backend is None or not backend.is_available():
            raise RuntimeError(
                f"Can't synchronize {kind.value} seeds: torch has no {kind.value} device here"
            )
        get_state, set_state = backend.get_rng_state, backend.set_rng_state
    rng_state = get_state()
    if ops.is_distributed():
        device = PartialState().device  # nccl broadcasts from the GPU only
        rng_state = ops.broadcast(rng_state.to(device)).cpu()
    set_state(rng_state)


def capture() -> dict[str, Any]:
    states: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    numpy = _numpy()
    if numpy is not None:
        kind, keys, pos, has_gauss, cached = numpy.random.get_state()
        states["numpy"] = (kind, torch.from_numpy(keys.astype("int64")), pos, has_gauss, cached)
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def restore(states: dict[str, Any]) -> None:
    """Put back what :func:`capture` saved; anything that cannot be restored raises."""
    random.setstate(_as_tuples(states["python"]))
    torch.set_rng_state(states["torch"])
    if "numpy" in states:
        numpy = _numpy()
        if numpy is None:
            raise RuntimeError("the checkpoint holds a numpy random state but numpy is missing")
        kind, keys, pos, has_gauss, cached = states["numpy"]
        numpy.random.set_state((kind, keys.numpy().astype("uint32"), pos, has_gauss, cached))
    if "cuda" in states:
        torch.cuda.set_rng_state_all(states["cuda"])


def _as_tuples(value: Any) -> Any:
    """``random.setstate`` wants tuples; some loaders hand sequences back as lists."""
    return tuple(_as_tuples(v) for v in value) if isinstance(value, (list, tuple)) else value


def _numpy() -> Any:
    try:
        import numpy
    except ImportError:
        return None
    return numpy
