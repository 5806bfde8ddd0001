"""Configure torch's elastic agent for a launch, run it, and turn a failure into a short report.

The agent (``torch.distributed.launcher.api``) starts, watches, stops and restarts the workers;
this module only decides its settings and what the user sees when a worker dies.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import signal
import socket
import tempfile
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from accelify.runtime.launch.bootstrap import LAUNCHER_PID
from accelify.runtime.launch.config import DEFAULT_PORT, ConfigError, Settings, child_env
from accelify.runtime.launch.failures import FailureReport, collect, describe

if TYPE_CHECKING:
    from torch.distributed.launcher.api import LaunchConfig

BOOTSTRAP = str(Path(__file__).with_name("bootstrap.py"))
SELFTEST = str(Path(__file__).with_name("selftest.py"))  # what `accel-run test` runs
_ELASTIC_LOGGER = "torch.distributed.elastic"


def launch_config(settings: Settings, start_method: str, log_dir: str) -> LaunchConfig:
    """The elastic agent's settings for ``settings`` (shared by accel-run and notebook_launcher)."""
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std
    from torch.distributed.launcher.api import LaunchConfig

    backend, endpoint, configs = _rendezvous(settings)
    return LaunchConfig(
        min_nodes=settings.num_machines,
        max_nodes=settings.num_machines,
        nproc_per_node=settings.processes_per_machine,
        run_id="accelify" if settings.num_machines > 1 else uuid.uuid4().hex,
        role=settings.role,
        rdzv_backend=backend,
        rdzv_endpoint=endpoint,
        rdzv_configs={**settings.rdzv_conf, **configs},
        max_restarts=settings.max_restarts,
        monitor_interval=settings.monitor_interval,
        start_method=start_method,
        logs_specs=DefaultLogsSpecs(log_dir=log_dir, tee=Std.from_str(settings.tee)),
    )


def _log_dir(settings: Settings) -> contextlib.AbstractContextManager[str]:
    """Where the agent writes each rank's error file (and, with --tee, its output).

    ``--log-dir`` keeps them: each run gets its own folder inside, so an earlier run's error
    files are never mistaken for this one's."""
    if settings.log_dir is None:
        return tempfile.TemporaryDirectory(prefix="accel-run-")
    Path(settings.log_dir).mkdir(parents=True, exist_ok=True)
    return contextlib.nullcontext(tempfile.mkdtemp(prefix="accel-run-", dir=settings.log_dir))


def _rendezvous(settings: Settings) -> tuple[str, str, dict[str, Any]]:
    """Pick the rendezvous: a fresh free port on one machine, else machine 0's address."""
    port = settings.main_process_port
    if settings.num_machines == 1 and not port:
        # torchrun --standalone: the agent's store binds a free port itself, so there is no race.
        return "c10d", "127.0.0.1:0", {}
    port = port or DEFAULT_PORT
    address = settings.main_process_ip or "127.0.0.1"
    if settings.machine_rank == 0:
        _check_port_free(port)
    if settings.num_machines > 1 and settings.rdzv_backend == "static":
        return "static", f"{address}:{port}", {"rank": settings.machine_rank}
    return "c10d", f"{address}:{port}", {}


def _check_port_free(port: int) -> None:
    """A busy port is a usage error (exit 2) before any worker starts, not a hang or a traceback."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind(("", port))
        except OSError as err:
            if err.errno != errno.EADDRINUSE:
                raise
            raise ConfigError(_port_busy(port)) from None


def _port_busy(port: int) -> str:
    return (
        f"port {port} is already in use; pick another (--main-process-port, or use_port in "
        "notebook_launcher), or 0 on a single machine to get a free one"
    )


@contextlib.contextmanager
def patched_environ(env: Mapping[str, str]) -> Iterator[None]:
    """Set ``env`` for the workers the agent starts (they inherit it), then put it back."""
    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextlib.contextmanager
def quiet_agent(debug: bool) -> Iterator[None]:
    """Keep the agent's own log lines (restarts, SIGTERMs, failure boxes) out of the user's way."""
    # torch gives each elastic module's logger its own level, so the parent's level is not enough.
    names = [_ELASTIC_LOGGER, *logging.root.manager.loggerDict]
    loggers = [logging.getLogger(n) for n in names if n.startswith(_ELASTIC_LOGGER)]
    levels = [logger.level for logger in loggers]
    if not debug:
        for logger in loggers:
            logger.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


def run_elastic(
    settings: Settings,
    entrypoint: Callable[..., Any] | str,
    args: list[Any],
    start_method: str,
    prog: str,
) -> FailureReport | None:
    """Run the workers under the elastic agent; ``None`` when all succeeded.

    Every failure the agent reports (a worker that raised, exited non-zero or was killed; the agent
    stops the others itself) comes back as a :class:`FailureReport`; a busy rendezvous port as a
    :class:`ConfigError`.
    """
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous import RendezvousError
    from torch.distributed.launcher.api import elastic_launch

    env = child_env(settings) | {LAUNCHER_PID: str(os.getpid())}
    if settings.max_restarts:
        # Workers of a restarted attempt would reuse the agent's store and read the dead
        # attempt's addresses (torch 2.13 hangs or fails in init_process_group); with this, each
        # attempt's rank 0 hosts a fresh store. Only the c10d rendezvous honours it.
        env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    with (
        _log_dir(settings) as log_dir,
        patched_environ(env),
        quiet_agent(settings.debug),
    ):
        config = launch_config(settings, start_method, log_dir)
        try:
            elastic_launch(config, entrypoint)(*args)
        except ChildFailedError as err:
            return describe(collect(err, log_dir), prog)
        except SignalException as err:
            sig = signal.Signals(err.sigval)
            return FailureReport(f"{prog}: stopped by {sig.name}", 128 + sig.value)
        except Exception as err:
            # The port was taken between our check and the static store's bind (a c10d agent
            # would instead wait on it as a client, until the rendezvous timeout).
            if settings.main_process_port and "EADDRINUSE" in f"{err!r} {err.__cause__!r}":
                raise ConfigError(_port_busy(settings.main_process_port)) from None
            if isinstance(err, RendezvousError):  # e.g. the other machines never joined
                return FailureReport(f"{prog}: rendezvous failed: {err}", 1)
            raise
    return None
