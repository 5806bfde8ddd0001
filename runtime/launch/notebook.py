"""``notebook_launcher``: run a function on several processes from a notebook, by forking
(``debug_launcher``: the same on CPU processes).

Same elastic agent and failure report as accel-run; what differs is that a notebook's process
outlives the launch, so everything that would make the forked workers fail (CUDA already
initialised, an Accelerator already created) is refused *before* forking, with what to move.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Sequence
from typing import Any

from accelify.runtime.launch import config as cfg
from accelify.runtime.launch.bootstrap import die_with_the_launcher, record_error
from accelify.runtime.launch.run import patched_environ, run_elastic

_RESTART = "then restart the kernel and call {} again"


def notebook_launcher(  # noqa: PLR0917 (HF Accelerate's signature, positional args included)
    function: Callable[..., Any],
    args: Sequence[Any] = (),
    num_processes: int | None = None,
    mixed_precision: str = "no",
    use_port: str = "29500",
    master_addr: str = "127.0.0.1",
    node_rank: int = 0,
    num_nodes: int = 1,
    rdzv_backend: str = "static",
    rdzv_endpoint: str = "",
    rdzv_conf: dict[str, Any] | None = None,
    rdzv_id: str = "none",
    max_restarts: int = 0,
    monitor_interval: float = 0.1,
    log_line_prefix_template: str | None = None,
) -> None:
    """Run ``function(*args)`` on ``num_processes`` processes per node (HF Accelerate's API).

    ``num_processes`` None means one per GPU, or a plain call on a CPU-only machine; so does 1.
    ``use_port`` "0" picks a free port (single node); ``rdzv_endpoint`` "HOST:PORT" stands for
    ``master_addr`` and ``use_port``. Raises ``RuntimeError`` (also torch's
    ``ChildFailedError``, as HF's launcher raises) with the failing rank's traceback
    first when a worker fails. ``rdzv_id`` and ``log_line_prefix_template`` are refused: the
    agent here names its runs itself and prefixes nothing.
    """
    gpus = cfg.gpu_count()
    try:
        _refuse_unsupported(
            rdzv_id=(rdzv_id, "none"), log_line_prefix_template=(log_line_prefix_template, None)
        )
        if rdzv_endpoint:
            master_addr, _, use_port = rdzv_endpoint.rpartition(":")
        per_node = cfg.positive_int(max(gpus, 1) if num_processes is None else num_processes)
        given = {
            "num_processes": per_node * num_nodes,
            "num_machines": num_nodes,
            "machine_rank": node_rank,
            "mixed_precision": mixed_precision,
            "main_process_ip": master_addr,
            "main_process_port": use_port,
            "max_restarts": max_restarts,
            "monitor_interval": monitor_interval,
            "rdzv_backend": rdzv_backend,
            "rdzv_conf": ",".join(f"{key}={value}" for key, value in (rdzv_conf or {}).items()),
            "use_cpu": gpus == 0,
        }
    except ValueError as err:
        raise ValueError(f"notebook_launcher: {err}") from None
    _launch("notebook_launcher", function, args, given)


def debug_launcher(
    function: Callable[..., Any], args: Sequence[Any] = (), num_processes: int = 2
) -> None:
    """Run ``function(*args)`` on ``num_processes`` CPU processes (HF Accelerate's API), to try
    distributed code on a machine without GPUs; the same launch as :func:`notebook_launcher`,
    on a free port."""
    given = {"num_processes": num_processes, "use_cpu": True, "main_process_port": "0"}
    _launch("debug_launcher", function, args, given)


def _launch(
    caller: str, function: Callable[..., Any], args: Sequence[Any], given: dict[str, Any]
) -> None:
    """Fork the workers that the launcher settings ``given`` describe (one process: a plain
    call) and raise with the failing rank's report when one fails."""
    try:
        flags = {key: cfg.parse_value(key, value) for key, value in given.items()}
        settings = cfg.resolve({}, flags, cfg.gpu_count)
    except ValueError as err:
        raise ValueError(f"{caller}: {err}") from None
    if settings.num_processes == 1:
        with patched_environ(cfg.child_env(settings)):
            function(*args)
        return
    _refuse_unforkable_parent(caller)
    report = run_elastic(settings, _recorded(function), list(args), "fork", caller)
    if report is not None:
        raise _worker_failed_type()(caller, report.text)


@functools.cache
def _worker_failed_type() -> type[RuntimeError]:
    """``RuntimeError`` that is also torch's ``ChildFailedError``, which HF's launcher raises
    and notebooks catch; built on first use so importing this module does not import torch."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    class WorkerFailed(RuntimeError, ChildFailedError):
        def __init__(self, caller: str, text: str) -> None:
            RuntimeError.__init__(self, text)
            self.name, self.failures = caller, {}

    return WorkerFailed


def _refuse_unsupported(**given: tuple[Any, Any]) -> None:
    """``ValueError`` naming the first option set to anything but its default."""
    for name, (value, default) in given.items():
        if value != default:
            raise ValueError(f"{name}={value!r} is not supported; leave it at {default!r}")


def _recorded(function: Callable[..., Any]) -> Callable[..., Any]:
    """``function`` recording its exception the way accel-run's workers do (see bootstrap.py).

    It exits instead of re-raising so torch's ``@record`` around it keeps that file as written.
    """

    @functools.wraps(function)
    def worker(*args: Any) -> Any:
        die_with_the_launcher()
        try:
            return function(*args)
        except Exception as err:
            if not record_error(err):
                raise
            sys.exit(1)

    return worker


def _refuse_unforkable_parent(caller: str) -> None:
    """Say what to move into the function now, instead of letting every forked worker crash."""
    import torch

    from accelify.runtime.state import is_initialized

    if is_initialized():
        raise RuntimeError(
            f"{caller}: an Accelerator already exists in this process; create it inside "
            f"the function you launch, not in the notebook, {_RESTART.format(caller)}"
        )
    if torch.cuda.is_initialized():
        raise RuntimeError(
            f"{caller}: CUDA is already initialised in this process, so forked workers "
            "could not use it. Move every call that touches the GPU (`.cuda()`, `.to('cuda')`, "
            "`torch.cuda.*` allocations or seeding, building the model on the GPU) into the "
            f"function you launch, {_RESTART.format(caller)}"
        )
