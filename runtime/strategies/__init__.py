"""One module per distribution backend; adding one is adding a class and a line below.

Backends are imported when selected: FSDP's and DeepSpeed's modules pull in half a second of
torch.distributed (and deepspeed itself), which a DDP run never needs.
"""

from __future__ import annotations

import importlib
from typing import Any

from ..state import DistributedType, ProcessState
from .base import Strategy, Training

# distributed type -> (module in this package, class)
STRATEGIES: dict[DistributedType, tuple[str, str]] = {
    DistributedType.NO: ("single", "SingleDevice"),
    DistributedType.MULTI_CPU: ("ddp", "DDP"),
    DistributedType.MULTI_GPU: ("ddp", "DDP"),
    DistributedType.DEEPSPEED: ("deepspeed", "DeepSpeed"),
    DistributedType.FSDP: ("fsdp", "FSDP"),
}
# A model tensor-parallelised by the script over every process (a ParallelismConfig's tp_size).
TENSOR_PARALLEL = ("tensor_parallel", "TensorParallel")


def select(state: ProcessState, tensor_parallel: bool = False, **kwargs: Any) -> Strategy:
    """The strategy for this process's distributed type, or for tensor parallelism alone."""
    module, name = TENSOR_PARALLEL if tensor_parallel else STRATEGIES[state.distributed_type]
    strategy = getattr(importlib.import_module(f".{module}", __name__), name)
    return strategy(state, **kwargs)


__all__ = ["STRATEGIES", "TENSOR_PARALLEL", "Strategy", "Training", "select"]
