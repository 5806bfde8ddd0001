"""``register_save_state_pre_hook``/``register_load_state_pre_hook``: user code run inside
``save_state``/``load_state``, as HF Accelerate calls it.

A save hook gets ``(models, weights, output_dir)`` before the weights are written, a load hook
``(models, input_dir)`` before they are read. Both may remove entries from these lists to save or
load those models themselves (diffusers' training scripts do), so the lists the hooks get are the
ones the checkpoint code then uses.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.hooks import RemovableHandle


class StateHooks:
    """The registered save and load pre-hooks, called in registration order."""

    def __init__(self) -> None:
        # OrderedDict, not dict: RemovableHandle keeps a weak reference to it.
        self.save: OrderedDict[int, Callable[..., None]] = OrderedDict()
        self.load: OrderedDict[int, Callable[..., None]] = OrderedDict()

    def register_save(self, hook: Callable[..., None]) -> RemovableHandle:
        handle = RemovableHandle(self.save)
        self.save[handle.id] = hook
        return handle

    def register_load(self, hook: Callable[..., None]) -> RemovableHandle:
        handle = RemovableHandle(self.load)
        self.load[handle.id] = hook
        return handle

    def before_save(
        self, models: list[torch.nn.Module], weights: list[dict[str, Any]], output_dir: str
    ) -> None:
        for hook in list(self.save.values()):
            hook(models, weights, output_dir)

    def before_load(self, models: list[torch.nn.Module], input_dir: str) -> None:
        for hook in list(self.load.values()):
            hook(models, input_dir)
