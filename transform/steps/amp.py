"""Native AMP (``GradScaler`` + ``autocast``) becomes ``Accelerator(mixed_precision=...)``.

The accelerator owns the scaler: ``scaler.scale(loss).backward()`` becomes
``accelerator.backward(loss)``, ``scaler.step(opt)`` becomes ``opt.step()``, ``unscale_``/``update``
go (``accelerator.clip_grad_norm_`` unscales first), and ``with autocast(...)`` becomes
``with accelerator.autocast():``. The precision comes from the script: a scaler or a float16
autocast means fp16, a bfloat16 autocast means bf16.
"""

from __future__ import annotations

import libcst as cst

from accelify.transform.patterns import Role, callee_name, dotted_name, keyword_arg, method_call
from accelify.transform.plan import Plan
from accelify.transform.steps.backward import to_accelerator_backward
from accelify.transform.walk import walk

_AUTOCASTS = frozenset({"autocast"})


_SCALER_METHODS = frozenset({"scale", "step", "unscale_", "update"})


def amp(plan: Plan) -> None:
    if plan.setup is None:
        return
    a = plan.analysis
    scalers = [
        b for b in a.bindings if b.value is not None and a.role(b.scope, b.key) is Role.SCALER
    ]
    precision: str | None = "fp16" if scalers else None
    enabled: cst.BaseExpression | None = None
    for call, scope in a.calls:
        receiver = dotted_name(call.func.value) if isinstance(call.func, cst.Attribute) else None
        if receiver is not None and a.role(scope, receiver) is Role.SCALER:
            if call.func.attr.value in _SCALER_METHODS:  # type: ignore[union-attr]
                _rewrite_scaler_call(plan, call)
        elif (
            callee_name(call) in _AUTOCASTS
            and isinstance(a.parent(call), cst.WithItem)
            and a.role(scope, receiver or "") is not Role.ACCELERATOR
        ):
            precision = _autocast_precision(call) or precision
            _rewrite_autocast(plan, call)
    other_uses = _other_scaler_uses(plan) if scalers else []
    for b in scalers:
        if isinstance(b.value, cst.Call) and (flag := keyword_arg(b.value, "enabled")) is not None:
            enabled = flag.value
        if other_uses:
            continue
        plan.remove(a.statement_of(b.node))
        plan.changed(b.node, f"removed {b.key}: the accelerator scales the loss")
    for use in other_uses:
        plan.needs_human(use, "the accelerator scales the loss now: remove this use of the scaler")
    if precision is not None:
        value: cst.BaseExpression = cst.SimpleString(f'"{precision}"')
        if enabled is not None:  # GradScaler(enabled=args.amp): keep the switch
            value = cst.IfExp(test=enabled, body=value, orelse=cst.SimpleString('"no"'))
        plan.accelerator_kwargs.setdefault("mixed_precision", value)


def _other_scaler_uses(plan: Plan) -> list[cst.Name]:
    """Reads of a scaler other than the calls this step rewrites (passed on, checkpointed, ...)."""
    a = plan.analysis
    uses: list[cst.Name] = []

    class _Finder(cst.CSTVisitor):
        def visit_Name(self, node: cst.Name) -> None:
            scope = a.scope_of.get(id(node))
            if scope is None or a.role(scope, node.value) is not Role.SCALER:
                return
            parent = a.parent(node)
            if isinstance(parent, cst.AssignTarget | cst.Param):
                return
            if (
                isinstance(parent, cst.Attribute)
                and parent.value is node
                and parent.attr.value in _SCALER_METHODS
            ):
                return
            uses.append(node)

    walk(a.module, _Finder())
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
    elif method == "scale" and accelerator is not None:
        backward = a.parent(a.parent(call) or call)
        if isinstance(backward, cst.Call) and method_call(backward, "backward") is not None:
            loss = call.args[0].value
            plan.edits.replace(
                backward,
                lambda node, acc=accelerator, loss=loss: to_accelerator_backward(
                    acc, node.with_changes(func=node.func.with_changes(value=loss))
                ),
            )
            plan.changed(call, "scaler.scale(loss).backward() -> accelerator.backward(loss)")


def _autocast_precision(call: cst.Call) -> str | None:
    dtype = keyword_arg(call, "dtype")
    if dtype is not None:
        name = dotted_name(dtype.value) or ""
        return "bf16" if name.endswith("bfloat16") else "fp16"
    device = keyword_arg(call, "device_type") or (
        call.args[0] if call.args and not call.args[0].keyword else None
    )
    if device is not None and isinstance(device.value, cst.SimpleString):
        # CPU autocast defaults to bfloat16, CUDA's to float16.
        return "bf16" if device.value.evaluated_value == "cpu" else "fp16"
    return "fp16" if "cuda" in (dotted_name(call.func) or "") else None


def _rewrite_autocast(plan: Plan, call: cst.Call) -> None:
    accelerator = plan.accelerator(call)
    if accelerator is None:
        plan.needs_human(call, "autocast where the accelerator is not reachable")
        return
    plan.edits.replace(call, cst.Call(cst.Attribute(accelerator, cst.Name("autocast"))))
    plan.changed(call, "autocast -> accelerator.autocast()")
