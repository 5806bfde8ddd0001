"""Native AMP (``GradScaler`` + ``autocast``) becomes ``Accelerator(mixed_precision=...)``.

The accelerator owns the scaler: ``scaler.scale(loss).backward()`` becomes
``accelerator.backward(loss)``, ``scaler.step(opt)`` becomes ``opt.step()``, ``unscale_``/``update``
go (``accelerator.clip_grad_norm_`` unscales first), and ``with autocast(...)`` becomes
``with accelerator.autocast():``. The precision comes from the script: a scaler or a float16
autocast means fp16, a bfloat16 autocast means bf16; ``enabled=flag`` keeps the switch.

An accelerator with mixed precision also runs the prepared model's ``forward`` under autocast,
everywhere. That only computes the same thing when the script already ran every call of the model
under autocast: otherwise (an evaluation outside the block, ``enabled=False``, two precisions) the
script keeps its own autocast and scaler, which run as written on every process, and only
``scaler.scale(loss).backward()`` goes through ``accelerator.backward``.
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from accelify.transform.analysis import key_of
from accelify.transform.patterns import Role, dotted_name, keyword_arg, method_call
from accelify.transform.plan import Plan
from accelify.transform.setup import Refused, origins
from accelify.transform.steps.accelerator import picks_device
from accelify.transform.steps.backward import to_accelerator_backward
from accelify.transform.walk import Visitor, walk

_AUTOCASTS = frozenset({"autocast"})
_SCALER_METHODS = frozenset({"scale", "step", "unscale_", "update"})


_OFF = "off"  # ``enabled=False``
_UNKNOWN = "unknown"  # a dtype and device type the script only decides at run time


@dataclass
class _Autocast:
    call: cst.Call
    precision: str  # "fp16", "bf16", _OFF or _UNKNOWN
    enabled: cst.BaseExpression | None  # a switch the script keeps


def amp(plan: Plan) -> None:
    if plan.setup is None:
        return
    a = plan.analysis
    scalers = [
        b
        for b in a.bindings
        if b.value is not None
        and b.scope in plan.training
        and a.role(b.scope, b.key) is Role.SCALER
    ]
    autocasts = [_autocast(plan, call) for call in _autocast_calls(plan)]
    if not scalers and not autocasts:
        return
    why, hard = _keep_manual(plan, scalers, autocasts)
    if why is not None and (hard or plan.options.mixed_precision is None):
        if plan.options.mixed_precision is not None:
            raise Refused(scalers[0].node, f"--mixed-precision: {why}")
        _manual(plan, why)
        return
    precisions = {c.precision for c in autocasts} or {"fp16"}
    precision = precisions.pop() if len(precisions) == 1 else "fp16"
    switches = [c.enabled for c in autocasts if c.enabled is not None]
    for b in scalers:
        flag = keyword_arg(b.value, "enabled") if isinstance(b.value, cst.Call) else None
        if flag is not None:
            switches.append(flag.value)
    for call, scope in plan.training_calls():
        receiver = dotted_name(call.func.value) if isinstance(call.func, cst.Attribute) else None
        if (
            receiver is not None
            and a.role(scope, receiver) is Role.SCALER
            and call.func.attr.value in _SCALER_METHODS  # type: ignore[union-attr]
        ):
            _rewrite_scaler_call(plan, call)
    for autocast in autocasts:
        accelerator = plan.accelerator(autocast.call)
        plan.edits.replace(
            autocast.call,
            cst.Call(cst.Attribute(accelerator, cst.Name("autocast"))),  # type: ignore[arg-type]
        )
        plan.changed(autocast.call, "autocast -> accelerator.autocast()")
    for b in scalers:
        plan.remove(a.statement_of(b.node))
        plan.changed(b.node, f"removed {b.key}: the accelerator scales the loss")
    value: cst.BaseExpression = cst.SimpleString(f'"{precision}"')
    if switches:  # GradScaler(enabled=args.amp): keep the switch
        value = cst.IfExp(test=switches[0], body=value, orelse=cst.SimpleString('"no"'))
    plan.accelerator_kwargs.setdefault("mixed_precision", value)


def _autocast_calls(plan: Plan) -> list[cst.Call]:
    a = plan.analysis
    return [
        call
        for call, _scope in plan.training_calls()
        if a.names.last_part(call.func) in _AUTOCASTS
        and isinstance(a.parent(call), cst.WithItem)
        and a.names.refers_to(call.func, ("torch",), "autocast")
    ]


def _autocast(plan: Plan, call: cst.Call) -> _Autocast:
    precision = _autocast_precision(call) or _UNKNOWN
    enabled = keyword_arg(call, "enabled")
    if enabled is None:
        return _Autocast(call, precision, None)
    if isinstance(enabled.value, cst.Name) and enabled.value.value in {"True", "False"}:
        return _Autocast(call, precision if enabled.value.value == "True" else _OFF, None)
    return _Autocast(call, precision, enabled.value)


def _keep_manual(plan: Plan, scalers: list, autocasts: list[_Autocast]) -> tuple[str | None, bool]:
    """Why the accelerator cannot take the script's mixed precision over as it is (or None), and
    whether even ``--mixed-precision`` cannot make it (the scaler would have to stay)."""
    if scalers and _other_scaler_uses(plan):
        return "the scaler is also used otherwise (passed on or checkpointed)", True
    precisions = {c.precision for c in autocasts}
    if _OFF in precisions:
        return "an autocast block is switched off", False
    if _UNKNOWN in precisions:
        return "the script picks the autocast dtype at run time", False
    if len(precisions) > 1:
        return "autocast blocks use different precisions", False
    if len({plan.analysis.module.code_for_node(c.enabled) for c in autocasts if c.enabled}) > 1:
        return "autocast blocks are switched by different flags", False
    if scalers and "bf16" in precisions:
        return "a GradScaler with bfloat16 autocast", False
    if not autocasts:
        return "a GradScaler without autocast", False
    on_cpu = not picks_device(plan.analysis)
    for c in autocasts:
        device = _autocast_device(c.call)
        if device is not None and device != ("cpu" if on_cpu else None):
            where = "the CPU" if on_cpu else "whichever device the accelerator picks"
            return f"autocast names {device!r} while the script runs on {where}", False
    outside = _model_calls_outside(plan, [c.call for c in autocasts])
    if outside is not None:
        line = plan.analysis.line(outside)
        return (
            f"the model also runs outside autocast (line {line}), and the accelerator would run "
            "every forward in mixed precision",
            False,
        )
    return None, False


def _manual(plan: Plan, why: str) -> None:
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
        f"kept the script's own mixed precision ({why}); it runs as written on every process. "
        "--mixed-precision hands precision to the Accelerator instead",
    )


def _model_calls_outside(plan: Plan, autocasts: list[cst.Call]) -> cst.CSTNode | None:
    """A call of a prepared model that runs outside every autocast block, or None."""
    a = plan.analysis
    setup = plan.setup
    models = {k for k in setup.keys if a.role(setup.scope, k) is Role.MODEL}  # type: ignore[union-attr]
    blocks = [a.enclosing(call, cst.With) for call in autocasts]
    for call, scope in plan.training_calls():
        key = key_of(call.func)
        if key is None or not origins(a, setup.scope, scope, key) & models:  # type: ignore[union-attr]
            continue
        if not any(block is not None and a.contains(block, call) for block in blocks):
            return call
    return None


def _other_scaler_uses(plan: Plan) -> list[cst.Name]:
    """Reads of a scaler other than its own method calls (passed on, checkpointed, ...)."""
    a = plan.analysis
    uses: list[cst.Name] = []

    class _Finder(Visitor):
        def visit_Name(self, node: cst.Name) -> None:
            scope = a.scope_of.get(id(node))
            if scope not in plan.training or a.role(scope, node.value) is not Role.SCALER:
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
            plan.changed(call, "scaler.scale(loss).backward() -> accelerator.backward(loss)")


def _autocast_device(call: cst.Call) -> str | None:
    """The device type an autocast names literally (``torch.cuda.amp.autocast`` names "cuda");
    None when it comes from the script's device at run time."""
    dotted = dotted_name(call.func) or ""
    if ".cuda." in f".{dotted}" or ".cpu." in f".{dotted}":
        return "cuda" if ".cuda." in f".{dotted}" else "cpu"
    device = keyword_arg(call, "device_type") or (
        call.args[0] if call.args and not call.args[0].keyword else None
    )
    if device is not None and isinstance(device.value, cst.SimpleString):
        return str(device.value.evaluated_value)
    return None


def _autocast_precision(call: cst.Call) -> str | None:
    """fp16 or bf16 from ``dtype=``, else from the device type autocast defaults for."""
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
