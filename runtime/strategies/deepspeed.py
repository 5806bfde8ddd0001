"""DeepSpeed ZeRO (stages 0-3, CPU offload): the engine owns backward, step, clipping, precision.

``prepare`` hands the model and optimizer to ``deepspeed.initialize`` together; the training
loop's ``optimizer.step()``/``zero_grad()`` become no-ops because ``accelerator.backward`` steps
the engine when gradients sync, as in HF Accelerate. deepspeed is imported only here, when this
backend is selected.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.optim.lr_scheduler import LRScheduler
from torch.utils.data import DataLoader

from .. import deepspeed_config as dsc
from ..deepspeed_placeholders import DummyOptim, DummyScheduler
from ..optim import PreparedOptimizer, PreparedScheduler
from ..precision import AutocastForward
from ..state import ProcessState
from .base import Strategy, Training

TAG = "pytorch_model"  # the engine checkpoint's folder inside save_state's, HF's name


@dataclass(frozen=True)
class DeepSpeedSettings:
    """What a run asks of DeepSpeed: launch options and the config they go into.

    ``config`` is a JSON file's path, a dict (``DeepSpeedPlugin(hf_ds_config=...)``) or ``None``
    to build one from the options alone; ``where`` names it in error messages.
    """

    options: Mapping[str, Any] = field(default_factory=dict)
    config: str | Mapping[str, Any] | None = None
    where: str = "the launch options"

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> DeepSpeedSettings:
        """What the launcher's ``ACCELERATE_DEEPSPEED_*`` variables ask for (HF's contract)."""
        path = environ.get(dsc.CONFIG_FILE_ENV) or None
        return cls(dsc.options_from_env(environ), path, path or "the launch options")

    def merged(self) -> dict[str, Any]:
        """The config with the options in it, its ``"auto"`` values still to fill."""
        config = dsc.read_file(self.config) if isinstance(self.config, str) else self.config
        return dsc.merge_options(config, self.options, self.where)


class DeepSpeedOptimizer(PreparedOptimizer):
    """The engine's optimizer; stepping and zeroing happen in ``accelerator.backward``."""

    def __init__(self, optimizer: Any, training: Training, replaces: Any) -> None:
        super().__init__(optimizer, training.shared, training.precision)
        self.replaces = replaces  # what the script prepared: its schedulers point at it

    def wraps(self, optimizer: Any) -> bool:
        return super().wraps(optimizer) or optimizer is self.replaces

    def zero_grad(self, set_to_none: bool | None = None) -> None:
        """The engine zeroes gradients after its step."""

    def step(self, closure: Any = None) -> None:
        self.step_was_skipped = bool(getattr(self.optimizer, "overflow", False))


class EngineScheduler(PreparedScheduler):
    """A scheduler the engine owns (config-declared or built by ``lr_scheduler_callable``)."""

    def step(self, *args: Any, **kwargs: Any) -> None:
        """The engine steps it after each optimizer step."""


