"""One module per distribution backend; adding one is adding a class and a line below."""

from __future__ import annotations

from typing import Any

from ..state import DistributedType, ProcessState
from .base import Strategy, Training
from .ddp import DDP
from .deepspeed import DeepSpeed
from .fsdp import FSDP
from .single import SingleDevice

STRATEGIES: dict[DistributedType, type[Strategy]] = {
    DistributedType.NO: SingleDevice,
    DistributedType.MULTI_CPU: DDP,
    DistributedType.MULTI_GPU: DDP,
    DistributedType.DEEPSPEED: DeepSpeed,
    DistributedType.FSDP: FSDP,
}


def select(state: ProcessState, **kwargs: Any) -> Strategy:
    """The strategy for this process's distributed type."""
    return STRATEGIES[state.distributed_type](state, **kwargs)


__all__ = [
    "DDP",
    "FSDP",
    "STRATEGIES",
    "DeepSpeed",
    "SingleDevice",
    "Strategy",
    "Training",
    "select",
]
