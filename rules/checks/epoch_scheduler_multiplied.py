"""ACL209 epoch-scheduler-multiplied."""

from __future__ import annotations

import libcst as cst

from accelify.rules.facts import Facts, Loop
from accelify.rules.rule import Invalid, Report, Rule, Severity
from accelify.transform.patterns import Role, keyword_arg, method_call


class EpochSchedulerMultiplied(Rule):
    """A prepared scheduler stepped once per epoch, while the Accelerator steps it per process.

    ## What it does
    Flags `scheduler.step()` on a prepared scheduler in an epoch loop: a loop that does not step
    an optimizer itself but runs a training pass on each iteration (a loop that steps one, a
    function with such a loop, or a call handed a prepared DataLoader), when the `Accelerator`
    is created without `step_scheduler_with_optimizer=False` (or `split_batches=True`). A
    scheduler stepped in the loop that steps the optimizer is stepped per batch, whatever that
    loop iterates (a prepared loader, `skip_first_batches(...)`, `next(iterator)`, a range).

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
        for batch in loader:
            ...
            optimizer.step()
        scheduler.step()
    ```

    ## Use instead
    Leave the per-epoch scheduler out of `accelerator.prepare(...)`, or, when no prepared
    scheduler steps per batch:
    ```python
    accelerator = Accelerator(step_scheduler_with_optimizer=False)
    ```

    ## Fix safety
    No fix: `step_scheduler_with_optimizer=False` applies to every prepared scheduler, and would
    make one stepped per batch run N times too slowly; which scheduler to take out of `prepare`
    is the script's choice.
    """

    code = "ACL209"
    name = "epoch-scheduler-multiplied"
    severity = Severity.WARNING

    VALID = (
        "accelerator = Accelerator(step_scheduler_with_optimizer=False)\n"
        "model, opt, dl, sched = accelerator.prepare(model, opt, dl, sched)\n"
        "for epoch in range(3):\n    for b in dl:\n        opt.step()\n    sched.step()",
        "accelerator = Accelerator()\n"
        "model, opt, train_dl, sched = accelerator.prepare(model, opt, train_dl, sched)\n"
        "for epoch in range(3):\n    for batch in train_dl:\n        opt.step()\n"
        "        sched.step()",
        "accelerator = Accelerator(split_batches=True)\n"
        "opt, sched = accelerator.prepare(opt, sched)\nfor epoch in range(3):\n"
        "    for b in dl:\n        opt.step()\n    sched.step()",
        "accelerator = Accelerator()\nfor epoch in range(3):\n    for b in dl:\n"
        "        opt.step()\n    sched.step()  # not prepared",
        # HF's resume pattern: the batch loop runs over `skip_first_batches` or an alias of it.
        "accelerator = Accelerator()\n"
        "model, optimizer, train_dl, lr_scheduler = accelerator.prepare(\n"
        "    model, optimizer, train_dl, lr_scheduler)\n"
        "for epoch in range(3):\n    if resume_step:\n"
        "        active_dataloader = accelerator.skip_first_batches(train_dl, resume_step)\n"
        "    else:\n        active_dataloader = train_dl\n"
        "    for step, batch in enumerate(active_dataloader):\n"
        "        accelerator.backward(model(**batch).loss)\n"
        "        if step % 2 == 0:\n            optimizer.step()\n"
        "            lr_scheduler.step()\n            optimizer.zero_grad()",
        # An update loop over `next(iterator)`, inside an epoch loop.
        "accelerator = Accelerator()\n"
        "model, optimizer, dl, lr_scheduler = accelerator.prepare(model, optimizer, dl, "
        "lr_scheduler)\n"
        "for epoch in range(3):\n    it = iter(dl)\n    for update in range(100):\n"
        "        batch = next(it)\n        accelerator.backward(model(batch))\n"
        "        optimizer.step()\n        lr_scheduler.step()",
        # A loader that was never prepared (a webdataset loader), in a method.
        "class Trainer:\n    def fit(self):\n        accelerator = Accelerator()\n"
        "        unet, optimizer, lr_scheduler = accelerator.prepare(unet, optimizer, "
        "lr_scheduler)\n"
        "        for epoch in range(3):\n            for batch in self.web_loader:\n"
        "                with accelerator.accumulate(unet):\n"
        "                    accelerator.backward(unet(batch))\n"
        "                    optimizer.step()\n                    lr_scheduler.step()",
        # One step per call of a helper, stepped in the batch loop.
        "accelerator = Accelerator()\nopt, dl, sched = accelerator.prepare(opt, dl, sched)\n"
        "def train_step(batch, opt):\n    accelerator.backward(model(batch))\n"
        "    opt.step()\n\nfor batch in dl:\n    train_step(batch, opt)\n    sched.step()",
        # A step helper that loops over micro-batches is still one step per call.
        "accelerator = Accelerator()\nopt, dl, sched = accelerator.prepare(opt, dl, sched)\n"
        "def train_step(batch):\n    for micro in batch.chunk(4):\n"
        "        accelerator.backward(model(micro))\n    opt.step()\n\n"
        "for batch in dl:\n    train_step(batch)\n    sched.step()",
        # No training pass in the loop: unsure, silent.
        "accelerator = Accelerator()\nopt, sched = accelerator.prepare(opt, sched)\n"
        "for epoch in range(3):\n    sched.step()",
    )
    INVALID = (
        Invalid(
            "accelerator = Accelerator()\n"
            "model, opt, dl, lr_scheduler = accelerator.prepare(model, opt, dl, lr_scheduler)\n"
            "for epoch in range(3):\n    train(model, dl, opt)\n    lr_scheduler.step()\n"
        ),
        Invalid(
            "def main():\n    accelerator = Accelerator()\n"
            "    model, optimizer, dl, scheduler = accelerator.prepare(model, optimizer, dl, "
            "scheduler)\n"
            "    for epoch in range(3):\n        for batch in dl:\n"
            "            accelerator.backward(model(batch))\n            optimizer.step()\n"
            "        if epoch > 0:\n            scheduler.step()\n"
        ),
        Invalid(
            "class Trainer:\n    def train_epoch(self, optimizer):\n"
            "        for batch in self.loader:\n            optimizer.step()\n\n"
            "    def fit(self):\n        accelerator = Accelerator()\n"
            "        optim, sched = accelerator.prepare(self.optim, self.sched)\n"
            "        while True:\n            self.train_epoch(optim)\n            sched.step()\n"
        ),
    )

    def __init__(self, facts: Facts, reports: list[Report]) -> None:
        super().__init__(facts, reports)
        self._candidates: list[tuple[cst.Call, Loop]] = []

    def visit_Call(self, node: cst.Call) -> None:
        step = method_call(node, "step")
        loop = self.facts.innermost_loop()
        if step is None or loop is None:
            return
        receiver = step.func.value  # type: ignore[union-attr]
        if (
            self.facts.prepared(receiver) is not None
            and self.facts.role(receiver) is Role.SCHEDULER
        ):
            self._candidates.append((node, loop))

    def leave_Module(self, node: cst.Module) -> None:
        if any(_steps_per_call(call) for call in self.facts.accelerators.values()):
            return
        for call, loop in self._candidates:
            if self.facts.repeats_training(loop):
                self.report(
                    call,
                    "a prepared scheduler stepped per epoch advances once per process per call: "
                    "leave it out of `prepare`, or use `Accelerator(step_scheduler_with_optimizer"
                    "=False)` if no prepared scheduler steps per batch",
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
