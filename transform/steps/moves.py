"""Drop ``.to(device)`` / ``.cuda()`` on the model and on batches of prepared loaders.

``prepare()`` puts the model on the right device and the prepared loaders yield batches already
there, so those moves are redundant on DDP and wrong under DeepSpeed/FSDP. Moves of tensors the
script creates itself stay: they still need ``device`` (which now is ``accelerator.device``).
Dtype casts survive: ``x.to(device, torch.float16)`` becomes ``x.to(torch.float16)``.

A model the script runs before ``prepare()`` (a smoke test, an evaluation before training) needs
its device then already, with inputs the script puts there: its move stays, made to
``accelerator.device``, where prepare() later finds it.
"""

from __future__ import annotations

import libcst as cst

from accelify.transform import patterns
from accelify.transform.analysis import (
    MODE_CALLS,
    Analysis,
    Loop,
    Scope,
    key_of,
    mentions,
    unwrap_moves,
)
from accelify.transform.neighbours import moves_its_argument, moving_function
from accelify.transform.patterns import (
    Role,
    dotted_name,
    is_device,
    keyword_arg,
    method_call,
    moved_to,
    target_names,
    unpacked,
)
from accelify.transform.plan import Plan
from accelify.transform.refusals import HAND_PICKED_DEVICE
from accelify.transform.setup import Refused, origins
from accelify.transform.sources import python_ast


def device_move(call: cst.CSTNode, a: Analysis) -> cst.Call | None:
    """``call`` as a move to a device, counting names the analysis knows hold one."""

    def known_device(expr: cst.BaseExpression) -> bool:
        key = key_of(expr)
        return is_device(expr, names=a.names) or (
            key is not None and a.role(a.scope_of[id(call)], key) is Role.DEVICE
        )

    return patterns.device_move(call, known_device)


def without_move(move: cst.Call) -> cst.BaseExpression:
    """``x.to(device, dtype)`` -> ``x.to(dtype)``; ``x.to(device)`` / ``x.cuda()`` -> ``x``."""
    receiver = move.func.value  # type: ignore[union-attr]
    rest = _besides_device(move)
    return move.with_changes(args=rest) if rest else receiver


