"""Manual gradient accumulation becomes ``with accelerator.accumulate(model):``.

The hand-written pattern (the loss divided by N, ``if (i + 1) % N == 0:`` around the optimizer
step) becomes ``Accelerator(gradient_accumulation_steps=N)`` and an ``accumulate`` block: the
accelerator divides the loss, skips the gradient sync between steps, and steps on the last batch
of the loader too. The manual division is removed exactly once, whatever its form (``/ N`` inline,
``loss = loss / N``, ``loss /= N``, ``(loss / N).backward()``, ``loss.div(N)``); code that read
the divided loss (``running += loss.item()``) reads ``(loss / N)``, the same value.

Anything else (no division, two of them, a zero_grad or scheduler step outside the ``if``, a
counter that is not the loop's own) keeps its manual accumulation, which stays right on several
processes (gradients are synchronised on every batch instead of every N), and the report says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from accelify.transform.analysis import Loop, key_of, names_in
from accelify.transform.patterns import Role, callee_name, method_call
from accelify.transform.plan import Plan
from accelify.transform.refusals import ACCUMULATION, OBJECTS_NOT_FOLLOWED
from accelify.transform.setup import BACKWARD, Refused, origins, step_order, stepped_optimizers
from accelify.transform.steps.moves import prepared_loop

_STEP_CALLS = frozenset({"step", "zero_grad", "clip_grad_norm_", "clip_grad_value_"})


class _Manual(Exception):
    """Why a loop's accumulation stays manual."""


@dataclass
class _Accumulation:
    loop: Loop
    step_if: cst.If
    steps: cst.BaseExpression
    syncs_at_end: bool  # the test already steps on the loader's last batch
    edits: list[tuple[cst.CSTNode, cst.CSTNode | None]] = field(default_factory=list)
    readers: list[cst.Name] = field(default_factory=list)


def accumulate(plan: Plan) -> None:
    setup = plan.setup
    if setup is None:
        return
    flag = plan.options.gradient_accumulation_steps
    for loop in plan.analysis.loops:
        if loop.scope not in plan.training or not loop.trains:
            continue
        step_if = _step_if(plan, loop)
        if step_if is None:
            if flag is not None and flag > 1 and _trains_directly(plan, loop):
                _keeps_alternation(plan, loop)
                _wrap(plan, loop, loop.node.body.body[-1], unwrap_if=None)  # type: ignore[attr-defined]
            continue
        try:
            found = _accumulation(plan, loop, step_if)
        except _Manual as why:
            if flag is not None:
                raise Refused(
                    step_if, ACCUMULATION, f"--gradient-accumulation-steps: {why}"
                ) from None
            plan.info(
                step_if,
                f"kept the manual gradient accumulation ({why}): it stays right on several "
                "processes, with gradients synchronised on every batch",
            )
            continue
        _keeps_alternation(plan, loop)
        _apply(plan, found)


def _keeps_alternation(plan: Plan, loop: Loop) -> None:
    """accumulate() holds every step and every prepared ``zero_grad()`` to the window's last
    batch. So a zero_grad must follow that batch's backward, and with several optimizers each
    batch must run every backward before any step, once each: a loss computed after a step in
    the same batch (a GAN's generator through the just-stepped discriminator) would see weights
    not yet updated, and a step repeated in an inner loop would repeat on one gradient."""
    a = plan.analysis
    inside = [call for call, _s, _lp in a.backward_calls if a.contains(loop.node, call)]
    last = max((a.line(call) for call in inside), default=0)
    several = len(stepped_optimizers(a, plan.setup)) > 1  # type: ignore[arg-type]
    for key, call in step_order(a, plan.setup, loop.node) if several else ():  # type: ignore[arg-type]
        if key == BACKWARD:
            continue
        if a.line(call) < last:
            raise Refused(
                call,
                ACCUMULATION,
                f"{key}.step() runs before a later backward in the same batch (alternating "
                "updates): accumulate() holds every step to the window's last batch, so that "
                "later loss would see weights not yet updated; convert without accumulation",
            )
        if a.enclosing(call, (cst.For, cst.While)) is not loop.node:
            raise Refused(
                call,
                ACCUMULATION,
                f"{key}.step() runs in an inner loop, several times per batch: accumulate() "
                "cannot keep that inside one window",
            )
    _zero_after_backward(plan, loop, last)


