"""Data parallel over a torch.distributed process group with ``DistributedDataParallel``."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from ..state import ProcessState
from .base import Strategy


class DDP(Strategy):
    """Each process holds the whole model; DDP averages gradients in backward."""

    def __init__(
        self,
        state: ProcessState,
        comm_hook: Callable[[DistributedDataParallel], None] | None = None,
        **ddp_kwargs: Any,
    ) -> None:
        """``comm_hook`` registers a communication hook on each wrapped model (see
        ``handlers.comm_hook``)."""
        super().__init__(state)
        self.comm_hook = comm_hook
        self.ddp_kwargs = ddp_kwargs

    def wrap_model(self, model: torch.nn.Module) -> torch.nn.Module:
        if not any(p.requires_grad for p in model.parameters()):
            return model  # DDP refuses modules without trainable parameters
        device = self.state.device
        ids = [device.index] if device.type == "cuda" else None
        wrapped = DistributedDataParallel(model, device_ids=ids, **self.ddp_kwargs)
        if self.comm_hook is not None:
            self.comm_hook(wrapped)
        return wrapped

    def unwrap_model(self, model: torch.nn.Module) -> torch.nn.Module:
        model = super().unwrap_model(model)
        return model.module if isinstance(model, DistributedDataParallel) else model

    def no_sync(self, model: torch.nn.Module) -> contextlib.AbstractContextManager:
        if isinstance(model, DistributedDataParallel):
            return model.no_sync()
        return contextlib.nullcontext()

    def barrier(self) -> None:
        dist.barrier()
