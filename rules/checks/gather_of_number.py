"""ACL009 gather-of-number."""

from __future__ import annotations

from collections.abc import Callable

import libcst as cst

from accelify.rules.bound import Bound
from accelify.rules.facts import Facts
from accelify.rules.rule import Invalid, Report, Rule, Severity
from accelify.transform.patterns import dotted_name

# Calls that hand back Python numbers (or lists of them) instead of tensors.
_TO_PYTHON = frozenset({"item", "tolist"})
_NUMBER_TYPES = frozenset({"float", "int", "len"})


class GatherOfNumber(Rule):
    """`accelerator.gather` of a Python number (`loss.item()`, `float(...)`, a counter).

    ## What it does
    Flags `accelerator.gather(x)` where `x` (or an element of the tuple or list it gets) is a
    Python number: `.item()`, `.tolist()`, `float(...)`, `int(...)`, `len(...)`, a literal, or a
    name bound to one of those in the same function (`total += loss.item()`).

    ## Why is this bad?
    On one process `gather` hands its argument back untouched, so the script works on a laptop.
    On several it all-gathers tensors only, and raises `TypeError` on anything else, at the end of
    the first epoch of the real run. (`gather_for_metrics` is different: it falls back to
    gathering Python objects.)

    ## Example
    ```python
    losses.append(accelerator.gather(loss.item()))
    ```

    ## Use instead
    ```python
    losses.append(accelerator.gather(loss.detach()))  # a tensor; `.item()` after the gather
    ```
    """

    code = "ACL009"
    name = "gather-of-number"
    severity = Severity.ERROR

    VALID = (
        "accelerator = Accelerator()\nlosses = accelerator.gather(loss.detach())\n",
        "accelerator = Accelerator()\nmean = accelerator.gather(loss.detach()).mean().item()\n",
        "accelerator = Accelerator()\nvalues = accelerator.gather_for_metrics(loss.item())\n",
        "accelerator = Accelerator()\ntotal = loss.item()\ntotal = torch.tensor(total)\n"
        "everyone = accelerator.gather(total)\n",
        "accelerator = Accelerator()\n\n\ndef a():\n    n = loss.item()\n\n\n"
        "def b(n):\n    return accelerator.gather(n)\n",
    )
    INVALID = (
        Invalid(
            "accelerator = Accelerator()\nfor batch in loader:\n"
            "    loss = model(**batch).loss\n"
            "    losses.append(accelerator.gather(loss.item()))\n"
        ),
        Invalid(
            "def evaluate(accelerator, model, loader):\n    correct = 0\n"
            "    for x, y in loader:\n        correct += (model(x).argmax(-1) == y).sum().item()\n"
            "    return accelerator.gather(correct)\n\n\n"
            "evaluate(Accelerator(), model, loader)\n"
        ),
        Invalid(
            "import torch\n\n\nclass Trainer:\n    def evaluate(self):\n"
            "        n = float(len(self.loader))\n"
            "        loss_sum, count = self.accelerator.gather((self.loss_sum, n))\n"
        ),
    )

    def __init__(self, facts: Facts, reports: list[Report]) -> None:
        super().__init__(facts, reports)
        self._numbers = Bound(facts, _is_number)

    def leave_Assign(self, node: cst.Assign) -> None:
        self._numbers.assign(node)

    def leave_AugAssign(self, node: cst.AugAssign) -> None:
        self._numbers.assign(node)

    def leave_AnnAssign(self, node: cst.AnnAssign) -> None:
        self._numbers.assign(node)

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if not (
            isinstance(func, cst.Attribute)
            and func.attr.value == "gather"
            and node.args
            and self.facts.is_accelerator(func.value)
        ):
            return
        value = node.args[0].value
        parts = (
            [e.value for e in value.elements]
            if isinstance(value, cst.Tuple | cst.List)
            else [value]
        )
        for part in parts:
            if self._numbers.holds(part):
                receiver = dotted_name(func.value) or "accelerator"
                self.report(
                    part,
                    "a Python number: on several processes `gather` raises TypeError (it "
                    "gathers tensors only; on one process it passes the number through); gather "
                    f"the tensor, or `torch.tensor(..., device={receiver}.device)`",
                )


def _is_number(value: cst.BaseExpression, named: Callable[[str], bool]) -> bool:
    if isinstance(value, cst.Integer | cst.Float):
        return True
    if isinstance(value, cst.Call):
        func = value.func
        if isinstance(func, cst.Attribute) and func.attr.value in _TO_PYTHON and not value.args:
            return True
        return isinstance(func, cst.Name) and func.value in _NUMBER_TYPES
    if isinstance(value, cst.BinaryOperation):
        return _is_number(value.left, named) and _is_number(value.right, named)
    if isinstance(value, cst.UnaryOperation):
        return _is_number(value.expression, named)
    name = dotted_name(value)
    return name is not None and named(name)