class DeepSpeed(Strategy):
    """One model per Accelerator, trained by a ``DeepSpeedEngine``."""

    owns_precision = True

    def __init__(
        self, state: ProcessState, settings: DeepSpeedSettings | None = None, **kwargs: Any
    ) -> None:
        """``settings`` from a ``DeepSpeedPlugin``, else the launcher's variables."""
        super().__init__(state)
        self.settings = DeepSpeedSettings.from_env(os.environ) if settings is None else settings
        self.engine: Any = None
        self.config: dict[str, Any] = {}

    def setup(self, objects: list[Any], training: Training) -> list[Any]:
        models = [o for o in objects if isinstance(o, torch.nn.Module)]
        optimizers = [o for o in objects if isinstance(o, torch.optim.Optimizer | DummyOptim)]
        schedulers = [o for o in objects if isinstance(o, LRScheduler | DummyScheduler)]
        if not models:
            if any(isinstance(o, DummyOptim | DummyScheduler) for o in objects):
                raise ValueError("prepare DummyOptim and DummyScheduler with their model")
            return objects
        if len(models) > 1 or self.engine is not None:
            raise ValueError("DeepSpeed trains one model per Accelerator; prepare only one")
        if len(optimizers) > 1:
            raise ValueError("DeepSpeed takes one optimizer; prepare it with its model")
        optimizer = optimizers[0] if optimizers else None
        scheduler = schedulers[0] if schedulers else None
        if isinstance(scheduler, DummyScheduler) and optimizer is None:
            raise ValueError(
                "DeepSpeed builds the DummyScheduler's schedule on the engine's optimizer: "
                "prepare it in one call with the model and its optimizer"
            )
        self.config = self._config(objects, training, optimizer, scheduler)
        os.environ.setdefault("DS_ACCELERATOR", self.state.device.type)
        import deepspeed

        given: dict[str, Any] = {}
        if isinstance(optimizer, DummyOptim):
            given["model_parameters"] = optimizer.params
        elif optimizer is not None:
            given["optimizer"] = self._for_offload(optimizer)
        if isinstance(scheduler, DummyScheduler) and scheduler.lr_scheduler_callable:
            given["lr_scheduler"] = scheduler.lr_scheduler_callable
        engine, engine_optimizer, _, engine_scheduler = deepspeed.initialize(
            model=models[0], config=self.config, dist_init_required=False, **given
        )
        self.engine = engine
        self._autocast(engine.module)
        swap = {id(models[0]): engine}
        if optimizer is not None:
            prepared = DeepSpeedOptimizer(engine_optimizer, training, replaces=optimizer)
            swap[id(optimizer)] = prepared
            if isinstance(scheduler, DummyScheduler):
                swap[id(scheduler)] = EngineScheduler(
                    engine_scheduler, [prepared], training.shared, num_processes=1
                )
        return [swap.get(id(o), o) for o in objects]

    def _config(
        self, objects: list[Any], training: Training, optimizer: Any, scheduler: Any
    ) -> dict:
        config = self.settings.merged()
        _check_declared(config, self.settings.where, optimizer, scheduler)
        if isinstance(optimizer, torch.optim.Optimizer):
            config["zero_allow_untested_optimizer"] = True  # any torch optimizer, as HF does
        batch_sizes = [o.batch_size for o in objects if isinstance(o, DataLoader)]
        model = next(o for o in objects if isinstance(o, torch.nn.Module))
        return dsc.fill_from_script(
            config,
            micro_batch_size=dsc.micro_batch_size(
                batch_sizes, self.state.num_processes, training.split_batches
            ),
            accumulation_steps=training.gradient_accumulation_steps,
            num_processes=self.state.num_processes,
            mixed_precision=training.mixed_precision,
            hidden_size=dsc.hidden_size_of(model),
            declared=dsc.placeholder_fills(
                optimizer,
                scheduler if isinstance(scheduler, DummyScheduler) else None,
                num_processes=self.state.num_processes,
                split_batches=training.split_batches,
            ),
        )

    def _for_offload(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """The optimizer ZeRO-Offload steps on the CPU.

        Adam, AdamW and Adagrad become DeepSpeed's vectorised CPU versions with the same
        hyperparameters and the *same* param-group dicts, so a scheduler built on the script's
        optimizer keeps setting the learning rate. Any other optimizer stays as it is, stepped by
        torch on the CPU: slower, but never a different algorithm (HF swaps in Adam).
        """
        offload = dsc.get(self.config, "zero_optimization.offload_optimizer.device")
        if offload in (None, "none") or self.config.get("zero_force_ds_cpu_optimizer") is False:
            return optimizer
        d = optimizer.defaults
        kind = type(optimizer)
        if kind in (torch.optim.Adam, torch.optim.AdamW) and not (d["amsgrad"] or d["maximize"]):
            from deepspeed.ops.adam import DeepSpeedCPUAdam

            return DeepSpeedCPUAdam(
                optimizer.param_groups,
                lr=d["lr"],
                betas=d["betas"],
                eps=d["eps"],
                weight_decay=d["weight_decay"],
                adamw_mode=kind is torch.optim.AdamW,
            )
        if kind is torch.optim.Adagrad and not (
            d["maximize"] or d["lr_decay"] or d["initial_accumulator_value"]
        ):
            from deepspeed.ops.adagrad import DeepSpeedCPUAdagrad

            return DeepSpeedCPUAdagrad(
                optimizer.param_groups, lr=d["lr"], eps=d["eps"], weight_decay=d["weight_decay"]
            )
        self.config["zero_force_ds_cpu_optimizer"] = False
        warnings.warn(
            f"ZeRO-Offload steps {kind.__name__} with torch on the CPU; DeepSpeed's CPU Adam(W) "
            "and Adagrad are several times faster",
            stacklevel=4,
        )
        return optimizer

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


def _check_declared(config: dict, where: str, optimizer: Any, scheduler: Any) -> None:
    """An optimizer or scheduler comes from the script or from the config, never from both.

    A config-declared one is stood for in the script by its placeholder, as in HF Accelerate.
    """
    for key, given, placeholder in (
        ("optimizer", optimizer, DummyOptim),
        ("scheduler", scheduler, DummyScheduler),
    ):
        name = placeholder.__name__
        if key in config and given is not None and not isinstance(given, placeholder):
            raise ValueError(
                f"{where} declares the {key}, and the script prepares its own "
                f"({type(given).__name__}); "
                f"create accelify.runtime.{name} in the script, or remove the config's {key}"
            )
        callable_ = getattr(given, "lr_scheduler_callable", None)
        if key not in config and isinstance(given, placeholder) and callable_ is None:
            raise ValueError(
                f"the script prepares a {name}, which stands for the {key} of a DeepSpeed "
                f"config, and {where} declares none"
            )
