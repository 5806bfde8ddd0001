"""Experiment tracking: HF Accelerate's ``log_with`` trackers, each a thin class over its library.

A tracker's library is imported only when the tracker starts, never vendored. ``log_with`` is
checked when the ``Accelerator`` is built: an unknown name, or a tracker that needs a logging
directory without one, fails before training. As in HF Accelerate, a tracker whose library is not
installed is left out (a script written for a machine that has wandb still runs where it has not),
but with a warning that names the pip package, where HF logs it at debug level.
"""

from __future__ import annotations

import importlib.util
import os
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

from .base import GeneralTracker, LoggerType
from .libraries import (
    AimTracker,
    ClearMLTracker,
    CometMLTracker,
    DVCLiveTracker,
    MLflowTracker,
    SwanLabTracker,
    TensorBoardTracker,
    TrackioTracker,
    WandBTracker,
)

__all__ = ["GeneralTracker", "LoggerType", "register_tracker_class"]

_BUILT_IN: tuple[type[GeneralTracker], ...] = (
    AimTracker,
    CometMLTracker,
    MLflowTracker,
    TensorBoardTracker,
    WandBTracker,
    ClearMLTracker,
    DVCLiveTracker,
    SwanLabTracker,
    TrackioTracker,
)
_REGISTRY: dict[str, type[GeneralTracker]] = {cls.name: cls for cls in _BUILT_IN}


LogWith = str | LoggerType | GeneralTracker | Sequence[str | LoggerType | GeneralTracker] | None


def register_tracker_class(tracker_class: type[GeneralTracker]) -> None:
    """Let ``log_with`` name a custom tracker class (built per ``init_trackers`` call with the
    project name, the logging directory when it requires one, and its ``init_kwargs``)."""
    if not (isinstance(tracker_class, type) and issubclass(tracker_class, GeneralTracker)):
        raise ValueError(
            f"`tracker_class` must be a subclass of `GeneralTracker`, not {tracker_class}"
        )
    if not getattr(tracker_class, "name", None):
        raise ValueError("The tracker class to register must define a non-empty `name` attribute.")
    if not hasattr(tracker_class, "requires_logging_directory"):
        raise ValueError(
            "The tracker class to register must define a `requires_logging_directory` attribute."
        )
    if tracker_class.name in _REGISTRY:
        warnings.warn(
            f"a tracker named {tracker_class.name!r} is already registered; "
            f"{tracker_class.__name__} replaces it",
            stacklevel=2,
        )
    _REGISTRY[tracker_class.name] = tracker_class


def installed(tracker_class: type[GeneralTracker]) -> bool:
    """Whether one of the modules the tracker needs is importable (a folder that merely shares
    its name, such as the ``./wandb`` a run leaves behind, does not count)."""
    if not tracker_class.modules:
        return True
    return any(_importable(module) for module in tracker_class.modules)


def select(log_with: LogWith, logging_dir: str | os.PathLike | None) -> list[str | GeneralTracker]:
    """Check ``log_with`` when the ``Accelerator`` is built: names of installed trackers (``"all"``
    expands to every installed built-in) and custom ``GeneralTracker`` instances, in order.

    An unknown name, or a tracker that needs a logging directory without one, is an error here
    rather than a surprise at ``init_trackers``; one whose library is missing is left out.
    """
    if log_with is None:
        return []
    wanted = list(log_with) if isinstance(log_with, list | tuple) else [log_with]
    chosen: list[str | GeneralTracker] = []
    for item in wanted:
        if isinstance(item, GeneralTracker):
            chosen.append(item)
            continue
        name = str(item)
        if name == LoggerType.ALL.value:
            names = [cls.name for cls in _BUILT_IN if installed(cls)]
            if not names:
                warnings.warn(
                    f"log_with={log_with!r}: no tracker library is installed", stacklevel=3
                )
        else:
            names = _installed(name)
        chosen += [name for name in names if name not in chosen]
    for name in chosen:
        if (
            isinstance(name, str)
            and _REGISTRY[name].requires_logging_directory
            and logging_dir is None
        ):
            raise ValueError(
                f"Logging with `{name}` requires a `logging_dir`: pass project_dir=... or "
                "project_config=ProjectConfiguration(logging_dir=...) to the Accelerator"
            )
    return chosen


def start(
    chosen: Sequence[str | GeneralTracker],
    project_name: str,
    logging_dir: str | os.PathLike | None,
    config: dict | None = None,
    init_kwargs: Mapping[str, dict] | None = None,
) -> list[GeneralTracker]:
    """Build the named trackers (custom instances come as they are), start each, then store
    ``config`` in each; ``init_kwargs`` maps a tracker's name to its constructor's options."""
    init_kwargs = init_kwargs or {}
    trackers = [
        item
        if isinstance(item, GeneralTracker)
        else _build(_REGISTRY[item], project_name, logging_dir, init_kwargs.get(item, {}))
        for item in chosen
    ]
    for tracker in trackers:
        tracker.start()
    if config is not None:
        for tracker in trackers:
            tracker.store_init_configuration(config)
    return trackers


def find(trackers: Sequence[GeneralTracker], name: str, unwrap: bool) -> Any:
    """``get_tracker``: the tracker called ``name`` (its library object with ``unwrap``); a blank
    tracker whose methods do nothing when there are none (the other processes)."""
    if not trackers:
        return GeneralTracker(_blank=True)
    for tracker in trackers:
        if tracker.name == name:
            return tracker.tracker if unwrap else tracker
    raise ValueError(f"{name} is not an available tracker stored inside the `Accelerator`.")


def _build(
    tracker_class: type[GeneralTracker],
    project_name: str,
    logging_dir: str | os.PathLike | None,
    options: dict,
) -> GeneralTracker:
    if tracker_class.requires_logging_directory:
        return tracker_class(project_name, logging_dir, **options)
    return tracker_class(project_name, **options)


def _installed(name: str) -> list[str]:
    """``[name]``, or ``[]`` with a warning when its library is not installed."""
    tracker_class = _REGISTRY.get(name)
    if tracker_class is None:
        raise ValueError(
            f"Unsupported logging capability: {name}. Choose between {LoggerType.list()}, a "
            "name given to register_tracker_class, or a GeneralTracker instance"
        )
    if installed(tracker_class):
        return [name]
    package = tracker_class.pip_package
    warnings.warn(
        f"log_with={name!r} is left out: the {package} package is not installed "
        f"(pip install {package})",
        stacklevel=4,
    )
    return []


def _importable(module: str) -> bool:
    try:
        spec = importlib.util.find_spec(module)
    except ValueError:  # in sys.modules without a spec
        return True
    return spec is not None and spec.origin is not None
