"""Who this process is and where it computes, resolved once from the environment.

The launcher contract is torch.distributed's: ``WORLD_SIZE``/``RANK``/``LOCAL_RANK`` set by
``torch.distributed.run`` (or ``accel-run``). More than one process always means a real process
group: HF Accelerate quietly trains N independent copies when ``torchrun`` starts it on a CPU-only
host without ``cpu=True``; here that case initialises gloo instead.
"""

from __future__ import annotations

import atexit
import os
import sys
import time
from dataclasses import dataclass, field
from enum import Enum

import torch
import torch.distributed as dist


class DistributedType(str, Enum):
    """The same names and values as HF Accelerate's enum, so scripts can compare either."""

    NO = "NO"
    MULTI_CPU = "MULTI_CPU"
    MULTI_GPU = "MULTI_GPU"
    DEEPSPEED = "DEEPSPEED"
    FSDP = "FSDP"


# The launcher's switches for a sharded backend (HF Accelerate's names); at most one may be set.
SHARDED_BACKENDS = {
    "ACCELERATE_USE_DEEPSPEED": DistributedType.DEEPSPEED,
    "ACCELERATE_USE_FSDP": DistributedType.FSDP,
}


@dataclass(frozen=True)
class ProcessState:
    """The immutable facts about this process, shared by every ``Accelerator`` in it."""

    num_processes: int
    process_index: int
    local_process_index: int
    device: torch.device
    distributed_type: DistributedType
    cpu: bool

    @property
    def is_main_process(self) -> bool:
        return self.process_index == 0

    @property
    def is_local_main_process(self) -> bool:
        return self.local_process_index == 0

    @property
    def use_distributed(self) -> bool:
        """More than one process, or a sharded backend (it runs a process group even on one)."""
        return self.num_processes > 1 or self.distributed_type in SHARDED_BACKENDS.values()


@dataclass
class StepState:
    """What the loaders, optimizers and schedulers of one ``Accelerator`` share during training.

    Plain attributes (no properties, no singletons) so reading them per step costs one lookup.
    """

    sync_gradients: bool = True
    end_of_dataloader: bool = False
    remainder: int = -1
    active_loaders: list = field(default_factory=list)


_resolved: dict[str, ProcessState] = {}  # "state" -> the one ProcessState of this process


def is_initialized() -> bool:
    """Whether an ``Accelerator`` (and so possibly a process group) already exists here."""
    return "state" in _resolved


def current() -> ProcessState | None:
    return _resolved.get("state")


def process_state(cpu: bool) -> ProcessState:
    """Resolve the state on the first call; later calls must agree on ``cpu``."""
    known = _resolved.get("state")
    if known is None:
        known = _resolved["state"] = _resolve(cpu)
    elif known.cpu != cpu:
        raise ValueError(
            f"an Accelerator with cpu={known.cpu} already exists in this process; "
            f"cannot create one with cpu={cpu}"
        )
    return known


def reset(timeout: float | None = None) -> None:
    """Forget the state and tear down the process group it started (``end_training``).

    With ``timeout``, give up waiting for the other ranks after that many seconds and leave the
    group to process exit."""
    known = _resolved.pop("state", None)
    distributed = known is not None and known.use_distributed and dist.is_initialized()
    if distributed and _all_out_of_collectives(known.num_processes, timeout):  # type: ignore[union-attr]
        dist.destroy_process_group()


def _all_out_of_collectives(world_size: int, timeout: float | None = None) -> bool:
    """Wait until every rank has returned from its last collective (False: timed out).

    A barrier returns on one rank while gloo may still be finishing it on another; destroying
    the group then kills that rank ("terminate called without an active exception", about one
    run in ten). The rendezvous store is not part of the group, so it can tell when all are out.
    """
    store = dist.distributed_c10d._get_default_store()
    arrived = store.add("accelify/end_training", 1)
    round_end = -(-arrived // world_size) * world_size  # end_training may be called again later
    deadline = None if timeout is None else time.monotonic() + timeout
    while store.add("accelify/end_training", 0) < round_end:
        if deadline is not None and time.monotonic() > deadline:
            return False
        time.sleep(0.005)
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
        return
    reset(timeout=EXIT_WAIT_S)


def _sharded_backend() -> DistributedType | None:
    from .config import env_flag

    chosen = [kind for name, kind in SHARDED_BACKENDS.items() if env_flag(name)]
    if len(chosen) > 1:
        raise ValueError("ACCELERATE_USE_DEEPSPEED and ACCELERATE_USE_FSDP are both set; pick one")
    return chosen[0] if chosen else None


def _resolve(cpu: bool) -> ProcessState:
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
        dist.init_process_group("nccl" if use_cuda else "gloo")
    if dist.get_world_size() != world_size:
        raise RuntimeError(
            f"WORLD_SIZE={world_size} but the process group has {dist.get_world_size()} processes"
        )
    kind = sharded or (DistributedType.MULTI_GPU if use_cuda else DistributedType.MULTI_CPU)
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
