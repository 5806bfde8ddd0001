"""The interface a distribution backend implements, with the single-device behaviour as default."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..precision import Precision
from ..state import ProcessState, StepState


@dataclass
class Training:
    """What a backend that builds its own engine needs to know about the training loop."""

    gradient_accumulation_steps: int
    mixed_precision: str
    shared: StepState
    precision: Precision
    split_batches: bool = False


class Strategy:
    """How models are wrapped, synchronised and saved; one subclass per backend."""

    # Whether the backend casts and scales itself, so the Accelerator must not (DeepSpeed).
    owns_precision = False
    # Whether the backend puts the model's parameters where they belong, so prepare() must not
    # move it (FSDP: fully_shard moves them to the mesh's device, or keeps them on the CPU when
    # it offloads them, and a later .to() would undo that).
    places_models = False

    def __init__(self, state: ProcessState, **kwargs: Any) -> None:
        self.state = state

    def setup(self, objects: list[Any], training: Training) -> list[Any]:
        """Prepare objects that the backend must see together (a model with its optimizer).

        Runs first in ``prepare``; what it returns goes through the usual per-object preparation.
        """
        return objects

    def wrap_model(self, model: torch.nn.Module) -> torch.nn.Module:
        """Return the module to train (already on ``state.device``)."""
        return model

    def unwrap_model(self, model: torch.nn.Module) -> torch.nn.Module:
        """Strip the backend's wrapper and any ``torch.compile`` wrapper."""
        return getattr(model, "_orig_mod", model)

    def no_sync(self, model: torch.nn.Module) -> contextlib.AbstractContextManager:
        """Skip the gradient all-reduce for the backward passes inside the context."""
        return contextlib.nullcontext()

    def backward(self, loss: torch.Tensor, training: Training, **kwargs: Any) -> None:
        """``loss.backward()`` with accumulation scaling (1/N) and the precision's loss scaling."""
        if training.gradient_accumulation_steps > 1:
            loss = loss / training.gradient_accumulation_steps
        training.precision.backward(loss, **kwargs)

    def clip_grad_norm_(
        self, parameters: Iterable[torch.Tensor], max_norm: float, norm_type: float
    ) -> torch.Tensor | None:
        return torch.nn.utils.clip_grad_norm_(parameters, max_norm, norm_type=norm_type)

    def model_state_dict(self, model: torch.nn.Module) -> dict[str, torch.Tensor]:
        """The full (unsharded) weights, as the main process will save them."""
        return self.unwrap_model(model).state_dict()

    def save_checkpoint(self, folder: Path, models: list[Any], optimizers: list[Any]) -> bool:
        """Write models and optimizers in the backend's own format, from every process.

        ``False`` (the default) leaves them to the common format: weights and optimizer state
        written by the main process.
        """
        return False

    def load_checkpoint(self, folder: Path, models: list[Any], optimizers: list[Any]) -> bool:
        """Read what :meth:`save_checkpoint` wrote; ``False`` for the common format."""
        return False

    def barrier(self) -> None:
        """Wait until every process gets here."""
