"""Prepared optimizers and schedulers: they step only when gradients were synchronised.

With gradient accumulation the training loop still calls ``optimizer.step()`` every batch; on the
accumulating batches that call (and ``zero_grad``) does nothing. Schedulers follow HF Accelerate's
``AcceleratedScheduler`` exactly, because that is what makes schedule lengths come out right:
they step only after a real optimizer step, and ``num_processes`` times per step unless
``split_batches`` (each step consumed ``num_processes`` loader batches).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from .precision import Precision
from .state import StepState


class PreparedOptimizer(torch.optim.Optimizer):
    """Wraps an optimizer; an ``Optimizer`` itself so schedulers can be built on it."""

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        shared: StepState,
        precision: Precision,
        on_step: Callable[[], None] | None = None,
    ):
        # Optimizer.__init__ is deliberately not called: all state lives in the wrapped optimizer.
        self.optimizer = optimizer
        self.step_was_skipped = False
        self._shared, self._precision = shared, precision
        self._on_step = on_step  # after each real step (the Accelerator's replica check)

    @property
    def state(self) -> Any:  # type: ignore[override]
        return self.optimizer.state

    @property
    def param_groups(self) -> list[dict[str, Any]]:  # type: ignore[override]
        return self.optimizer.param_groups

    @param_groups.setter
    def param_groups(self, groups: list[dict[str, Any]]) -> None:
        self.optimizer.param_groups = groups

    @property
    def defaults(self) -> dict[str, Any]:  # type: ignore[override]
        return self.optimizer.defaults

    def wraps(self, optimizer: Any) -> bool:
        """Whether ``optimizer`` is this one or sits under it (ZeRO wraps the user's)."""
        inner = getattr(self.optimizer, "optimizer", None)
        return any(optimizer is candidate for candidate in (self, self.optimizer, inner))

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        self.optimizer.add_param_group(param_group)

    def state_dict(self) -> dict[str, Any]:
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state_dict)

    def zero_grad(self, set_to_none: bool | None = None) -> None:
        if self._shared.sync_gradients:
            if set_to_none is None:
                self.optimizer.zero_grad()
            else:
                self.optimizer.zero_grad(set_to_none=set_to_none)

    def step(self, closure: Callable | None = None) -> None:  # type: ignore[override]
        if self._shared.sync_gradients:
            self.step_was_skipped = not self._precision.step(self.optimizer, closure)
            if self._on_step is not None:
                self._on_step()

    def train(self) -> None:
        """For optimizers with train/eval modes (schedule-free ones)."""
        if hasattr(self.optimizer, "train"):
            self.optimizer.train()

    def eval(self) -> None:
        if hasattr(self.optimizer, "eval"):
            self.optimizer.eval()


class PreparedScheduler:
    """Wraps a learning-rate scheduler; unknown attributes read through to it."""

    def __init__(
        self,
        scheduler: Any,
        optimizers: Sequence[PreparedOptimizer],
        shared: StepState,
        *,
        num_processes: int,
        step_with_optimizer: bool = True,
        split_batches: bool = False,
    ) -> None:
        self.scheduler = scheduler
        self.optimizers = list(optimizers)
        self.step_with_optimizer = step_with_optimizer
        self.split_batches = split_batches
        self._shared = shared
        self._repeats = 1 if split_batches else num_processes
        self._total_steps = getattr(scheduler, "total_steps", None)  # OneCycleLR must not overrun

    def step(self, *args: Any, **kwargs: Any) -> None:
        scheduler = self.scheduler
        if not self.step_with_optimizer:
            scheduler.step(*args, **kwargs)
            return
        if not self._shared.sync_gradients:
            # Between accumulation steps nothing moves, ``_step_count`` included: HF Accelerate
            # counts them only with ``adjust_scheduler``, which a plain
            # ``Accelerator(gradient_accumulation_steps=N)`` leaves off, and OneCycleLR's
            # ``total_steps`` guard below reads it.
            return
        for optimizer in self.optimizers:
            if optimizer.step_was_skipped:
                return
        total = self._total_steps
        for _ in range(self._repeats):
            if total is None or scheduler._step_count <= total:
                scheduler.step(*args, **kwargs)

    def get_last_lr(self) -> list[float]:
        return self.scheduler.get_last_lr()

    def get_lr(self) -> list[float]:
        return self.scheduler.get_lr()

    def state_dict(self) -> dict[str, Any]:
        return self.scheduler.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.scheduler.load_state_dict(state_dict)

    def __getattr__(self, name: str) -> Any:
        if name == "scheduler":  # not set yet (e.g. during unpickling)
            raise AttributeError(name)
        return getattr(self.scheduler, name)
