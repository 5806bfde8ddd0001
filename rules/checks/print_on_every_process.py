"""ACL301 print-on-every-process."""

from __future__ import annotations

import libcst as cst

from accelify.rules.build import method_call
from accelify.rules.facts import Facts, Where
from accelify.rules.rule import Invalid, Report, Rule, Severity
from accelify.transform.patterns import keyword_arg


class PrintOnEveryProcess(Rule):
    """`print` that runs on every process (off by default).

    ## What it does
    In a script that creates an `Accelerator`, flags `print(...)` calls that are not under a
    main-process guard.

    ## Why is this bad?
    Every line appears N times, interleaved, in the job's log. Not a bug, which is why the rule
    is off by default: enable it with `--select ACL301`.

    ## Example
    ```python
    print(f"epoch {epoch}: loss {loss:.3f}")
    ```

    ## Use instead
    ```python
    accelerator.print(f"epoch {epoch}: loss {loss:.3f}")
    ```

    ## Fix safety
    Unsafe: the other processes stop printing, which changes the output.
    """

    code = "ACL301"
    name = "print-on-every-process"
    severity = Severity.INFO
    enabled_by_default = False

    VALID = (
        "accelerator = Accelerator()\naccelerator.print('hi')",
        "accelerator = Accelerator()\nif accelerator.is_local_main_process:\n    print('hi')",
        "accelerator = Accelerator()\nprint('hi', file=log)",
        "print('hi')  # no Accelerator",
    )
    INVALID = (
        Invalid(
            "accelerator = Accelerator()\nprint('epoch', epoch)\n",
            "accelerator = Accelerator()\naccelerator.print('epoch', epoch)\n",
        ),
    )

    def __init__(self, facts: Facts, reports: list[Report]) -> None:
        super().__init__(facts, reports)
        self._candidates: list[tuple[cst.Call, Where, str | None]] = []

    def visit_Call(self, node: cst.Call) -> None:
        if (
            isinstance(node.func, cst.Name)
            and node.func.value == "print"
            and keyword_arg(node, "file") is None
        ):
            self._candidates.append((node, self.facts.where(), self.facts.accelerator_here()))

    def leave_Module(self, node: cst.Module) -> None:
        if not self.facts.creates_accelerator:
            return
        for call, where, accelerator in self._candidates:
            if self.facts.runs_on(where) != "all":
                continue
            message = "prints on every process; use `accelerator.print`"
            new = method_call(accelerator, "print", call.args) if accelerator else None
            self.report(call, message, new=new, safe=False)
