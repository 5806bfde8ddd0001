"""Which constructor opens an experiment run of its own: what the converter reports and the
linter flags (ACL105) when every process runs it.

``wandb.init``, ``visdom.Visdom``, ``tensorboard_logger.configure`` and the ``...Logger``/
``...Writer`` classes of the experiment-tracking libraries each open a run (an event file, a
tracked run, a plot stream), so N processes open N. A logger the project writes itself is not
known to: research code's ``MetricLogger`` wraps the data loader and all-reduces
its meters, and putting it on the main process only would leave the other processes out of that
collective (a hang) and out of their data.
"""

from __future__ import annotations

import libcst as cst

from accelify.transform.names import Names
from accelify.transform.patterns import dotted_name

LOGGERS = ("SummaryWriter", "Logger", "Writer")
# The packages whose loggers and writers open runs.
TRACKING = (
    "aim",
    "clearml",
    "comet_ml",
    "dvclive",
    "lightning",
    "lightning_fabric",
    "mlflow",
    "neptune",
    "pytorch_lightning",
    "tensorboard",
    "tensorboardX",
    "tensorflow.summary",
    "torch.utils.tensorboard",
    "wandb",
)


def opens_a_run(names: Names, call: cst.Call) -> str | None:
    """What run ``call`` opens ("wandb run", "SummaryWriter"), or None.

    A bare name the file neither imports nor defines (a snippet) is judged by its last part, a
    dotted one by its module."""
    dotted = dotted_name(call.func)
    if dotted is None:
        return None
    qualified = names.qualify(call.func)
    if qualified is None and "." not in dotted:
        return None if dotted in names.defined or not _logger(dotted) else dotted
    return tracked_run(qualified or dotted)


# Calls that open a run whatever their name says, and their last parts (a cheap first test).
OPENERS = {
    "wandb.init": "wandb run",
    "visdom.Visdom": "visdom connection",
    "tensorboard_logger.configure": "tensorboard_logger run",
}
OPENER_NAMES = frozenset(qualified.rsplit(".", 1)[1] for qualified in OPENERS)


def tracked_run(qualified: str) -> str | None:
    """What run the call of ``qualified`` (``torch.utils.tensorboard.SummaryWriter``) opens."""
    if qualified in OPENERS:
        return OPENERS[qualified]
    last = qualified.rsplit(".", 1)[-1]
    tracking = qualified.startswith(tuple(f"{p}." for p in TRACKING))
    return last if tracking and _logger(last) else None


def _logger(name: str) -> bool:
    return name.endswith(LOGGERS) and name != "getLogger"