def _zero_after_backward(plan: Plan, loop: Loop, last: int) -> None:
    """A prepared ``zero_grad()`` acts on a window's last batch only, so one that runs before
    that batch's backward (the common ``zero_grad()`` at the top of the loop) would clear the
    gradients of the whole window: only the last batch would count, silently."""
    a = plan.analysis
    for call, _scope in plan.training_calls():
        if a.contains(loop.node, call) and a.line(call) < last and _zeroes(plan, call):
            raise Refused(
                call,
                ACCUMULATION,
                f"{_code(plan, call)} runs before the backward: on a window's last batch it "
                "would clear the gradients accumulated over the window (move it after the "
                "optimizer's step)",
            )


def _zeroes(plan: Plan, call: cst.Call) -> bool:
    """``optimizer.zero_grad()``, ``model.zero_grad()``, or a call of the file's own function
    that makes one (``reset_grad()``)."""
    a = plan.analysis
    function = a.functions.get(callee_name(call) or "")
    inner = [c for c, where in a.calls if where is function] if function else []
    return any(
        callee_name(c) == "zero_grad" and _steps_training_object(plan, c) for c in [call, *inner]
    )


def _trains_directly(plan: Plan, loop: Loop) -> bool:
    """The innermost loop over a prepared loader that runs the backward itself."""
    return prepared_loop(plan, loop) and any(
        lp is loop for _c, _s, lp in plan.analysis.backward_calls
    )


def _step_if(plan: Plan, loop: Loop) -> cst.If | None:
    """The ``if <counter> % N == 0: ... optimizer.step() ...`` among the loop's statements. A
    branch that also holds the backward trains every N-th batch, accumulating nothing (a GAN's
    ``if ii % d_every == 0:`` discriminator step)."""
    a = plan.analysis
    for statement in loop.node.body.body:  # type: ignore[attr-defined]
        if not isinstance(statement, cst.If) or _modulo(statement.test) is None:
            continue
        if any(a.contains(statement, call) for call, _scope, _loop in a.backward_calls):
            continue
        for call, scope in a.calls:
            if a.contains(statement, call) and method_call(call, "step") is not None:
                key = key_of(call.func.value)  # type: ignore[union-attr]
                if key is not None and a.role(scope, key) is Role.OPTIMIZER:
                    return statement
    return None


def _modulo(test: cst.BaseExpression) -> tuple[cst.BaseExpression, cst.BaseExpression] | None:
    """(counter expression, N) for ``<c> % N == 0``."""
    if not (
        isinstance(test, cst.Comparison)
        and len(test.comparisons) == 1
        and isinstance(test.comparisons[0].operator, cst.Equal)
        and isinstance(test.comparisons[0].comparator, cst.Integer)
        and test.comparisons[0].comparator.value == "0"
        and isinstance(test.left, cst.BinaryOperation)
        and isinstance(test.left.operator, cst.Modulo)
    ):
        if isinstance(test, cst.BooleanOperation) and isinstance(test.operator, cst.Or):
            return _modulo(test.left)
        return None
    return test.left.left, test.left.right.with_changes(lpar=[], rpar=[])


def _accumulation(plan: Plan, loop: Loop, step_if: cst.If) -> _Accumulation:
    a = plan.analysis
    counter, steps = _modulo(step_if.test)  # type: ignore[misc]
    index = _enumerate_index(loop)
    counter = counter.with_changes(lpar=[], rpar=[])
    if index is None or _code(plan, counter).replace(" ", "") != f"{index}+1":
        raise _Manual(f"the step test counts with {_code(plan, counter)}, not the loop's index + 1")
    if not prepared_loop(plan, loop):
        raise _Manual("the loop does not walk a prepared DataLoader")
    if step_if.orelse is not None:
        raise _Manual("the step test has an else branch")
    _check_steps_readable(plan, loop, steps)
    found = _Accumulation(loop, step_if, steps, _ends_with_loader(plan, step_if.test, index))
    backwards = [(c, s) for c, s, lp in a.backward_calls if lp is loop]
    if len(backwards) != 1 or a.contains(step_if, backwards[0][0]):
        raise _Manual("the loop does not run exactly one backward before the step")
    for call, _scope in plan.training_calls():
        name = call.func.attr.value if isinstance(call.func, cst.Attribute) else None
        if (
            name in {"zero_grad", "step"}
            and a.contains(loop.node, call)
            and not a.contains(step_if, call)
            and _steps_training_object(plan, call)
        ):
            raise _Manual(f"{_code(plan, call.func)}() runs on every batch")
    _find_division(plan, found, backwards[0][0])
    return found


