"""What every tracker is: HF Accelerate's ``GeneralTracker`` contract and ``LoggerType`` names."""

from __future__ import annotations

import enum
import functools
from collections.abc import Callable
from typing import Any

from .. import state


class LoggerType(enum.Enum):
    """The built-in trackers by name (HF's ``accelerate.utils.LoggerType``); ``"all"`` is every
    installed one."""

    ALL = "all"
    AIM = "aim"
    TENSORBOARD = "tensorboard"
    WANDB = "wandb"
    TRACKIO = "trackio"
    COMETML = "comet_ml"
    MLFLOW = "mlflow"
    CLEARML = "clearml"
    DVCLIVE = "dvclive"
    SWANLAB = "swanlab"

    def __str__(self) -> str:
        return self.value

    @classmethod
    def list(cls) -> list[str]:
        return [member.value for member in cls]


def on_main_process(method: Callable) -> Callable:
    """Run a tracker method on the main process only when the tracker's ``main_process_only`` is
    set, read at call time so a subclass (or instance) may change it."""

    @functools.wraps(method)
    def wrapper(self: GeneralTracker, *args: Any, **kwargs: Any) -> Any:
        if getattr(self, "main_process_only", False) and not state.PartialState().is_main_process:
            return None
        return method(self, *args, **kwargs)

    return wrapper


class GeneralTracker:
    """The base of every tracker, built-in or the user's (HF's contract).

    A subclass defines ``name``, ``requires_logging_directory`` and a ``tracker`` property (the
    library's own run or writer), and overrides what it needs of ``start``,
    ``store_init_configuration``, ``log`` and ``finish``. With ``main_process_only`` (the default)
    the ``Accelerator`` calls it on the main process only.
    """

    main_process_only = True
    # What the built-in trackers need: the modules (any one will do) and the pip package.
    modules: tuple[str, ...] = ()
    pip_package = ""

    def __init__(self, _blank: bool = False) -> None:
        """``_blank`` builds the stand-in ``get_tracker`` returns on the other processes."""
        if _blank:
            return
        missing = [
            f"`{attribute}`"
            for attribute in ("name", "requires_logging_directory", "tracker")
            if attribute not in dir(self)
        ]
        if missing:
            raise NotImplementedError(
                "The implementation for this tracker class is missing the following required "
                f"attributes. Please define them in the class definition: {', '.join(missing)}"
            )

    def start(self) -> None:
        """Open the run; called by ``init_trackers``, after the process group exists."""

    def store_init_configuration(self, values: dict) -> None:
        """Record the run's hyperparameters."""

    def log(self, values: dict, step: int | None = None, **kwargs: Any) -> None:
        """Record ``values`` (numbers, strings, ...) at ``step``."""

    def finish(self) -> None:
        """Close the run (``end_training``)."""
