"""Stand-ins for the optimizer and scheduler a DeepSpeed config declares (HF Accelerate's names).

A script whose DeepSpeed config has an ``optimizer`` (or ``scheduler``) section still calls
``prepare(model, optimizer, loader, scheduler)``; these carry what the script knows (parameters,
learning rate, schedule length) to fill the config's ``"auto"`` values, and ``prepare`` returns
the engine's real optimizer and scheduler in their place. Plain Python: no torch import.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

# HF Accelerate's defaults, used only where the config says "auto" and the script gave nothing.
DEFAULT_LR = 0.001
DEFAULT_WEIGHT_DECAY = 0.0


class DummyOptim:
    """The parameters to train, and the hyperparameters the config may leave ``"auto"``.

    ``lr``/``weight_decay`` left as ``None`` mean "not given": an explicit config value is then
    used as is, never contradicted by a default.
    """

    def __init__(
        self,
        params: Iterable[Any],
        lr: float | None = None,
        weight_decay: float | None = None,
        **kwargs: Any,
    ) -> None:
        self.params = params
        self.lr = lr
        self.weight_decay = weight_decay
        self.kwargs = kwargs


class DummyScheduler:
    """The schedule length and warm-up the config may leave ``"auto"``.

    ``total_num_steps`` counts optimizer steps over the *unprepared* loader, as a single process
    would see them; each of N processes takes 1/N of them (unless ``split_batches``).
    ``lr_scheduler_callable(optimizer)`` builds a scheduler instead of a config-declared one.
    """

    def __init__(
        self,
        optimizer: DummyOptim,
        total_num_steps: int | None = None,
        warmup_num_steps: int | None = None,
        lr_scheduler_callable: Callable[[Any], Any] | None = None,
        **kwargs: Any,
    ) -> None:
        self.optimizer = optimizer
        self.total_num_steps = total_num_steps
        self.warmup_num_steps = warmup_num_steps
        self.lr_scheduler_callable = lr_scheduler_callable
        self.kwargs = kwargs
