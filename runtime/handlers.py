"""``kwargs_handlers``: the small dataclasses that pass options through to DDP, GradScaler,
autocast and ``init_process_group``, with HF Accelerate's names and defaults.

Handlers are recognised by class name, so HF Accelerate's own handler objects work too.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from datetime import timedelta
from enum import Enum
from typing import Any


@dataclasses.dataclass
class KwargsHandler:
    def to_kwargs(self) -> dict[str, Any]:
        """The fields that differ from their defaults (what HF Accelerate passes on)."""
        defaults = type(self)()
        return {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if getattr(self, f.name) != getattr(defaults, f.name)
        }


class DDPCommunicationHookType(str, Enum):
    """Which of torch's DDP communication hooks compresses or approximates the gradients
    (``torch.distributed.algorithms.ddp_comm_hooks``); ``NO`` keeps the plain all-reduce."""

    NO = "no"
    FP16 = "fp16"
    BF16 = "bf16"
    POWER_SGD = "power_sgd"
    BATCHED_POWER_SGD = "batched_power_sgd"


# The fields that choose a communication hook instead of going to DDP's constructor.
_HOOK_FIELDS = ("comm_hook", "comm_wrapper", "comm_state_option")


@dataclasses.dataclass
class DistributedDataParallelKwargs(KwargsHandler):
    """DDP's constructor options, plus ``comm_hook`` (with ``comm_wrapper`` compressing what it
    sends, ``comm_state_option`` the ``PowerSGDState`` options) registered once DDP wraps the
    model, as in HF Accelerate."""

    dim: int = 0
    broadcast_buffers: bool = True
    bucket_cap_mb: int = 25
    find_unused_parameters: bool = False
    check_reduction: bool = False
    gradient_as_bucket_view: bool = False
    static_graph: bool = False
    comm_hook: DDPCommunicationHookType = DDPCommunicationHookType.NO
    comm_wrapper: DDPCommunicationHookType = DDPCommunicationHookType.NO
    comm_state_option: dict = dataclasses.field(default_factory=dict)

    def to_kwargs(self) -> dict[str, Any]:
        """The options for DDP's constructor only (HF leaves the hook fields out as well)."""
        return {k: v for k, v in super().to_kwargs().items() if k not in _HOOK_FIELDS}


@dataclasses.dataclass
class GradScalerKwargs(KwargsHandler):
    init_scale: float = 65536.0
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000
    enabled: bool = True


@dataclasses.dataclass
class AutocastKwargs(KwargsHandler):
    enabled: bool = True
    cache_enabled: bool | None = None


@dataclasses.dataclass
class InitProcessGroupKwargs(KwargsHandler):
    """Only what differs from the defaults reaches ``init_process_group`` (as in HF), so the
    default ``backend`` leaves the choice to the runtime (gloo on CPU, nccl on CUDA)."""

    backend: str | None = "nccl"
    init_method: str | None = None
    timeout: timedelta | None = None


@dataclasses.dataclass
class ProfileKwargs(KwargsHandler):
    """``torch.profiler.profile`` options for ``Accelerator.profile`` (see ``profiling.py``);
    ``activities`` are names (``"cpu"``, ``"cuda"``, ...), ``schedule_option`` the keyword
    arguments of ``torch.profiler.schedule``."""

    activities: list[str] | None = None
    schedule_option: dict[str, int] | None = None
    on_trace_ready: Callable | None = None
    record_shapes: bool = False
    profile_memory: bool = False
    with_stack: bool = False
    with_flops: bool = False
    with_modules: bool = False
    output_trace_dir: str | None = None


_KINDS = {
    "DistributedDataParallelKwargs": ("ddp", DistributedDataParallelKwargs),
    "GradScalerKwargs": ("scaler", GradScalerKwargs),
    "AutocastKwargs": ("autocast", AutocastKwargs),
    "InitProcessGroupKwargs": ("init", InitProcessGroupKwargs),
    "ProfileKwargs": ("profile", ProfileKwargs),
}


def collect(handlers: Iterable[Any] | None) -> dict[str, dict[str, Any]]:
    """``{"ddp": ..., "scaler": ..., "autocast": ..., "init": ..., "profile": ...}`` keyword
    arguments."""
    found: dict[str, dict[str, Any]] = {kind: {} for kind, _ in _KINDS.values()}
    seen: set[str] = set()
    for handler in handlers or ():
        name = type(handler).__name__
        if name not in _KINDS or not callable(getattr(handler, "to_kwargs", None)):
            raise ValueError(f"unsupported kwargs handler {name}; use one of {sorted(_KINDS)}")
        if name in seen:
            raise ValueError(f"more than one {name} in kwargs_handlers")
        seen.add(name)
        kind, ours = _KINDS[name]
        options = handler.to_kwargs()
        unknown = set(options) - {f.name for f in dataclasses.fields(ours)}
        if unknown:
            raise ValueError(f"{name} options not supported here: {sorted(unknown)}")
        found[kind] = options
    return found


_COMPRESSIONS = (DDPCommunicationHookType.FP16, DDPCommunicationHookType.BF16)


def comm_hook(handler: Any) -> Callable[[Any], None] | None:
    """What registers the hook a ``DistributedDataParallelKwargs`` (ours or HF's) asks for on a
    ``DistributedDataParallel`` model, or ``None`` for DDP's plain all-reduce.

    Checked when the ``Accelerator`` is created, so an unknown name fails at once (HF ignores
    it, leaving a typo to train without the hook); each model gets its own PowerSGD state.
    """
    if handler is None:
        return None
    kind, wrapper = (
        # HF's enum is no str: compare by value
        DDPCommunicationHookType(getattr(choice, "value", choice))
        for choice in (getattr(handler, "comm_hook", "no"), getattr(handler, "comm_wrapper", "no"))
    )
    if wrapper not in {DDPCommunicationHookType.NO, *_COMPRESSIONS}:
        raise ValueError(f"comm_wrapper must be 'no', 'fp16' or 'bf16', not {wrapper.value!r}")
    if kind is DDPCommunicationHookType.NO:
        return None
    options = dict(getattr(handler, "comm_state_option", None) or {})

    def register(model: Any) -> None:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

        hook = {
            DDPCommunicationHookType.FP16: default_hooks.fp16_compress_hook,
            DDPCommunicationHookType.BF16: default_hooks.bf16_compress_hook,
            DDPCommunicationHookType.POWER_SGD: powerSGD_hook.powerSGD_hook,
            DDPCommunicationHookType.BATCHED_POWER_SGD: powerSGD_hook.batched_powerSGD_hook,
        }[kind]
        if wrapper is DDPCommunicationHookType.FP16:
            hook = default_hooks.fp16_compress_wrapper(hook)
        elif wrapper is DDPCommunicationHookType.BF16:
            hook = default_hooks.bf16_compress_wrapper(hook)
        # The compression hooks take the process group as state; None is the default group.
        state = None if kind in _COMPRESSIONS else powerSGD_hook.PowerSGDState(None, **options)
        model.register_comm_hook(state=state, hook=hook)

    return register


def given(handlers: Iterable[Any] | None) -> dict[str, Any]:
    """The handler object of each kind, ``None`` where none was given (HF's ``ddp_handler``,
    ``scaler_handler``, ... attributes); call after :func:`collect` has checked them."""
    found: dict[str, Any] = {kind: None for kind, _ in _KINDS.values()}
    for handler in handlers or ():
        found[_KINDS[type(handler).__name__][0]] = handler
    return found