def _enumerate_index(loop: Loop) -> str | None:
    """``i`` of ``for i, batch in enumerate(loader)`` (counting from 0)."""
    node = loop.node
    if not (
        isinstance(node, cst.For)
        and isinstance(node.iter, cst.Call)
        and callee_name(node.iter) == "enumerate"
        and len(node.iter.args) == 1
        and isinstance(node.target, cst.Tuple)
        and len(node.target.elements) == 2
    ):
        return None
    first = node.target.elements[0].value
    return first.value if isinstance(first, cst.Name) else None


def _ends_with_loader(plan: Plan, test: cst.BaseExpression, index: str) -> bool:
    """``... or i + 1 == len(loader)``: the script already steps on the last batch."""
    if not (isinstance(test, cst.BooleanOperation) and isinstance(test.operator, cst.Or)):
        return False
    right = test.right
    return (
        isinstance(right, cst.Comparison)
        and len(right.comparisons) == 1
        and _code(plan, right.left).replace(" ", "") == f"{index}+1"
        and isinstance(right.comparisons[0].comparator, cst.Call)
        and callee_name(right.comparisons[0].comparator) == "len"
    )


def _check_steps_readable(plan: Plan, loop: Loop, steps: cst.BaseExpression) -> None:
    """N goes into ``Accelerator(...)``, created in the setup scope: it must mean the same there."""
    setup = plan.setup
    a = plan.analysis
    for name in names_in(steps):
        if loop.scope is setup.scope:  # type: ignore[union-attr]
            if any(b.scope is loop.scope and b.key == name.value and b.in_loop for b in a.bindings):
                raise _Manual(f"{name.value} changes inside a loop")
        elif name.value in loop.scope.params or any(
            b.scope is loop.scope and b.key == name.value for b in a.bindings
        ):
            raise _Manual(f"N ({name.value}) is local to {loop.scope.name}()")


def _steps_training_object(plan: Plan, call: cst.Call) -> bool:
    a = plan.analysis
    key = key_of(call.func.value)  # type: ignore[union-attr]
    scope = a.scope_of[id(call)]
    role = a.role(scope, key) if key is not None else None
    return role in (Role.OPTIMIZER, Role.SCHEDULER, Role.MODEL)


def _find_division(plan: Plan, found: _Accumulation, backward: cst.Call) -> None:
    """Record the one edit that removes the division by N, and the readers of the divided loss."""
    receiver = backward.func.value  # type: ignore[union-attr]
    undivided = _undivided(plan, receiver, found.steps)
    if undivided is not None:
        found.edits.append((receiver, undivided))
        return
    key = key_of(receiver)
    if key is None:
        raise _Manual("the loss is not divided by N before backward()")
    divisions = _divisions_of(plan, found, key, backward)
    if len(divisions) != 1:
        many = "divided by N more than once" if divisions else "not divided by N"
        raise _Manual(f"{key} is {many}")
    node, edit = divisions[0]
    found.edits.append((node, edit))
    found.readers = _readers(plan, found.loop, key, node, backward)


def _undivided(
    plan: Plan, expr: cst.BaseExpression, steps: cst.BaseExpression
) -> cst.BaseExpression | None:
    """``x / N`` or ``x.div(N)`` -> ``x``; else None."""
    if (
        isinstance(expr, cst.BinaryOperation)
        and isinstance(expr.operator, cst.Divide)
        and _same(plan, expr.right, steps)
    ):
        return expr.left.with_changes(lpar=[], rpar=[]) if not expr.lpar else expr.left
    call = method_call(expr, "div", "div_")
    if call is not None and len(call.args) == 1 and _same(plan, call.args[0].value, steps):
        return call.func.value  # type: ignore[union-attr]
    return None


