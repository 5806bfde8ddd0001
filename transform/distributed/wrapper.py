"""``DDP(model, device_ids=[rank], **options)`` -> ``model``; ``model.module`` -> the bare model.

The single-process script trains the bare model and the conversion prepares it, which wraps it
again on several processes. The options that change what DistributedDataParallel does carry over
as ``DistributedDataParallelKwargs`` (the accelerator's ``kwargs_handlers``); where to put the
model (``device_ids``, ``output_device``) is the accelerator's to decide. ``model.module`` of a
wrapped model is the bare model: ``accelerator.unwrap_model(model)``, which is the model itself
on one process or before prepare(), and the module inside the wrapper after it (an alias such as
``raw_model = model.module`` keeps meaning the bare module wherever it is taken). Reached through
(``model.module.decode(z)``), it becomes ``model.decode(z)``, which the conversion's unwrap step
sends to the module. Any other ``.module`` in the file is refused: it may be a wrapper's that the
rewrite did not see.
"""

from __future__ import annotations

import libcst as cst

from accelify.transform.analysis import Analysis, Scope, key_of, unwrap_moves
from accelify.transform.distributed.context import Rewrite
from accelify.transform.patterns import placeholder
from accelify.transform.refusals import DDP_WRAPPER
from accelify.transform.walk import nodes

# Options DistributedDataParallelKwargs takes, as DistributedDataParallel does.
CARRIED = frozenset(
    {
        "find_unused_parameters",
        "broadcast_buffers",
        "gradient_as_bucket_view",
        "static_graph",
        "bucket_cap_mb",
        "check_reduction",
    }
)
_PLACEMENT = frozenset({"device_ids", "output_device"})


def unwrap_ddp(r: Rewrite) -> None:
    a = r.analysis
    for call, scope in a.calls:
        if a.names.last_part(call.func) != "DistributedDataParallel" or not a.names.refers_to(
            call.func, ("torch",), "DistributedDataParallel"
        ):
            continue
        model = _options(r, call)
        parent = a.parent(call)
        line = a.parent(parent) if isinstance(parent, cst.Assign) else None
        target = parent.targets[0].target if isinstance(parent, cst.Assign) else None
        if target is not None and key_of(target) is not None:
            r.wrapped.add((r.owner(scope, key_of(target)), key_of(target)))  # type: ignore[arg-type]
        same = target is not None and _already(r, scope, target, model)
        if same and isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1:
            r.remove(line)
        else:
            r.edits.replace(call, lambda _node, m=model: m)
        r.changed(call, "DistributedDataParallel removed: prepare() wraps the model")
    for attribute in nodes(a.module, cst.Attribute):
        if attribute.attr.value != "module":  # type: ignore[attr-defined]
            continue
        if not r.is_wrapped(attribute.value):  # type: ignore[attr-defined]
            raise r.refuse(
                attribute, DDP_WRAPPER, "reads .module of a model the conversion cannot follow"
            )
        parent = a.parent(attribute)
        if isinstance(parent, cst.Attribute) and parent.value is attribute:
            # ``model.module.decode(z)``: the unwrap step reaches what the model's class adds.
            r.edits.replace(attribute, lambda node: node.value)  # type: ignore[attr-defined]
            continue
        either = _either(a, attribute)  # ``model.module if ddp else model``: the bare model too
        r.edits.replace(
            either or attribute,
            lambda _node, m=attribute.value: cst.Call(placeholder("unwrap_model"), [cst.Arg(m)]),  # type: ignore[attr-defined]
        )


def _either(a: Analysis, attribute: cst.Attribute) -> cst.IfExp | None:
    """The ``x.module if c else x`` (or ``x if c else x.module``) around ``attribute``."""
    parent = a.parent(attribute)
    if not isinstance(parent, cst.IfExp) or parent.test is attribute:
        return None
    other = parent.orelse if parent.body is attribute else parent.body
    return parent if other.deep_equals(attribute.value) else None


def _already(
    r: Rewrite, scope: Scope, target: cst.BaseExpression, model: cst.BaseExpression
) -> bool:
    """Whether ``target`` already holds ``model`` (``self.model = model.to(rank)`` above
    ``self.model = DDP(model)``: a module's ``.to`` moves it in place and returns it)."""
    code = r.analysis.module.code_for_node
    if code(target) == code(model):
        return True
    line = r.analysis.line(target)
    earlier = [
        b
        for b in r.analysis.bindings
        if b.scope is scope and b.key == key_of(target) and r.analysis.line(b.node) < line
    ]
    last = max(earlier, key=lambda b: r.analysis.line(b.node), default=None)
    return (
        last is not None
        and last.value is not None
        and not last.nested
        and code(unwrap_moves(last.value)) == code(model)
    )


def _options(r: Rewrite, call: cst.Call) -> cst.BaseExpression:
    """The wrapped model; the options that carry over go to ``r.ddp_options``."""
    model = next((arg.value for arg in call.args if arg.keyword is None), None)
    positional = [arg for arg in call.args if arg.keyword is None]
    if model is None or len(positional) > 2 or any(arg.star for arg in call.args):
        raise r.refuse(call, DDP_WRAPPER, "DistributedDataParallel is given options by position")
    for arg in call.args:
        if arg.keyword is None or arg.keyword.value in _PLACEMENT:
            continue
        name = arg.keyword.value
        if name not in CARRIED:
            raise r.refuse(
                call, DDP_WRAPPER, f"DistributedDataParallel's {name}= has no Accelerate equivalent"
            )
        if not isinstance(arg.value, cst.Name | cst.Integer | cst.Float) or (
            isinstance(arg.value, cst.Name) and arg.value.value not in {"True", "False"}
        ):
            raise r.refuse(
                arg, DDP_WRAPPER, f"{name}= is computed; set DistributedDataParallelKwargs by hand"
            )
        earlier = r.ddp_options.get(name)
        if earlier is not None and earlier.deep_equals(arg.value) is False:
            raise r.refuse(arg, DDP_WRAPPER, f"the models are wrapped with different {name}=")
        r.ddp_options[name] = arg.value
    return model
