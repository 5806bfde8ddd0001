"""HF Accelerate's ``accelerate.logging``: a logger that knows which process it runs in.

``from accelerate.logging import get_logger`` becomes ``from accelify.runtime.logging import
get_logger``. The package imports are absolute, so this module never hides the standard
``logging`` from the rest of ``accelify.runtime`` (a test checks it).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, MutableMapping
from typing import Any

from . import state


class MultiProcessAdapter(logging.LoggerAdapter):
    """A logger whose calls take ``main_process_only`` (default ``True``: log on the main process
    only) and ``in_order`` (log on every process, one process after the other), as HF's adapter
    of this name does. Messages start with ``[RANK i]``."""

    def __init__(self, logger: logging.Logger, extra: Mapping[str, object] | None = None) -> None:
        super().__init__(logger, extra or {})
        self._warned: set[tuple] = set()

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, Any]:
        msg, kwargs = super().process(msg, kwargs)
        kwargs.setdefault("stacklevel", 2)  # report the caller's line, not this module's
        return f"[RANK {_process_state().process_index}] {msg}", kwargs

    def log(self, level: int, msg: Any, *args: Any, **kwargs: Any) -> None:
        """``Logger.log`` on the processes chosen; ``in_order`` waits for every process, so all
        of them must make the call (``main_process_only`` is then ignored)."""
        known = _process_state()
        main_process_only = kwargs.pop("main_process_only", True)
        in_order = kwargs.pop("in_order", False)
        if not self.isEnabledFor(level):
            return
        msg, kwargs = self.process(msg, kwargs)
        if not in_order:
            if known.is_main_process or not main_process_only:
                self.logger.log(level, msg, *args, **kwargs)
            return
        for index in range(known.num_processes):
            if index == known.process_index:
                self.logger.log(level, msg, *args, **kwargs)
            known.wait_for_everyone()

    def warning_once(self, *args: Any, **kwargs: Any) -> None:
        """``warning``, but a call with the same arguments as an earlier one logs nothing.

        Reports the caller's line (HF's reports its own, one frame short)."""
        key = (args, tuple(sorted(kwargs.items())))
        if key not in self._warned:
            self._warned.add(key)
            self.warning(*args, **{"stacklevel": 3, **kwargs})


def get_logger(name: str, log_level: str | None = None) -> MultiProcessAdapter:
    """HF's ``get_logger``: the logger ``name`` wrapped in a :class:`MultiProcessAdapter`.

    ``log_level`` (else the ``ACCELERATE_LOG_LEVEL`` environment variable) sets the level of this
    logger and of the root logger, as HF does; with neither, levels are left alone.
    """
    if log_level is None:
        log_level = os.environ.get("ACCELERATE_LOG_LEVEL")
    logger = logging.getLogger(name)
    if log_level is not None:
        logger.setLevel(log_level.upper())
        logging.getLogger().setLevel(log_level.upper())
    return MultiProcessAdapter(logger, {})


def _process_state() -> state.ProcessState:
    known = state.current()
    if known is None:
        raise RuntimeError(
            "You must initialize the accelerate state by calling either `PartialState()` or "
            "`Accelerator()` before using the logging utility."
        )
    return known
