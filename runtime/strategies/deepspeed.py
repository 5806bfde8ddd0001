"""DeepSpeed ZeRO (stages 0-3, CPU offload): the engine owns backward, step, clipping, precision.

``prepare`` hands the model and optimizer to ``deepspeed.initialize`` together; the training
loop's ``optimizer.step()``/``zero_grad()`` become no-ops because ``accelerator.backward`` steps
the engine when gradients sync, as in HF Accelerate. deepspeed is imported only here, when this
backend is selected.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from torch.optim.lr_scheduler import LRScheduler
from torch.utils.data import DataLoader

from .. import deepspeed_config as dsc
from ..optim import PreparedOptimizer
from ..precision import AutocastForward
from ..state import ProcessState
from .base import Strategy, Training

TAG = "pytorch_model"  # the engine checkpoint's folder inside save_state's, HF's name


class DeepSpeedOptimizer(PreparedOptimizer):
    """The engine's optimizer; stepping and zeroing happen in ``accelerator.backward``."""

    def zero_grad(self, set_to_none: bool | None = None) -> None:
        """The engine zeroes gradients after its step."""

    def step(self, closure: Any = None) -> None:
        self.step_was_skipped = bool(getattr(self.optimizer, "overflow", False))


class DeepSpeed(Strategy):
    """One model per Accelerator, trained by a ``DeepSpeedEngine``."""

    owns_precision = True

    def __init__(self, state: ProcessState, **kwargs: Any) -> None:
        super().__init__(state)
        self.options = dsc.options_from_env(os.environ)
        self.config_file = os.environ.get(dsc.CONFIG_FILE_ENV) or None
        self.engine: Any = None
        self.config: dict[str, Any] = {}

    def setup(self, objects: list[Any], training: Training) -> list[Any]:
        models = [o for o in objects if isinstance(o, torch.nn.Module)]
        if not models:
            return objects
        if len(models) > 1 or self.engine is not None:
            raise ValueError("DeepSpeed trains one model per Accelerator; prepare only one")
        optimizers = [o for o in objects if isinstance(o, torch.optim.Optimizer)]
        if len(optimizers) > 1:
            raise ValueError("DeepSpeed takes one optimizer; prepare it with its model")
        self.config = self._config(objects, training, bool(optimizers))
        os.environ.setdefault("DS_ACCELERATOR", self.state.device.type)
        import deepspeed

        engine, optimizer, _, _ = deepspeed.initialize(
            model=models[0],
            optimizer=optimizers[0] if optimizers else None,
            config=self.config,
            dist_init_required=False,
        )
        self.engine = engine
        self._autocast(engine.module)
        prepared = DeepSpeedOptimizer(optimizer, training.shared, training.precision)
        swap = {id(models[0]): engine, **({id(optimizers[0]): prepared} if optimizers else {})}
        return [swap.get(id(o), o) for o in objects]

    def _config(self, objects: list[Any], training: Training, has_optimizer: bool) -> dict:
        file = dsc.read_file(self.config_file) if self.config_file else None
        where = self.config_file or "the launch options"
        config = dsc.merge_options(file, self.options, where)
        for key, given, kind in (
            ("optimizer", has_optimizer, torch.optim.Optimizer),
            ("scheduler", any(isinstance(o, LRScheduler) for o in objects), LRScheduler),
        ):
            if key in config and given:
                raise ValueError(
                    f"{where} declares a {key} and the script prepares a {kind.__name__}; "
                    f"remove one of them"
                )
        if has_optimizer:
            config["zero_allow_untested_optimizer"] = True  # any torch optimizer, as HF does
        loaders = [o for o in objects if isinstance(o, DataLoader)]
        return dsc.fill_from_script(
            config,
            micro_batch_size=loaders[0].batch_size if loaders else None,
            accumulation_steps=training.gradient_accumulation_steps,
            num_processes=self.state.num_processes,
            mixed_precision=training.mixed_precision,
        )

    def _autocast(self, module: torch.nn.Module) -> None:
        """Run the forward under autocast when the engine holds 16-bit weights.

        The engine casts the weights but not the inputs (float batches would clash with them);
        outputs come back as fp32, as with the Accelerator's own mixed precision.
        """
        enabled = [k for k in ("fp16", "bf16") if dsc.get(self.config, f"{k}.enabled") is True]
        if enabled:
            options = {"dtype": torch.float16 if enabled[0] == "fp16" else torch.bfloat16}
            module.forward = AutocastForward(module.forward, self.state.device.type, options)

    def unwrap_model(self, model: torch.nn.Module) -> torch.nn.Module:
        model = model.module if model is self.engine else model
        return super().unwrap_model(model)

    def backward(self, loss: torch.Tensor, training: Training, **kwargs: Any) -> None:
        """The engine scales by the accumulation steps itself and steps at the sync boundary."""
        sync = training.shared.sync_gradients
        self.engine.set_gradient_accumulation_boundary(is_boundary=sync)
        self.engine.backward(loss, **kwargs)
        if sync:
            self.engine.step()

    def clip_grad_norm_(
        self, parameters: Iterable[torch.Tensor], max_norm: float, norm_type: float
    ) -> None:
        configured = self.config.get("gradient_clipping", 0.0)
        if configured != max_norm:
            warnings.warn(
                f"DeepSpeed clips inside its step with gradient_clipping={configured} from its "
                f"config, not {max_norm}; set --gradient-clipping {max_norm} (or "
                "gradient_clipping in the config) to clip as the script asks",
                stacklevel=3,
            )

    def model_state_dict(self, model: torch.nn.Module) -> dict[str, torch.Tensor]:
        """Full weights; under ZeRO-3 every process gathers, the main process gets them."""
        if self.engine is not None and self.engine.zero_optimization_partition_weights():
            return self.engine._zero3_consolidated_16bit_state_dict()
        return super().model_state_dict(model)

    def save_checkpoint(self, folder: Path, models: list[Any], optimizers: list[Any]) -> bool:
        if self.engine is None:
            return False
        self.engine.save_checkpoint(str(folder), tag=TAG)
        return True

    def load_checkpoint(self, folder: Path, models: list[Any], optimizers: list[Any]) -> bool:
        if self.engine is None:
            return False
        path, _ = self.engine.load_checkpoint(str(folder), tag=TAG)
        if path is None:
            raise FileNotFoundError(f"{folder / TAG}: no DeepSpeed checkpoint in this folder")
        return True

    def barrier(self) -> None:
        torch.distributed.barrier()
