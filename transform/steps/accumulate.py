"""Manual gradient accumulation becomes ``with accelerator.accumulate(model):``.

The hand-written pattern (loss divided by N, ``if (i + 1) % N == 0:`` around the optimizer step)
is replaced by ``Accelerator(gradient_accumulation_steps=N)`` and an ``accumulate`` block around
the step body: the accelerator divides the loss, skips gradient sync on the in-between steps, and
also syncs on the last batch of the loader, which the modulo test forgets.
"""

from __future__ import annotations

import libcst as cst

from accelify.transform.analysis import Loop, key_of, names_in
from accelify.transform.patterns import Role, method_call
from accelify.transform.plan import Plan
from accelify.transform.walk import children


def accumulate(plan: Plan) -> None:
    setup = plan.setup
    if setup is None:
        return
    a = plan.analysis
    flag = plan.options.gradient_accumulation_steps
    for loop in a.loops:
        if not loop.trains or _has_accumulate(loop.node) or plan.accelerator(loop.node) is None:
            continue
        body = list(loop.node.body.body)  # type: ignore[attr-defined]
        step_if = next((s for s in body if _modulo_steps(plan, s) is not None), None)
        model = _model_in(plan, loop)
        if model is None:
            continue
        if step_if is not None:
            steps = _modulo_steps(plan, step_if)
            plan.accelerator_kwargs.setdefault("gradient_accumulation_steps", steps)  # type: ignore[arg-type]
            _drop_division(plan, loop, steps)  # type: ignore[arg-type]
            plan.edits.unwrap(step_if)  # type: ignore[arg-type]
            last = step_if
        elif flag is not None and flag > 1:
            last = body[-1]
        else:
            continue
        header = cst.With(
            items=[
                cst.WithItem(
                    _call(plan.accelerator(loop.node), "accumulate", cst.parse_expression(model))
                )
            ],
            body=cst.IndentedBlock(body=[]),
        )
        plan.edits.wrap(body[0], last, header)
        plan.accumulating.add(id(loop.node))
        plan.changed(loop.node, f"wrapped the step in accelerator.accumulate({model})")


def _call(receiver: cst.BaseExpression | None, method: str, *args: cst.BaseExpression) -> cst.Call:
    return cst.Call(cst.Attribute(receiver, cst.Name(method)), args=[cst.Arg(x) for x in args])  # type: ignore[arg-type]


def _has_accumulate(loop: cst.For) -> bool:
    return any(
        isinstance(s, cst.With) and any(method_call(i.item, "accumulate") for i in s.items)
        for s in loop.body.body  # type: ignore[attr-defined]
    )


def _modulo_steps(plan: Plan, statement: cst.CSTNode) -> cst.BaseExpression | None:
    """N, when ``statement`` is ``if <i> % N == 0: ... optimizer.step() ...``."""
    if not isinstance(statement, cst.If) or statement.orelse is not None:
        return None
    test = statement.test
    if isinstance(test, cst.BooleanOperation):
        test = test.left
    if not (
        isinstance(test, cst.Comparison)
        and len(test.comparisons) == 1
        and isinstance(test.comparisons[0].operator, cst.Equal)
        and isinstance(test.left, cst.BinaryOperation)
        and isinstance(test.left.operator, cst.Modulo)
    ):
        return None
    steps_optimizer = any(
        isinstance(s, cst.SimpleStatementLine)
        and any(
            isinstance(x, cst.Expr)
            and (call := method_call(x.value, "step")) is not None
            and plan.analysis.role(plan.analysis.scope_of[id(s)], key_of(call.func.value) or "")  # type: ignore[union-attr]
            is Role.OPTIMIZER
            for x in s.body
        )
        for s in statement.body.body  # type: ignore[attr-defined]
    )
    return test.left.right.with_changes(lpar=[], rpar=[]) if steps_optimizer else None


def _drop_division(plan: Plan, loop: Loop, steps: cst.BaseExpression) -> None:
    """Remove ``loss = loss / N``, ``loss /= N`` and the ``/ N`` of ``(loss / N).backward()``."""
    a = plan.analysis
    code = plan.analysis.module.code_for_node(steps)
    for call, _scope, where in a.backward_calls:
        if where is not loop:
            continue
        receiver = call.func.value  # type: ignore[union-attr]
        if _divides_by(plan, receiver, code):
            plan.edits.replace(receiver, receiver.left.with_changes(lpar=[], rpar=[]))  # type: ignore[attr-defined]
    for b in a.bindings:
        node = b.node
        if b.scope is not loop.scope or a.enclosing(node, cst.For) is not loop.node:
            continue
        if (
            isinstance(node, cst.Assign)
            and _divides_by(plan, node.value, code)
            and key_of(node.value.left) == b.key  # type: ignore[attr-defined]
        ):
            plan.remove(a.statement_of(node))  # type: ignore[arg-type]
            plan.changed(node, "removed the manual loss division: accumulate() scales the loss")
            _flag_later_reads(plan, loop, b.key, a.line(node), code)
    for statement in _walk_statements(loop.node):
        for small in getattr(statement, "body", ()):
            if (
                isinstance(small, cst.AugAssign)
                and isinstance(small.operator, cst.DivideAssign)
                and plan.analysis.module.code_for_node(small.value) == code
            ):
                plan.remove(statement)
                plan.changed(
                    small, "removed the manual loss division: accumulate() scales the loss"
                )


def _flag_later_reads(plan: Plan, loop: Loop, key: str, after: int, steps: str) -> None:
    """Code reading the loss after its division now sees it undivided: say where."""
    a = plan.analysis
    backward_args = {id(c.func.value) for c, _s, where in a.backward_calls if where is loop}  # type: ignore[union-attr]
    for node in (n for n in names_in(loop.scope.node) if n.value == key):
        parent = a.parent(node)
        if (
            a.line(node) > after
            and id(node) not in backward_args
            and not isinstance(parent, cst.AssignTarget)
        ):
            plan.needs_human(node, f"{key} is no longer divided by {steps} here; check this use")


def _divides_by(plan: Plan, node: cst.CSTNode, code: str) -> bool:
    return (
        isinstance(node, cst.BinaryOperation)
        and isinstance(node.operator, cst.Divide)
        and plan.analysis.module.code_for_node(node.right.with_changes(lpar=[], rpar=[])) == code
    )


def _walk_statements(node: cst.CSTNode):
    for child in children(node):
        if isinstance(child, cst.SimpleStatementLine):
            yield child
        elif not isinstance(child, cst.FunctionDef):
            yield from _walk_statements(child)


def _model_in(plan: Plan, loop: Loop) -> str | None:
    """The prepared model the loop trains: the one it calls, else the only one."""
    a = plan.analysis
    setup = plan.setup
    models = [b.key for b in setup.prepared if a.role(setup.scope, b.key) is Role.MODEL]  # type: ignore[union-attr]
    called = {
        key_of(call.func)
        for call, scope in a.calls
        if scope is loop.scope
        and a.enclosing(call, cst.For) is loop.node
        and a.role(scope, key_of(call.func) or "") is Role.MODEL
    }
    called.discard(None)
    if len(called) == 1:
        return called.pop()
    return models[0] if len(models) == 1 else None
