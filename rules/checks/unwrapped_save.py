"""ACL101 unwrapped-save."""

from __future__ import annotations

import libcst as cst

from accelify.rules.build import method_call, unwrapped
from accelify.rules.facts import Prepared
from accelify.rules.rule import Invalid, Rule, Severity
from accelify.transform.patterns import Role, dotted_name


class UnwrappedSave(Rule):
    """A prepared (wrapped) model is saved instead of `accelerator.unwrap_model(model)`.

    ## What it does
    Flags `torch.save(model.state_dict(), ...)`, `torch.save(model, ...)`,
    `accelerator.save(model.state_dict(), ...)` and `model.save_pretrained(...)` where `model`
    came out of `accelerator.prepare`.

    ## Why is this bad?
    The prepared model is a DDP/FSDP/DeepSpeed wrapper: its state dict keys carry a `module.`
    prefix (or are shards), so the checkpoint does not load into the plain model later, and
    `save_pretrained` does not exist on the wrapper at all.

    ## Example
    ```python
    torch.save(model.state_dict(), "model.pt")
    ```

    ## Use instead
    ```python
    accelerator.save(accelerator.unwrap_model(model).state_dict(), "model.pt")
    ```
    or `accelerator.save_model(model, "out/")`.

    ## Fix safety
    Unsafe: `accelerator.save` writes on the main process only, which is what a checkpoint wants
    but changes what the other processes do.
    """

    code = "ACL101"
    name = "unwrapped-save"
    severity = Severity.ERROR

    VALID = (
        "accelerator = Accelerator()\nmodel = accelerator.prepare(model)\n"
        "accelerator.save(accelerator.unwrap_model(model).state_dict(), 'm.pt')",
        "accelerator = Accelerator()\nmodel = accelerator.prepare(model)\n"
        "accelerator.save_model(model, 'out')",
        "accelerator = Accelerator()\nmodel, opt = accelerator.prepare(model, opt)\n"
        "accelerator.save(opt.state_dict(), 'opt.pt')  # optimizers are not wrapped in a module",
        "accelerator = Accelerator()\nmodel = accelerator.prepare(model)\n"
        "model = accelerator.unwrap_model(model)\nmodel.save_pretrained('out')",
        "model = Net()\ntorch.save(model.state_dict(), 'm.pt')",
    )
    INVALID = (
        Invalid(
            "accelerator = Accelerator()\nmodel, opt = accelerator.prepare(model, opt)\n"
            "torch.save(model.state_dict(), 'm.pt')\n",
            "accelerator = Accelerator()\nmodel, opt = accelerator.prepare(model, opt)\n"
            "accelerator.save(accelerator.unwrap_model(model).state_dict(), 'm.pt')\n",
        ),
        Invalid(
            "accelerator = Accelerator()\nmodel = accelerator.prepare(model)\n"
            "model.save_pretrained('out', safe_serialization=True)\n",
            "accelerator = Accelerator()\nmodel = accelerator.prepare(model)\n"
            "accelerator.unwrap_model(model).save_pretrained('out', safe_serialization=True)\n",
        ),
        Invalid(
            "accelerator = Accelerator()\nnet = accelerator.prepare(net)\n"
            "accelerator.save(net, 'net.pt')\n",
            "accelerator = Accelerator()\nnet = accelerator.prepare(net)\n"
            "accelerator.save(accelerator.unwrap_model(net), 'net.pt')\n",
        ),
    )

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if isinstance(func, cst.Attribute) and func.attr.value == "save_pretrained":
            model = self._model(func.value)
            if model is not None:
                new_func = func.with_changes(value=unwrapped(model.accelerator, func.value))
                self.report(node, self._message(model), new=node.with_changes(func=new_func))
            return
        is_torch_save = dotted_name(func) == "torch.save"
        is_acc_save = (
            isinstance(func, cst.Attribute)
            and func.attr.value == "save"
            and self.facts.is_accelerator(func.value)
        )
        if not (is_torch_save or is_acc_save) or not node.args or node.args[0].keyword:
            return
        obj = node.args[0].value
        state_dict = (
            isinstance(obj, cst.Call)
            and isinstance(obj.func, cst.Attribute)
            and obj.func.attr.value == "state_dict"
        )
        target = obj.func.value if state_dict else obj  # type: ignore[union-attr]
        model = self._model(target)
        if model is None:
            return
        new_target = unwrapped(model.accelerator, target)
        new_obj = (
            obj.with_changes(func=obj.func.with_changes(value=new_target))  # type: ignore[union-attr]
            if state_dict
            else new_target
        )
        args = [node.args[0].with_changes(value=new_obj), *node.args[1:]]
        new = method_call(model.accelerator, "save", args)
        self.report(node, self._message(model), new=new, safe=False)

    def _model(self, expr: cst.BaseExpression) -> Prepared | None:
        prepared = self.facts.prepared(expr)
        if prepared is None or prepared.role is not Role.MODEL:
            return None
        return prepared

    @staticmethod
    def _message(model: Prepared) -> str:
        return (
            f"`{model.name}` is the prepared (wrapped) model; save "
            f"`{model.accelerator}.unwrap_model({model.name})` instead"
        )
