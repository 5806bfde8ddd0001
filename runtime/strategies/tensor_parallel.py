"""Tensor parallelism over every process (``ParallelismConfig(tp_size=N)`` on N processes).

As in HF Accelerate the script splits the model before ``prepare`` (transformers' ``tp_plan``, or
torch's ``parallelize_module`` on ``accelerator.torch_device_mesh["tp"]``), so its parameters are
DTensors already and there is nothing to wrap; with no data parallelism no gradient is averaged,
and, as in HF, ``prepare`` moves no DTensor model. What the FSDP2 strategy does with a DTensor
model applies as it is: one gradient norm over every mesh, the full weights gathered for
``save_model``, checkpoints through ``torch.distributed.checkpoint``.
"""

from __future__ import annotations

import warnings

import torch
from torch.distributed.tensor import DTensor

from .fsdp import FSDP


class TensorParallel(FSDP):
    """A model the script parallelised; ``prepare`` only keeps it."""

    def wrap_model(self, model: torch.nn.Module) -> torch.nn.Module:
        if not any(isinstance(p, DTensor) for p in model.parameters()):
            warnings.warn(
                f"{type(model).__name__} has no DTensor parameters, so tensor parallelism splits "
                "nothing: every process trains a whole copy on the same batches. Parallelise it "
                "before prepare (transformers' tp_plan, or torch's parallelize_module on "
                "accelerator.torch_device_mesh['tp'])",
                stacklevel=4,
            )
        if all(model is not seen for seen in self._models):
            self._models.append(model)
        return model
