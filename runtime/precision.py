"""Mixed precision as plugins: autocast for the forward pass, a GradScaler for fp16 steps.

The prepared model's ``forward`` runs under autocast and hands back fp32 outputs (HF Accelerate
does the same, so losses match); fp16 scales the loss, unscales before clipping and reports a
step the scaler skipped because of inf/nan gradients.
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Callable
from typing import Any

import torch

from . import ops


class Precision:
    """Full precision: every hook is the plain PyTorch call."""

    name = "no"
    dtype: torch.dtype | None = None

    def __init__(
        self,
        device: torch.device,
        autocast_kwargs: dict[str, Any] | None = None,
        scaler_kwargs: dict[str, Any] | None = None,
    ) -> None:
        self.device_type = device.type
        self.autocast_kwargs = {"dtype": self.dtype, **(autocast_kwargs or {})}

    def autocast(self, **kwargs: Any) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def wrap_forward(self, model: torch.nn.Module) -> None:
        """Make ``model.forward`` run under :meth:`autocast` (a no-op in full precision)."""

    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        loss.backward(**kwargs)

    def unscale(self, optimizer: torch.optim.Optimizer) -> None:
        """Bring gradients back to their true scale before clipping them."""

    def step(self, optimizer: torch.optim.Optimizer, closure: Callable | None) -> bool:
        """Step ``optimizer``; return whether it really stepped."""
        if closure is None:
            optimizer.step()
        else:
            optimizer.step(closure)
        return True

    def state_dict(self) -> dict[str, Any] | None:
        return None

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Nothing to restore without a scaler."""


class Autocast(Precision):
    """bf16: autocast only; the forward's low-precision outputs come back as fp32."""

    name = "bf16"
    dtype = torch.bfloat16

    def autocast(self, **kwargs: Any) -> contextlib.AbstractContextManager:
        return torch.autocast(self.device_type, **{**self.autocast_kwargs, **kwargs})

    def wrap_forward(self, model: torch.nn.Module) -> None:
        forward = AutocastForward(model.forward, self.device_type, self.autocast_kwargs)
        model.forward = forward  # type: ignore[method-assign]


class AutocastForward:
    """A module's ``forward`` run under autocast, returning fp32 outputs.

    An object rather than a closure, holding the unbound function and its module, so that
    ``copy.deepcopy`` of the module yields a copy whose forward runs the copy (a closure would
    keep calling the original module).
    """

    def __init__(self, forward: Callable, device_type: str, options: dict[str, Any]) -> None:
        bound = isinstance(forward, types.MethodType)
        self.function = forward.__func__ if bound else forward  # type: ignore[union-attr]
        self.owner = forward.__self__ if bound else None  # type: ignore[union-attr]
        self.device_type, self.options = device_type, options

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with torch.autocast(self.device_type, **self.options):
            if self.owner is None:
                outputs = self.function(*args, **kwargs)
            else:
                outputs = self.function(self.owner, *args, **kwargs)
        return ops.apply(_to_fp32, outputs)


def unwrap_forward(model: torch.nn.Module) -> None:
    """Undo :meth:`Autocast.wrap_forward` (for ``unwrap_model(keep_fp32_wrapper=False)``)."""
    wrapper = vars(model).get("forward")
    if not isinstance(wrapper, AutocastForward):
        return
    del model.forward
    if wrapper.owner is None:
        model.forward = wrapper.function  # type: ignore[method-assign]
    elif wrapper.function is not type(model).forward:
        model.forward = types.MethodType(wrapper.function, model)  # type: ignore[method-assign]


class GradScaling(Autocast):
    """fp16: autocast plus a ``torch.amp.GradScaler``."""

    name = "fp16"
    dtype = torch.float16

    def __init__(
        self,
        device: torch.device,
        autocast_kwargs: dict[str, Any] | None = None,
        scaler_kwargs: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(device, autocast_kwargs)
        self.scaler = torch.amp.GradScaler(device.type, **(scaler_kwargs or {}))
        self._stepped = False
        self._original_step: Callable = lambda: None

    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        self.scaler.scale(loss).backward(**kwargs)

    def unscale(self, optimizer: torch.optim.Optimizer) -> None:
        self.scaler.unscale_(optimizer)

    def step(self, optimizer: torch.optim.Optimizer, closure: Callable | None) -> bool:
        if closure is not None:
            raise ValueError("optimizer closures are not supported with fp16 mixed precision")
        # The scaler calls optimizer.step only for finite gradients: watch it do so, through a
        # stand-in put back right after, so schedulers' own step wrappers stay intact.
        own_attribute = "step" in vars(optimizer)
        self._original_step, self._stepped = optimizer.step, False
        optimizer.step = self._counting_step  # type: ignore[method-assign]
        try:
            self.scaler.step(optimizer)
        finally:
            if own_attribute:
                optimizer.step = self._original_step  # type: ignore[method-assign]
            else:
                del optimizer.step
        self.scaler.update()
        return self._stepped

    def _counting_step(self, *args: Any, **kwargs: Any) -> Any:
        self._stepped = True
        return self._original_step(*args, **kwargs)

    def state_dict(self) -> dict[str, Any]:
        return self.scaler.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.scaler.load_state_dict(state)


def _to_fp32(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.float() if tensor.dtype in (torch.float16, torch.bfloat16) else tensor


_PLUGINS = {plugin.name: plugin for plugin in (Precision, Autocast, GradScaling)}


def select(mixed_precision: str, device: torch.device, **options: Any) -> Precision:
    """The plugin for ``"no"``, ``"bf16"`` or ``"fp16"`` (``options``: handler kwargs)."""
    return _PLUGINS[mixed_precision](device, **options)
