"""``loss.backward()`` becomes ``accelerator.backward(loss)``, keeping any arguments.

The accelerator scales the loss for mixed precision and gradient accumulation and calls the
backend's own backward (DeepSpeed's engine, for one), which a bare ``.backward()`` would skip.

A loss scaler's call (``loss_scaler(loss, optimizer, ...)``, :mod:`~accelify.transform.
loss_scaler`) stays: its backward is in a helper module the program shares. With neither of the
accelerator's mixed precision nor its accumulation, ``accelerator.backward(loss)`` is
``loss.backward()``, and DDP averages the gradients of any backward through the prepared model,
so the call trains as before; the report says which backends that holds for.
"""

from __future__ import annotations

import libcst as cst

from accelify.transform.analysis import Scope, key_of
from accelify.transform.gradient_penalty import penalty_alone
from accelify.transform.patterns import Role, dotted_name, method_call
from accelify.transform.plan import Plan
from accelify.transform.refusals import ACCUMULATION, MIXED_PRECISION, UNSYNCED_GRADIENTS
from accelify.transform.setup import Refused, runs_ahead_of_builds


def to_accelerator_backward(accelerator: cst.BaseExpression, call: cst.Call) -> cst.Call:
    """``(loss / n).backward(x=1)`` -> ``accelerator.backward(loss / n, x=1)``."""
    loss = call.func.value.with_changes(lpar=[], rpar=[])  # type: ignore[union-attr]
    # The call keeps its own layout: comments among its arguments stay where they were.
    args = [cst.Arg(loss), *call.args]
    return call.with_changes(func=cst.Attribute(accelerator, cst.Name("backward")), args=args)


def backward(plan: Plan) -> None:
    if plan.setup is None:
        return
    a = plan.analysis
    _refuse_double_backward(plan)
    for call, scope, _loop in a.backward_calls:
        if method_call(call, "backward") is None:
            _keep_loss_scaler(plan, call)
            continue
        receiver = call.func.value  # type: ignore[union-attr]
        if _is_scaled(plan, scope, receiver):
            continue  # the amp step's business
        if runs_ahead_of_builds(a, plan.setup, call, plan.setup.keys):
            plan.info(call, "left as is: it runs before any object prepare() wraps is built")
            continue
        if a.names.qualify(receiver) is not None:  # torch.autograd.backward(...)
            raise Refused(
                call, UNSYNCED_GRADIENTS, f"{dotted_name(call.func)}(...): convert by hand"
            )
        accelerator = plan.accelerator(call)
        plan.edits.replace(call, lambda node, acc=accelerator: to_accelerator_backward(acc, node))
        plan.changed(call, swapped(a.module, receiver, receiver))


def _refuse_double_backward(plan: Plan) -> None:
    """A backward through a gradient penalty alone (see :mod:`gradient_penalty`)."""
    call = penalty_alone(plan.analysis, plan.setup, plan.training)  # type: ignore[arg-type]
    if call is not None:
        raise Refused(
            call,
            UNSYNCED_GRADIENTS,
            "this backward runs through a gradient penalty alone (torch.autograd.grad(..., "
            "create_graph=True)), with no forward of the model besides the penalty's: under "
            "DistributedDataParallel a parameter the penalty does not reach (a last layer's "
            "bias) never finishes reducing, and the next forward fails on every process; add "
            "the penalty to a loss of the model's own outputs, then convert again",
        )


def _keep_loss_scaler(plan: Plan, call: cst.Call) -> None:
    scaler = plan.analysis.module.code_for_node(call.func)
    if plan.options.mixed_precision is not None:
        raise Refused(
            call,
            MIXED_PRECISION,
            f"--mixed-precision: {scaler}(...) scales, runs the backward and steps with a "
            "GradScaler of its own, in a helper the accelerator cannot take it from",
        )
    if plan.options.gradient_accumulation_steps is not None:
        raise Refused(
            call,
            ACCUMULATION,
            f"--gradient-accumulation-steps: {scaler}(...) runs the backward and steps on the "
            "script's own schedule, in a helper accumulate() cannot hold",
        )
    plan.info(
        call,
        f"kept {scaler}(...): its loss scaler runs the backward, the clipping and the step "
        "itself, as written, which is right under DDP (accel-run's default) with the "
        "accelerator's default precision; DeepSpeed, FSDP or --mixed-precision at launch need "
        "them through accelerator.backward() and accelerator.clip_grad_norm_()",
    )


def _is_scaled(plan: Plan, scope: Scope, receiver: cst.BaseExpression) -> bool:
    """``scaler.scale(loss).backward()``."""
    scale = method_call(receiver, "scale")
    key = key_of(scale.func.value) if scale is not None else None  # type: ignore[union-attr]
    return key is not None and plan.analysis.role(scope, key) is Role.SCALER


def swapped(module: cst.Module, receiver: cst.BaseExpression, loss: cst.BaseExpression) -> str:
    """The report of ``receiver.backward()`` becoming ``accelerator.backward(loss)``, in the
    script's own names (``errD_real.backward()``, not a generic ``loss``)."""
    called = _one_line(module.code_for_node(receiver))
    argument = _one_line(module.code_for_node(loss.with_changes(lpar=[], rpar=[])))
    return f"{called}.backward() -> accelerator.backward({argument})"


def _one_line(code: str) -> str:
    """``code`` as a report quotes it: one line, long ones cut in the middle."""
    flat = " ".join(code.split())
    return flat if len(flat) <= 40 else f"{flat[:18]}...{flat[-18:]}"
