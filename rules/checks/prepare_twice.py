"""ACL006 prepare-twice."""

from __future__ import annotations

import libcst as cst

from accelify.rules.facts import PREPARE_ONE, Facts
from accelify.rules.rule import Invalid, Report, Rule, Severity
from accelify.transform.patterns import dotted_name, target_names

_PREPARES = frozenset({"prepare", *PREPARE_ONE})


class PrepareTwice(Rule):
    """An object passed to `accelerator.prepare` again after it was prepared.

    ## What it does
    Flags an argument of `prepare(...)` (or `prepare_model`, `prepare_data_loader`, ...) that is
    a name already bound to what an earlier `prepare` returned, on every path that reaches the
    second call (a `prepare` in one branch and another in the `else` is fine).

    ## Why is this bad?
    The second call wraps the wrapper: a model in `DistributedDataParallel` twice (DDP refuses,
    or gradients are reduced twice), an optimizer stepping through two wrappers, and a loader
    sharded twice, so each process reads 1/N of its own 1/N of the data.

    ## Example
    ```python
    model, optimizer = accelerator.prepare(model, optimizer)
    ...
    model = accelerator.prepare(model)
    ```

    ## Use instead
    ```python
    model, optimizer = accelerator.prepare(model, optimizer)
    ```
    """

    code = "ACL006"
    name = "prepare-twice"
    severity = Severity.ERROR

    VALID = (
        "accelerator = Accelerator()\nif args.fsdp:\n    model = accelerator.prepare(model)\n"
        "else:\n    model = accelerator.prepare(model)\n",
        "accelerator = Accelerator()\nmodel = accelerator.prepare(model)\nmodel = Net()\n"
        "model = accelerator.prepare(model)\n",
        "accelerator = Accelerator()\nif a: dl = accelerator.prepare(dl)\n"
        "else: dl = accelerator.prepare(dl)\n",
        "accelerator = Accelerator()\n\n\ndef a():\n    model = accelerator.prepare(Net())\n\n\n"
        "def b(model):\n    return accelerator.prepare(model)\n",
        "accelerator = Accelerator()\nmodel = accelerator.prepare(model)\n\n\n"
        "def fine_tune(model):\n    return accelerator.prepare(model)\n",
    )
    INVALID = (
        Invalid(
            "accelerator = Accelerator()\n\n\ndef main():\n"
            "    model, optimizer, train_dl = accelerator.prepare(model, optimizer, train_dl)\n"
            "    for epoch in range(3):\n        if epoch == 1:\n"
            "            train_dl = accelerator.prepare_data_loader(train_dl)\n"
        ),
        Invalid(
            "acc = Accelerator()\nnet = acc.prepare(net)\nwith torch.no_grad():\n"
            "    net, eval_dl = acc.prepare(net, eval_dl)\n"
        ),
    )

    def __init__(self, facts: Facts, reports: list[Report]) -> None:
        super().__init__(facts, reports)
        self._blocks: list[cst.CSTNode] = []  # the open blocks, outermost first
        # (function, name) -> the blocks open where the name was bound to prepare()'s result in
        # that function (None: at module level; a function's own names hide the module's)
        self._prepared: dict[tuple[cst.FunctionDef | None, str], tuple[cst.CSTNode, ...]] = {}

    def _enter(self, node: cst.IndentedBlock | cst.SimpleStatementSuite) -> None:
        self._blocks.append(node)

    def _leave(self, node: cst.IndentedBlock | cst.SimpleStatementSuite) -> None:
        self._blocks.pop()

    visit_IndentedBlock = visit_SimpleStatementSuite = _enter
    leave_IndentedBlock = leave_SimpleStatementSuite = _leave

    def visit_Call(self, node: cst.Call) -> None:
        if not self._is_prepare(node):
            return
        here = tuple(self._blocks)
        function = self.facts.function()
        for arg in node.args:
            name = dotted_name(arg.value)
            there = self._prepared.get((function, name)) if name else None
            if there is not None and here[: len(there)] == there:
                self.report(
                    arg.value,
                    f"`{name}` was already prepared: preparing it again wraps the wrapper; "
                    "prepare each object once",
                )

    def leave_Assign(self, node: cst.Assign) -> None:
        prepared = isinstance(node.value, cst.Call) and self._is_prepare(node.value)
        if not prepared and not self._prepared:
            return
        function = self.facts.function()
        for target in node.targets:
            for name in target_names(target.target):
                if prepared:
                    self._prepared[function, name] = tuple(self._blocks)
                else:
                    self._prepared.pop((function, name), None)

    def _is_prepare(self, call: cst.Call) -> bool:
        func = call.func
        return (
            isinstance(func, cst.Attribute)
            and func.attr.value in _PREPARES
            and self.facts.is_accelerator(func.value)
        )
