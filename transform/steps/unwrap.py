"""A prepared model is a wrapper: what the model class adds is reached through
``accelerator.unwrap_model(model)``.

On several processes ``prepare()`` wraps the model (DistributedDataParallel, FSDP, DeepSpeed),
and the wrapper forwards ``model(x)`` and nn.Module's own methods but nothing the model's class
adds: ``model.decode(z)``, ``model.init_hidden(n)`` or ``policy.rewards`` raise AttributeError.
``state_dict``/``load_state_dict`` exist on the wrapper but with its key prefix, so a checkpoint
would not load into a plain model. Both go through ``accelerator.unwrap_model(model)``, as HF's
guides write them; on one process, or on a model not yet prepared, it returns the model itself.
A method the training step itself calls is refused instead: computing the loss through the bare
module would bypass the wrapper, and the replicas would not stay synchronised.
"""

from __future__ import annotations

import libcst as cst

from accelify.transform.analysis import key_of
from accelify.transform.plan import Plan
from accelify.transform.refusals import BARE_MODULE
from accelify.transform.setup import Refused, in_training_step, origins

# What DistributedDataParallel and friends answer for the module itself.
MODULE_API = frozenset(
    {
        "train", "eval", "parameters", "named_parameters", "buffers", "named_buffers",
        "children", "named_children", "modules", "named_modules", "zero_grad",
        "requires_grad_", "to", "cuda", "cpu", "float", "half", "double", "bfloat16", "type",
        "apply", "register_forward_hook", "register_forward_pre_hook",
        "register_full_backward_hook", "register_backward_hook", "training", "forward",
        "__call__",
    }
)  # fmt: skip
# DistributedDataParallel's own switch, set on the wrapper itself (nanoGPT's micro-steps).
SYNC_TOGGLE = "require_backward_grad_sync"
# Not the model's computation: fine from inside the training step too.
_BOOKKEEPING = frozenset({"state_dict", "load_state_dict"})


def unwrap(plan: Plan) -> None:
    setup = plan.setup
    if setup is None or setup.prepare_at is None:
        return
    a = plan.analysis
    models = set(setup.models(a))
    for node, scope in a.attributes:
        key = key_of(node.value)
        if key is None or node.attr.value in MODULE_API | {SYNC_TOGGLE}:
            continue
        if scope not in plan.training:
            continue
        found = origins(a, setup.scope, scope, key)
        if not found or not found <= models or not setup.timeline.after(setup.prepare_at, node):
            continue
        if not all(setup.current(a, k, node) for k in found):
            continue
        called = isinstance(a.parent(node), cst.Call) and a.parent(node).func is node  # type: ignore[union-attr]
        if called and node.attr.value not in _BOOKKEEPING and in_training_step(a, node):
            raise Refused(
                node,
                BARE_MODULE,
                f"the training step calls {key}.{node.attr.value}(...), which the prepared "
                f"(wrapped) model does not have; call {key}(...) itself or convert by hand",
            )
        accelerator = plan.accelerator(node)
        unwrapped = cst.Call(
            cst.Attribute(accelerator, cst.Name("unwrap_model")),  # type: ignore[arg-type]
            args=[cst.Arg(node.value)],
        )
        plan.edits.replace(node.value, unwrapped)
        plan.changed(
            node, f"{key}.{node.attr.value} -> accelerator.unwrap_model({key}).{node.attr.value}"
        )
