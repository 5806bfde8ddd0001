"""ACL010 exit-on-own-value."""

from __future__ import annotations

from collections.abc import Callable

import libcst as cst

from accelify.rules.bound import Bound
from accelify.rules.facts import (
    ACCELERATOR_COLLECTIVES,
    DIST_COLLECTIVES,
    Facts,
    Loop,
    batches_walked,
    name_role,
)
from accelify.rules.rule import Invalid, Report, Rule, Severity
from accelify.transform.patterns import Role, callee_name, dotted_name
from accelify.transform.walk import nodes

# Calls whose result every process shares: a value passed through one is no longer its own.
_SHARED = ACCELERATOR_COLLECTIVES | DIST_COLLECTIVES


class ExitOnOwnValue(Rule):
    """A training loop left on a value each process computes from its own batch.

    ## What it does
    Flags `break` and `return` under an `if` whose test reads a value computed (in the same
    function) from a batch of a loader, such as its loss, without a `gather`/`reduce` between,
    inside a loop that trains; and a training `while` loop whose test reads such a value
    (`while loss.item() > 0.01:`), which decides per process how many passes it runs.

    ## Why is this bad?
    Each process trains on its own shard, so each has its own loss. When one process's loss
    passes the threshold first, it leaves the loop; the others go on to the next
    `accelerator.backward`, whose gradient all-reduce waits for the one that left: gloo fails
    with "Connection closed by peer", NCCL hangs until its timeout. On one process it works.

    ## Example
    ```python
    for batch in train_dataloader:
        loss = model(**batch).loss
        accelerator.backward(loss)
        optimizer.step()
        if loss.item() < 0.01:
            break
    ```

    ## Use instead
    ```python
    for batch in train_dataloader:
        loss = model(**batch).loss
        accelerator.backward(loss)
        optimizer.step()
        if accelerator.reduce(loss.detach(), "mean").item() < 0.01:  # the same on every process
            break
    ```
    """

    code = "ACL010"
    name = "exit-on-own-value"
    severity = Severity.ERROR

    VALID = (
        "accelerator = Accelerator()\nmodel, opt, dl = accelerator.prepare(model, opt, dl)\n"
        "for batch in dl:\n    loss = model(batch).mean()\n    accelerator.backward(loss)\n"
        "    opt.step()\n    mean = accelerator.reduce(loss.detach(), 'mean')\n"
        "    if mean.item() < 0.01:\n        break\n",
        # Reduced in the test itself: the advice, followed as written.
        "accelerator = Accelerator()\nmodel, opt, dl = accelerator.prepare(model, opt, dl)\n"
        "for batch in dl:\n    loss = model(batch).mean()\n    accelerator.backward(loss)\n"
        "    opt.step()\n    if accelerator.reduce(loss.detach(), 'mean').item() < 0.01:\n"
        "        break\n",
        "accelerator = Accelerator()\nmodel, opt, dl = accelerator.prepare(model, opt, dl)\n"
        "for step, batch in enumerate(dl):\n    accelerator.backward(model(batch).mean())\n"
        "    opt.step()\n    if step >= max_steps:\n        break\n",
        "accelerator = Accelerator()\nmodel, opt, dl = accelerator.prepare(model, opt, dl)\n"
        "loss = torch.tensor(1.0)\nwhile loss.item() > 0.05:\n    for batch in dl:\n"
        "        loss = model(batch).mean()\n        accelerator.backward(loss)\n"
        "        opt.step()\n    loss = accelerator.reduce(loss.detach(), 'mean')\n",
        # Evaluation: leaving a loop that does not train hangs nothing.
        "accelerator = Accelerator()\nmodel, dl = accelerator.prepare(model, dl)\n"
        "for batch in dl:\n    loss = model(batch).mean()\n    if loss.item() > 10:\n"
        "        break\n",
    )
    INVALID = (
        Invalid(
            "accelerator = Accelerator()\nmodel, opt, dl = accelerator.prepare(model, opt, dl)\n"
            "loss = torch.tensor(1.0)\nwhile loss.item() > 0.05:\n    for batch in dl:\n"
            "        loss = model(batch).mean()\n        accelerator.backward(loss)\n"
            "        opt.step()\n"
        ),
        Invalid(
            "accelerator = Accelerator()\nmodel, opt, dl = accelerator.prepare(model, opt, dl)\n"
            "for batch in dl:\n    loss = model(**batch).loss\n    accelerator.backward(loss)\n"
            "    opt.step()\n    if loss.item() < 0.01:\n        break\n"
        ),
        Invalid(
            "def train(accelerator, model, opt, loader):\n"
            "    model, opt, loader = accelerator.prepare(model, opt, loader)\n"
            "    for epoch in range(10):\n        for x, y in loader:\n"
            "            loss = loss_fn(model(x), y)\n            accelerator.backward(loss)\n"
            "            opt.step()\n            if torch.isnan(loss):\n                return\n"
        ),
        Invalid(
            "accelerator = Accelerator()\nmodel, opt, dl = accelerator.prepare(model, opt, dl)\n"
            "for epoch in range(10):\n    total = 0.0\n    for batch in dl:\n"
            "        loss = model(batch).mean()\n        accelerator.backward(loss)\n"
            "        opt.step()\n        total += loss.item()\n"
            "    if total / len(dl) < 0.05:\n        break\n"
        ),
    )

    def __init__(self, facts: Facts, reports: list[Report]) -> None:
        super().__init__(facts, reports)
        self._own = Bound(facts, self._is_own)
        self._exits: list[tuple[cst.If | cst.While, cst.BaseExpression, Loop, str]] = []
        self._whiles: list[tuple[cst.While, Loop]] = []

    def _is_own(self, value: cst.BaseExpression, named: Callable[[str], bool]) -> bool:
        """Computed from this process's batch, and not made common by a collective."""
        if isinstance(value, cst.Name):  # the common case, without a walk
            return named(value.value) or self.facts.batch_of(value) is not None
        found = list(nodes(value, (cst.Name, cst.Call)))
        if any(isinstance(n, cst.Call) and callee_name(n) in _SHARED for n in found):
            return False
        return any(
            isinstance(n, cst.Name) and (named(n.value) or self.facts.batch_of(n) is not None)
            for n in found
        )

    def visit_For(self, node: cst.For) -> None:
        """A loop over a loader handed in (``train(accelerator, model, loader)``) reads its
        batches too; the facts know such a loader by its name only."""
        walked = batches_walked(node.iter, node.target)
        if walked is None:
            return
        loader = walked[0]
        if (self.facts.role(loader) or name_role(dotted_name(loader))) is Role.DATALOADER:
            self._own.mark(walked[1])

    def leave_Assign(self, node: cst.Assign) -> None:
        if self._own.here() or self.facts.loader_loops:  # only a batch starts what is own
            self._own.assign(node)

    def leave_AugAssign(self, node: cst.AugAssign) -> None:
        if self._own.here() or self.facts.loader_loops:
            self._own.assign(node)

    def visit_If(self, node: cst.If) -> None:
        loop = self.facts.innermost_loop()
        if loop is not None and _leaves(node.body):
            self._note_exit(node, loop)

    def visit_While_body(self, node: cst.While) -> None:
        loop = self.facts.innermost_loop()  # the facts open this loop's record first
        if loop is not None and loop.node is node:
            self._whiles.append((node, loop))

    def leave_While(self, node: cst.While) -> None:
        """``while loss.item() > 0.01:``: the test is read again after each pass of the body,
        so it is judged on what the body binds."""
        if not self._whiles or self._whiles[-1][0] is not node:
            return
        self._note_exit(node, self._whiles.pop()[1])

    def _note_exit(self, node: cst.If | cst.While, loop: Loop) -> None:
        """Remember ``node`` when its test reads this process's own value."""
        read = self._own_read(node.test)
        if read is not None:
            self._exits.append((node, read, loop, self.facts.accelerator_here() or ""))

    def _own_read(self, test: cst.BaseExpression) -> cst.Name | None:
        """The first name ``test`` reads that holds this process's own value, outside the
        collectives it calls itself (``accelerator.reduce(loss, "mean") < t`` is shared)."""
        shared = {
            id(n)
            for call in nodes(test, cst.Call)
            if callee_name(call) in _SHARED
            for n in nodes(call, cst.Name)
        }
        return next(
            (n for n in nodes(test, cst.Name) if id(n) not in shared and self._own.holds(n)),
            None,
        )

    def leave_Module(self, node: cst.Module) -> None:
        for test, read, loop, accelerator in self._exits:
            if not (loop.trains or loop.inner_trains):
                continue
            shared = (
                f"`{accelerator}.reduce(..., 'mean')`" if accelerator else "a `reduce`/`gather`"
            )
            self.report(
                test.test,
                f"`{dotted_name(read)}` comes from this process's own batch: one process can "
                "leave the training loop here while the others wait for it in the next "
                f"gradient all-reduce (a hang); decide on {shared}, which every process shares",
            )


def _leaves(body: cst.BaseSuite) -> bool:
    """Whether ``body`` leaves the loop or function: a ``break`` or ``return`` of its own."""
    lines = body.body if isinstance(body, cst.IndentedBlock) else [body]
    return any(
        isinstance(small, cst.Break | cst.Return)
        for line in lines
        if isinstance(line, cst.SimpleStatementLine | cst.SimpleStatementSuite)
        for small in line.body
    )
