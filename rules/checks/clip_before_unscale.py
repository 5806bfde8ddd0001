"""ACL207 clip-before-unscale."""

from __future__ import annotations

import libcst as cst

from accelify.rules.facts import Facts
from accelify.rules.rule import Invalid, Report, Rule, Severity
from accelify.transform.patterns import Role, callee_name, dotted_name

_CLIPS = frozenset({"clip_grad_norm_", "clip_grad_value_"})


class ClipBeforeUnscale(Rule):
    """Gradients clipped while a manual `GradScaler` still has them scaled.

    ## What it does
    Flags `clip_grad_norm_`/`clip_grad_value_` after `scaler.scale(loss).backward()` and before
    `scaler.unscale_(optimizer)` in the same function.

    ## Why is this bad?
    The gradients are multiplied by the loss scale (65536 to start with), so the clip threshold
    applies to the wrong numbers: every step is clipped to nothing, or never clipped.

    ## Example
    ```python
    scaler.scale(loss).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(optimizer)
    ```

    ## Use instead
    ```python
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(optimizer)
    ```
    or let the Accelerator own the scaler: `Accelerator(mixed_precision="fp16")`,
    `accelerator.backward(loss)`, `accelerator.clip_grad_norm_(...)`.
    """

    code = "ACL207"
    name = "clip-before-unscale"
    severity = Severity.ERROR

    VALID = (
        "scaler = GradScaler()\nscaler.scale(loss).backward()\nscaler.unscale_(opt)\n"
        "clip_grad_norm_(model.parameters(), 1.0)\nscaler.step(opt)",
        "loss.backward()\nclip_grad_norm_(model.parameters(), 1.0)",
    )
    INVALID = (
        Invalid(
            "import torch\nscaler = torch.cuda.amp.GradScaler()\nfor x in dl:\n"
            "    scaler.scale(loss).backward()\n"
            "    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n"
            "    scaler.step(opt)\n    scaler.update()\n"
        ),
    )

    def __init__(self, facts: Facts, reports: list[Report]) -> None:
        super().__init__(facts, reports)
        self._scaled: set[cst.FunctionDef | None] = set()  # functions with scaled gradients now

    def visit_Call(self, node: cst.Call) -> None:
        function = self.facts.function()
        func = node.func
        name = callee_name(node)
        if name in _CLIPS:
            if function in self._scaled and not (
                isinstance(func, cst.Attribute) and self.facts.is_accelerator(func.value)
            ):
                self.report(
                    node,
                    "clips gradients that the GradScaler still has scaled; call "
                    "`scaler.unscale_(optimizer)` first",
                )
            return
        if not isinstance(func, cst.Attribute):
            return
        if name == "backward" and isinstance(func.value, cst.Call):
            scale = func.value
            if callee_name(scale) == "scale" and self._is_scaler(scale.func):
                self._scaled.add(function)
        elif name in {"unscale_", "step", "update"} and self._is_scaler(node):
            self._scaled.discard(function)

    def _is_scaler(self, expr: cst.BaseExpression) -> bool:
        receiver = expr.func.value if isinstance(expr, cst.Call) else expr.value  # type: ignore[attr-defined]
        name = dotted_name(receiver) or ""
        return self.facts.role(receiver) is Role.SCALER or "scaler" in name.lower()
