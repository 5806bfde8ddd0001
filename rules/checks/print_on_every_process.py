"""ACL301 print-on-every-process."""

from __future__ import annotations

import libcst as cst

from accelify.rules.build import method_call
from accelify.rules.every_process import EveryProcessRule, Reach
from accelify.rules.rule import Invalid, Severity
from accelify.transform.patterns import keyword_arg


class PrintOnEveryProcess(EveryProcessRule):
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

    def visit_Call(self, node: cst.Call) -> None:
        if (
            isinstance(node.func, cst.Name)
            and node.func.value == "print"
            and keyword_arg(node, "file") is None
        ):
            self.candidate(node)

    def flag(self, call: cst.Call, reach: Reach) -> None:
        message = f"prints on every process; use `{reach.name or 'PartialState()'}.print`"
        new = method_call(reach.fix, "print", call.args) if reach.fix else None
        self.report(call, message, new=new, safe=False)
