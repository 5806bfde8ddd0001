"""HF Accelerate's ``init_empty_weights`` and ``init_on_device``: build a model without
allocating its weights (on the ``meta`` device), or straight on the device it will run on.

As in HF, only parameters go to the device unless ``include_buffers`` (default: the
``ACCELERATE_INIT_INCLUDE_BUFFERS`` variable, else false), which puts every tensor created
inside the block there.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from .config import env_flag


@contextlib.contextmanager
def init_empty_weights(include_buffers: bool | None = None) -> Iterator[None]:
    """Modules built inside get their parameters on the ``meta`` device: no memory is used,
    so a model too large for RAM can be built to load its checkpoint into."""
    with init_on_device(torch.device("meta"), include_buffers=include_buffers):
        yield


@contextlib.contextmanager
def init_on_device(
    device: torch.device | str, include_buffers: bool | None = None
) -> Iterator[None]:
    """Modules built inside get their parameters on ``device`` (buffers too with
    ``include_buffers``)."""
    device = torch.device(device)
    if include_buffers is None:
        include_buffers = env_flag("ACCELERATE_INIT_INCLUDE_BUFFERS")
    if include_buffers:
        with device:  # every tensor created: parameters, buffers and the rest
            yield
        return
    register = torch.nn.Module.register_parameter

    def register_on_device(
        module: torch.nn.Module, name: str, param: torch.nn.Parameter | None
    ) -> None:
        register(module, name, param)
        if param is not None:
            module._parameters[name] = _moved(module._parameters[name], device)

    torch.nn.Module.register_parameter = register_on_device  # type: ignore[method-assign]
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = register  # type: ignore[method-assign]


def _moved(param: torch.nn.Parameter, device: torch.device) -> torch.nn.Parameter:
    """``param`` on ``device``, of its own class and with its attributes.

    A parameter subclass (bitsandbytes' ``Params4bit``) is rebuilt with its attributes as
    constructor arguments, as HF does; ``_is_hf_initialized`` (transformers' mark) is no
    constructor argument, so it is set afterwards.
    """
    attributes = dict(param.__dict__)
    mark = attributes.pop("_is_hf_initialized", None)
    moved = type(param)(param.to(device), **{**attributes, "requires_grad": param.requires_grad})
    if mark is not None:
        moved._is_hf_initialized = mark
    return moved