def _same(plan: Plan, divisor: cst.BaseExpression, steps: cst.BaseExpression) -> bool:
    """``N``, ``(N)`` or ``float(N)`` for N."""
    if isinstance(divisor, cst.Call) and callee_name(divisor) == "float" and len(divisor.args) == 1:
        divisor = divisor.args[0].value
    return _code(plan, divisor.with_changes(lpar=[], rpar=[])) == _code(plan, steps)


def _divisions_of(
    plan: Plan, found: _Accumulation, key: str, backward: cst.Call
) -> list[tuple[cst.CSTNode, cst.CSTNode | None]]:
    """Where the loop, before the backward, divides ``key`` by N, and the edit that undoes it:
    (statement, None) removes the statement, (expression, new) replaces the expression."""
    a = plan.analysis
    out: list[tuple[cst.CSTNode, cst.CSTNode | None]] = []
    end = a.line(backward)
    for statement in _statements(plan, found.loop):
        if a.line(statement) >= end or len(statement.body) != 1:
            continue
        small = statement.body[0]
        if isinstance(small, cst.AugAssign):
            if (
                key_of(small.target) == key
                and isinstance(small.operator, cst.DivideAssign)
                and _same(plan, small.value, found.steps)
            ):
                out.append((statement, None))
        elif isinstance(small, cst.Assign) and len(small.targets) == 1:
            if key_of(small.targets[0].target) != key:
                continue
            undivided = _undivided(plan, small.value, found.steps)
            if undivided is None:
                continue
            if key_of(undivided) == key:  # loss = loss / N
                out.append((statement, None))
            else:  # loss = criterion(out, y) / N
                out.append((small.value, undivided))
        elif isinstance(small, cst.Expr):
            call = method_call(small.value, "div_")
            if (
                call is not None
                and key_of(call.func.value) == key  # type: ignore[union-attr]
                and len(call.args) == 1
                and _same(plan, call.args[0].value, found.steps)
            ):
                out.append((statement, None))
    return out


def _statements(plan: Plan, loop: Loop) -> list[cst.SimpleStatementLine]:
    """The loop's simple statements, also inside ``with`` blocks (autocast), not deeper."""
    out: list[cst.SimpleStatementLine] = []
    todo = list(loop.node.body.body)  # type: ignore[attr-defined]
    while todo:
        statement = todo.pop(0)
        if isinstance(statement, cst.SimpleStatementLine):
            out.append(statement)
        elif isinstance(statement, cst.With):
            todo[0:0] = list(statement.body.body)  # type: ignore[attr-defined]
    return out


def _readers(
    plan: Plan, loop: Loop, key: str, division: cst.CSTNode, backward: cst.Call
) -> list[cst.Name]:
    """Reads of ``key`` after its division and before it is bound again: they read the divided
    value, and will read ``(key / N)``."""
    a = plan.analysis
    start = a.line(division)
    rebinds = [
        a.line(b.node)
        for b in a.bindings
        if b.scope is loop.scope and b.key == key and a.line(b.node) > start
    ]
    rebinds += [
        a.line(n)
        for n in names_in(loop.scope.node)
        if n.value == key and _target(a, n) and a.line(n) > start
    ]
    end = min(rebinds, default=None)
    skip = {id(backward.func.value)}  # type: ignore[union-attr]
    out = []
    for name in names_in(loop.scope.node):
        line = a.line(name)
        if (
            name.value == key
            and line > start
            and (end is None or line < end)
            and id(name) not in skip
            and not _target(a, name)
        ):
            out.append(name)
    return out


def _target(a, name: cst.Name) -> bool:
    parent = a.parent(name)
    return isinstance(parent, cst.AssignTarget | cst.Del | cst.AugAssign) and (
        not isinstance(parent, cst.AugAssign) or parent.target is name
    )