def _besides_device(move: cst.Call) -> list[cst.Arg]:
    """The arguments of ``x.to(...)`` but the device (``device=`` or the first) and
    ``non_blocking``; none for ``x.cuda()``."""
    if move.func.attr.value == "cuda":  # type: ignore[union-attr]
        return []
    device = keyword_arg(move, "device") or (move.args[0] if move.args else None)
    rest = [
        arg
        for arg in move.args
        if arg is not device and not (arg.keyword and arg.keyword.value == "non_blocking")
    ]
    if rest:  # the last one ends the call now
        rest[-1] = rest[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
    return rest


def moves(plan: Plan) -> None:
    setup = plan.setup
    if setup is None:
        return
    a = plan.analysis
    models = set(setup.models(a))
    _refuse_a_moving_helper(plan, models)
    travelling = _moved_elsewhere(plan, models)
    early = _run_before_prepare(plan, models)
    placed: list[cst.Call] = []  # the model's moves, now the accelerator's to make
    kept: list[cst.Call] = []
    for call, scope in plan.training_calls():
        move = device_move(call, a)
        if move is None:
            continue
        receiver = _receiver_key(move.func.value)  # type: ignore[union-attr]
        if receiver is not None and _prepared_model(plan, scope, receiver, move, models):
            placed.append(move)
            found = origins(a, setup.scope, scope, receiver)
            if found & early:
                _place_model_move(plan, move, receiver)
            elif not (travelling & found) or _is_build(a, move):
                _drop_model_move(plan, move, receiver)
        elif receiver is not None and _is_batch(plan, move, receiver):
            _drop_batch_move(plan, move, receiver)
        elif (built := _model_built(plan, move, models)) is not None:
            placed.append(move)
            if built & early:
                _place_model_move(plan, move, ", ".join(sorted(built & early)))
            else:
                plan.edits.replace(move, without_move)  # Net().to(device)
                plan.changed(move, "model placement left to prepare()")
        else:
            kept.append(move)
    for loop in a.loops:
        if loop.scope in plan.training and prepared_loop(plan, loop):
            _drop_comprehension_moves(plan, loop)
    _refuse_a_flag_beside_the_accelerator(plan, placed, kept)


def _refuse_a_flag_beside_the_accelerator(
    plan: Plan, placed: list[cst.Call], kept: list[cst.Call]
) -> None:
    """makemore's ``model.to(args.device)`` with ``--device cpu`` by default: the model now goes
    where the accelerator puts it, a GPU wherever there is one, while the moves that stay
    (``t.to(args.device)`` of batches no prepared loader gives) still follow the flag, to the CPU
    or to ``cuda:2``. A device held in a name (``device = torch.device(args.device)``) becomes
    the accelerator's and every move follows it; one read from an object's attribute each time
    cannot, so the setup is refused where a kept move reads it."""
    a = plan.analysis
    code = a.module.code_for_node
    flags = {code(d) for m in placed if (d := moved_to(m)) is not None and _a_flag(d)}
    for move in kept:
        device = moved_to(move)
        statement = a.statement_of(move)
        if device is None or code(device) not in flags or plan.edits.is_removed(statement):  # type: ignore[arg-type]
            continue
        raise Refused(
            move,
            HAND_PICKED_DEVICE,
            f"this move follows {code(device)}, as the model's did; prepare() now puts the "
            f"model on the accelerator's device, which {code(device)} does not choose (the CPU "
            "asked for on a machine with a GPU, or cuda:2): bind device = "
            f"torch.device({code(device)}) once, move to it, and convert again",
        )


def _refuse_a_moving_helper(plan: Plan, models: set[str]) -> None:
    """Beta-VAE's ``self.net = cuda(Net(...), self.use_cuda)``, with ``cuda`` a function (of the
    file or of a module beside it) that returns what it is given moved to the GPU, or not: the
    script's device choice goes through it, for the model and the batches alike. The conversion
    can neither read that choice nor take the model's move out of it, and the batches' moves
    would still follow the flag while prepare() places the model: refused."""
    a = plan.analysis
    setup = plan.setup
    assert setup is not None
    model_values = {
        id(unwrap_moves(b.value))
        for b in a.bindings
        if b.value is not None and origins(a, setup.scope, b.scope, b.key) & models
    }
    for call, scope in a.calls:
        handed = id(call) in model_values or any(
            (key := key_of(arg.value)) is not None and origins(a, setup.scope, scope, key) & models
            for arg in call.args
        )
        if handed and _moving(plan, call):
            raise Refused(
                call,
                HAND_PICKED_DEVICE,
                f"the model goes through {dotted_name(call.func)}(), which returns what it is "
                "given moved to a device: the script picks the model's device, and its "
                "batches', through it, which prepare() cannot take over; move the model with "
                ".to(device) in this file, or convert by hand",
            )


def _moving(plan: Plan, call: cst.Call) -> bool:
    """Whether ``call`` runs a function of this file, or of a module beside it, that returns
    what it is given moved to a device."""
    a = plan.analysis
    local = a.callee(call)
    if local is not None and isinstance(local.node, cst.FunctionDef):
        # libcst writes a nested definition out on its own, at column 0
        code = a.module.code_for_node(local.node.with_changes(decorators=()))
        return moves_its_argument(python_ast(code, a.path).body[0])  # type: ignore[arg-type]
    qualified = a.names.qualify(call.func)
    return qualified is not None and "." in qualified and moving_function(a.path, qualified)


def _a_flag(device: cst.BaseExpression) -> bool:
    """``args.device``, ``cfg.train.device``: an object's attribute, not this class's own
    (``self.device``) nor the accelerator's."""
    name = dotted_name(device) if isinstance(device, cst.Attribute) else None
    return name is not None and name.split(".")[0] not in {"self", "accelerator"}


def _prepared_model(
    plan: Plan, scope: Scope, key: str, node: cst.CSTNode, models: set[str]
) -> bool:
    """Whether ``key`` at ``node`` holds a model prepare() wraps (not a later rebuild of it)."""
    setup = plan.setup
    a = plan.analysis
    found = origins(a, setup.scope, scope, key)  # type: ignore[union-attr]
    return bool(found) and found <= models and all(setup.current(a, k, node) for k in found)  # type: ignore[union-attr]


def _moved_elsewhere(plan: Plan, models: set[str]) -> set[str]:
    """Prepared models the script also moves off the device (``.cpu()``, ``.to("cpu")`` to save
    them): their moves back are kept, prepare() placed them only once. Moved off and back while
    training goes on, a DistributedDataParallel model stops averaging gradients (the parameters'
    hooks are lost): that is refused."""
    a = plan.analysis
    setup = plan.setup
    out: set[str] = set()
    for call, scope in plan.training_calls():
        move = method_call(call, "cpu", "to")
        if move is None or (device_move(call, a) is not None and not _to_cpu(move)):
            continue
        receiver = key_of(_chain_root(move.func.value))  # type: ignore[union-attr]
        if receiver is None or a.role(scope, receiver) is not Role.MODEL:
            continue
        moved = origins(a, setup.scope, scope, receiver) & models  # type: ignore[union-attr]
        if moved and _training_goes_on(plan, call):
            raise Refused(
                call,
                HAND_PICKED_DEVICE,
                f"{receiver} is moved off its device while training goes on: the prepared "
                "(DistributedDataParallel) model would stop synchronising; save "
                f"accelerator.unwrap_model({receiver}).state_dict() without moving it",
            )
        out |= moved
    return out


def _training_goes_on(plan: Plan, node: cst.CSTNode) -> bool:
    """Inside a loop that trains (``for epoch ...`` around the batch loop counts)."""
    a = plan.analysis
    current = a.parent(node)
    while current is not None and not isinstance(current, cst.FunctionDef | cst.Module):
        if any(lp.node is current and lp.trains for lp in a.loops):
            return True
        current = a.parent(current)
    return False


def _chain_root(expr: cst.BaseExpression) -> cst.BaseExpression:
    """``net.eval().float()`` -> ``net``: mode switches return the module itself."""
    while (call := method_call(expr, *MODE_CALLS)) is not None:
        expr = call.func.value  # type: ignore[union-attr]
    return expr


def _to_cpu(move: cst.Call) -> bool:
    if move.func.attr.value == "cpu":  # type: ignore[union-attr]
        return True
    first = move.args[0].value if move.args else None
    return isinstance(first, cst.SimpleString) and first.evaluated_value == "cpu"


def _is_build(a: Analysis, move: cst.Call) -> bool:
    """``Net().to(device)``: the move of a model as it is built, before anything else runs."""
    return (
        isinstance(unwrap_moves(move), cst.Call)
        and not isinstance(unwrap_moves(move), cst.Attribute)
        and key_of(unwrap_moves(move)) is None
        and isinstance(a.parent(move), cst.Assign)
    )


_SHAPE_CALLS = (
    "reshape", "view", "flatten", "squeeze", "unsqueeze", "permute", "transpose", "contiguous",
    "float", "long", "int", "half", "double", "bool",
)  # fmt: skip


def _receiver_key(receiver: cst.BaseExpression) -> str | None:
    """``x`` for ``x.to(...)``, ``x[0].to(...)``, ``x["ids"].to(...)`` and
    ``x.reshape(-1, 784).to(...)``: the moved tensor is ``x``, reshaped or cast."""
    while (call := method_call(receiver, *_SHAPE_CALLS)) is not None:
        receiver = call.func.value  # type: ignore[union-attr]
    if isinstance(receiver, cst.Subscript):
        receiver = receiver.value
    return key_of(receiver)


def _model_built(plan: Plan, move: cst.Call, models: set[str]) -> set[str] | None:
    """The setup's names for the model ``Net().to(device)`` is assigned to, when prepare() wraps
    it; None for any other move."""
    a = plan.analysis
    assign = a.parent(move)
    if not isinstance(assign, cst.Assign) or assign.value is not move:
        return None
    scope = a.scope_of[id(move)]
    keys = [key_of(t.target) for t in assign.targets]
    built = [k for k in keys if k is not None and _prepared_model(plan, scope, k, move, models)]
    if not built:
        return None
    return {o for k in built for o in origins(a, plan.setup.scope, scope, k)}  # type: ignore[union-attr]


_RUNS = ("forward", "generate")


def _run_before_prepare(plan: Plan, models: set[str]) -> set[str]:
    """Prepared models the script runs (``model(x)``, ``model.forward``/``generate``) at a point
    that comes before prepare(): directly, or in a function called from there."""
    setup = plan.setup
    a = plan.analysis
    if setup is None or setup.prepare_at is None:
        return set()
    out: set[str] = set()
    for call, scope in a.calls:
        method = method_call(call, *_RUNS)
        key = key_of(method.func.value if method is not None else call.func)  # type: ignore[union-attr]
        if key is None or not setup.timeline.anchors(call):
            continue  # runs only after the setup, or from nowhere this file shows
        found = origins(a, setup.scope, scope, key) & models
        if found and not setup.timeline.after(setup.prepare_at, call):
            out |= found
    return out


def _place_model_move(plan: Plan, move: cst.Call, receiver: str) -> None:
    """``model.cuda()`` / ``model.to(device, ...)`` -> ``model.to(accelerator.device, ...)``."""
    device = cst.Arg(cst.Attribute(plan.accelerator(move), cst.Name("device")))  # type: ignore[arg-type]

    def placed(node: cst.Call) -> cst.Call:
        func = node.func.with_changes(attr=cst.Name("to"))  # type: ignore[union-attr]
        return node.with_changes(func=func, args=[device, *_besides_device(node)])

    plan.edits.replace(move, placed)
    plan.changed(
        move,
        f"{receiver} runs before prepare(): moved to accelerator.device, where prepare() finds it",
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
    """``x = x.to(device)`` (not ``x = x.reshape(-1).to(device)``, which must keep its reshape,
    nor ``x = x.to(device, torch.float16)``, which must keep its cast)."""
    return (
        isinstance(parent, cst.Assign)
        and parent.value is move
        and len(parent.targets) == 1
        and key_of(parent.targets[0].target) == receiver
        and key_of(move.func.value) == receiver  # type: ignore[attr-defined]
        and not _besides_device(move)
    )


def _is_batch(plan: Plan, move: cst.Call, receiver: str) -> bool:
    loop = plan.analysis.loop_of(move)
    return (
        loop is not None
        and prepared_loop(plan, loop)
        and receiver in batch_names(plan.analysis, loop)
    )


def prepared_loop(plan: Plan, loop: Loop) -> bool:
    """A ``for`` over one loader that prepare() wraps, after it does."""
    setup = plan.setup
    if setup is None or loop.iterable is None:
        return False
    found = origins(plan.analysis, setup.scope, loop.scope, loop.iterable)
    return (
        bool(found)
        and found <= setup.loaders
        and (setup.prepare_at is None or setup.timeline.after(setup.prepare_at, loop.node))
    )


def batch_names(a: Analysis, loop: Loop) -> set[str]:
    """The loop's batch names plus names unpacked or indexed from them (``x, y = batch``), but
    for a name the loop also binds to something else (pointnet's ``j, data =
    next(enumerate(testdataloader))`` every ten steps), and the names taken from it: what it
    holds at a move is not told by its name."""
    assigns = [
        b.node
        for b in a.bindings
        if b.scope is loop.scope
        and a.enclosing(b.node, cst.For) is loop.node
        and isinstance(b.node, cst.Assign)
    ]
    names = set(loop.batch_names)
    for node in assigns:
        value = node.value.value if isinstance(node.value, cst.Subscript) else node.value
        if key_of(value) in names:  # x = batch["input_ids"]
            names.update(n for t in node.targets for n in target_names(t.target))
    other: set[str] = set()
    grown = True
    while grown:
        grown = False
        for node in assigns:
            bound = {n for t in node.targets for n in target_names(t.target)} & names
            if bound - other and (not mentions(node.value, names) or mentions(node.value, other)):
                other |= bound
                grown = True
    return names - other


def _drop_batch_move(plan: Plan, move: cst.Call, receiver: str) -> None:
    a = plan.analysis
    parent = a.parent(move)
    if _self_assign(parent, receiver, move) or _is_tuple_of_moves(plan, parent, move):
        plan.remove(a.statement_of(move))
    else:
        plan.edits.replace(move, without_move)
    plan.changed(move, f"removed the move of {receiver}: prepared loaders place batches")


def _is_tuple_of_moves(plan: Plan, element: cst.CSTNode | None, move: cst.Call) -> bool:
    """``x, y = x.to(device), y.to(device)``: every element moves the batch name it is assigned
    to, and only moves it (a cast stays). A name the loop makes itself (``z = torch.rand(...)``
    in ``x, z = x.cuda(), z.cuda()``) keeps its move."""
    a = plan.analysis
    tup = a.parent(element) if isinstance(element, cst.Element) else None
    assign = a.parent(tup) if isinstance(tup, cst.Tuple) else None
    pairs = unpacked(assign) if isinstance(assign, cst.Assign) else None
    if pairs is None:
        return False
    for target, value in pairs:
        inner = device_move(value, a)
        key = key_of(target)
        if inner is None or key is None or key_of(inner.func.value) != key:  # type: ignore[union-attr]
            return False
        if not _is_batch(plan, inner, key):
            return False
        if _besides_device(inner):
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
