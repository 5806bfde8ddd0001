"""``Accelerator``: HF Accelerate's public API as a thin front over separate pieces.

Process state (``state.py``), the distribution backend (``strategies/``), mixed precision
(``precision.py``), data loading (``data.py``), stepping (``optim.py``), collectives (``ops.py``),
checkpoints (``checkpoint.py``, with ``hooks.py``), experiment trackers (``tracking.py``),
``torch.compile`` (``compiling.py``) and profiling (``profiling.py``) each live in their own
module; this class only routes calls. Read-only properties live in the ``properties.py`` mixin.
"""

from __future__ import annotations

import contextlib
import gc
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, BinaryIO

import torch
from torch.distributed.algorithms import Join
from torch.optim.lr_scheduler import LRScheduler
from torch.utils.data import DataLoader
from torch.utils.hooks import RemovableHandle

from . import (
    checkpoint,
    compiling,
    config,
    data,
    handlers,
    hooks,
    ops,
    parallelism,
    plugins,
    precision,
    profiling,
    properties,
    replicas,
    rng,
    state,
    strategies,
    tracking,
)
from .deepspeed_placeholders import DummyOptim, DummyScheduler
from .optim import PreparedOptimizer, PreparedScheduler
from .state import DistributedType, ProcessState, StepState
from .uneven import WATCH, caller_line

_DDP_KINDS = (DistributedType.MULTI_CPU, DistributedType.MULTI_GPU)  # what strategies.DDP runs


