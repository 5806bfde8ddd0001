"""``torch.save`` in training code writes once; a model is saved unwrapped, after everyone is done.

Every process runs the script, so a plain ``torch.save`` writes the same file N times at once;
``accelerator.save`` writes on the main process only. A prepared model saved whole is unwrapped
(its ``state_dict()`` is unwrapped by the unwrap step), and ``wait_for_everyone()`` makes sure no
process is still training when it is saved. The wait is left out where the save runs under a
condition that may differ between processes (a loss of this process's batch): there only some
processes would reach it, and they would wait for the others forever.
"""

from __future__ import annotations

import libcst as cst

from accelify.transform.analysis import Analysis, Scope, key_of, names_in
from accelify.transform.patterns import dotted_name, shows, target_names
from accelify.transform.plan import Plan
from accelify.transform.setup import origins


def save(plan: Plan) -> None:
    setup = plan.setup
    if setup is None:
        return
    a = plan.analysis
    models = set(setup.models(a))
    saved_at: list[cst.Call] = []
    waited: set[int] = set()  # saves a wait_for_everyone() runs just before
    for call, scope in plan.training_calls():
        if not a.names.refers_to(call.func, ("torch",), "save") or len(call.args) < 2:
            continue
        statement = a.statement_of(call)
        if not isinstance(a.parent(call), cst.Expr):
            continue
        saved = call.args[0].value
        whole = _prepared(plan, scope, saved, models)
        holds = whole or any(_prepared(plan, scope, name, models) for name in names_in(saved))
        accelerator = plan.accelerator(call, optional=not holds)
        if accelerator is None:
            continue
        plan.edits.replace(call.func, cst.Attribute(accelerator, cst.Name("save")))
        saved_at.append(call)
        if whole:
            unwrap = cst.Call(
                cst.Attribute(accelerator, cst.Name("unwrap_model")), args=[cst.Arg(saved)]
            )
            plan.edits.replace(saved, unwrap)
        if not holds:
            plan.changed(call, "torch.save -> accelerator.save (main process only)")
            continue
        if _wait_before(plan, statement, waited):  # type: ignore[arg-type]
            _wait(plan, statement, accelerator)  # type: ignore[arg-type]
        plan.changed(call, "torch.save -> accelerator.save of the unwrapped model")
    saved_at += _save_pretrained(plan, models, waited)
    if saved_at:
        _wait_before_loads(plan, saved_at)


def _wait_before(plan: Plan, statement: cst.BaseStatement, waited: set[int]) -> bool:
    """Whether a save needs its own ``wait_for_everyone()``: not where only some processes would
    reach it, nor right after another save that has one (nothing trains in between: DCGAN's two
    saves got a wait each)."""
    if not rank_safe(plan, statement):
        return False
    waited.add(id(statement))
    block = plan.analysis.parent(statement)
    before = list(getattr(block, "body", ()))
    before = before[: next((i for i, s in enumerate(before) if s is statement), 0)]
    while before and _does_nothing(before[-1]):  # a notebook's cell marker, a stray string
        before.pop()
    return not before or id(before[-1]) not in waited


def _does_nothing(statement: cst.BaseStatement) -> bool:
    """A line of bare strings (a docstring's form)."""
    return isinstance(statement, cst.SimpleStatementLine) and all(
        isinstance(small, cst.Expr)
        and isinstance(small.value, cst.SimpleString | cst.ConcatenatedString)
        for small in statement.body
    )


def _save_pretrained(plan: Plan, models: set[str], waited: set[int]) -> list[cst.Call]:
    """``model.save_pretrained(path)`` of a prepared model (unwrapped by the unwrap step) writes
    on the main process only, through the accelerator, once every process is done (HF's own
    form)."""
    a = plan.analysis
    saved: list[cst.Call] = []
    for call, scope in plan.training_calls():
        func = call.func
        if not isinstance(func, cst.Attribute) or func.attr.value != "save_pretrained":
            continue
        if not _prepared(plan, scope, func.value, models):
            continue
        accelerator = plan.accelerator(call)
        code = a.module.code_for_node(accelerator)  # type: ignore[arg-type]
        given = {arg.keyword.value for arg in call.args if arg.keyword is not None}
        extra = [
            cst.parse_expression(f"f({key}={code}.{attribute})").args[0]  # type: ignore[attr-defined]
            for key, attribute in (
                ("is_main_process", "is_main_process"),
                ("save_function", "save"),
            )
            if key not in given
        ]
        plan.edits.replace(call, lambda node, extra=extra: _with_args(node, extra))
        statement = a.statement_of(call)
        if _wait_before(plan, statement, waited):  # type: ignore[arg-type]
            plan.edits.insert_before(statement, plan.statement(f"{code}.wait_for_everyone()\n"))  # type: ignore[arg-type]
        plan.changed(call, "save_pretrained writes on the main process, once every process is done")
        saved.append(call)
    return saved


