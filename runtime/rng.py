"""Seeding, random states shared across processes, and those a checkpoint saves and restores.

A checkpoint keeps the states under HF Accelerate's keys (so each runtime restores the other's)
as tensors and plain Python values only (so they load with ``torch.load(weights_only=True)``).
numpy is optional and only touched when it is installed.
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


def checked_rng_types(rng_types: Iterable[str | RNGType] | None) -> list[str]:
    """``Accelerator(rng_types=...)`` as names, checked now rather than at the first epoch;
    HF's default ``["generator"]`` when ``None``."""
    names = ["generator"] if rng_types is None else [getattr(t, "value", t) for t in rng_types]
    unknown = [name for name in names if name not in RNGType._value2member_map_]
    if unknown:
        raise ValueError(f"rng_types {unknown} unknown; choose from {[t.value for t in RNGType]}")
    return names


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


# Devices whose generators a checkpoint keeps, under HF's key ``torch_<device>_manual_seed``.
_DEVICES = ("cuda", "xpu", "mlu", "sdaa", "musa", "hpu", "neuron")


def capture() -> dict[str, Any]:
    """Every random state, under the keys HF Accelerate's checkpoints use, so HF restores them.

    numpy's state is ``numpy.random.get_state()`` with its key array as a list, which
    ``numpy.random.set_state`` (HF's restore) takes as well; device generators are saved wherever
    the device is available, as HF does.
    """
    states: dict[str, Any] = {
        "random_state": random.getstate(),
        "torch_manual_seed": torch.get_rng_state(),
    }
    numpy = _numpy()
    if numpy is not None:
        kind, keys, pos, has_gauss, cached = numpy.random.get_state()
        states["numpy_random_seed"] = (kind, keys.tolist(), pos, has_gauss, cached)
    for name, backend in _device_backends():
        states[f"torch_{name}_manual_seed"] = backend.get_rng_state_all()
    return states


def restore(states: dict[str, Any]) -> None:
    """Put back what :func:`capture` saved (or HF, or an older accelify); failures raise.

    A device generator is restored where that device is available: a GPU run's states resume
    on a CPU without their device states, as under HF.
    """
    if "random_state" not in states:
        _restore_before_hf_keys(states)
        return
    random.setstate(_as_tuples(states["random_state"]))
    torch.set_rng_state(states["torch_manual_seed"])
    if "numpy_random_seed" in states:
        _needs_numpy().random.set_state(states["numpy_random_seed"])
    for name, backend in _device_backends():
        if f"torch_{name}_manual_seed" in states:
            backend.set_rng_state_all(states[f"torch_{name}_manual_seed"])


def _restore_before_hf_keys(states: dict[str, Any]) -> None:
    """Random states of checkpoints accelify wrote before it used HF's keys."""
    random.setstate(_as_tuples(states["python"]))
    torch.set_rng_state(states["torch"])
    if "numpy" in states:
        kind, keys, pos, has_gauss, cached = states["numpy"]
        _needs_numpy().random.set_state(
            (kind, keys.numpy().astype("uint32"), pos, has_gauss, cached)
        )
    if "cuda" in states:
        torch.cuda.set_rng_state_all(states["cuda"])


def _device_backends() -> list[tuple[str, Any]]:
    found = ((name, getattr(torch, name, None)) for name in _DEVICES)
    return [(name, backend) for name, backend in found if backend and backend.is_available()]


def _needs_numpy() -> Any:
    numpy = _numpy()
    if numpy is None:
        raise RuntimeError("the checkpoint holds a numpy random state but numpy is missing")
    return numpy


def _as_tuples(value: Any) -> Any:
    """``random.setstate`` wants tuples; some loaders hand sequences back as lists."""
    return tuple(_as_tuples(v) for v in value) if isinstance(value, (list, tuple)) else value


def _numpy() -> Any:
    try:
        import numpy
    except ImportError:
        return None
    return numpy
