"""Wrap model, optimizers, loaders and schedulers in one ``accelerator.prepare(...)``.

The call goes right after the last of them is built. A scheduler sized from
``len(train_dataloader)`` is therefore sized from the *unprepared* length and then prepared itself:
under HF Accelerate's semantics a prepared scheduler steps once per process per optimizer step,
so it runs exactly the schedule it was sized for on any number of processes. A scheduler stepped
once per *epoch* must not be multiplied that way: then the accelerator gets
``step_scheduler_with_optimizer=False``.
"""

from __future__ import annotations

import libcst as cst

from accelify.transform.analysis import Analysis, Loop, key_of, mentions
from accelify.transform.patterns import Role, dotted_name
from accelify.transform.plan import Plan

# Wrap the call like black would past this width (the guide's own example is wrapped).
LINE_LENGTH = 88


def prepare(plan: Plan) -> None:
    setup = plan.setup
    if setup is None or not setup.prepared:
        return
    a = plan.analysis
    keys = [b.key for b in setup.prepared]
    body = list(setup.scope.body)
    statement = plan.statement(_prepare_code(keys, setup.accelerator, _indent(a, setup.scope.node)))
    built = [body.index(b.statement) for b in setup.prepared if b.node is not setup.scope.node]
    if built:
        where = body[max(built)]
        plan.edits.insert_after(where, statement)
    else:  # objects the snippet never builds: prepare them before their first use
        live = (s for s in body if not plan.edits.is_removed(s) and mentions(s, set(keys)))
        where = next(live, None)
        if where is None:
            return
        plan.edits.insert_before(where, statement)
    plan.changed(where, f"prepared {', '.join(keys)} with {setup.accelerator}.prepare()")
    for b in setup.unprepared:
        plan.needs_human(b.node, f"{b.key} is built conditionally: add it to prepare() by hand")
    _report_unsharded_training(plan, keys)
    _epoch_schedulers(plan)


def _epoch_schedulers(plan: Plan) -> None:
    """Schedulers stepped outside the batch loop step once per call, not once per process."""
    a = plan.analysis
    per_batch: dict[bool, list[cst.Call]] = {True: [], False: []}
    for call, scope in plan.training_calls():
        receiver = key_of(call.func.value) if isinstance(call.func, cst.Attribute) else None
        if (
            receiver is not None
            and call.func.attr.value == "step"  # type: ignore[union-attr]
            and a.role(scope, receiver) is Role.SCHEDULER
        ):
            per_batch[_in_batch_loop(a, call)].append(call)
    if per_batch[False] and per_batch[True]:
        plan.needs_human(
            per_batch[False][0],
            "schedulers step per epoch and per batch: set "
            "step_scheduler_with_optimizer by hand (see HF Accelerate's docs)",
        )
    elif per_batch[False]:
        plan.accelerator_kwargs["step_scheduler_with_optimizer"] = cst.Name("False")
        plan.changed(
            per_batch[False][0],
            "the scheduler steps per epoch: "
            "step_scheduler_with_optimizer=False keeps one step per call",
        )


def _in_batch_loop(a: Analysis, node: cst.CSTNode) -> bool:
    """Inside a loop over a loader, directly or in a function such a loop calls."""
    scope = a.scope_of[id(node)]
    if any(lp.scope is scope and a.contains(lp.node, node) for lp in _loader_loops(a)):
        return True
    return any(
        dotted_name(call.func) in {scope.name, f"self.{scope.name}"}
        and any(lp.scope is where and a.contains(lp.node, call) for lp in _loader_loops(a))
        for call, where in a.calls
    )


def _loader_loops(a: Analysis) -> list[Loop]:
    return [
        lp
        for lp in a.loops
        if lp.iterable is not None and a.role(lp.scope, lp.iterable) is Role.DATALOADER
    ]


def _report_unsharded_training(plan: Plan, keys: list[str]) -> None:
    """Without a DataLoader there is nothing to shard: every process would see all the data."""
    a = plan.analysis
    setup = plan.setup
    loaders = set(keys) | setup.already_prepared  # type: ignore[union-attr]
    if any(a.role(setup.scope, k) is Role.DATALOADER for k in loaders):  # type: ignore[union-attr]
        return
    training = next((loop for loop in a.loops if loop.trains), None)
    if training is not None:
        plan.needs_human(
            training.node,
            "no DataLoader feeds this loop, so every process trains on all the data; "
            "iterate a DataLoader and prepare() it to shard the data",
        )


def _prepare_code(keys: list[str], accelerator: str, indent: int) -> str:
    names = ", ".join(keys)
    line = f"{names} = {accelerator}.prepare({names})"
    if indent + len(line) <= LINE_LENGTH:
        return line + "\n"
    return f"{names} = {accelerator}.prepare(\n    {names}\n)\n"


def _indent(a: Analysis, node: cst.CSTNode) -> int:
    depth = 0
    current: cst.CSTNode | None = node
    while current is not None:
        if isinstance(current, cst.FunctionDef | cst.ClassDef):
            depth += 1
        current = a.parent(current)
    return 4 * depth
