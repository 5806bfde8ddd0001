"""The conversion step that gives the rewritten script's rank values and actions their source.

It runs inside the conversion of the intermediate (single-process) script, after every other
step has planned and before the accelerator is written, so it knows where the accelerator is:
``__accelify_process_index__`` becomes ``accelerator.process_index`` where code can reach the
accelerator (threading it into functions as other steps do), ``PartialState().process_index``
where it cannot (before it exists, in a class it does not live in). It also checks what only the
conversion knows: a loader that was sharded is prepared; and it takes back every
``wait_for_everyone()`` the save step put under a condition, which in a DDP script is likely a
rank guard (only the main process would wait: a hang).
"""

from __future__ import annotations

from collections.abc import Callable

import libcst as cst

from accelify.transform.analysis import Analysis, Scope, key_of, returns
from accelify.transform.neighbours import process_group_readers
from accelify.transform.patterns import placeholder_of, returned_shards, runs_as_script
from accelify.transform.plan import Plan
from accelify.transform.refusals import ACCUMULATION, DDP_RANK, DDP_SAMPLER
from accelify.transform.setup import Refused, origins
from accelify.transform.steps.accelerator import process_state
from accelify.transform.steps.unwrap import SYNC_TOGGLE
from accelify.transform.walk import nodes

# Placeholders read as attributes of the accelerator (or of PartialState, which has them too).
_ATTRIBUTES = frozenset(
    {
        "process_index",
        "local_process_index",
        "num_processes",
        "is_main_process",
        "is_local_main_process",
        "device",
        "wait_for_everyone",
    }
)


def resolver(ddp_options: dict[str, cst.BaseExpression], path: str) -> Callable[[Plan], None]:
    """The step, with the DistributedDataParallel options the rewrite carried over and the
    file's path (whose neighbours hold the script's own helpers)."""

    def resolve(plan: Plan) -> None:
        if plan.setup is None:
            return
        _helpers_after_the_accelerator(plan, path)
        for name in list(nodes(plan.analysis.module, cst.Name)):
            what = placeholder_of(name)
            if what is not None:
                _resolve(plan, name, what)  # type: ignore[arg-type]
        if _accumulates(plan):
            for attribute in nodes(plan.analysis.module, cst.Attribute):
                if attribute.attr.value == SYNC_TOGGLE:  # type: ignore[attr-defined]
                    raise _second_schedule(attribute, SYNC_TOGGLE)
        _ddp_options(plan, ddp_options)
        _no_waits_under_conditions(plan)

    return resolve


def _helpers_after_the_accelerator(plan: Plan, path: str) -> None:
    """A helper of the script's own modules that asks torch.distributed about the processes
    (``utils.get_rank()``) answers as one process until the accelerator starts them; the
    original started its process group first, so such a call in the setup must come after the
    accelerator is created."""
    a, setup = plan.analysis, plan.setup
    assert setup is not None
    point = setup.create_at or setup.prepare_at
    calls = [
        (call, q)
        for call, scope in a.calls
        if scope is setup.scope and (q := a.names.qualify(call.func))
    ]
    readers = process_group_readers(path, {q for _call, q in calls})
    for call, qualified in calls:
        if qualified in readers and point is not None and not setup.timeline.after(point, call):
            raise Refused(
                call,
                DDP_RANK,
                f"{a.module.code_for_node(call.func)}() asks torch.distributed about the "
                "processes before the accelerator starts them, so every process would get one "
                "process's answer: move it below the accelerator's creation, or convert by hand",
            )


def _resolve(plan: Plan, name: cst.Name, what: str) -> None:
    a = plan.analysis
    parent = a.parent(name)
    call = parent if isinstance(parent, cst.Call) and parent.func is name else None
    if what in _ATTRIBUTES:
        plan.edits.replace(name, cst.Attribute(_state(plan, name), cst.Name(what)))
    elif what == "end_training" and call is not None:
        accelerator = plan.accelerator(name, optional=True)
        if accelerator is None:
            plan.remove(a.statement_of(call))
        else:
            plan.edits.replace(name, cst.Attribute(accelerator, cst.Name("end_training")))
    elif what == "unwrap_model" and call is not None:
        accelerator = plan.accelerator(name)
        plan.edits.replace(name, cst.Attribute(accelerator, cst.Name(what)))  # type: ignore[arg-type]
    elif what in {"reduce", "no_sync"} and call is not None:
        if what == "no_sync" and _accumulates(plan):
            raise _second_schedule(name, "no_sync()")
        accelerator = plan.accelerator(name)
        plan.edits.replace(name, cst.Attribute(accelerator, cst.Name(what)))  # type: ignore[arg-type]
    elif what == "set_epoch" and call is not None:
        _set_epoch(plan, call)
    elif what == "sharded" and call is not None:
        _sharded(plan, call)
    else:
        raise Refused(name, DDP_RANK, f"cannot place {what} here")


