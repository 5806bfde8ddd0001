"""ACL302 progress-bar-on-every-process."""

from __future__ import annotations

import libcst as cst

from accelify.rules.build import name_expr, with_keyword
from accelify.rules.facts import Facts, Where
from accelify.rules.rule import Invalid, Report, Rule, Severity
from accelify.transform.patterns import callee_name, keyword_arg

_BARS = frozenset({"tqdm", "trange"})


class ProgressBarOnEveryProcess(Rule):
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

    def __init__(self, facts: Facts, reports: list[Report]) -> None:
        super().__init__(facts, reports)
        self._candidates: list[tuple[cst.Call, Where, str | None]] = []

    def visit_Call(self, node: cst.Call) -> None:
        if callee_name(node) in _BARS and keyword_arg(node, "disable") is None:
            self._candidates.append((node, self.facts.where(), self.facts.accelerator_here()))

    def leave_Module(self, node: cst.Module) -> None:
        if not self.facts.creates_accelerator:
            return
        for call, where, accelerator in self._candidates:
            if self.facts.runs_on(where) != "all":
                continue
            message = (
                "every process draws this progress bar; "
                "pass `disable=not accelerator.is_local_main_process`"
            )
            if accelerator is None:
                self.report(call, message)
                continue
            disable = cst.UnaryOperation(
                cst.Not(), name_expr(f"{accelerator}.is_local_main_process")
            )
            self.report(call, message, new=with_keyword(call, "disable", disable))
