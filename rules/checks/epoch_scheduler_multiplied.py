"""ACL209 epoch-scheduler-multiplied."""

from __future__ import annotations

import libcst as cst

from accelify.rules.facts import Facts
from accelify.rules.rule import Invalid, Report, Rule, Severity
from accelify.transform.patterns import Role, keyword_arg, method_call


class EpochSchedulerMultiplied(Rule):
    """A prepared scheduler stepped once per epoch, while the Accelerator steps it per process.

    ## What it does
    Flags `scheduler.step()` on a prepared scheduler inside a loop that is not a loop over a
    prepared DataLoader (typically `for epoch in range(...)`), when the `Accelerator` is created
    without `step_scheduler_with_optimizer=False` (or `split_batches=True`).

    ## Why is this bad?
    A prepared scheduler assumes it is stepped with the optimizer, once per batch, and steps the
    wrapped scheduler once per process each call, so that a schedule sized in batches lasts as
    long on N processes as on one. Stepped once per epoch, it advances N epochs per epoch: a
    `StepLR` decays N times too fast.

    ## Example
    ```python
    accelerator = Accelerator()
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    for epoch in range(epochs):
        train(model, loader, optimizer)
        scheduler.step()
    ```

    ## Use instead
    ```python
    accelerator = Accelerator(step_scheduler_with_optimizer=False)
    ```

    ## Fix safety
    No fix: the argument belongs to the `Accelerator(...)` call, which may be far away, and other
    schedulers in the script may step per batch.
    """

    code = "ACL209"
    name = "epoch-scheduler-multiplied"
    severity = Severity.WARNING

    VALID = (
        "accelerator = Accelerator(step_scheduler_with_optimizer=False)\n"
        "model, opt, dl, sched = accelerator.prepare(model, opt, dl, sched)\n"
        "for epoch in range(3):\n    sched.step()",
        "accelerator = Accelerator()\n"
        "model, opt, train_dl, sched = accelerator.prepare(model, opt, train_dl, sched)\n"
        "for epoch in range(3):\n    for batch in train_dl:\n        opt.step()\n"
        "        sched.step()",
        "accelerator = Accelerator(split_batches=True)\n"
        "opt, sched = accelerator.prepare(opt, sched)\nfor epoch in range(3):\n    sched.step()",
        "accelerator = Accelerator()\nfor epoch in range(3):\n    sched.step()  # not prepared",
    )
    INVALID = (
        Invalid(
            "accelerator = Accelerator()\n"
            "model, opt, dl, lr_scheduler = accelerator.prepare(model, opt, dl, lr_scheduler)\n"
            "for epoch in range(3):\n    train(model, dl, opt)\n    lr_scheduler.step()\n"
        ),
    )

    def __init__(self, facts: Facts, reports: list[Report]) -> None:
        super().__init__(facts, reports)
        self._loops = 0

    def visit_For(self, node: cst.For) -> None:
        self._loops += 1

    def leave_For(self, node: cst.For) -> None:
        self._loops -= 1

    def visit_Call(self, node: cst.Call) -> None:
        step = method_call(node, "step")
        if step is None or not self._loops or self.facts.loader_loops:
            return
        receiver = step.func.value  # type: ignore[union-attr]
        if self.facts.prepared(receiver) is None or self.facts.role(receiver) is not Role.SCHEDULER:
            return
        if any(_steps_per_call(call) for call in self.facts.accelerators.values()):
            return
        self.report(
            node,
            "a prepared scheduler stepped per epoch advances once per process: create the "
            "Accelerator with `step_scheduler_with_optimizer=False`",
        )


def _steps_per_call(accelerator: cst.Call) -> bool:
    """``Accelerator(step_scheduler_with_optimizer=False)`` or ``(split_batches=True)``."""
    with_optimizer = keyword_arg(accelerator, "step_scheduler_with_optimizer")
    split = keyword_arg(accelerator, "split_batches")
    return (
        with_optimizer is not None
        and isinstance(with_optimizer.value, cst.Name)
        and with_optimizer.value.value == "False"
    ) or (split is not None and isinstance(split.value, cst.Name) and split.value.value == "True")
