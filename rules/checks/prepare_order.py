"""ACL004 prepare-order."""

from __future__ import annotations

from collections import Counter

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
        "accelerator = Accelerator()\ng, d = accelerator.prepare(Generator(), Discriminator())",
        "accelerator = Accelerator()\nencoder_opt = torch.optim.SGD(encoder.parameters())\n"
        "decoder_opt = torch.optim.SGD(decoder.parameters())\n"
        "encoder, decoder, encoder_opt, decoder_opt = accelerator.prepare(\n"
        "    encoder, decoder, encoder_opt, decoder_opt\n)",
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
        if any(a.star or a.keyword for a in call.args):
            return
        targets = [dotted_name(e.value) for e in target.elements]
        args = [dotted_name(a.value) for a in call.args]
        if len(targets) != len(args) or None in targets:
            return
        message = "`prepare` returns objects in argument order; these targets are swapped"
        if None not in args and Counter(targets) == Counter(args) and targets != args:
            elements = [
                e.with_changes(value=cst.parse_expression(name))
                for e, name in zip(target.elements, args, strict=True)
                if name is not None
            ]
            fixed_target = target.with_changes(elements=elements)
            new = node.with_changes(targets=[node.targets[0].with_changes(target=fixed_target)])
            self.report(node, message, new=new)
            return
        clashes = 0
        for name, arg, arg_name in zip(targets, call.args, args, strict=True):
            if name == arg_name:  # the same name bound again: never a swap
                continue
            wanted = name_role(name)
            got = self.facts.role(arg.value) or name_role(arg_name)
            clashes += wanted is not None and got is not None and wanted is not got
        if clashes >= 2:
            self.report(node, message)
