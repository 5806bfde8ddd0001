"""ACL108 load-state-before-prepare."""

from __future__ import annotations

import libcst as cst

from accelify.rules.facts import PREPARE_ONE, Facts, name_role
from accelify.rules.rule import Invalid, Report, Rule, Severity
from accelify.transform.patterns import Role, dotted_name

_PREPARES = frozenset({"prepare", *PREPARE_ONE})


class LoadStateBeforePrepare(Rule):
    """`accelerator.load_state(...)` before the `prepare` that registers what it restores.

    ## What it does
    Flags `accelerator.load_state(...)` called in a function (or at module level) before that
    same function's `accelerator.prepare(...)` (or `prepare_model`/`prepare_optimizer`/...):
    its first one, or a later one that prepares a model, optimizer or scheduler (a model
    prepared first under one backend only, the rest after the load).

    ## Why is this bad?
    `load_state` restores into the models, optimizers, schedulers and loaders the accelerator
    has prepared so far. Before `prepare` it has none: it reads the checkpoint folder and
    restores nothing, without an error, and training silently starts over from scratch.

    ## Example
    ```python
    if args.resume:
        accelerator.load_state(args.resume)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    ```

    ## Use instead
    ```python
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    if args.resume:
        accelerator.load_state(args.resume)
    ```
    """

    code = "ACL108"
    name = "load-state-before-prepare"
    severity = Severity.ERROR

    VALID = (
        "accelerator = Accelerator()\nmodel, opt = accelerator.prepare(model, opt)\n"
        "accelerator.load_state('ckpt')\n",
        # Prepared in another function, which ran first.
        "def setup(accelerator):\n    return accelerator.prepare(model, opt)\n\n\n"
        "def resume(accelerator):\n    accelerator.load_state('ckpt')\n",
        "accelerator = Accelerator()\nmodel = accelerator.prepare_model(model)\n"
        "if args.resume:\n    accelerator.load_state(args.resume)\n",
        # A loader prepared after the load: only its sampler position is not restored.
        "accelerator = Accelerator()\nmodel, opt = accelerator.prepare(model, opt)\n"
        "accelerator.load_state('ckpt')\ntest_loader = accelerator.prepare(test_loader)\n",
    )
    INVALID = (
        Invalid(  # peft's shape: the model is prepared first under FSDP only
            "def main():\n    accelerator = Accelerator()\n    if fsdp:\n"
            "        model = accelerator.prepare(model)\n"
            "    optimizer = AdamW(model.parameters())\n    accelerator.load_state('ckpt')\n"
            "    model, optimizer = accelerator.prepare(model, optimizer)\n"
        ),
        Invalid(
            "def main():\n    accelerator = Accelerator()\n    if args.resume:\n"
            "        accelerator.load_state(args.resume)\n"
            "    model, opt, dl = accelerator.prepare(model, opt, dl)\n"
        ),
        Invalid(
            "import torch\n\n\nclass Trainer:\n    def setup(self):\n"
            "        self.accelerator.load_state(self.checkpoint)\n"
            "        self.model = self.accelerator.prepare(self.model)\n"
        ),
    )

    def __init__(self, facts: Facts, reports: list[Report]) -> None:
        super().__init__(facts, reports)
        # per function (None: module level): its loads not yet followed by a prepare there,
        # and whether it has prepared yet
        self._loads: dict[cst.FunctionDef | None, list[cst.Call]] = {}
        self._prepared: set[cst.FunctionDef | None] = set()

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if not (
            isinstance(func, cst.Attribute)
            and (func.attr.value == "load_state" or func.attr.value in _PREPARES)
            and self.facts.is_accelerator(func.value)
        ):
            return
        function = self.facts.function()
        if func.attr.value == "load_state":
            self._loads.setdefault(function, []).append(node)
            return
        # A load is too early for the first prepare of its function, and for any later one
        # that registers training state (a model, an optimizer, a scheduler): a loader
        # prepared after the load is common and costs only its sampler's position.
        if function in self._prepared and not any(_holds_state(a.value) for a in node.args):
            return
        self._prepared.add(function)
        receiver = dotted_name(func.value)
        for load in self._loads.pop(function, []):
            self.report(
                load,
                "`load_state` before this function's `prepare` restores nothing (it "
                "restores into what is prepared so far); call it after "
                f"`{receiver}.{func.attr.value}(...)`",
            )


def _holds_state(argument: cst.BaseExpression) -> bool:
    """A model, optimizer or scheduler, by its conventional name."""
    return name_role(dotted_name(argument)) in (Role.MODEL, Role.OPTIMIZER, Role.SCHEDULER)
