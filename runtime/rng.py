"""Seeding and the per-process random states a checkpoint saves and restores.

States are stored as tensors and plain Python values only, so a checkpoint loads with
``torch.load(weights_only=True)``; numpy is optional and only touched when it is installed.
"""

from __future__ import annotations

import random
from typing import Any

import torch

from .state import current


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