def _accumulates(plan: Plan) -> bool:
    """Whether the conversion adds gradient accumulation (the script's or the flag's)."""
    flag = plan.options.gradient_accumulation_steps
    return "gradient_accumulation_steps" in plan.accelerator_kwargs or (flag or 1) > 1


def _second_schedule(node: cst.CSTNode, what: str) -> Refused:
    return Refused(
        node,
        ACCUMULATION,
        f"the script schedules gradient sync itself ({what}); accumulate() would add a second "
        "schedule around it",
    )


def _state(plan: Plan, node: cst.CSTNode) -> cst.BaseExpression:
    return process_state(plan, node, DDP_RANK, "the process index is read")


def _set_epoch(plan: Plan, call: cst.Call) -> None:
    """``loader.set_epoch(e)`` for a prepared loader; gone for one every process reads whole."""
    loader, epoch = (arg.value for arg in call.args)
    if _prepared(plan, loader):
        plan.edits.replace(
            call, cst.Call(cst.Attribute(loader, cst.Name("set_epoch")), [cst.Arg(epoch)])
        )
    else:
        plan.remove(plan.analysis.statement_of(call))


def _prepared(plan: Plan, loader: cst.BaseExpression) -> bool:
    setup = plan.setup
    key = key_of(loader)
    scope = plan.analysis.scope_of.get(id(loader))
    if setup is None or key is None or scope is None:
        return False
    found = origins(plan.analysis, setup.scope, scope, key)
    return bool(found) and found <= setup.loaders


def _sharded(plan: Plan, marker: cst.Call) -> None:
    """The loader whose DistributedSampler went: prepared, it shards the data itself; kept for
    evaluation, a sampler over its own dataset without shuffling comes back, told the
    accelerator's process count and index (as many processes read the same shards as before,
    and one reads every sample in order); otherwise refused."""
    a = plan.analysis
    loader = a.parent(a.parent(marker))  # marker -> Arg -> DataLoader(...)
    holder = a.parent(loader)  # type: ignore[arg-type]
    if isinstance(holder, cst.Assign) and len(holder.targets) == 1:
        target = holder.targets[0].target
        if _prepared(plan, target):
            _shards_itself(plan, marker)
            return
        if _kept(plan, target) and returned_shards(marker):
            _sampler_back(plan, marker, key_of(target))
            return
        if _returned_prepared(plan, a.scope_of[id(holder)], target):
            _shards_itself(plan, marker)
            return
    elif isinstance(holder, cst.Return):
        function = a.scope_of[id(holder)]
        built = [_prepared(plan, t) for t in _results_of(a, function)]
        if built and all(built):
            _shards_itself(plan, marker)
            return
    raise Refused(
        loader,  # type: ignore[arg-type]
        DDP_SAMPLER,
        "this loader was sharded by a DistributedSampler, but the conversion would not prepare "
        "it: every process would read all of it (and a sum of it reduced N times over)",
    )


def _shards_itself(plan: Plan, marker: cst.Call) -> None:
    """The mark gives way to what it holds: the sampler's ``shuffle`` (or the batch sampler)."""
    value = marker.args[0].value
    plan.edits.replace(marker, value)
    arg = plan.analysis.parent(marker)
    if isinstance(arg, cst.Arg) and arg.keyword is not None and arg.keyword.value == "shuffle":
        plan.changed(
            marker,
            "DistributedSampler removed: the prepared loader shards the data "
            f"(shuffle={plan.analysis.module.code_for_node(value)})",
        )


def _kept(plan: Plan, loader: cst.BaseExpression) -> bool:
    """Whether ``loader`` is the setup's own name of a loader only evaluation reads."""
    setup = plan.setup
    return (
        setup is not None
        and plan.analysis.scope_of.get(id(loader)) is setup.scope
        and key_of(loader) in setup.kept_loaders
    )


def _sampler_back(plan: Plan, marker: cst.Call, key: str | None) -> None:
    """``shuffle=sharded(False, ds)`` -> ``sampler=torch.utils.data.DistributedSampler(ds, ..)``."""
    torch = plan.analysis.names.local_name("torch")
    if torch is None:
        raise Refused(
            marker,
            DDP_SAMPLER,
            f"{key} is only evaluated, and its DistributedSampler would come back with the "
            "accelerator's process count, but the file has no `import torch` to spell it with",
        )
    state = cst.Module([]).code_for_node(_state(plan, marker))
    dataset = cst.Module([]).code_for_node(marker.args[1].value)
    sampler = cst.parse_expression(
        f"{torch}.utils.data.DistributedSampler({dataset}, num_replicas={state}.num_processes, "
        f"rank={state}.process_index, shuffle=False)"
    )
    plan.edits.replace(
        plan.analysis.parent(marker),  # type: ignore[arg-type]
        lambda arg: arg.with_changes(keyword=cst.Name("sampler"), value=sampler),
    )
    plan.changed(
        marker,
        f"{key} is only evaluated, so it is not prepared: its DistributedSampler stays, told "
        "the accelerator's process count and index, and shards it as before",
    )


