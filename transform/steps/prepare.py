"""Wrap model, optimizers, loaders and schedulers in one ``accelerator.prepare(...)``.

The call goes right after the last of them is built. A scheduler sized from
``len(train_dataloader)`` is therefore sized from the *unprepared* length and then prepared itself:
under HF Accelerate's semantics a prepared scheduler steps once per process per optimizer step,
so it runs exactly the schedule it was sized for on any number of processes.
"""

from __future__ import annotations

import libcst as cst

from accelify.transform.analysis import Analysis, mentions
from accelify.transform.patterns import Role
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
