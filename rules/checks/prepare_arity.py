"""ACL003 prepare-arity."""

from __future__ import annotations

import libcst as cst

from accelify.rules.facts import prepare_call
from accelify.rules.rule import Invalid, Rule, Severity


class PrepareArity(Rule):
    """`a, b = accelerator.prepare(x, y, z)`: the counts differ.

    ## What it does
    Flags an unpacking assignment from `accelerator.prepare(...)` whose number of targets is not
    the number of arguments.

    ## Why is this bad?
    `prepare` returns one object per argument, in order. Too few or too many targets is a
    `ValueError` at best; with one target and several arguments the name silently holds a tuple.

    ## Example
    ```python
    model, optimizer = accelerator.prepare(model, optimizer, train_dataloader)
    ```

    ## Use instead
    ```python
    model, optimizer, train_dataloader = accelerator.prepare(model, optimizer, train_dataloader)
    ```
    """

    code = "ACL003"
    name = "prepare-arity"
    severity = Severity.ERROR

    VALID = (
        "accelerator = Accelerator()\nmodel, opt = accelerator.prepare(model, opt)",
        "accelerator = Accelerator()\nobjs = accelerator.prepare(*objs)",
        "accelerator = Accelerator()\nmodel, *rest = accelerator.prepare(model, opt, dl)",
        "accelerator = Accelerator()\nmodel = accelerator.prepare(model)",
    )
    INVALID = (
        Invalid("accelerator = Accelerator()\nmodel, opt = accelerator.prepare(model, opt, dl)\n"),
        Invalid(
            "accelerator = Accelerator()\n(model, opt, dl) = accelerator.prepare(model, opt)\n"
        ),
    )

    def visit_Assign(self, node: cst.Assign) -> None:
        call = prepare_call(node.value, self.facts)
        if call is None or len(node.targets) != 1 or any(a.star for a in call.args):
            return
        target = node.targets[0].target
        if not isinstance(target, (cst.Tuple, cst.List)):
            return
        if any(isinstance(e, cst.StarredElement) for e in target.elements):
            return
        if len(target.elements) != len(call.args):
            self.report(
                node,
                f"{len(target.elements)} names receive the {len(call.args)} objects "
                "`prepare` returns",
            )
