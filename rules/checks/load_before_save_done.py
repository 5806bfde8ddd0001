"""ACL106 load-before-save-done."""

from __future__ import annotations

import libcst as cst

from accelify.rules.facts import Facts
from accelify.rules.rule import Invalid, Report, Rule, Severity
from accelify.transform.patterns import callee_name, dotted_name

_MAIN_ONLY_SAVES = frozenset({"save", "save_model"})  # the accelerator writes on the main process


class LoadBeforeSaveDone(Rule):
    """A file read back on every process right after the main process alone wrote it.

    ## What it does
    Flags `torch.load(path)` (or `from_pretrained(path)`, `load_state_dict(torch.load(...))`)
    that follows, in the same function, an `accelerator.save(..., path)` /
    `accelerator.save_model(..., path)` (or a `torch.save` under `if accelerator.is_main_process:`)
    of the same path, with no `accelerator.wait_for_everyone()` in between.

    ## Why is this bad?
    Only the main process writes the file; the others reach the load at once and read a file
    that is missing, half-written or the previous epoch's, and quietly diverge from the main
    process.

    ## Example
    ```python
    accelerator.save(accelerator.unwrap_model(model).state_dict(), "ckpt.pt")
    state = torch.load("ckpt.pt", weights_only=True)
    ```

    ## Use instead
    ```python
    accelerator.save(accelerator.unwrap_model(model).state_dict(), "ckpt.pt")
    accelerator.wait_for_everyone()
    state = torch.load("ckpt.pt", weights_only=True)
    ```
    A wait under a condition that processes may answer differently would hang: move the load out
    of it, or make the condition the same on every process.
    """

    code = "ACL106"
    name = "load-before-save-done"
    severity = Severity.WARNING

    VALID = (
        "accelerator = Accelerator()\naccelerator.save(state, 'ckpt.pt')\n"
        "accelerator.wait_for_everyone()\nstate = torch.load('ckpt.pt', weights_only=True)\n",
        "accelerator = Accelerator()\naccelerator.save(state, 'a.pt')\n"
        "state = torch.load('b.pt', weights_only=True)\n",
        "accelerator = Accelerator()\ntorch.save(state, 'ckpt.pt')  # every process writes\n"
        "state = torch.load('ckpt.pt', weights_only=True)\n",
        "accelerator = Accelerator()\n\n\ndef save():\n    accelerator.save(state, path)\n\n\n"
        "def load(path):\n    return torch.load(path, weights_only=True)\n",
    )
    INVALID = (
        Invalid(
            "accelerator = Accelerator()\nfor epoch in range(2):\n"
            "    accelerator.wait_for_everyone()\n"
            "    accelerator.save(accelerator.unwrap_model(model).state_dict(), 'ckpt.pt')\n"
            "    if loss.item() > best:\n"
            "        model.load_state_dict(torch.load('ckpt.pt', weights_only=True))\n"
        ),
        Invalid(
            "def checkpoint(accelerator, model, path):\n    if accelerator.is_main_process:\n"
            "        torch.save(model.state_dict(), path)\n"
            "    return torch.load(path, weights_only=True)\n"
        ),
    )

    def __init__(self, facts: Facts, reports: list[Report]) -> None:
        super().__init__(facts, reports)
        # (function, path) -> the number of waits seen when the main process wrote it
        self._written: dict[tuple[cst.FunctionDef | None, str], int] = {}
        self._waits = 0

    def visit_Call(self, node: cst.Call) -> None:
        name = callee_name(node)
        if name == "wait_for_everyone":
            self._waits += 1
        elif name in _MAIN_ONLY_SAVES:
            self._saved(node)
        elif name == "load" and self._written and node.args:
            self._loaded(node)

    def _saved(self, call: cst.Call) -> None:
        func = call.func
        if len(call.args) < 2 or not isinstance(func, cst.Attribute):
            return
        by_accelerator = self.facts.is_accelerator(func.value) and func.attr.value in (
            _MAIN_ONLY_SAVES
        )
        where = self.facts.where()
        if by_accelerator or (dotted_name(func) == "torch.save" and where.guarded):
            path = _path(call.args[1].value)
            if path is not None:
                self._written[where.function, path] = self._waits

    def _loaded(self, call: cst.Call) -> None:
        if dotted_name(call.func) != "torch.load":
            return
        path = _path(call.args[0].value)
        where = self.facts.where()
        if path is None or where.guarded:
            return
        waits = self._written.get((where.function, path))
        if waits is not None and waits == self._waits:
            self.report(
                call,
                "only the main process wrote this file: the other processes may read it before "
                "it is written; call `accelerator.wait_for_everyone()` between the save and the "
                "load",
            )


def _path(expr: cst.BaseExpression) -> str | None:
    """A path written the same way twice: a string literal or a name."""
    if isinstance(expr, cst.SimpleString):
        return expr.value
    return dotted_name(expr)