def _apply(plan: Plan, found: _Accumulation) -> None:
    steps = found.steps
    known = plan.accelerator_kwargs.get("gradient_accumulation_steps")
    if known is not None and _code(plan, known) != _code(plan, steps):
        raise Refused(
            found.step_if, ACCUMULATION, "two loops accumulate gradients over different step counts"
        )
    plan.accelerator_kwargs["gradient_accumulation_steps"] = steps
    for node, edit in found.edits:
        if edit is None:
            plan.remove(node)  # type: ignore[arg-type]
        else:
            plan.edits.replace(node, edit)
    plan.changed(
        found.edits[0][0], "removed the manual loss division: accumulate() scales the loss"
    )
    divided = cst.BinaryOperation(
        cst.Name("_"), cst.Divide(), steps, lpar=[cst.LeftParen()], rpar=[cst.RightParen()]
    )
    for name in found.readers:
        plan.edits.replace(name, divided.with_changes(left=name))
        plan.changed(name, f"reads ({name.value} / {_code(plan, steps)}), the value it read before")
    pure = all(_is_step_call(plan, s) for s in found.step_if.body.body)  # type: ignore[attr-defined]
    _wrap(plan, found.loop, found.step_if, unwrap_if=found.step_if if pure else None)
    if not found.syncs_at_end:
        plan.changed(
            found.step_if,
            "accumulate() also steps on each epoch's last batch (the modulo test alone carried "
            "a partial window into the next epoch)",
        )


def _is_step_call(plan: Plan, statement: cst.BaseStatement) -> bool:
    """``optimizer.step()``, ``optimizer.zero_grad()``, ``scheduler.step()``, a clip: what
    accumulate() already skips between steps."""
    if not isinstance(statement, cst.SimpleStatementLine):
        return False
    for small in statement.body:
        call = small.value if isinstance(small, cst.Expr) else None
        if not isinstance(call, cst.Call) or callee_name(call) not in _STEP_CALLS:
            return False
        if callee_name(call) in {"step", "zero_grad"} and not _steps_optimizer(plan, call):
            return False
    return True


def _steps_optimizer(plan: Plan, call: cst.Call) -> bool:
    """``optimizer.step()``/``zero_grad()`` or ``scheduler.step()``: the prepared ones do nothing
    between accumulation steps (a model's own ``zero_grad()`` would still clear the gradients)."""
    a = plan.analysis
    key = key_of(call.func.value)  # type: ignore[union-attr]
    role = a.role(a.scope_of[id(call)], key) if key is not None else None
    return role in (Role.OPTIMIZER, Role.SCHEDULER)


def _wrap(plan: Plan, loop: Loop, last: cst.BaseStatement, unwrap_if: cst.If | None) -> None:
    """``with accelerator.accumulate(model):`` around the loop's statements up to ``last``; the
    step test becomes ``accelerator.sync_gradients`` (or goes, when it only stepped)."""
    accelerator = plan.accelerator(loop.node)
    models = _models_in(plan, loop)
    body = list(loop.node.body.body)  # type: ignore[attr-defined]
    header = cst.With(
        items=[
            cst.WithItem(
                cst.Call(
                    cst.Attribute(accelerator, cst.Name("accumulate")),  # type: ignore[arg-type]
                    args=[cst.Arg(cst.parse_expression(m)) for m in models],
                )
            )
        ],
        body=cst.IndentedBlock(body=[]),
    )
    plan.edits.wrap(body[0], last, header)
    plan.accumulating.add(id(loop.node))
    if isinstance(last, cst.If) and last is not unwrap_if:
        test = cst.Attribute(accelerator, cst.Name("sync_gradients"))  # type: ignore[arg-type]
        plan.edits.replace(last.test, test)
    elif unwrap_if is not None:
        plan.edits.unwrap(unwrap_if)
        plan.unwrapped.add(id(unwrap_if))
    plan.changed(loop.node, f"wrapped the step in accelerator.accumulate({', '.join(models)})")


def _models_in(plan: Plan, loop: Loop) -> list[str]:
    """The prepared models the loop trains, in prepare()'s order: the ones it calls (each
    skips its gradient sync between steps), else the only one."""
    a = plan.analysis
    setup = plan.setup
    models = setup.models(a)  # type: ignore[union-attr]
    called = {
        key: min(models.index(m) for m in held)
        for call, scope in a.calls
        if scope is loop.scope
        and a.contains(loop.node, call)
        and (key := key_of(call.func)) is not None
        and (held := origins(a, setup.scope, scope, key) & set(models))  # type: ignore[union-attr]
    }
    if called:
        return sorted(called, key=called.__getitem__)
    if len(models) == 1 and loop.scope is setup.scope:  # type: ignore[union-attr]
        return models
    raise Refused(
        loop.node, OBJECTS_NOT_FOLLOWED, "cannot tell which prepared model this loop trains"
    )


def _code(plan: Plan, node: cst.CSTNode) -> str:
    return plan.analysis.module.code_for_node(node)
