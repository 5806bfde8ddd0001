"""Who this process is and where it computes, resolved once from the environment.

The launcher contract is torch.distributed's: ``WORLD_SIZE``/``RANK``/``LOCAL_RANK`` set by
``torch.distributed.run`` (or ``accel-run``). More than one process always means a real process
group: HF Accelerate quietly trains N independent copies when ``torchrun`` starts it on a CPU-only
host without ``cpu=True``; here that case initialises gloo instead.
"""

from __future__ import annotations

import atexit
import builtins
import contextlib
import functools
import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from enum import Enum
from typing import Any

import torch
import torch.distributed as dist

from . import ops, uneven
from .launch.bootstrap import TIMEOUT_ENV


class DistributedType(str, Enum):
    """HF Accelerate's enum, every member: scripts compare against kinds accelify never runs
    (``== DistributedType.XLA``), and the values equal HF's so either enum compares equal."""

    NO = "NO"
    MULTI_CPU = "MULTI_CPU"
    MULTI_GPU = "MULTI_GPU"
    MULTI_NPU = "MULTI_NPU"
    MULTI_MLU = "MULTI_MLU"
    MULTI_SDAA = "MULTI_SDAA"
    MULTI_MUSA = "MULTI_MUSA"
    MULTI_XPU = "MULTI_XPU"
    DEEPSPEED = "DEEPSPEED"
    FSDP = "FSDP"
    XLA = "XLA"
    MEGATRON_LM = "MEGATRON_LM"
    MULTI_HPU = "MULTI_HPU"
    MULTI_NEURON = "MULTI_NEURON"


# The launcher's switches for a sharded backend (HF Accelerate's names); at most one may be set.
SHARDED_BACKENDS = {
    "ACCELERATE_USE_DEEPSPEED": DistributedType.DEEPSPEED,
    "ACCELERATE_USE_FSDP": DistributedType.FSDP,
}


