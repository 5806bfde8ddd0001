"""``loss.backward()`` becomes ``accelerator.backward(loss)``, keeping any arguments.

The accelerator scales the loss for mixed precision and gradient accumulation and calls the
backend's own backward (DeepSpeed's engine, for one), which a bare ``.backward()`` would skip.
"""

from __future__ import annotations

import libcst as cst

from accelify.transform.analysis import key_of
from accelify.transform.patterns import Role
from accelify.transform.plan import Plan


def to_accelerator_backward(accelerator: cst.BaseExpression, call: cst.Call) -> cst.Call:
    """``(loss / n).backward(x=1)`` -> ``accelerator.backward(loss / n, x=1)``."""
    loss = call.func.value.with_changes(lpar=[], rpar=[])  # type: ignore[union-attr]
    args = [cst.Arg(loss), *call.args]
    return cst.Call(cst.Attribute(accelerator, cst.Name("backward")), args=args)


def backward(plan: Plan) -> None:
    if plan.setup is None:
        return
    a = plan.analysis
    for call, scope, _loop in a.backward_calls:
        receiver = key_of(call.func.value)  # type: ignore[union-attr]
        if _is_scaled(call) or (receiver and a.role(scope, receiver) is Role.ACCELERATOR):
            continue  # the amp step's business, or already accelerator.backward(loss)
        accelerator = plan.accelerator(call)
        if accelerator is None:
            plan.needs_human(call, "backward() where the accelerator is not reachable")
            continue
        plan.edits.replace(call, lambda node, acc=accelerator: to_accelerator_backward(acc, node))
        plan.changed(call, "loss.backward() -> accelerator.backward(loss)")


def _is_scaled(call: cst.Call) -> bool:
    receiver = call.func.value  # type: ignore[union-attr]
    return (
        isinstance(receiver, cst.Call)
        and isinstance(receiver.func, cst.Attribute)
        and receiver.func.attr.value == "scale"
    )
