"""ACL201 backward-bypass."""

from __future__ import annotations

import libcst as cst

from accelify.rules.build import method_call
from accelify.rules.facts import Facts, Where
from accelify.rules.rule import Invalid, Report, Rule, Severity


class BackwardBypass(Rule):
    """`loss.backward()` in a script that creates an `Accelerator`.

    ## What it does
    Flags `.backward()` called on a loss instead of `accelerator.backward(loss)`, where an
    accelerator is in sight (or in a function called where one is).

    ## Why is this bad?
    `accelerator.backward` scales the loss for mixed precision, divides it for gradient
    accumulation and hands it to DeepSpeed's engine. Calling `.backward()` directly skips all of
    that: fp16 gradients underflow, accumulated steps are N times too large, DeepSpeed fails.

    ## Example
    ```python
    model, optimizer = accelerator.prepare(model, optimizer)
    loss = criterion(model(x), y)
    loss.backward()
    ```

    ## Use instead
    ```python
    model, optimizer = accelerator.prepare(model, optimizer)
    loss = criterion(model(x), y)
    accelerator.backward(loss)
    ```

    ## Fix safety
    Safe when exactly one accelerator name is visible at the call; keyword arguments
    (`retain_graph=True`) are kept, `accelerator.backward` forwards them.
    """

    code = "ACL201"
    name = "backward-bypass"
    severity = Severity.ERROR

    VALID = (
        "accelerator = Accelerator()\naccelerator.backward(loss)",
        "import torch\nloss = model(x).sum()\nloss.backward()  # no Accelerator: plain PyTorch",
        "accelerator = Accelerator()\nengine.backward(loss)  # a DeepSpeed engine takes the loss",
        "accelerator = Accelerator()\ntorch.autograd.backward(loss)",
        "def baseline(model, x):\n    model(x).sum().backward()\n\nbaseline(net, x)\n"
        "accelerator = Accelerator()",
    )
    INVALID = (
        Invalid(
            "accelerator = Accelerator()\nloss = model(x).sum()\nloss.backward()\n",
            "accelerator = Accelerator()\nloss = model(x).sum()\naccelerator.backward(loss)\n",
        ),
        Invalid(
            "acc = Accelerator()\n(loss / 2).backward(retain_graph=True)\n",
            "acc = Accelerator()\nacc.backward(loss / 2, retain_graph=True)\n",
        ),
        Invalid(
            "def step(model, batch):\n    model(batch).loss.backward()\n\n"
            "def main():\n    accelerator = Accelerator()\n    step(model, batch)\n"
        ),
    )

    def __init__(self, facts: Facts, reports: list[Report]) -> None:
        super().__init__(facts, reports)
        self._candidates: list[tuple[cst.Call, str | None, Where]] = []

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if (
            isinstance(func, cst.Attribute)
            and func.attr.value == "backward"
            and not any(arg.keyword is None for arg in node.args)
            and not isinstance(func.value, cst.Call)
            and not self.facts.is_accelerator(func.value)
        ):
            self._candidates.append((node, self.facts.accelerator_here(), self.facts.where()))

    def leave_Module(self, node: cst.Module) -> None:
        if not self.facts.creates_accelerator:
            return
        for call, accelerator, where in self._candidates:
            if not (where.accelerator or self.facts.called_with_accelerator(where.function)):
                continue  # code that never meets the Accelerator (a plain-PyTorch baseline)
            assert isinstance(call.func, cst.Attribute)
            message = "`.backward()` bypasses the Accelerator; use `accelerator.backward(loss)`"
            if accelerator is None:
                self.report(call, message)
                continue
            loss = call.func.value.with_changes(lpar=[], rpar=[])
            new = method_call(accelerator, "backward", [cst.Arg(loss), *call.args])
            self.report(call, message, new=new)
