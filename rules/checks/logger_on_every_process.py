"""ACL105 logger-on-every-process."""

from __future__ import annotations

import libcst as cst

from accelify.rules.every_process import EveryProcessRule, Reach
from accelify.rules.facts import Facts
from accelify.rules.imports import ImportsRule
from accelify.rules.rule import Invalid, Report, Severity
from accelify.transform.neighbours import ProjectRuns
from accelify.transform.patterns import callee_name
from accelify.transform.trackers import LOGGERS, OPENER_NAMES, opens_a_run


class LoggerOnEveryProcess(EveryProcessRule, ImportsRule):
    """An experiment logger (`SummaryWriter`, `wandb.init`, a `...Logger`) opened by every process.

    ## What it does
    In a script that creates an `Accelerator`, flags `SummaryWriter(...)`, `wandb.init(...)` and
    the other `...Logger(...)`/`...Writer(...)` constructors of experiment-tracking libraries
    (TensorBoard, wandb, MLflow, Aim, Comet, ClearML, Neptune, DVCLive, Lightning's loggers) that
    run on every process, and a logger class imported from a module beside the script whose
    `__init__` builds one of those (read, never run), as accel-convert reports it. Any other
    logger the project defines is left alone: nothing shows it opens a run, and research code's
    `MetricLogger` all-reduces its meters, so guarding it would hang.

    ## Why is this bad?
    Each process opens its own run: N TensorBoard event files in one folder (the curves
    interleave), N wandb runs, each logging its own shard's numbers.

    ## Example
    ```python
    writer = SummaryWriter("runs/exp")
    ```

    ## Use instead
    ```python
    writer = SummaryWriter("runs/exp") if accelerator.is_main_process else None
    ```
    or `Accelerator(log_with="tensorboard")` with `accelerator.init_trackers(...)` and
    `accelerator.log(...)`, which log from the main process.
    """

    code = "ACL105"
    name = "logger-on-every-process"
    severity = Severity.WARNING

    VALID = (
        "accelerator = Accelerator()\nif accelerator.is_main_process:\n"
        "    writer = SummaryWriter('runs/exp')\n",
        "accelerator = Accelerator()\nlogger = logging.getLogger(__name__)\n"
        "handler = logging.FileHandler('x.log')\nout = csv.DictWriter(f, fields)\n",
        "writer = SummaryWriter('runs/exp')  # no Accelerator\n",
        "accelerator = Accelerator()\n"
        "writer = SummaryWriter('runs/exp') if accelerator.is_main_process else None\n",
        "import utils\naccelerator = Accelerator()\nmetric_logger = utils.MetricLogger()\n"
        "for x in metric_logger.log_every(loader, 10):\n    pass\n"
        "metric_logger.synchronize_between_processes()\n",
        "class RunLogger:\n    pass\n\n\naccelerator = Accelerator()\nlog = RunLogger()\n",
    )
    INVALID = (
        Invalid(
            "def main():\n    accelerator = Accelerator()\n    writer = SummaryWriter('runs/exp')\n"
            "    for step in range(10):\n        writer.add_scalar('loss', 1.0, step)\n"
            "\n\nif __name__ == '__main__':\n    main()\n"
        ),
        Invalid(
            "from lightning.pytorch.loggers import TensorBoardLogger\n"
            "accelerator = Accelerator()\nlogger = TensorBoardLogger('runs')\n"
        ),
        Invalid(
            "accelerator = Accelerator()\n\n\ndef setup_logging(cfg):\n"
            "    wandb.init(project=cfg.project)\n\n\nsetup_logging(cfg)\n"
        ),
        # At the top of the script, which every process runs, the accelerator made in main().
        Invalid(
            "import visdom\n\nviz = visdom.Visdom()\n\n\ndef main():\n"
            "    accelerator = Accelerator()\n\n\nif __name__ == '__main__':\n    main()\n"
        ),
        # Called by a CLI (fire), not in the file: it creates the accelerator, so every process
        # runs it.
        Invalid(
            "def train(**kwargs):\n    accelerator = Accelerator()\n"
            "    writer = SummaryWriter('runs/exp')\n\n\nif __name__ == '__main__':\n"
            "    fire.Fire()\n"
        ),
    )

    def __init__(self, facts: Facts, reports: list[Report]) -> None:
        super().__init__(facts, reports)
        self._project = ProjectRuns(facts.path)
        self._opens: dict[int, str] = {}  # id(call) -> the run it opens

    def visit_Call(self, node: cst.Call) -> None:
        last = callee_name(node) or ""
        known = last in OPENER_NAMES or last.endswith(LOGGERS)  # cheap: most calls stop here
        what = opens_a_run(self.names, node) if known else None
        what = what or self._project.opened(self.names.qualify(node.func))
        if what is not None:
            self._opens[id(node)] = what
            self.candidate(node, fixable=False)

    def flag(self, call: cst.Call, reach: Reach) -> None:
        self.report(
            call,
            f"every process opens its own {self._opens[id(call)]} here; open it, and log, on the "
            f"main process only (`if {reach.test()}:`)",
        )