def _with_args(call: cst.Call, extra: list[cst.Arg]) -> cst.Call:
    args = list(call.args)
    if args and args[-1].comma is cst.MaybeSentinel.DEFAULT:
        args[-1] = args[-1].with_changes(
            comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
        )
    for i, arg in enumerate(extra):
        last = i == len(extra) - 1
        args.append(
            arg.with_changes(
                comma=cst.MaybeSentinel.DEFAULT
                if last
                else cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
            )
        )
    return call.with_changes(args=args)


def _wait_before_loads(plan: Plan, saves: list[cst.Call]) -> None:
    """Only the main process writes now: a ``torch.load`` or ``from_pretrained`` after the save
    waits until it has, and so does a call handed the name of the path it wrote
    (``evaluate(model_path, ...)`` from another module, which reads the file on every process)."""
    a = plan.analysis
    first = min(a.line(n) for n in _anchors(plan, saves[0]))
    paths = {key_of(path) for path in map(_written, saves)} - {None}
    waited: set[int] = set()
    for call, _scope in plan.training_calls():
        loads = a.names.refers_to(call.func, ("torch",), "load")
        handed = (
            call not in saves
            and not shows(call)
            and any(key_of(arg.value) in paths for arg in call.args)
        )
        if not (loads or handed or a.names.last_part(call.func) == "from_pretrained"):
            continue
        if min((a.line(n) for n in _anchors(plan, call)), default=0) <= first:
            continue
        statement = a.statement_of(call)
        if id(statement) in waited:
            continue
        waited.add(id(statement))
        accelerator = plan.accelerator(call)
        if not rank_safe(plan, statement):  # type: ignore[arg-type]
            plan.needs_human(
                call, "other processes may read this file before the main process wrote it"
            )
            continue
        _wait(plan, statement, accelerator)  # type: ignore[arg-type]
        plan.changed(call, "waits for the main process to finish writing before loading")


def _wait(plan: Plan, statement: cst.BaseStatement, accelerator: cst.BaseExpression) -> None:
    """``accelerator.wait_for_everyone()`` just before ``statement``, which gives it the blank
    lines and comments above it: they now sit above the pair."""
    code = plan.analysis.module.code_for_node(accelerator)
    wait = plan.statement(f"{code}.wait_for_everyone()\n")
    wait = wait.with_changes(leading_lines=getattr(statement, "leading_lines", ()))
    plan.edits.insert_before(statement, wait)
    plan.edits.replace(statement, lambda node: node.with_changes(leading_lines=()))


def _written(save: cst.Call) -> cst.BaseExpression:
    """Where a save writes: ``torch.save(obj, path)``, ``model.save_pretrained(path)``."""
    return save.args[0 if len(save.args) == 1 or save.args[0].keyword else 1].value


def _anchors(plan: Plan, node: cst.CSTNode) -> list[cst.CSTNode]:
    found = plan.setup.timeline.anchors(node) if plan.setup is not None else None
    return found or [node]


def _prepared(plan: Plan, scope: Scope, expr: cst.BaseExpression, models: set[str]) -> bool:
    """Whether ``expr`` is a name that may hold a prepared model there (unwrapping a model
    not yet prepared gives it back as it is)."""
    setup = plan.setup
    key = key_of(expr)
    if key is None or setup is None or setup.prepare_at is None:
        return False
    found = origins(plan.analysis, setup.scope, scope, key)
    return bool(found) and found <= models and setup.timeline.may_follow(setup.prepare_at, expr)


def rank_safe(plan: Plan, statement: cst.CSTNode) -> bool:
    """Whether every process reaches ``statement`` alike: no condition on the way there reads a
    value computed inside a loop (a batch's loss, a shard's count), and no ``except`` handler
    (only the processes that raised, each at its own point, reach it), here or at the calls
    into its function."""
    a = plan.analysis
    setup = plan.setup
    nodes = [statement]
    anchors = setup.timeline.anchors(statement) if setup is not None else None
    if anchors is None:
        return False
    nodes.extend(n for n in anchors if n is not statement)
    return all(_conditions_safe(a, node) for node in nodes)


def _conditions_safe(a: Analysis, node: cst.CSTNode) -> bool:
    scope = a.scope_of.get(id(node))
    looped = _loop_bound(a, scope) if scope is not None else set()
    current = a.parent(node)
    while current is not None and not isinstance(current, cst.FunctionDef | cst.Module):
        if isinstance(current, cst.ExceptHandler):
            return False
        test = current.test if isinstance(current, cst.If | cst.While) else None
        if test is not None and any(n.value in looped for n in names_in(test)):
            return False
        current = a.parent(current)
    return True


def _loop_bound(a: Analysis, scope: Scope) -> set[str]:
    """Names a scope binds inside its loops, but for counters over ``range``/``enumerate``."""
    out = set()
    for b in a.bindings:
        if b.scope is scope and b.in_loop:
            out.add(b.key)
    for loop in a.loops:
        if loop.scope is scope and isinstance(loop.node, cst.For):
            counting = isinstance(loop.node.iter, cst.Call) and dotted_name(
                loop.node.iter.func
            ) in {"range", "enumerate"}
            if not counting:
                out |= set(target_names(loop.node.target))
    for node, where in a.augmented:
        if where is scope:
            out.add(node)
    return out
