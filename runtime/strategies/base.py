"""The interface a distribution backend implements, with the single-device behaviour as default."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from typing import Any

import torch

from ..state import ProcessState


class Strategy:
    """How models are wrapped, synchronised and saved; one subclass per backend."""

    def __init__(self, state: ProcessState, **kwargs: Any) -> None:
        self.state = state

    def wrap_model(self, model: torch.nn.Module) -> torch.nn.Module:
        """Return the module to train (already on ``state.device``)."""
        return model

    def unwrap_model(self, model: torch.nn.Module) -> torch.nn.Module:
        """Strip the backend's wrapper and any ``torch.compile`` wrapper."""
        return getattr(model, "_orig_mod", model)

    def no_sync(self, model: torch.nn.Module) -> contextlib.AbstractContextManager:
        """Skip the gradient all-reduce for the backward passes inside the context."""
        return contextlib.nullcontext()

    def clip_grad_norm_(
        self, parameters: Iterable[torch.Tensor], max_norm: float, norm_type: float
    ) -> torch.Tensor:
        return torch.nn.utils.clip_grad_norm_(parameters, max_norm, norm_type=norm_type)

    def model_state_dict(self, model: torch.nn.Module) -> dict[str, torch.Tensor]:
        """The full (unsharded) weights, as the main process will save them."""
        return self.unwrap_model(model).state_dict()

    def barrier(self) -> None:
        """Wait until every process gets here."""
