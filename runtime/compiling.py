"""``Accelerator(dynamo_backend=...)``: ``torch.compile`` the prepared model, as HF Accelerate's
``prepare_model`` does last, for any backend other than ``"no"``.

Unset arguments are read from the ``ACCELERATE_DYNAMO_*`` variables that ``accel-run`` and
``accelerate launch`` set. Unlike HF, which passes only what differs from those variables' values
(so ``ACCELERATE_DYNAMO_BACKEND=eager`` compiles with inductor there), the configured backend and
mode always reach ``torch.compile``.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from .config import env_flag

_PREFIX = "ACCELERATE_DYNAMO_"


def options(dynamo_backend: Any = None, dynamo_plugin: Any = None) -> dict[str, Any] | None:
    """``torch.compile`` keyword arguments, or ``None`` for backend ``"no"`` (no compiling).

    ``dynamo_backend`` is a name or HF's ``DynamoBackend``; ``dynamo_plugin`` HF's
    ``TorchDynamoPlugin`` (only one of the two, as in HF).
    """
    if dynamo_plugin is not None and dynamo_backend is not None:
        raise ValueError(
            "You cannot pass in both `dynamo_plugin` and `dynamo_backend`, please only pass in one."
        )
    plugin = dynamo_plugin
    backend = getattr(plugin, "backend", dynamo_backend)
    if backend is None:
        backend = os.environ.get(_PREFIX + "BACKEND", "no")
    backend = str(getattr(backend, "value", backend)).lower()
    if backend == "no":
        return None
    known = torch.compiler.list_backends(exclude_tags=())
    if backend not in known:
        raise ValueError(f"dynamo_backend {backend!r} is not a torch.compile backend here: {known}")
    regional = getattr(plugin, "use_regional_compilation", None)
    if regional or (regional is None and env_flag(_PREFIX + "USE_REGIONAL_COMPILATION")):
        raise ValueError("use_regional_compilation is not supported by accelify; compile whole")
    chosen = {"backend": backend, "mode": getattr(plugin, "mode", None)}
    chosen["mode"] = chosen["mode"] or os.environ.get(_PREFIX + "MODE", "default")
    fullgraph = getattr(plugin, "fullgraph", None)
    chosen["fullgraph"] = env_flag(_PREFIX + "USE_FULLGRAPH") if fullgraph is None else fullgraph
    dynamic = getattr(plugin, "dynamic", None)
    if dynamic is None and os.environ.get(_PREFIX + "USE_DYNAMIC"):
        dynamic = env_flag(_PREFIX + "USE_DYNAMIC")
    chosen["dynamic"] = dynamic
    for name in ("options", "disable"):
        if getattr(plugin, name, None):
            chosen[name] = getattr(plugin, name)
    return chosen


def is_compiled(model: torch.nn.Module) -> bool:
    return isinstance(model, torch._dynamo.eval_frame.OptimizedModule)


def compile_model(model: torch.nn.Module, chosen: dict[str, Any] | None) -> torch.nn.Module:
    """``model`` compiled with ``chosen`` options, unless there are none or it already is."""
    if chosen is None or is_compiled(model):
        return model
    return torch.compile(model, **chosen)
