"""ACL004 prepare-order."""

from __future__ import annotations

import libcst as cst

from accelify.rules.facts import name_role, prepare_call
from accelify.rules.rule import Invalid, Rule, Severity
from accelify.transform.patterns import dotted_name


class PrepareOrder(Rule):
    """`model, optimizer = accelerator.prepare(optimizer, model)`: targets and arguments swapped.

    ## What it does
    Flags a `prepare` unpacking whose targets are the same names as its arguments in another
    order, or whose targets' names say another role than the argument in the same position.

    ## Why is this bad?
    `prepare` returns its arguments in order, so `model` ends up holding the optimizer; the
    script fails far from the mistake, or trains the wrong object.

    ## Example
    ```python
    model, optimizer = accelerator.prepare(optimizer, model)
    ```

    ## Use instead
    ```python
    optimizer, model = accelerator.prepare(optimizer, model)
    ```

    ## Fix safety
    Safe when the targets are a permutation of the argument names: the fix reorders the targets
    to match the arguments.
    """

    code = "ACL004"
    name = "prepare-order"
    severity = Severity.ERROR

    VALID = (
        "accelerator = Accelerator()\nmodel, opt = accelerator.prepare(model, opt)",
        "accelerator = Accelerator()\nmodel, opt = accelerator.prepare(net, adam)",
        "accelerator = Accelerator()\nteacher, student = accelerator.prepare(teacher_model, model)",
    )
    INVALID = (
        Invalid(
            "acc = Accelerator()\nmodel, optimizer = acc.prepare(optimizer, model)\n",
            "acc = Accelerator()\noptimizer, model = acc.prepare(optimizer, model)\n",
        ),
        Invalid(
            "accelerator = Accelerator()\n"
            "model, train_loader = accelerator.prepare(train_dataloader, net)\n"
        ),
    )

    def visit_Assign(self, node: cst.Assign) -> None:
        call = prepare_call(node.value, self.facts)
        target = node.targets[0].target if len(node.targets) == 1 else None
        if call is None or not isinstance(target, (cst.Tuple, cst.List)):
            return
        targets = [dotted_name(e.value) for e in target.elements]
        args = [dotted_name(a.value) if a.keyword is None else None for a in call.args]
        if len(targets) != len(args) or None in targets or a_star(call):
            return
        message = "`prepare` returns objects in argument order; these targets are swapped"
        if sorted(targets) == sorted(args) and targets != args:  # type: ignore[type-var]
            elements = [
                e.with_changes(value=cst.parse_expression(a))
                for e, a in zip(target.elements, args, strict=True)
            ]  # type: ignore[arg-type]
            new = node.with_changes(
                targets=[
                    node.targets[0].with_changes(target=target.with_changes(elements=elements))
                ]
            )
            self.report(node, message, new=new)
            return
        roles = [
            (name_role(t), self._role(a, arg))
            for t, a, arg in zip(targets, args, call.args, strict=True)
        ]
        clash = [i for i, (want, got) in enumerate(roles) if want and got and want is not got]
        if len(clash) >= 2:
            self.report(node, message)

    def _role(self, name: str | None, arg: cst.Arg):
        return self.facts.role(arg.value) or name_role(name)


def a_star(call: cst.Call) -> bool:
    return any(a.star for a in call.args)