def _returned_prepared(plan: Plan, function: Scope, target: cst.BaseExpression) -> bool:
    """``train_loader = DataLoader(...)`` ... ``return train_loader, test_loader`` in a loader
    factory, and every call's name for that element (``train_loader, _ = factory()``) prepared."""
    a = plan.analysis
    if not isinstance(target, cst.Name) or function.is_module:
        return False
    positions = {_position(r.value, target.value) for r in returns(function)}
    if len(positions) != 1 or (at := positions.pop()) == -1:
        return False
    calls = _assigned_from(a, function)
    if any(len(assign.targets) != 1 for assign in calls):
        return False
    names = []
    for assign in calls:
        unpacked = assign.targets[0].target
        if at is None:
            names.append(unpacked)
        elif isinstance(unpacked, cst.Tuple | cst.List) and at < len(unpacked.elements):
            names.append(unpacked.elements[at].value)
        else:
            return False
    return bool(names) and all(_prepared(plan, n) for n in names)


def _position(value: cst.BaseExpression | None, name: str) -> int | None:
    """None: ``return name``; i: ``return a, name``; -1: anything else."""
    if isinstance(value, cst.Name) and value.value == name:
        return None
    if isinstance(value, cst.Tuple):
        found = [
            i for i, e in enumerate(value.elements)
            if isinstance(e.value, cst.Name) and e.value.value == name
        ]  # fmt: skip
        if len(found) == 1 and not any(isinstance(e, cst.StarredElement) for e in value.elements):
            return found[0]
    return -1


def _results_of(a: Analysis, function: Scope) -> list[cst.BaseExpression]:
    """What the calls of ``function`` are assigned to (a name, or a tuple unpacking them)."""
    return [assign.targets[0].target for assign in _assigned_from(a, function)]


def _assigned_from(a: Analysis, function: Scope) -> list[cst.Assign]:
    """The assignments whose value is a call of ``function``."""
    return [
        node
        for node, _scope in a.assignments
        if isinstance(node, cst.Assign)
        and isinstance(node.value, cst.Call)
        and a.callee(node.value) is function
    ]


def _ddp_options(plan: Plan, options: dict[str, cst.BaseExpression]) -> None:
    if not options:
        return
    merged = dict(options)
    if "kwargs_handlers" in plan.accelerator_kwargs:  # the prepare step's: part of a model trains
        merged["find_unused_parameters"] = cst.Name("True")
    args = ", ".join(f"{k}={plan.analysis.module.code_for_node(v)}" for k, v in merged.items())
    plan.accelerator_kwargs["kwargs_handlers"] = cst.parse_expression(
        f"[DistributedDataParallelKwargs({args})]"
    )
    plan.imports.add("DistributedDataParallelKwargs")


def _no_waits_under_conditions(plan: Plan) -> None:
    """Take back the waits other steps put where only some processes may run."""
    a = plan.analysis
    statements = {id(s): s for s in nodes(a.module, cst.BaseStatement)}
    for inserted in (plan.edits.before, plan.edits.after):
        for anchor_id, new in inserted.items():
            anchor = statements.get(anchor_id)
            if anchor is None or not _conditional(a, anchor, set()):
                continue
            kept = [s for s in new if not _is_wait(s)]
            if len(kept) != len(new):
                lead = next(s for s in new if _is_wait(s)).leading_lines  # type: ignore[attr-defined]
                if lead:  # the wait had taken the anchor's own lines: they go back to it
                    plan.edits.replace(
                        anchor, lambda node, lead=lead: node.with_changes(leading_lines=lead)
                    )
                new[:] = kept


def _is_wait(statement: cst.BaseStatement) -> bool:
    return "wait_for_everyone()" in cst.Module([statement]).code and isinstance(
        statement, cst.SimpleStatementLine
    )


def _conditional(a: Analysis, node: cst.CSTNode, seen: set[int]) -> bool:
    """Whether ``node`` runs under an ``if`` (in its function, or at a call of the function)."""
    current = a.parent(node)
    while current is not None and not isinstance(current, cst.FunctionDef | cst.Module):
        if isinstance(current, cst.If | cst.IfExp | cst.While) and not runs_as_script(current):
            return True
        current = a.parent(current)
    scope = a.scope_of.get(id(node))
    if scope is None or scope.is_module or id(scope) in seen:
        return False
    seen.add(id(scope))
    return any(_conditional(a, call, seen) for call, _s in a.calls if a.callee(call) is scope)
