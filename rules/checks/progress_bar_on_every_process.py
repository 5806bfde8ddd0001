"""ACL302 progress-bar-on-every-process."""

from __future__ import annotations

import libcst as cst

from accelify.rules.build import name_expr, with_keyword
from accelify.rules.every_process import EveryProcessRule, Reach
from accelify.rules.rule import Invalid, Severity
from accelify.transform.patterns import callee_name, keyword_arg

_BARS = frozenset({"tqdm", "trange"})


class ProgressBarOnEveryProcess(EveryProcessRule):
    """A `tqdm` progress bar drawn by every process (off by default).

    ## What it does
    In a script that creates an `Accelerator`, flags `tqdm(...)`/`trange(...)` without a
    `disable=` argument, outside a main-process guard.

    ## Why is this bad?
    N bars redraw over each other on the same terminal, and fill log files with carriage
    returns. Off by default: enable it with `--select ACL302`.

    ## Example
    ```python
    for batch in tqdm(train_dataloader):
        ...
    ```

    ## Use instead
    ```python
    for batch in tqdm(train_dataloader, disable=not accelerator.is_local_main_process):
        ...
    ```

    ## Fix safety
    Safe: only the drawing changes.
    """

    code = "ACL302"
    name = "progress-bar-on-every-process"
    severity = Severity.INFO
    enabled_by_default = False

    VALID = (
        "accelerator = Accelerator()\nfor b in tqdm(dl, disable=not accelerator.is_main_process):"
        "\n    pass",
        "for b in tqdm(dl):\n    pass  # no Accelerator",
    )
    INVALID = (
        Invalid(
            "accelerator = Accelerator()\nfor b in tqdm(dl, desc='train'):\n    pass\n",
            "accelerator = Accelerator()\n"
            "for b in tqdm(dl, desc='train', disable=not accelerator.is_local_main_process):\n"
            "    pass\n",
        ),
    )

    def visit_Call(self, node: cst.Call) -> None:
        if callee_name(node) in _BARS and keyword_arg(node, "disable") is None:
            self.candidate(node)

    def flag(self, call: cst.Call, reach: Reach) -> None:
        test = reach.test("is_local_main_process")
        message = f"every process draws this progress bar; pass `disable=not {test}`"
        if reach.fix is None:
            self.report(call, message)
            return
        disable = cst.UnaryOperation(cst.Not(), name_expr(f"{reach.fix}.is_local_main_process"))
        self.report(call, message, new=with_keyword(call, "disable", disable))
