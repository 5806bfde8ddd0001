"""``LocalSGD``: train without the per-step gradient all-reduce and average the weights every
few steps instead (HF Accelerate's ``accelerate.local_sgd.LocalSGD``), trading some agreement
between processes for far less communication.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from types import TracebackType
from typing import TYPE_CHECKING

import torch

from . import ops, replicas
from .state import DistributedType

if TYPE_CHECKING:
    from .accelerator import Accelerator

# Where every process holds the whole model, so averaging the weights is meaningful.
_SUPPORTED = (DistributedType.NO, DistributedType.MULTI_CPU, DistributedType.MULTI_GPU)


class LocalSGD:
    """Inside ``with LocalSGD(accelerator, model, k) as local_sgd:`` backward passes skip DDP's
    gradient all-reduce; ``local_sgd.step()`` after each optimizer step averages the parameters
    over processes every ``k`` calls, and leaving the block averages them once more.

    On one process, or with ``enabled=False``, it changes nothing (plain DDP training).
    """

    def __init__(
        self,
        accelerator: Accelerator,
        model: torch.nn.Module,
        local_sgd_steps: int,
        enabled: bool = True,
    ) -> None:
        if accelerator.distributed_type not in _SUPPORTED:
            raise NotImplementedError(
                "LocalSGD is supported only for data parallel training on CPUs and GPUs "
                f"(not {accelerator.distributed_type.value})"
            )
        if local_sgd_steps < 1:
            raise ValueError(f"local_sgd_steps must be at least 1, not {local_sgd_steps}")
        self.enabled = enabled and accelerator.distributed_type != DistributedType.NO
        self.num_steps = 0
        self.accelerator = accelerator
        self.model = model
        self.local_sgd_steps = local_sgd_steps
        self._no_sync: AbstractContextManager | None = None
        self._sync_check = replicas.schedule("off")

    def __enter__(self) -> LocalSGD:
        if self.enabled:
            self._no_sync = self.accelerator.no_sync(self.model)
            self._no_sync.__enter__()
            # Replicas differ between averaging points on purpose: hold the check that they
            # agree (replicas.py) off until the block ends.
            accelerator = self.accelerator
            self._sync_check, accelerator._sync_check = accelerator._sync_check, self._sync_check
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._no_sync is None:
            return
        no_sync, self._no_sync = self._no_sync, None
        accelerator = self.accelerator
        self._sync_check, accelerator._sync_check = accelerator._sync_check, self._sync_check
        if kind is None:  # averaging after a failure would hang if another process died
            self._average()
        no_sync.__exit__(kind, value, traceback)

    def step(self) -> None:
        """Count one optimizer step; every ``local_sgd_steps``-th averages the parameters."""
        self.num_steps += 1
        if self.enabled and self.num_steps % self.local_sgd_steps == 0:
            self._average()

    @torch.no_grad()
    def _average(self) -> None:
        """Replace every parameter by its mean over processes, in place (optimizers and DDP's
        buckets keep pointing at the same tensors)."""
        self.accelerator.wait_for_everyone()
        for param in self.model.parameters():
            param.copy_(ops.reduce(param.detach(), "mean"))
