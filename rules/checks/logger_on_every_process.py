"""ACL105 logger-on-every-process."""

from __future__ import annotations

import libcst as cst

from accelify.rules.every_process import EveryProcessRule, Reach
from accelify.rules.rule import Invalid, Severity
from accelify.transform.patterns import callee_name, dotted_name

_LOGGERS = ("SummaryWriter", "Logger", "Writer")
# Loggers of the standard library write to a stream or a handler, not one run per process.
_NOT_RUNS = ("logging.", "csv.")


class LoggerOnEveryProcess(EveryProcessRule):
    """An experiment logger (`SummaryWriter`, `wandb.init`, a `...Logger`) opened by every process.

    ## What it does
    In a script that creates an `Accelerator`, flags `SummaryWriter(...)`, `wandb.init(...)` and
    other `...Logger(...)`/`...Writer(...)` constructors that run on every process.

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
    )
    INVALID = (
        Invalid(
            "def main():\n    accelerator = Accelerator()\n    writer = SummaryWriter('runs/exp')\n"
            "    for step in range(10):\n        writer.add_scalar('loss', 1.0, step)\n"
            "\n\nif __name__ == '__main__':\n    main()\n"
        ),
        Invalid(
            "accelerator = Accelerator()\n\n\ndef setup_logging(cfg):\n"
            "    wandb.init(project=cfg.project)\n\n\nsetup_logging(cfg)\n"
        ),
    )

    def visit_Call(self, node: cst.Call) -> None:
        last = callee_name(node) or ""
        if last != "init" and not last.endswith(_LOGGERS):  # cheap: most calls stop here
            return
        qualified = dotted_name(node.func) or ""
        if qualified == "wandb.init" or (
            last.endswith(_LOGGERS) and last != "getLogger" and not qualified.startswith(_NOT_RUNS)
        ):
            self.candidate(node, fixable=False)

    def flag(self, call: cst.Call, reach: Reach) -> None:
        what = "wandb run" if dotted_name(call.func) == "wandb.init" else callee_name(call)
        self.report(
            call,
            f"every process opens its own {what} here; open it, and log, on the main process "
            f"only (`if {reach.test()}:`)",
        )
