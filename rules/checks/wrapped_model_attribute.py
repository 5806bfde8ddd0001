"""ACL005 wrapped-model-attribute."""

from __future__ import annotations

import libcst as cst

from accelify.rules.build import name_expr, unwrapped
from accelify.rules.facts import PREPARE_ONE, Facts, Prepared, prepare_call
from accelify.rules.rule import Invalid, Report, Rule, Severity
from accelify.transform.patterns import Role, callee_name, dotted_name, target_names
from accelify.transform.walk import children

# What ``DistributedDataParallel`` answers itself: every public name of an instance (``nn.Module``'s
# API and DDP's own, listed from torch 2.13). Anything else exists only on the module it wraps.
# ``save_pretrained`` is ACL101's.
_ON_WRAPPER = frozenset(
    [
        "T_destination",
        "add_module",
        "apply",
        "batched_grad_copy",
        "bfloat16",
        "broadcast_bucket_size",
        "broadcast_buffers",
        "bucket_bytes_cap",
        "bucket_bytes_cap_default",
        "bucket_bytes_cap_list",
        "buffers",
        "call_super_init",
        "children",
        "compile",
        "cpu",
        "cuda",
        "device",
        "device_ids",
        "device_type",
        "dim",
        "double",
        "dump_patches",
        "eval",
        "extra_repr",
        "find_unused_parameters",
        "float",
        "forward",
        "forward_sync_buffers",
        "gather",
        "get_buffer",
        "get_extra_state",
        "get_parameter",
        "get_submodule",
        "gradient_as_bucket_view",
        "half",
        "ipu",
        "is_multi_device_module",
        "join",
        "join_device",
        "join_hook",
        "join_process_group",
        "load_state_dict",
        "logger",
        "mixed_precision",
        "module",
        "modules",
        "modules_buffers",
        "mtia",
        "named_buffers",
        "named_children",
        "named_module_buffers",
        "named_modules",
        "named_parameters",
        "no_sync",
        "output_device",
        "parameters",
        "parameters_to_ignore",
        "process_group",
        "reducer",
        "register_backward_hook",
        "register_buffer",
        "register_comm_hook",
        "register_forward_hook",
        "register_forward_pre_hook",
        "register_full_backward_hook",
        "register_full_backward_pre_hook",
        "register_load_state_dict_post_hook",
        "register_load_state_dict_pre_hook",
        "register_module",
        "register_parameter",
        "register_state_dict_post_hook",
        "register_state_dict_pre_hook",
        "require_backward_grad_sync",
        "require_forward_param_sync",
        "requires_grad_",
        "scatter",
        "set_extra_state",
        "set_submodule",
        "share_memory",
        "skip_all_reduce_unused_params",
        "state_dict",
        "static_graph",
        "to",
        "to_empty",
        "to_kwargs",
        "train",
        "training",
        "type",
        "use_side_stream_for_tensor_copies",
        "will_sync_module_buffers",
        "xpu",
        "zero_grad",
        "save_pretrained",
    ]
)
# Distributed types under which ``prepare`` does not wrap the model in DDP (``TPU``: XLA's old
# name, still in Accelerate and in the scripts written for it).
_UNWRAPPED_TYPES = frozenset({"NO", "XLA", "TPU"})


