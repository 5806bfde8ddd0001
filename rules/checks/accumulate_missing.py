"""ACL203 accumulate-missing."""

from __future__ import annotations

import libcst as cst

from accelify.rules.facts import Facts, name_role
from accelify.rules.rule import Invalid, Report, Rule, Severity
from accelify.transform.patterns import Role, callee_name, dotted_name, keyword_arg

# Names that show the script handles gradient sync itself, called or not (``ctx = model.no_sync``).
_ACCUMULATION_APIS = frozenset({"accumulate", "no_sync"})


class AccumulateMissing(Rule):
    """Gradient accumulation asked for but not done the Accelerate way.

    ## What it does
    Flags `Accelerator(gradient_accumulation_steps=N)` (N not 1) in a script that never enters
    `accelerator.accumulate(model)`, and a manual `if (step + 1) % N == 0: optimizer.step()` in a
    script that creates an `Accelerator` but does not use `accumulate()`. A modulo branch that
    holds the backward too trains every N-th batch (a GAN's generator step) and accumulates
    nothing: it is left alone.

    ## Why is this bad?
    Without `accumulate()`, `gradient_accumulation_steps` still divides every loss by N but the
    optimizer steps on every batch: a silent N-fold learning-rate cut. The manual modulo loop
    all-reduces gradients on every micro-batch instead of once per step, wasting most of the
    communication; under DDP the result is still right, but under DeepSpeed
    `accelerator.backward` steps the engine itself on every batch (its accumulation is the
    Accelerator's), so the modulo is ignored and the model steps every batch. A script that
    syncs by hand with `model.no_sync` (HF's autoregressive accumulation example) is left
    alone.

    ## Example
    ```python
    accelerator = Accelerator(gradient_accumulation_steps=4)
    for batch in loader:
        accelerator.backward(model(batch))
        optimizer.step()
    ```

    ## Use instead
    ```python
    accelerator = Accelerator(gradient_accumulation_steps=4)
    for batch in loader:
        with accelerator.accumulate(model):
            accelerator.backward(model(batch))
            optimizer.step()
            optimizer.zero_grad()
    ```
    """

    code = "ACL203"
    name = "accumulate-missing"
    severity = Severity.WARNING

    VALID = (
        "accelerator = Accelerator(gradient_accumulation_steps=4)\nfor b in dl:\n"
        "    with accelerator.accumulate(model):\n        optimizer.step()",
        "accelerator = Accelerator(gradient_accumulation_steps=1)\noptimizer.step()",
        # An evaluation script that shares its training script's arguments: nothing steps.
        "accelerator = Accelerator(gradient_accumulation_steps=args.accum)\n"
        "model = accelerator.prepare(model)\nfor batch in dl:\n    images = model(batch)\n",
        "optimizer = SGD(p)\nfor i, b in enumerate(dl):\n    if (i + 1) % 4 == 0:\n"
        "        optimizer.step()  # no Accelerator",
        "accelerator = Accelerator()\nfor i, b in enumerate(dl):\n    if i % 100 == 0:\n"
        "        print(i)",
        # A GAN's generator trained every third batch: its backward is in the branch too.
        "accelerator = Accelerator()\nfor i, b in enumerate(dl):\n    if i % 3 == 0:\n"
        "        accelerator.backward(g_loss(b))\n        opt_g.step()",
        # Syncs by hand: `no_sync` taken as a context factory, not called where it is named.
        "def main():\n    accelerator = Accelerator(gradient_accumulation_steps=accum)\n"
        "    for update in range(steps):\n        for i, batch in enumerate(micro_batches):\n"
        "            ctx = model.no_sync if i < len(micro_batches) - 1 else nullcontext\n"
        "            with ctx():\n                accelerator.backward(model(batch) * accum)\n"
        "        optimizer.step()",
    )
    INVALID = (
        Invalid(
            "accelerator = Accelerator(gradient_accumulation_steps=args.accum)\nfor b in dl:\n"
            "    optimizer.step()\n"
        ),
        Invalid(
            "accelerator = Accelerator()\noptimizer = AdamW(model.parameters())\n"
            "for i, b in enumerate(dl):\n    if (i + 1) % accum == 0:\n"
            "        optimizer.step()\n        optimizer.zero_grad()\n"
        ),
        Invalid(
            "class Trainer:\n    def fit(self):\n"
            "        self.accelerator = Accelerator(gradient_accumulation_steps=self.accum)\n"
            "        for batch in self.loader:\n"
            "            self.accelerator.backward(self.model(batch))\n"
            "            self.optimizer.step()\n"
        ),
        Invalid(
            "def main():\n    accelerator = Accelerator()\n    for epoch in range(3):\n"
            "        for step, batch in enumerate(train_dl):\n"
            "            accelerator.backward(model(batch) / accum)\n"
            "            if step % accum == 0 or step == len(train_dl) - 1:\n"
            "                opt.step()\n"
        ),
    )

    def __init__(self, facts: Facts, reports: list[Report]) -> None:
        super().__init__(facts, reports)
        self._uses_accumulate = False
        self._trains = False  # a backward pass or an optimizer step: an evaluation script has none
        self._steps_asked: list[cst.Arg] = []
        self._manual: list[cst.BaseExpression] = []
        self._modulo_ifs: list[cst.If] = []
        # Modulo branches that hold a backward train every N-th batch: no accumulation.
        self._every_nth: set[int] = set()

    def visit_Attribute(self, node: cst.Attribute) -> None:
        if node.attr.value in _ACCUMULATION_APIS:
            self._uses_accumulate = True

    def visit_Call(self, node: cst.Call) -> None:
        name = callee_name(node)
        if name in _ACCUMULATION_APIS:
            self._uses_accumulate = True
        elif name == "Accelerator":
            steps = keyword_arg(node, "gradient_accumulation_steps")
            if steps is not None and not (
                isinstance(steps.value, cst.Integer) and int(steps.value.value) <= 1
            ):
                self._steps_asked.append(steps)
        elif name == "backward":
            self._trains = True
            self._every_nth.update(id(branch.test) for branch in self._modulo_ifs)
        elif name == "step" and isinstance(node.func, cst.Attribute):
            receiver = node.func.value
            role = self.facts.role(receiver) or name_role(dotted_name(receiver))
            if role is not Role.OPTIMIZER:
                return
            self._trains = True
            if self._modulo_ifs and self._modulo_ifs[-1].test not in self._manual:
                self._manual.append(self._modulo_ifs[-1].test)

    def visit_If(self, node: cst.If) -> None:
        if _is_modulo_zero(node.test):
            self._modulo_ifs.append(node)

    def leave_If(self, node: cst.If) -> None:
        if self._modulo_ifs and self._modulo_ifs[-1] is node:
            self._modulo_ifs.pop()

    def leave_Module(self, node: cst.Module) -> None:
        if self._uses_accumulate or not self._trains:
            return
        for steps in self._steps_asked:
            self.report(
                steps,
                "`gradient_accumulation_steps` without `accelerator.accumulate(model)`: the loss "
                "is divided but the optimizer steps every batch",
            )
        if self.facts.creates_accelerator:
            for test in (t for t in self._manual if id(t) not in self._every_nth):
                self.report(
                    test,
                    "manual gradient accumulation all-reduces gradients on every batch, and "
                    "under DeepSpeed the engine steps on every batch whatever this test says; "
                    "use `Accelerator(gradient_accumulation_steps=N)` with "
                    "`accelerator.accumulate(model)`",
                )


def _is_modulo_zero(test: cst.BaseExpression) -> bool:
    """``(step + 1) % n == 0`` and friends, also ``... or step == len(loader) - 1``."""
    if isinstance(test, cst.BooleanOperation):
        return _is_modulo_zero(test.left) or _is_modulo_zero(test.right)
    if not isinstance(test, cst.Comparison) or len(test.comparisons) != 1:
        return False
    target = test.comparisons[0]
    left = test.left
    return (
        isinstance(target.operator, cst.Equal)
        and isinstance(target.comparator, cst.Integer)
        and target.comparator.value == "0"
        and isinstance(left, cst.BinaryOperation)
        and isinstance(left.operator, cst.Modulo)
    )
