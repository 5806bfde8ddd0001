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
    model = accelerator.prepare(model)
    torch.save(model.state_dict(), "model.pt")
    ```

    ## Use instead
    ```python
    model = accelerator.prepare(model)
    accelerator.save(accelerator.unwrap_model(model).state_dict(), "model.pt")
    ```
    or `accelerator.save_model(model, "out/")`.

    Under FSDP or DeepSpeed ZeRO-3 the unwrapped module holds only this process's shards: its
    `save_pretrained` also needs `state_dict=accelerator.get_state_dict(model)`, which gathers
    them and so must run on every process (under `if accelerator.is_main_process:` it hangs).

    ## Fix safety
    Unsafe: `accelerator.save` writes on the main process only, which is what a checkpoint wants
    but changes what the other processes do. The `save_pretrained` fix only unwraps the model:
    right under DDP, still incomplete under FSDP/ZeRO-3, where the `state_dict` argument is
    needed and cannot be added blindly (the call may sit under a main-process guard).
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
        # diffusers' shape: unwrapped into another name, saved under the main-process guard.
        "def main():\n    accelerator = Accelerator()\n"
        "    unet, optimizer = accelerator.prepare(unet, optimizer)\n"
        "    if accelerator.is_main_process:\n        unet = accelerator.unwrap_model(unet)\n"
        "        unet.save_pretrained('out')",
        # Prepared on one path only: the else branch saves the bare module.
        "accelerator = Accelerator()\nif args.train_text_encoder:\n"
        "    text_encoder = accelerator.prepare(text_encoder)\nelse:\n"
        "    text_encoder.to(accelerator.device)\n"
        "    torch.save(text_encoder.state_dict(), 'te.pt')",
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
        Invalid(  # prepared one at a time, then re-bound to itself
            "accelerator = Accelerator()\nunet = accelerator.prepare_model(unet)\nunet = unet\n"
            "torch.save(unet.state_dict(), 'u.pt')\n",
            "accelerator = Accelerator()\nunet = accelerator.prepare_model(unet)\nunet = unet\n"
            "accelerator.save(accelerator.unwrap_model(unet).state_dict(), 'u.pt')\n",
        ),
        Invalid(  # through another name for the prepared model, in a function
            "def train(args):\n    accelerator = Accelerator()\n"
            "    model, opt = accelerator.prepare(model, opt)\n    final = model\n"
            "    final.save_pretrained(args.save_dir)\n",
            "def train(args):\n    accelerator = Accelerator()\n"
            "    model, opt = accelerator.prepare(model, opt)\n    final = model\n"
            "    accelerator.unwrap_model(final).save_pretrained(args.save_dir)\n",
        ),
        Invalid(  # in a method, under a branch
            "class Runner:\n    def finish(self, accelerator, model):\n"
            "        model = accelerator.prepare(model)\n        if self.keep:\n"
            "            torch.save({'m': model}, 'all.pt')\n"
            "        if self.best:\n            torch.save(model.state_dict(), 'b.pt')\n",
            "class Runner:\n    def finish(self, accelerator, model):\n"
            "        model = accelerator.prepare(model)\n        if self.keep:\n"
            "            torch.save({'m': model}, 'all.pt')\n"
            "        if self.best:\n"
            "            accelerator.save(accelerator.unwrap_model(model).state_dict(), 'b.pt')\n",
        ),
    )

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if isinstance(func, cst.Attribute) and func.attr.value == "save_pretrained":
            model = self._model(func.value)
            if model is not None:
                new_func = func.with_changes(value=unwrapped(model.accelerator, func.value))
                message = (
                    f"{self._message(model)}; under FSDP/ZeRO-3 also pass `state_dict="
                    f"{model.accelerator}.get_state_dict({model.name})`, on every process"
                )
                self.report(node, message, new=node.with_changes(func=new_func), safe=False)
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