class WrappedModelAttribute(Rule):
    """A method or attribute of the model read through the prepared (wrapped) model.

    ## What it does
    Flags `model.generate(...)`, `model.decode(z)`, `model.config`, `model.num_classes` and any
    other attribute that `DistributedDataParallel` does not have itself, read on a name that
    came out of `accelerator.prepare`.

    ## Why is this bad?
    On one process `prepare` returns the model itself and the script works; on two or more it
    returns a `DistributedDataParallel` wrapper, which has `forward`, `parameters()`,
    `state_dict()` and the rest of `nn.Module`, but none of the model's own methods and
    attributes: `AttributeError` on the cluster, never on the laptop.

    ## Example
    ```python
    model = accelerator.prepare(model)
    tokens = model.generate(input_ids, max_new_tokens=20)
    ```

    ## Use instead
    ```python
    model = accelerator.prepare(model)
    tokens = accelerator.unwrap_model(model).generate(input_ids, max_new_tokens=20)
    ```

    ## Fix safety
    Unsafe: the unwrapped model computes without the wrapper, so a method that is part of the
    training step (`loss = model.encode(x)...`) would train without gradient synchronisation.
    There, call `model(...)` (the wrapper's `forward`) instead. No fix where the Accelerator's
    name has since been given to a prepared object (`accelerator = accelerator.prepare(model)`):
    no name holds the Accelerator any more.
    """

    code = "ACL005"
    name = "wrapped-model-attribute"
    severity = Severity.ERROR

    VALID = (
        "accelerator = Accelerator()\nmodel = accelerator.prepare(model)\nmodel.train()\n"
        "out = model(x)\nparams = list(model.parameters())\nwith model.no_sync():\n    pass\n",
        "accelerator = Accelerator()\nmodel = accelerator.prepare(model)\n"
        "out = accelerator.unwrap_model(model).generate(ids)\n",
        "accelerator = Accelerator()\nmodel, opt = accelerator.prepare(model, opt)\n"
        "lr = opt.param_groups[0]['lr']\n",
        "accelerator = Accelerator()\nmodel = accelerator.prepare(model)\n"
        "model = accelerator.unwrap_model(model)\nout = model.generate(ids)\n",
        "accelerator = Accelerator()\n\n\ndef sample(model):\n    return model.generate(ids)\n",
        # DDP's own attributes, and a script that checks for the wrapper itself.
        "accelerator = Accelerator()\nmodel = accelerator.prepare(model)\nbatch = move(batch, "
        "model.device)\n",
        "accelerator = Accelerator()\nmodel = accelerator.prepare(model)\n"
        "config = model.module.config if hasattr(model, 'module') else model.config\n",
        "accelerator = Accelerator()\nmodel = accelerator.prepare(model)\n"
        "if accelerator.distributed_type == DistributedType.XLA:\n    model.tie_weights()\n",
        "accelerator = Accelerator()\nmodel = accelerator.prepare(model)\n"
        "if accelerator.distributed_type == DistributedType.TPU:\n    model.tie_weights()\n",
    )
    INVALID = (
        Invalid(
            "import torch\n\n\nclass Trainer:\n    def __init__(self, model):\n"
            "        self.accelerator = Accelerator()\n"
            "        self.model = self.accelerator.prepare(model)\n\n"
            "    def labels(self):\n        return self.model.config.num_labels\n",
            "import torch\n\n\nclass Trainer:\n    def __init__(self, model):\n"
            "        self.accelerator = Accelerator()\n"
            "        self.model = self.accelerator.prepare(model)\n\n"
            "    def labels(self):\n"
            "        return self.accelerator.unwrap_model(self.model).config.num_labels\n",
        ),
        Invalid(
            "accelerator = Accelerator()\nmodel = accelerator.prepare(model)\n"
            "if accelerator.distributed_type == DistributedType.XLA:\n    pass\n"
            "else:\n    model.tie_weights()\n",
            "accelerator = Accelerator()\nmodel = accelerator.prepare(model)\n"
            "if accelerator.distributed_type == DistributedType.XLA:\n    pass\n"
            "else:\n    accelerator.unwrap_model(model).tie_weights()\n",
        ),
        Invalid(
            "accelerator = Accelerator()\nmodel, opt, dl = accelerator.prepare(model, opt, dl)\n"
            "def evaluate():\n    for batch in dl:\n"
            "        if accelerator.is_main_process:\n"
            "            out = model.generate(batch['input_ids'], max_new_tokens=8)\n",
            "accelerator = Accelerator()\nmodel, opt, dl = accelerator.prepare(model, opt, dl)\n"
            "def evaluate():\n    for batch in dl:\n"
            "        if accelerator.is_main_process:\n"
            "            out = accelerator.unwrap_model(model).generate(batch['input_ids'], "
            "max_new_tokens=8)\n",
        ),
        Invalid(
            "acc = Accelerator()\nvae, optimizer = acc.prepare(vae, optimizer)\n"
            "samples = [vae.decode(z) for z in latents]\n",
            "acc = Accelerator()\nvae, optimizer = acc.prepare(vae, optimizer)\n"
            "samples = [acc.unwrap_model(vae).decode(z) for z in latents]\n",
        ),
        Invalid(
            "accelerator = Accelerator()\nmodel = accelerator.prepare(model)\n"
            "n = model.config.num_labels\n",
            "accelerator = Accelerator()\nmodel = accelerator.prepare(model)\n"
            "n = accelerator.unwrap_model(model).config.num_labels\n",
        ),
        # The model took the Accelerator's name: `accelerator.unwrap_model` is the model's too.
        Invalid(
            "accelerator = Accelerator()\naccelerator = accelerator.prepare(model)\n"
            "out = accelerator.generate(ids)\n"
        ),
        Invalid(
            "accelerator = Accelerator()\nmodel = accelerator.prepare(model)\n"
            "accelerator = accelerator.prepare(net)\nout = model.generate(ids)\n"
        ),
    )

    def __init__(self, facts: Facts, reports: list[Report]) -> None:
        super().__init__(facts, reports)
        self._bound: set[str] = set()  # names some ``prepare`` result was bound to: a cheap gate
        # Per enclosing test, the names the script checks for a wrapper itself ("*": all models).
        self._handled: list[frozenset[str]] = []

    def visit_If_body(self, node: cst.If) -> None:
        self._handled.append(_handles_wrapping(node.test, taken=True))

    def leave_If_body(self, node: cst.If) -> None:
        self._handled.pop()

    def visit_If_orelse(self, node: cst.If) -> None:
        self._handled.append(_handles_wrapping(node.test, taken=False))

    def leave_If_orelse(self, node: cst.If) -> None:
        self._handled.pop()

    def visit_IfExp(self, node: cst.IfExp) -> None:
        self._handled.append(_handles_wrapping(node.test, taken=False))

    def leave_IfExp(self, node: cst.IfExp) -> None:
        self._handled.pop()

    def visit_Assign(self, node: cst.Assign) -> None:
        if prepare_call(node.value, self.facts) is not None or _prepares_one(node.value):
            self._bound.update(n for t in node.targets for n in target_names(t.target))

    def visit_Attribute(self, node: cst.Attribute) -> None:
        value = node.value
        name = dotted_name(value) if isinstance(value, cst.Name | cst.Attribute) else None
        if name is None or name not in self._bound:
            return
        attr = node.attr.value
        if attr in _ON_WRAPPER or attr.startswith("__"):
            return
        if any(name in names or "*" in names for names in self._handled):
            return
        model = self.facts.prepared(value)
        if model is None or model.role is not Role.MODEL or model.name != name:
            return
        problem = (
            f"`{model.name}` is the prepared (wrapped) model: on several processes it has no "
            f"`{attr}`"
        )
        if self._accelerator_rebound(model):
            self.report(
                node,
                f"{problem}; `{model.accelerator}` no longer holds the Accelerator: keep it under "
                f"a name of its own and use its `unwrap_model({model.name}).{attr}`",
            )
            return
        self.report(
            node,
            f"{problem}; use `{model.accelerator}.unwrap_model({model.name}).{attr}`",
            new=node.with_changes(value=unwrapped(model.accelerator, node.value)),
            safe=False,
        )

    def _accelerator_rebound(self, model: Prepared) -> bool:
        """Whether the name ``model`` was prepared through now holds a prepared object: its
        ``unwrap_model`` would be that object's attribute, another finding whose fix wraps it
        again, once per fix pass (``accelerator = accelerator.prepare(model)``)."""
        return self.facts.prepared(name_expr(model.accelerator)) is not None


