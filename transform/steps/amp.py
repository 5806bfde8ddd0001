"""Native AMP (``GradScaler`` + ``autocast``) stays the script's own, unless asked otherwise.

An accelerator with mixed precision runs every ``forward`` of the prepared model under autocast
and hands back fp32 outputs. Whether that computes what the script's own autocast blocks computed
depends on the device's autocast op lists (on the CPU, ``log_softmax`` of a bf16 output stays
bf16; behind the accelerator's forward it is fp32) and on every forward being inside a block. So
by default the script keeps its autocast and GradScaler, which run as written on every process,
and only ``scaler.scale(loss).backward()`` goes through ``accelerator.backward``.

``--mixed-precision fp16|bf16`` hands precision to the Accelerator: ``autocast(...)`` blocks
become ``accelerator.autocast()``, the scaler goes (``scaler.step(opt)`` -> ``opt.step()``,
``unscale_``/``update`` removed, ``accelerator.clip_grad_norm_`` unscales first). A scaler the
script also passes around or checkpoints cannot go: that setup is refused.
"""

from __future__ import annotations

import libcst as cst

from accelify.transform.analysis import key_of
from accelify.transform.patterns import Role, dotted_name, method_call
from accelify.transform.plan import Plan
from accelify.transform.refusals import MIXED_PRECISION
from accelify.transform.setup import BACKWARD, Refused, step_order, stepped_optimizers
from accelify.transform.steps.backward import swapped, to_accelerator_backward
from accelify.transform.walk import nodes

_AUTOCASTS = frozenset({"autocast"})
_SCALER_METHODS = frozenset({"scale", "step", "unscale_", "update"})


def amp(plan: Plan) -> None:
    if plan.setup is None:
        return
    a = plan.analysis
    if plan.options.mixed_precision == "fp16":
        _one_scaler_keeps_steps(plan)
    scalers = [
        b
        for b in a.bindings
        if b.value is not None
        and b.scope in plan.training
        and a.role(b.scope, b.key) is Role.SCALER
    ]
    autocasts = _autocast_calls(plan)
    if not scalers and not autocasts:
        return
    if plan.options.mixed_precision is None:
        _manual(plan)
        return
    if scalers and (uses := _other_scaler_uses(plan)):
        raise Refused(
            uses[0], MIXED_PRECISION, "--mixed-precision: the scaler is also used otherwise"
        )
    for call, scope in plan.training_calls():
        receiver = dotted_name(call.func.value) if isinstance(call.func, cst.Attribute) else None
        if (
            receiver is not None
            and a.role(scope, receiver) is Role.SCALER
            and call.func.attr.value in _SCALER_METHODS  # type: ignore[union-attr]
        ):
            _rewrite_scaler_call(plan, call)
    for call in autocasts:
        accelerator = plan.accelerator(call)
        plan.edits.replace(call, cst.Call(cst.Attribute(accelerator, cst.Name("autocast"))))  # type: ignore[arg-type]
        plan.changed(call, "autocast -> accelerator.autocast()")
    for b in scalers:
        plan.remove(a.statement_of(b.node))
        plan.changed(b.node, f"removed {b.key}: the accelerator scales the loss")


def _one_scaler_keeps_steps(plan: Plan) -> None:
    """fp16 gives the accelerator one GradScaler for all optimizers, updated after each step (as
    HF Accelerate's): gradients scaled before another optimizer's step would be unscaled with
    the updated scale. So with several optimizers every step must follow its own backward, made
    after the previous step (D's backward, D's step, G's backward, G's step)."""
    a = plan.analysis
    setup = plan.setup
    if len(stepped_optimizers(a, setup)) < 2 or not a.backward_calls:  # type: ignore[arg-type]
        return
    within = a.scope_of[id(a.backward_calls[0][0])].node
    previous = BACKWARD
    for key, call in step_order(a, setup, within):  # type: ignore[arg-type]
        if BACKWARD not in (key, previous):
            raise Refused(
                call,
                MIXED_PRECISION,
                f"--mixed-precision fp16: {key}.step() follows {previous}.step() with no "
                f"backward between; the accelerator's one loss scaler changes its scale at "
                f"{previous}.step(), after {key}'s gradients were scaled",
            )
        previous = key


def _autocast_calls(plan: Plan) -> list[cst.Call]:
    a = plan.analysis
    return [
        call
        for call, _scope in plan.training_calls()
        if a.names.last_part(call.func) in _AUTOCASTS
        and isinstance(a.parent(call), cst.WithItem)
        and a.names.refers_to(call.func, ("torch",), "autocast")
    ]


def _manual(plan: Plan) -> None:
    """Keep the script's own AMP; only the scaled backward goes through the accelerator."""
    a = plan.analysis
    anchor: cst.CSTNode | None = next(iter(_autocast_calls(plan)), None)
    for call, scope in plan.training_calls():
        scale = method_call(call, "scale")
        receiver = key_of(scale.func.value) if scale is not None else None  # type: ignore[union-attr]
        backward = a.parent(a.parent(call) or call)
        if (
            receiver is None
            or a.role(scope, receiver) is not Role.SCALER
            or not isinstance(backward, cst.Call)
            or method_call(backward, "backward") is None
        ):
            continue
        accelerator = plan.accelerator(call)
        plan.edits.replace(
            backward,
            lambda node, acc=accelerator: to_accelerator_backward(acc, node),  # type: ignore[arg-type]
        )
        plan.changed(call, "scaler.scale(loss).backward() -> accelerator.backward(...)")
        anchor = anchor or call
    plan.info(
        anchor,  # type: ignore[arg-type]
        "kept the script's own mixed precision: it runs as written on every process. "
        "--mixed-precision hands it to the Accelerator, which runs every forward in mixed "
        "precision with fp32 outputs (numbers change)",
    )


def _other_scaler_uses(plan: Plan) -> list[cst.Name]:
    """Reads of a scaler other than its own method calls (passed on, checkpointed, ...)."""
    a = plan.analysis
    uses: list[cst.Name] = []
    for node in nodes(a.module, cst.Name):
        scope = a.scope_of.get(id(node))
        if scope not in plan.training or a.role(scope, node.value) is not Role.SCALER:
            continue
        parent = a.parent(node)
        if isinstance(parent, cst.AssignTarget | cst.Param):
            continue
        if (
            isinstance(parent, cst.Attribute)
            and parent.value is node
            and parent.attr.value in _SCALER_METHODS
        ):
            continue
        uses.append(node)
    return uses


def _rewrite_scaler_call(plan: Plan, call: cst.Call) -> None:
    a = plan.analysis
    method = call.func.attr.value  # type: ignore[union-attr]
    accelerator = plan.accelerator(call)
    if method in {"update", "unscale_"} and isinstance(a.parent(call), cst.Expr):
        plan.remove(a.statement_of(call))  # type: ignore[arg-type]
        plan.changed(call, f"removed scaler.{method}(): the accelerator handles it")
    elif method == "step" and call.args:
        optimizer = call.args[0].value
        plan.edits.replace(call, cst.Call(cst.Attribute(optimizer, cst.Name("step"))))
        plan.changed(call, "scaler.step(optimizer) -> optimizer.step()")
    elif method == "scale":
        backward = a.parent(a.parent(call) or call)
        if isinstance(backward, cst.Call) and method_call(backward, "backward") is not None:
            loss = call.args[0].value
            plan.edits.replace(
                backward,
                lambda node, acc=accelerator, loss=loss: to_accelerator_backward(
                    acc, node.with_changes(func=node.func.with_changes(value=loss))
                ),
            )
            plan.changed(call, swapped(a.module, call, loss))