@dataclass
class ProcessState:
    """The facts about this process, shared by every ``Accelerator`` in it (``accelerator.state``).

    Not frozen: HF scripts set ``accelerator.state.distributed_type`` to try another code path.
    """

    num_processes: int
    process_index: int
    local_process_index: int
    device: torch.device
    distributed_type: DistributedType
    cpu: bool
    # HF's PartialState().debug: collectives check shapes first (ops.DistributedOperationException)
    debug: bool = field(default_factory=ops.debug_from_env)

    @property
    def is_main_process(self) -> bool:
        return self.process_index == 0

    @property
    def is_local_main_process(self) -> bool:
        return self.local_process_index == 0

    @property
    def is_last_process(self) -> bool:
        return self.process_index == self.num_processes - 1

    @property
    def use_distributed(self) -> bool:
        """More than one process, or a sharded backend (it runs a process group even on one)."""
        return self.num_processes > 1 or self.distributed_type in SHARDED_BACKENDS.values()

    def wait_for_everyone(self) -> None:
        if self.use_distributed and dist.is_initialized():
            dist.barrier()

    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` on the local main process only."""
        if self.is_local_main_process:
            builtins.print(*args, **kwargs)

    def destroy_process_group(self) -> None:
        """HF's name for :func:`reset` (the next ``Accelerator`` starts afresh)."""
        reset()

    @contextlib.contextmanager
    def main_process_first(self) -> Iterator[None]:
        """Let the main process run the block (e.g. download, cache) before the others."""
        with self._first(self.is_main_process):
            yield

    @contextlib.contextmanager
    def local_main_process_first(self) -> Iterator[None]:
        with self._first(self.is_local_main_process):
            yield

    @contextlib.contextmanager
    def _first(self, leader: bool) -> Iterator[None]:
        if not leader:
            self.wait_for_everyone()
        yield
        if leader:
            self.wait_for_everyone()

    def on_main_process(self, function: Callable) -> Callable:
        """Decorator: run ``function`` on the main process only (others get ``None``)."""
        return _only_if(self.is_main_process, function)

    def on_local_main_process(self, function: Callable) -> Callable:
        return _only_if(self.is_local_main_process, function)

    def on_last_process(self, function: Callable) -> Callable:
        return _only_if(self.is_last_process, function)

    def on_process(
        self, function: Callable | None = None, process_index: int | None = None
    ) -> Callable:
        """Decorator: run on process ``process_index`` only; ``@on_process(process_index=i)``."""
        if function is None:
            return functools.partial(self.on_process, process_index=process_index)
        return _only_if(self.process_index == process_index, function)

    def on_local_process(
        self, function: Callable | None = None, local_process_index: int | None = None
    ) -> Callable:
        if function is None:
            return functools.partial(self.on_local_process, local_process_index=local_process_index)
        return _only_if(self.local_process_index == local_process_index, function)

    @contextlib.contextmanager
    def split_between_processes(self, inputs: Any, apply_padding: bool = False) -> Iterator[Any]:
        """Yield this process's contiguous share of ``inputs`` (list, tuple, dict or tensor)."""
        yield ops.split(inputs, self.num_processes, self.process_index, apply_padding)


def _only_if(condition: bool, function: Callable) -> Callable:
    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return function(*args, **kwargs) if condition else None

    return wrapper


@dataclass
class StepState:
    """What the loaders, optimizers and schedulers of one ``Accelerator`` share during training
    (``accelerator.gradient_state``, with HF's ``GradientState`` names).

    Plain attributes (no singletons) so reading them per step costs one lookup.
    """

    sync_gradients: bool = True
    end_of_dataloader: bool = False
    remainder: int = -1
    active_loaders: list = field(default_factory=list)
    num_steps: int = 1
    sync_with_dataloader: bool = True
    sync_each_batch: bool = False

    @property
    def active_dataloader(self) -> Any:
        """The innermost prepared loader being iterated, else ``None``."""
        return self.active_loaders[-1] if self.active_loaders else None

    @property
    def in_dataloader(self) -> bool:
        return bool(self.active_loaders)

    def follow(self, plugin: Any) -> StepState:
        """Take an accumulation plugin's settings (HF's ``GradientAccumulationPlugin`` fields)."""
        self.num_steps = plugin.num_steps or 1
        self.sync_with_dataloader = plugin.sync_with_dataloader
        self.sync_each_batch = plugin.sync_each_batch
        return self


class GradientState:
    """HF's ``GradientState()``: the step state of the newest ``Accelerator`` of this process
    (HF shares one between all of them; accelify gives each its own and hands out the newest's).
    Before any ``Accelerator``, a fresh one that the next ``GradientState()`` returns too; a
    ``gradient_accumulation_plugin`` updates its accumulation settings, as in HF. Not a real
    class: the object returned is a :class:`StepState`."""

    def __new__(cls, gradient_accumulation_plugin: Any = None) -> StepState:  # type: ignore[misc]
        shared = _newest_steps.get("steps")
        if shared is None:
            shared = _newest_steps["steps"] = StepState()
        if gradient_accumulation_plugin is not None:
            shared.follow(gradient_accumulation_plugin)
        return shared

    @staticmethod
    def _reset_state() -> None:
        """HF's helper to start over: the next ``GradientState()`` is a fresh one."""
        _newest_steps.clear()


def share_steps(steps: StepState) -> None:
    """Make ``steps`` (a new ``Accelerator``'s) what ``GradientState()`` returns."""
    _newest_steps["steps"] = steps


class PartialState:
    """HF's way to reach this process's state without an ``Accelerator``: ``PartialState()``
    returns the one :class:`ProcessState` of this process, resolving it on first use (then
    ``cpu`` and ``kwargs``, which go to ``init_process_group``, apply). Not a real class: the
    object returned is a ``ProcessState``."""

    def __new__(cls, cpu: bool | None = None, **kwargs: Any) -> ProcessState:  # type: ignore[misc]
        known = current()
        if known is not None and cpu is None:
            return known
        from .config import use_cpu

        return process_state(use_cpu(bool(cpu)), kwargs)

    @staticmethod
    def _reset_state() -> None:
        """HF's helper to start over: tears down the process group, like :func:`reset`."""
        reset()


class AcceleratorState(PartialState):
    """HF's ``AcceleratorState()``: the same shared :class:`ProcessState` (accelify keeps mixed
    precision and plugins on the ``Accelerator``, so only ``cpu`` is accepted)."""

    def __new__(cls, cpu: bool | None = None) -> ProcessState:  # type: ignore[misc]
        return PartialState(cpu)

    @staticmethod
    def _reset_state(reset_partial_state: bool = False) -> None:
        """HF's helper so the next ``Accelerator`` may choose other settings (mixed precision,
        ...). accelify keeps those on each ``Accelerator``, so only ``reset_partial_state``
        (tear down the process group too) has anything to do."""
        if reset_partial_state:
            reset()


_newest_steps: dict[str, StepState] = {}  # "steps" -> what GradientState() returns
_resolved: dict[str, ProcessState] = {}  # "state" -> the one ProcessState of this process


def is_initialized() -> bool:
    """Whether an ``Accelerator`` (and so possibly a process group) already exists here."""
    return "state" in _resolved


def current() -> ProcessState | None:
    return _resolved.get("state")


def process_state(cpu: bool, init_kwargs: Mapping[str, Any] | None = None) -> ProcessState:
    """Resolve the state on the first call; later calls must agree on ``cpu``.

    ``init_kwargs`` (``InitProcessGroupKwargs``: ``backend``, ``init_method``, ``timeout``) go to
    ``init_process_group`` when this call starts the group.
    """
    known = _resolved.get("state")
    if known is None:
        known = _resolved["state"] = _resolve(cpu, init_kwargs or {})
    elif known.cpu != cpu:
        raise ValueError(
            f"an Accelerator with cpu={known.cpu} already exists in this process; "
            f"cannot create one with cpu={cpu}"
        )
    return known


def reset(
    timeout: float | None = None,
    *,
    where: str = "its script returned",
    last_check: Callable[[], None] | None = None,
) -> None:
    """Forget the state and tear down the process group it started (``end_training``).

    With ``timeout``, give up waiting for the other ranks after that many seconds and leave the
    group to process exit. ``where`` says how this process ended, for the uneven-steps report;
    ``last_check`` is a collective run once every process has ended, before the teardown."""
    known = _resolved.pop("state", None)
    if known is None or not known.use_distributed or not dist.is_initialized():
        return
    if known.num_processes > 1:
        uneven.WATCH.ended(known.process_index, where)
    if last_check is not None and _all_out_of_collectives(known.num_processes, timeout):
        last_check()
    if _all_out_of_collectives(known.num_processes, timeout):
        dist.destroy_process_group()


def _all_out_of_collectives(world_size: int, timeout: float | None = None) -> bool:
    """Wait until every rank has returned from its last collective (False: timed out).

    A barrier returns on one rank while gloo may still be finishing it on another; destroying
    the group then kills that rank ("terminate called without an active exception", about one
    run in ten). The rendezvous store is not part of the group, so it can tell when all are out.
    The store may live in rank 0's own process (a launch without torch elastic's agent: srun,
    or ``MASTER_PORT`` set by hand), so rank 0 leaves last, once every rank has read the count:
    a rank still reading it from a store that went away fails ("Connection reset by peer").
    """
    store = dist.distributed_c10d._get_default_store()
    deadline = None if timeout is None else time.monotonic() + timeout
    out = _arrive(store, "accelify/end_training", world_size, deadline, wait=True)
    # Counted in also by a rank that gave up waiting (it reads the store no more), so that rank
    # 0 never waits for one that left at its exit wait while rank 0 still worked.
    first = dist.get_rank() == 0
    done_reading = _arrive(store, "accelify/end_training_read", world_size, deadline, wait=first)
    return out and done_reading


def _arrive(store: Any, key: str, world_size: int, deadline: float | None, *, wait: bool) -> bool:
    """Count this rank in at ``key``; with ``wait``, until every rank has (False: timed out).
    Each call is one round: ``end_training`` may be called again later."""
    arrived = store.add(key, 1)
    round_end = -(-arrived // world_size) * world_size
    while wait and arrived < round_end:
        if deadline is not None and time.monotonic() > deadline:
            return False
        time.sleep(0.005)
        arrived = store.add(key, 0)
    return True


# How long a rank that ends without end_training() waits at exit for the others to end too.
EXIT_WAIT_S = 30.0


@atexit.register
def _end_at_exit() -> None:
    """Most scripts never call ``end_training()``: without this, the process group is torn down
    by interpreter exit while gloo may still be finishing the last collective with another rank,
    and a clean job aborts (SIGABRT) about one run in four. After an uncaught exception nothing
    is waited for: the launcher stops the other ranks."""
    if getattr(sys, "last_value", None) is not None:
        uneven.WATCH.stop()  # its thread must not outlive the interpreter (see stop)
        return
    reset(timeout=EXIT_WAIT_S)


def _sharded_backend() -> DistributedType | None:
    from .config import env_flag

    chosen = [kind for name, kind in SHARDED_BACKENDS.items() if env_flag(name)]
    if len(chosen) > 1:
        raise ValueError("ACCELERATE_USE_DEEPSPEED and ACCELERATE_USE_FSDP are both set; pick one")
    return chosen[0] if chosen else None


def _resolve(cpu: bool, init_kwargs: Mapping[str, Any]) -> ProcessState:
    world_size = _int_env("WORLD_SIZE", 1)
    sharded = _sharded_backend()
    if sharded is not None and "MASTER_ADDR" not in os.environ:
        raise ValueError(f"{sharded.value} needs a launcher: start the script with accel-run")
    if world_size <= 1 and sharded is None:
        device = _best_device(cpu)
        return ProcessState(1, 0, 0, device, DistributedType.NO, cpu)
    rank, local_rank = _int_env("RANK", 0), _int_env("LOCAL_RANK", 0)
    use_cuda = torch.cuda.is_available() and not cpu
    if use_cuda:
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if not dist.is_initialized():
        options = dict(init_kwargs)
        if TIMEOUT_ENV in os.environ and "timeout" not in options:
            options["timeout"] = timedelta(seconds=float(os.environ[TIMEOUT_ENV]))
        dist.init_process_group(options.pop("backend", "nccl" if use_cuda else "gloo"), **options)
    if dist.get_world_size() != world_size:
        raise RuntimeError(
            f"WORLD_SIZE={world_size} but the process group has {dist.get_world_size()} processes"
        )
    kind = sharded or (DistributedType.MULTI_GPU if use_cuda else DistributedType.MULTI_CPU)
    if world_size > 1:
        uneven.WATCH.start(rank)
    return ProcessState(world_size, rank, local_rank, device, kind, cpu)


def _best_device(cpu: bool) -> torch.device:
    if not cpu and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    if not cpu and torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def _int_env(name: str, default: int) -> int:
    value = os.environ.get(name, "")
    if not value:
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"environment variable {name}={value!r} is not an integer") from None