def _prepares_one(value: cst.BaseExpression) -> bool:
    """``accelerator.prepare_model(...)`` and its kin (the facts check the receiver)."""
    return (
        isinstance(value, cst.Call)
        and isinstance(value.func, cst.Attribute)
        and value.func.attr.value in PREPARE_ONE
    )


def _handles_wrapping(test: cst.BaseExpression, taken: bool) -> frozenset[str]:
    """Names whose wrapping ``test`` decides: ``hasattr(model, "module")`` picks the right form
    on both branches; the branch taken under ``distributed_type == DistributedType.XLA`` (or
    ``NO``) sees no DDP wrapper at all ("*")."""
    names: set[str] = set()
    stack: list[cst.CSTNode] = [test]
    while stack:
        node = stack.pop()
        stack.extend(children(node))
        if isinstance(node, cst.Call) and callee_name(node) == "hasattr" and len(node.args) == 2:
            obj, attr = node.args[0].value, node.args[1].value
            is_string = isinstance(attr, cst.SimpleString)
            name = dotted_name(obj)
            if name is not None and is_string and attr.evaluated_value == "module":
                names.add(name)
        elif taken and isinstance(node, cst.Comparison) and _tests_unwrapped_type(node):
            names.add("*")
    return frozenset(names)


def _tests_unwrapped_type(node: cst.Comparison) -> bool:
    """``x.distributed_type == DistributedType.XLA`` (or ``TPU``; ``is``, either order)."""
    if len(node.comparisons) != 1:
        return False
    target = node.comparisons[0]
    if not isinstance(target.operator, (cst.Equal, cst.Is)):
        return False
    sides = [dotted_name(node.left) or "", dotted_name(target.comparator) or ""]
    return any(side.endswith("distributed_type") for side in sides) and any(
        side.rsplit(".", 1)[-1] in _UNWRAPPED_TYPES and side.startswith("DistributedType")
        for side in sides
    )
