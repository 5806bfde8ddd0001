"""Drop ``.to(device)`` / ``.cuda()`` on the model and on batches of prepared loaders.

``prepare()`` puts the model on the right device and the prepared loaders yield batches already
there, so those moves are redundant on DDP and wrong under DeepSpeed/FSDP. Moves of tensors the
script creates itself stay: they still need ``device`` (which now is ``accelerator.device``).
Dtype casts survive: ``x.to(device, torch.float16)`` becomes ``x.to(torch.float16)``.
"""

from __future__ import annotations

import libcst as cst

from accelify.transform import patterns
from accelify.transform.analysis import Analysis, Loop, key_of
from accelify.transform.patterns import Role, dotted_name, is_device, target_names
from accelify.transform.plan import Plan


def device_move(call: cst.CSTNode, a: Analysis) -> cst.Call | None:
    """``call`` as a move to a device, counting names the analysis knows hold one."""

    def known_device(expr: cst.BaseExpression) -> bool:
        key = key_of(expr)
        return is_device(expr) or (
            key is not None and a.role(a.scope_of[id(call)], key) is Role.DEVICE
        )

    return patterns.device_move(call, known_device)


def without_move(move: cst.Call) -> cst.BaseExpression:
    """``x.to(device, dtype)`` -> ``x.to(dtype)``; ``x.to(device)`` / ``x.cuda()`` -> ``x``."""
    receiver = move.func.value  # type: ignore[union-attr]
    rest = [
        arg for arg in move.args[1:] if not (arg.keyword and arg.keyword.value == "non_blocking")
    ]
    if move.func.attr.value == "cuda" or not rest:  # type: ignore[union-attr]
        return receiver
    rest[-1] = rest[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
    return move.with_changes(args=rest)


def moves(plan: Plan) -> None:
    setup = plan.setup
    if setup is None:
        return
    a = plan.analysis
    prepared = {b.key for b in setup.prepared} | setup.already_prepared
    models = {k for k in prepared if a.role(setup.scope, k) is Role.MODEL}
    for call, scope in a.calls:
        move = device_move(call, a)
        if move is None:
            continue
        receiver = _receiver_key(move.func.value)  # type: ignore[union-attr]
        if receiver is not None and (
            a.role(scope, receiver) is Role.MODEL
            and (receiver in models or scope is not setup.scope)
        ):
            _drop_model_move(plan, move, receiver)
        elif receiver is not None and _is_batch(a, move, receiver):
            _drop_batch_move(plan, move, receiver)
        elif _is_model_build(a, move):
            plan.edits.replace(move, without_move)  # Net().to(device)
            plan.changed(move, "model placement left to prepare()")
    for loop in a.loops:
        if _prepared_loop(a, loop):
            _drop_comprehension_moves(plan, loop)


def _receiver_key(receiver: cst.BaseExpression) -> str | None:
    """``x`` for ``x.to(...)`` and for ``x[0].to(...)`` / ``x["ids"].to(...)``."""
    if isinstance(receiver, cst.Subscript):
        receiver = receiver.value
    return key_of(receiver)


def _is_model_build(a: Analysis, move: cst.Call) -> bool:
    """``Net().to(device)`` assigned to a model name."""
    assign = a.parent(move)
    if not isinstance(assign, cst.Assign) or assign.value is not move:
        return False
    return any(
        (key := key_of(t.target)) is not None and a.role(a.scope_of[id(move)], key) is Role.MODEL
        for t in assign.targets
    )


def _drop_model_move(plan: Plan, move: cst.Call, receiver: str) -> None:
    a = plan.analysis
    parent = a.parent(move)
    statement = a.statement_of(move)
    if isinstance(parent, cst.Expr) or _self_assign(parent, receiver, move):
        plan.remove(statement)
    else:
        plan.edits.replace(move, without_move)
    plan.changed(move, f"removed the move of {receiver}: prepare() places the model")


def _self_assign(parent: cst.CSTNode | None, receiver: str, move: cst.Call) -> bool:
    """``x = x.to(device)``."""
    return (
        isinstance(parent, cst.Assign)
        and parent.value is move
        and len(parent.targets) == 1
        and key_of(parent.targets[0].target) == receiver
    )


def _is_batch(a: Analysis, move: cst.Call, receiver: str) -> bool:
    loop = a.loop_of(move)
    return loop is not None and _prepared_loop(a, loop) and receiver in batch_names(a, loop)


def _prepared_loop(a: Analysis, loop: Loop) -> bool:
    return loop.iterable is not None and a.role(loop.scope, loop.iterable) is Role.DATALOADER


def batch_names(a: Analysis, loop: Loop) -> set[str]:
    """The loop's batch names plus names unpacked or indexed from them (``x, y = batch``)."""
    names = set(loop.batch_names)
    for b in a.bindings:
        if b.scope is not loop.scope or a.enclosing(b.node, cst.For) is not loop.node:
            continue
        if not isinstance(b.node, cst.Assign):
            continue
        value = b.node.value
        if isinstance(value, cst.Subscript):  # x = batch["input_ids"]
            value = value.value
        if key_of(value) in names:
            names.update(n for t in b.node.targets for n in target_names(t.target))
    return names


def _drop_batch_move(plan: Plan, move: cst.Call, receiver: str) -> None:
    a = plan.analysis
    parent = a.parent(move)
    if _self_assign(parent, receiver, move) or _is_tuple_of_moves(a, parent, move):
        plan.remove(a.statement_of(move))
    else:
        plan.edits.replace(move, without_move)
    plan.changed(move, f"removed the move of {receiver}: prepared loaders place batches")


def _is_tuple_of_moves(a: Analysis, element: cst.CSTNode | None, move: cst.Call) -> bool:
    """``x, y = x.to(device), y.to(device)``: every element moves the name it is assigned to."""
    tup = a.parent(element) if isinstance(element, cst.Element) else None
    assign = a.parent(tup) if isinstance(tup, cst.Tuple) else None
    if not isinstance(assign, cst.Assign) or len(assign.targets) != 1:
        return False
    target = assign.targets[0].target
    if not isinstance(target, cst.Tuple) or len(target.elements) != len(tup.elements):  # type: ignore[union-attr]
        return False
    for t, v in zip(target.elements, tup.elements, strict=True):  # type: ignore[union-attr]
        inner = device_move(v.value, a)
        if inner is None or key_of(inner.func.value) != key_of(t.value):  # type: ignore[union-attr]
            return False
    return True


def _drop_comprehension_moves(plan: Plan, loop: Loop) -> None:
    """``{k: v.to(device) for k, v in batch.items()}``, ``tuple(t.to(device) for t in batch)``."""
    a = plan.analysis
    for b in a.bindings:
        if b.key not in loop.batch_names or a.enclosing(b.node, cst.For) is not loop.node:
            continue
        value = b.node.value if isinstance(b.node, cst.Assign) else None
        if _moves_each_item(a, value, b.key):
            plan.remove(a.statement_of(b.node))
            plan.changed(b.node, f"removed the move of {b.key}: prepared loaders place batches")


def _moves_each_item(a: Analysis, value: cst.CSTNode | None, batch: str) -> bool:
    if isinstance(value, cst.Call) and dotted_name(value.func) in {"tuple", "list"} and value.args:
        value = value.args[0].value
    if isinstance(value, cst.DictComp):
        element: cst.CSTNode = value.value
    elif isinstance(value, cst.GeneratorExp | cst.ListComp):
        element = value.elt
    else:
        return False
    source = (
        dotted_name(value.for_in.iter.func)
        if isinstance(value.for_in.iter, cst.Call)
        # type: ignore[union-attr]
        else (dotted_name(value.for_in.iter))
    )
    return device_move(element, a) is not None and source in {batch, f"{batch}.items"}