class Accelerator(properties.SettingsFacts):
    """Prepare a training loop's objects and run it on one or many processes."""

    def __init__(  # noqa: PLR0917 (HF Accelerate's signature, positional args included)
        self,
        device_placement: bool = True,
        split_batches: bool | None = None,
        mixed_precision: str | None = None,
        gradient_accumulation_steps: int = 1,
        cpu: bool = False,
        dataloader_config: config.DataLoaderConfiguration | None = None,
        *,
        deepspeed_plugin: plugins.DeepSpeedPlugin | None = None,
        fsdp_plugin: plugins.FullyShardedDataParallelPlugin | None = None,
        torch_tp_plugin: Any = None,
        megatron_lm_plugin: Any = None,
        rng_types: Sequence[str | rng.RNGType] | None = None,
        even_batches: bool | None = None,
        log_with: tracking.LogWith = None,
        project_dir: str | None = None,
        project_config: config.ProjectConfiguration | None = None,
        gradient_accumulation_plugin: config.GradientAccumulationPlugin | None = None,
        step_scheduler_with_optimizer: bool = True,
        kwargs_handlers: Sequence[Any] | None = None,
        dynamo_backend: Any = None,
        dynamo_plugin: Any = None,
        deepspeed_plugins: Any = None,
        parallelism_config: parallelism.ParallelismConfig | None = None,
        sync_check: str | None = None,
    ) -> None:
        """HF Accelerate's arguments, plus ``sync_check`` (``off``, ``first`` or ``every:N``;
        default ``ACCELIFY_SYNC_CHECK``, else ``first``): when data-parallel processes compare
        their weights (``replicas.py``)."""
        properties.unsupported_plugins(
            deepspeed_plugins=deepspeed_plugins,
            torch_tp_plugin=torch_tp_plugin,
            megatron_lm_plugin=megatron_lm_plugin,
        )
        backend = plugins.requested(deepspeed_plugin, fsdp_plugin)  # before the state resolves
        self._parallelism = parallelism.requested(parallelism_config)
        options = handlers.collect(kwargs_handlers)
        for kind, handler in handlers.given(kwargs_handlers).items():
            setattr(self, f"{kind}_handler", handler)  # HF's ddp_handler, profile_handler, ...
        self.rng_types = rng.checked_rng_types(rng_types)
        self._compile = compiling.options(dynamo_backend, dynamo_plugin)
        self._sync_check = replicas.schedule(sync_check)
        self.state: ProcessState = state.process_state(config.use_cpu(cpu), options["init"])
        if self._parallelism is not None:
            parallelism.configure(self._parallelism, self.state)
        self.mixed_precision = config.mixed_precision(mixed_precision)
        self.dataloader_config = _loader_config(dataloader_config, split_batches, even_batches)
        if backend and gradient_accumulation_plugin is None and gradient_accumulation_steps == 1:
            # DeepSpeedPlugin(gradient_accumulation_steps=N) sets the default, as its variable does
            gradient_accumulation_steps = backend.accumulation_steps or 1
        self._shared = _step_state(gradient_accumulation_plugin, gradient_accumulation_steps)
        state.share_steps(self._shared)
        self.device_placement = device_placement
        self.step_scheduler_with_optimizer = step_scheduler_with_optimizer
        self.project_configuration = project_config or config.ProjectConfiguration()
        if project_dir is not None:
            self.project_configuration.set_directories(project_dir)
        self.log_with = tracking.select(log_with, self.logging_dir)
        self.trackers: list[tracking.GeneralTracker] = []
        hook = handlers.comm_hook(self.ddp_handler)
        chosen = backend.strategy_kwargs(self.state) if backend else {}
        chosen |= parallelism.strategy_kwargs(self._parallelism, self.distributed_type)
        self.strategy = strategies.select(self.state, comm_hook=hook, **options["ddp"], **chosen)
        if self._compile and self.distributed_type == DistributedType.DEEPSPEED:
            raise ValueError("dynamo_backend under DeepSpeed is not supported by accelify")
        self.precision = precision.select(
            "no" if self.strategy.owns_precision else self.mixed_precision,
            self.state.device,
            autocast_kwargs=options["autocast"],
            scaler_kwargs=options["scaler"],
        )
        self.step = 0
        self.flag_tensor: torch.Tensor | None = None
        self._models: list[torch.nn.Module] = []
        self._optimizers: list[PreparedOptimizer] = []
        self._schedulers: list[PreparedScheduler] = []
        self._dataloaders: list[data.PreparedDataLoader] = []
        self._custom_objects: list[Any] = []
        self._state_hooks = hooks.StateHooks()
        self._optimizer_steps = 0  # real steps of all prepared optimizers, for the sync check
        self._check_due = ""  # when the replica check is due at the next backward: its "when"

    @property
    def gradient_accumulation_steps(self) -> int:
        return self._shared.num_steps

    @gradient_accumulation_steps.setter
    def gradient_accumulation_steps(self, value: int) -> None:
        self._shared.num_steps = value

    @property
    def split_batches(self) -> bool:
        return self.dataloader_config.split_batches

    @property
    def even_batches(self) -> bool:
        return self.dataloader_config.even_batches

    @even_batches.setter
    def even_batches(self, value: bool) -> None:
        self.dataloader_config.even_batches = value

    @property
    def sync_gradients(self) -> bool:
        return self._shared.sync_gradients

    @sync_gradients.setter
    def sync_gradients(self, value: bool) -> None:
        self._shared.sync_gradients = value

    @property
    def gradient_state(self) -> StepState:
        """``sync_gradients``, ``end_of_dataloader``, ``active_dataloader``, ... (HF's names)."""
        return self._shared

    @property
    def optimizer_step_was_skipped(self) -> bool:
        """Whether the last step of any prepared optimizer was skipped (fp16 inf/nan)."""
        return any(optimizer.step_was_skipped for optimizer in self._optimizers)

    @property
    def scaler(self) -> torch.amp.GradScaler | None:
        return getattr(self.precision, "scaler", None)

    # -- prepare -------------------------------------------------------------------------------

    def prepare(self, *args: Any, device_placement: Sequence[bool] | None = None) -> Any:
        """Wrap models, optimizers, data loaders and schedulers; return them in the same order.

        Anything else passes through unchanged. Schedulers are prepared last so they can find
        their (prepared) optimizer.
        """
        placement = list(device_placement or [self.device_placement] * len(args))
        if len(placement) != len(args):
            raise ValueError("device_placement needs one entry per object passed to prepare()")
        result = self.strategy.setup(list(args), self._training())
        for i, obj in enumerate(result):
            if not isinstance(obj, LRScheduler):
                result[i] = self._prepare_one(obj, placement[i])
        for i, obj in enumerate(result):
            if isinstance(obj, LRScheduler):
                result[i] = self._prepare_scheduler(obj)
        return result[0] if len(result) == 1 else tuple(result)

    def _prepare_one(self, obj: Any, placement: bool) -> Any:
        if isinstance(obj, torch.nn.Module):
            return self.prepare_model(obj, device_placement=placement)
        if isinstance(obj, data.PreparedDataLoader):
            return obj
        if isinstance(obj, PreparedOptimizer | PreparedScheduler):  # a backend's (or re-prepared)
            known = self._optimizers if isinstance(obj, PreparedOptimizer) else self._schedulers
            if all(obj is not seen for seen in known):
                known.append(obj)
            return obj
        if isinstance(obj, DummyOptim | DummyScheduler):
            raise ValueError(
                f"{type(obj).__name__} stands for what a DeepSpeed config declares; launch with "
                "accel-run --use-deepspeed --deepspeed-config-file FILE, or use a torch one"
            )
        if isinstance(obj, torch.optim.Optimizer):
            if obj.state and placement:  # state loaded before prepare: follow the parameters
                obj.load_state_dict(obj.state_dict())
            prepared = PreparedOptimizer(obj, self._shared, self.precision, self._after_step)
            self._optimizers.append(prepared)
            return prepared
        if isinstance(obj, DataLoader):
            return self.prepare_data_loader(obj, device_placement=placement)
        return obj

    def prepare_model(
        self, model: torch.nn.Module, device_placement: bool | None = None
    ) -> torch.nn.Module:
        if any(model is seen for seen in self._models):
            return model
        if _default(device_placement, self.device_placement) and not self.strategy.places_models:
            model.to(self.device)
        self.precision.wrap_forward(model)
        wrapped = compiling.compile_model(self.strategy.wrap_model(model), self._compile)
        if self.num_processes > 1:
            WATCH.watch_forwards(wrapped)
        self._models.append(wrapped)
        return wrapped

    def prepare_data_loader(
        self, loader: DataLoader, device_placement: bool | None = None
    ) -> data.PreparedDataLoader:
        config.check_loader_config(self.dataloader_config)
        prepared = data.prepare_loader(
            loader,
            self.state,
            self._shared,
            shards=parallelism.data_parallel_share(
                self.torch_device_mesh, self.num_processes, self.process_index
            ),
            split_batches=self.split_batches,
            even_batches=self.even_batches,
            device_placement=_default(device_placement, self.device_placement),
            non_blocking=self.dataloader_config.non_blocking,
            seedable_sampler=self.dataloader_config.use_seedable_sampler,
            data_seed=self.dataloader_config.data_seed,
            rng_types=self.rng_types,
            # HF's None means True for iterable datasets; accelify then shards the stream on
            # every process instead, which gives each process the same batches.
            dispatch_batches=bool(self.dataloader_config.dispatch_batches),
        )
        self._dataloaders.append(prepared)
        return prepared

    def prepare_optimizer(
        self, optimizer: torch.optim.Optimizer, device_placement: bool | None = None
    ) -> PreparedOptimizer:
        """``prepare`` for one optimizer (HF's method; ``prepare`` is the usual way)."""
        return self._prepare_one(optimizer, _default(device_placement, self.device_placement))

    def prepare_scheduler(self, scheduler: LRScheduler) -> PreparedScheduler:
        """``prepare`` for one scheduler, after its optimizer."""
        if isinstance(scheduler, PreparedScheduler):
            return self._prepare_one(scheduler, self.device_placement)
        return self._prepare_scheduler(scheduler)

    def _prepare_scheduler(self, scheduler: LRScheduler) -> PreparedScheduler:
        optimizers = [o for o in self._optimizers if o.wraps(scheduler.optimizer)]
        prepared = PreparedScheduler(
            scheduler,
            optimizers,
            self._shared,
            num_processes=self.num_processes,
            step_with_optimizer=self.step_scheduler_with_optimizer,
            split_batches=self.split_batches,
        )
        self._schedulers.append(prepared)
        return prepared

    # -- the training step ---------------------------------------------------------------------

    def _training(self) -> strategies.Training:
        return strategies.Training(
            self.gradient_accumulation_steps,
            self.mixed_precision,
            self._shared,
            self.precision,
            self.split_batches,
        )

    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """``loss.backward()`` with accumulation scaling (1/N) and fp16 loss scaling.

        Under DeepSpeed the engine does both, and steps its optimizer when gradients sync.
        """
        WATCH.passes += 1
        if self._check_due:
            when, self._check_due = self._check_due, ""
            self._check_replicas(when)
        self.strategy.backward(loss, self._training(), **kwargs)

    def _after_step(self) -> None:
        """Schedule the replica check for the next backward, not now: a step whose gradients DDP
        never finished averaging (a parameter without gradient) makes DDP raise in the next
        forward, and a collective of ours in between would wait for a process stuck in it."""
        self._optimizer_steps += 1
        if self._sync_check.due(self._optimizer_steps):
            self._check_due = f"after optimizer step {self._optimizer_steps}"

    def _check_replicas(self, when: str) -> None:
        """Raise when the data-parallel processes hold different weights (see replicas.py)."""
        split = self._parallelism is not None and self._parallelism.tp_enabled  # not replicas
        replicated = self.num_processes > 1 and self.distributed_type in _DDP_KINDS and not split
        if self._sync_check.off or not replicated:
            return
        found = replicas.groups(self._models, self._optimizers)
        replicas.compare(found, self.device, when)

    @contextlib.contextmanager
    def accumulate(self, *models: torch.nn.Module) -> Iterator[None]:
        """Count a step; skip gradient sync unless it is every N-th or the loader's last
        (``sync_each_batch``: sync every batch, still step every N-th)."""
        self._do_sync()
        shared = self._shared
        if shared.sync_gradients or shared.sync_each_batch or not self.state.use_distributed:
            yield
            return
        with contextlib.ExitStack() as stack:
            for model in models:
                stack.enter_context(self.strategy.no_sync(model))
            yield

    def _do_sync(self) -> None:
        shared = self._shared
        if shared.sync_with_dataloader and shared.end_of_dataloader:
            self.step = 0
            shared.sync_gradients = True
        else:
            self.step += 1
            shared.sync_gradients = self.step % shared.num_steps == 0

    def no_sync(self, model: torch.nn.Module) -> contextlib.AbstractContextManager:
        """Run forward and backward without the gradient all-reduce (accumulate locally)."""
        return self.strategy.no_sync(model)

    @staticmethod
    @contextlib.contextmanager
    def trigger_sync_in_backward(model: torch.nn.Module) -> Iterator[None]:
        """Make the next backward all-reduce even inside ``no_sync`` (DDP models; else no-op)."""
        if not isinstance(model, torch.nn.parallel.DistributedDataParallel):
            yield
            return
        saved = model.require_backward_grad_sync, model.require_forward_param_sync
        model.require_backward_grad_sync = model.require_forward_param_sync = True
        model.reducer.prepare_for_backward([])
        try:
            yield
        finally:
            model.require_backward_grad_sync, model.require_forward_param_sync = saved

    @contextlib.contextmanager
    def join_uneven_inputs(
        self, joinables: Sequence[Any], even_batches: bool | None = None
    ) -> Iterator[None]:
        """Let DDP processes with fewer batches join early (``torch.distributed.algorithms.Join``).

        Unlike HF Accelerate, which joins only on GPUs (on CPU its processes then wait on each
        other forever), every DDP run joins, gloo included. ``even_batches`` overrides the
        prepared map-style loaders' setting inside the block.
        """
        if self.state.use_distributed and self.distributed_type in _DDP_KINDS:
            WATCH.stop()  # Join lets processes run different numbers of passes on purpose
            with data.even_batches_overridden(self._dataloaders, even_batches):
                enable = not _default(even_batches, self.even_batches)
                with Join(list(joinables), enable=enable, throw_on_early_termination=False):
                    yield
            return
        if self.distributed_type != DistributedType.NO:
            warnings.warn(
                "Joining uneven inputs is only supported for multi-GPU and multi-CPU DDP "
                "training, as a result `join_uneven_inputs` will have no effect.",
                stacklevel=3,
            )
        yield

    def autocast(self, autocast_handler: Any = None) -> contextlib.AbstractContextManager:
        """The mixed-precision autocast context (a no-op without mixed precision).

        ``autocast_handler`` is anything with ``to_kwargs()`` (HF's ``AutocastKwargs``).
        """
        return self.precision.autocast(**(autocast_handler.to_kwargs() if autocast_handler else {}))

    def unscale_gradients(self, optimizer: Any = None) -> None:
        targets = self._optimizers if optimizer is None else _as_list(optimizer)
        for prepared in targets:
            self.precision.unscale(getattr(prepared, "optimizer", prepared))

    def clip_grad_norm_(
        self, parameters: Iterable[torch.Tensor], max_norm: float, norm_type: float = 2
    ) -> torch.Tensor | None:
        """Clip the gradients' total norm (unscaled first under fp16); return that norm.

        Under DeepSpeed the engine clips (``gradient_clipping`` in its config) and this returns
        ``None``, as in HF Accelerate.
        """
        self.unscale_gradients()
        return self.strategy.clip_grad_norm_(parameters, max_norm, norm_type)

    def clip_grad_value_(self, parameters: Iterable[torch.Tensor], clip_value: float) -> None:
        self.unscale_gradients()
        torch.nn.utils.clip_grad_value_(parameters, clip_value)

    # -- collectives ---------------------------------------------------------------------------

    def gather(self, tensor: Any) -> Any:
        return ops.gather(tensor)

    def gather_for_metrics(self, input_data: Any, use_gather_object: bool = False) -> Any:
        """Gather, then drop the samples ``even_batches`` repeated in the loader's last round."""
        use_gather_object = use_gather_object or not ops.only_tensors(input_data)
        gathered = ops.gather_object(input_data) if use_gather_object else ops.gather(input_data)
        remainder = self._shared.remainder
        if not self._shared.end_of_dataloader or remainder <= 0:
            return gathered
        if use_gather_object:
            return gathered[:remainder]
        return ops.apply(lambda tensor: tensor[:remainder], gathered)

    def reduce(self, tensor: Any, reduction: str = "sum", scale: float = 1.0) -> Any:
        """Sum, average, max or min over processes. ``scale`` is accepted and ignored, as HF
        Accelerate ignores it everywhere but on TPUs."""
        return ops.reduce(tensor, reduction)

    def pad_across_processes(
        self, tensor: Any, dim: int = 0, pad_index: int = 0, pad_first: bool = False
    ) -> Any:
        return ops.pad_across_processes(tensor, dim, pad_index, pad_first)

    # -- process coordination ------------------------------------------------------------------

    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` on the local main process only."""
        self.state.print(*args, **kwargs)

    def wait_for_everyone(self) -> None:
        self.strategy.barrier()

    def main_process_first(self) -> contextlib.AbstractContextManager[None]:
        """Let the main process run the block (e.g. download, cache) before the others."""
        return self.state.main_process_first()

    def local_main_process_first(self) -> contextlib.AbstractContextManager[None]:
        return self.state.local_main_process_first()

    def on_main_process(self, function: Callable) -> Callable:
        """Decorator: run ``function`` on the main process only (others get ``None``)."""
        return self.state.on_main_process(function)

    def on_local_main_process(self, function: Callable) -> Callable:
        return self.state.on_local_main_process(function)

    def on_last_process(self, function: Callable) -> Callable:
        return self.state.on_last_process(function)

    def on_process(
        self, function: Callable | None = None, process_index: int | None = None
    ) -> Callable:
        """Decorator: run on process ``process_index`` only; ``@on_process(process_index=i)``."""
        return self.state.on_process(function, process_index)

    def on_local_process(
        self, function: Callable | None = None, local_process_index: int | None = None
    ) -> Callable:
        return self.state.on_local_process(function, local_process_index)

    def split_between_processes(
        self, inputs: Any, apply_padding: bool = False
    ) -> contextlib.AbstractContextManager[Any]:
        """Yield this process's contiguous share of ``inputs`` (list, tuple, dict or tensor)."""
        return self.state.split_between_processes(inputs, apply_padding)

    def set_trigger(self) -> None:
        """Raise this process's flag; ``check_trigger`` on every process then returns True once
        (e.g. to stop all processes when one sees a NaN loss)."""
        self.flag_tensor = torch.tensor(1, device=self.device)

    def check_trigger(self) -> bool:
        """Whether any process called ``set_trigger`` since the last check (a collective)."""
        if self.flag_tensor is None:
            self.flag_tensor = torch.tensor(0, device=self.device)
        raised = ops.reduce(self.flag_tensor, "sum").item() >= 1
        if raised:
            self.flag_tensor = torch.tensor(0, device=self.device)
        return raised

    # -- models and checkpoints ----------------------------------------------------------------

    def unwrap_model(
        self, model: torch.nn.Module, keep_fp32_wrapper: bool = True
    ) -> torch.nn.Module:
        """The user's module without DDP/compile wrappers (and, if asked, without autocast)."""
        model = self.strategy.unwrap_model(model)
        if not keep_fp32_wrapper:
            precision.unwrap_forward(model)
        return model

    def save(self, obj: Any, f: str | Path | BinaryIO, safe_serialization: bool = False) -> None:
        """Save ``obj`` from the main process only."""
        if self.is_main_process:
            checkpoint.save(obj, f, safe_serialization)

    def save_model(
        self,
        model: torch.nn.Module,
        save_directory: str | Path,
        max_shard_size: int | str = "10GB",
        safe_serialization: bool = True,
    ) -> None:
        """Save the unwrapped weights (safetensors, sharded above ``max_shard_size``)."""
        weights = self.strategy.model_state_dict(model)
        if self.is_main_process:
            checkpoint.save_model(weights, save_directory, max_shard_size, safe_serialization)

    def get_state_dict(self, model: torch.nn.Module) -> dict[str, torch.Tensor]:
        return self.strategy.model_state_dict(model)

    def register_for_checkpointing(self, *objects: Any) -> None:
        """Add objects with ``state_dict``/``load_state_dict`` to what ``save_state`` saves."""
        bad = [repr(o) for o in objects if not _has_state(o)]
        if bad:
            raise ValueError(f"cannot checkpoint objects without state_dict/load_state_dict: {bad}")
        self._custom_objects.extend(objects)

    def _parts(self) -> checkpoint.Parts:
        return checkpoint.Parts(
            self._models,
            self._optimizers,
            self._schedulers,
            self._dataloaders,
            self._custom_objects,
            self.precision,
            self.strategy,
            self._state_hooks,
        )

    def _checkpoints_root(self) -> Path:
        if self.project_dir is None:
            raise ValueError("automatic_checkpoint_naming needs a project_dir")
        return Path(self.project_dir) / "checkpoints"

    def register_save_state_pre_hook(self, hook: Callable[..., None]) -> RemovableHandle:
        """Call ``hook(models, weights, output_dir)`` in ``save_state`` before the weights are
        written, on every process; weights it removes from the list are not saved.
        ``output_dir`` is the folder being written, renamed into place once complete."""
        return self._state_hooks.register_save(hook)

    def register_load_state_pre_hook(self, hook: Callable[..., None]) -> RemovableHandle:
        """Call ``hook(models, input_dir)`` in ``load_state`` before the weights are read;
        models it removes from the list are not loaded."""
        return self._state_hooks.register_load(hook)

    def save_state(
        self, output_dir: str | Path | None = None, safe_serialization: bool = True
    ) -> str:
        """Save everything needed to resume training; return the checkpoint folder.

        With automatic naming the folder is ``<project_dir>/checkpoints/checkpoint_<N>`` and only
        the newest ``total_limit`` are kept (older ones are removed after the new one is safe).
        """
        project = self.project_configuration
        if project.automatic_checkpoint_naming:
            target = self._checkpoints_root() / f"checkpoint_{project.iteration}"
            if target.exists():
                raise ValueError(f"{target}: checkpoint already exists; raise save_iteration")
        elif output_dir is None:
            raise ValueError("save_state needs output_dir unless automatic_checkpoint_naming")
        else:
            target = Path(output_dir)
        self._check_replicas("at save_state")
        meta = {"next_iteration": project.iteration + 1, "step": self.step}
        meta["num_processes"] = self.num_processes
        checkpoint.save_state(target, self._parts(), meta, safe_serialization)
        project.iteration += 1
        if project.automatic_checkpoint_naming and self.is_main_process:
            checkpoint.rotate(target.parent, project.total_limit)
        return str(target)

    def load_state(self, input_dir: str | Path | None = None) -> None:
        """Restore a ``save_state`` checkpoint; ``None`` resumes the latest automatic one."""
        project = self.project_configuration
        if input_dir is None:
            if not project.automatic_checkpoint_naming:
                raise ValueError("load_state needs input_dir unless automatic_checkpoint_naming")
            found = checkpoint.numbered_checkpoints(self._checkpoints_root())
            if not found:
                raise FileNotFoundError(f"{self._checkpoints_root()}: no checkpoint to resume")
            input_dir = found[-1][1]
        meta = checkpoint.load_state(input_dir, self._parts())
        # HF's folders hold no iteration unless named checkpoint_N, older HF's no step.
        project.iteration = int(meta.get("next_iteration", project.iteration))
        self.step = int(meta.get("step", self.step))

    def skip_first_batches(self, dataloader: DataLoader, num_batches: int = 0) -> DataLoader:
        return data.skip_first_batches(dataloader, num_batches)

    def profile(
        self, profile_handler: handlers.ProfileKwargs | None = None
    ) -> contextlib.AbstractContextManager[torch.profiler.profile]:
        """Profile the block with ``torch.profiler`` (``profile_handler``, else the
        ``ProfileKwargs`` in ``kwargs_handlers``); see ``profiling.py``."""
        handler = profile_handler or self.profile_handler
        return profiling.profile(handler, self.process_index, self.wait_for_everyone)

    # -- experiment tracking (tracking.py) ------------------------------------------------------

    def init_trackers(
        self, project_name: str, config: dict | None = None, init_kwargs: dict | None = None
    ) -> None:
        """Start a run in every ``log_with`` tracker, on the main process only; ``config`` is
        stored as its hyperparameters, ``init_kwargs`` maps a tracker's name to its options."""
        if self.is_main_process:
            self.trackers += tracking.start(
                self.log_with, project_name, self.logging_dir, config, init_kwargs
            )

    def get_tracker(self, name: str, unwrap: bool = False) -> Any:
        """The tracker called ``name`` (with ``unwrap``, its library's run or writer); on the
        other processes a blank tracker whose methods do nothing."""
        return tracking.find(self.trackers, name, unwrap)

    def log(self, values: dict, step: int | None = None, log_kwargs: dict | None = None) -> None:
        """Log ``values`` at ``step`` to every tracker, on the main process only;
        ``log_kwargs`` maps a tracker's name to extra options for its ``log``."""
        if self.is_main_process:
            for tracker in self.trackers:
                tracker.log(values, step=step, **(log_kwargs or {}).get(tracker.name, {}))

    def end_training(self) -> None:
        """Finish the trackers, then tear down the process group once every process got here;
        a new ``Accelerator`` may be created afterwards."""
        for tracker in self.trackers:
            tracker.finish()
        state.reset(
            where=f"end_training() at {caller_line()}",
            last_check=lambda: self._check_replicas("at end_training"),
        )

    def free_memory(self, *objects: Any) -> list[None]:
        """Drop references to everything prepared and release cached device memory."""
        self._models, self._optimizers, self._schedulers = [], [], []
        self._dataloaders = []
        self.step = 0
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        return [None] * len(objects)

    clear = free_memory


def _loader_config(
    given: config.DataLoaderConfiguration | None, split_batches: bool | None, even: bool | None
) -> config.DataLoaderConfiguration:
    """The ``dataloader_config``, or one built from the older ``split_batches``/``even_batches``
    arguments; giving both ways is refused rather than guessing which one wins."""
    if given is None:
        return config.DataLoaderConfiguration(
            split_batches=bool(split_batches), even_batches=_default(even, True)
        )
    if split_batches is not None or even is not None:
        raise ValueError("pass split_batches/even_batches inside dataloader_config, not next to it")
    return given


def _step_state(plugin: config.GradientAccumulationPlugin | None, steps: int) -> StepState:
    """Accumulation options from the plugin, else from ``gradient_accumulation_steps``."""
    if plugin is None:
        return StepState(num_steps=config.accumulation_steps(steps))
    if steps != 1:
        raise ValueError(
            "pass either gradient_accumulation_steps or gradient_accumulation_plugin, not both"
        )
    shared = StepState().follow(plugin)
    shared.num_steps = config.accumulation_steps(shared.num_steps)
    return shared


def _has_state(obj: Any) -> bool:
    return callable(getattr(obj, "state_dict", None)) and callable(
        getattr(obj, "load_state_dict", None)
    )


def _default(value: bool | None, default: bool) -> bool:
    return default if value is None else value


def _as_list(value: Any) -> list:
    return list(value) if isinstance(value, list | tuple) else [value]
