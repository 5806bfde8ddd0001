"""Evaluation metrics count every sample once, not one process's shard.

A prepared eval loader gives each process a different shard, so a metric fed inside the loop only
sees that process's share. ``metric.add_batch(predictions=p, references=r)`` (HF ``evaluate``)
gets its arguments through ``accelerator.gather_for_metrics``, which also drops the samples
duplicated to even out the last batch. Hand-rolled sums (``correct += ...``) are reported: which
part of the expression holds one value per sample is not something to guess.
"""

from __future__ import annotations

from collections import Counter

import libcst as cst

from accelify.transform.analysis import Loop, key_of, mentions
from accelify.transform.patterns import callee_name, loader_dataset_name, method_call
from accelify.transform.plan import Plan
from accelify.transform.setup import origins
from accelify.transform.steps.moves import batch_names, prepared_loop
from accelify.transform.walk import walk

_GATHERS = frozenset({"gather", "gather_for_metrics", "reduce"})


def metrics(plan: Plan) -> None:
    a = plan.analysis
    setup = plan.setup
    if setup is None:
        return
    for loop in a.loops:
        if loop.trains or loop.scope not in plan.training or not prepared_loop(plan, loop):
            continue
        _gather_metric_inputs(plan, loop)
        _report_sums(plan, loop)
    _report_dataset_averages(plan)
    for comp, scope, key in a.comprehensions:
        found = origins(a, setup.scope, scope, key)
        prepared = setup.prepare_at is None or setup.timeline.after(setup.prepare_at, comp)
        if scope in plan.training and found and found <= setup.loaders and prepared:
            plan.needs_human(
                comp,
                f"computes over this process's shard of {key} only: gather per-sample values "
                "with accelerator.gather_for_metrics first",
            )


def _gather_metric_inputs(plan: Plan, loop: Loop) -> None:
    a = plan.analysis
    for call, scope in a.calls:
        if scope is not loop.scope or method_call(call, "add_batch") is None:
            continue
        if not a.contains(loop.node, call) or any(
            isinstance(arg.value, cst.Call) and callee_name(arg.value) in _GATHERS
            for arg in call.args
        ):
            continue
        accelerator = plan.accelerator(call)
        gather = cst.Attribute(accelerator, cst.Name("gather_for_metrics"))
        for arg in call.args:
            plan.edits.replace(arg.value, lambda node, f=gather: cst.Call(f, [cst.Arg(node)]))
        plan.changed(call, "metric inputs gathered with accelerator.gather_for_metrics")


def _report_sums(plan: Plan, loop: Loop) -> None:
    a = plan.analysis
    per_batch = batch_names(a, loop) | {
        b.key for b in a.bindings if b.scope is loop.scope and a.contains(loop.node, b.node)
    }
    for node in _aug_assigns(loop.node):
        if mentions(node.value, per_batch):
            plan.needs_human(
                node,
                "sums this process's shard only: gather per-sample values with "
                "accelerator.gather_for_metrics first",
            )


def _aug_assigns(node: cst.CSTNode) -> list[cst.AugAssign]:
    found: list[cst.AugAssign] = []

    class _Finder(cst.CSTVisitor):
        def visit_AugAssign(self, aug: cst.AugAssign) -> None:
            found.append(aug)

        def visit_FunctionDef(self, function: cst.FunctionDef) -> bool:
            return False

    walk(node, _Finder())
    return found


def _report_dataset_averages(plan: Plan) -> None:
    """``total / len(loader.dataset)`` over a prepared loader: each process summed its shard, and
    divides by the whole dataset's length (on N processes it prints 1/N of the average)."""
    a = plan.analysis
    setup = plan.setup
    over = _datasets_of_prepared_loaders(plan)
    for call, scope in plan.training_calls():
        division = a.parent(call)
        if not (
            callee_name(call) == "len"
            and len(call.args) == 1
            and isinstance(division, cst.BinaryOperation)
            and isinstance(division.operator, cst.Divide)
            and division.right is call
        ):
            continue
        arg = call.args[0].value
        if isinstance(arg, cst.Name) and arg.value in over:  # ``len(train_set)``
            key: str | None = over[arg.value]
        elif isinstance(arg, cst.Attribute) and arg.attr.value == "dataset":
            key = key_of(arg.value)
        else:
            continue
        point = setup.prepare_at  # type: ignore[union-attr]
        if point is not None and not setup.timeline.after(point, call):  # type: ignore[union-attr]
            continue  # the bare loader: every process read all of it
        found = origins(a, setup.scope, scope, key) if key is not None else set()  # type: ignore[union-attr]
        if found and found <= setup.loaders:  # type: ignore[union-attr]
            plan.needs_human(
                call,
                f"divides this process's sum by the whole dataset's length: each process sees "
                f"its shard of {key} only (gather or reduce the sum first)",
            )


def _datasets_of_prepared_loaders(plan: Plan) -> dict[str, str]:
    """Dataset name -> the prepared loader built over it (``DataLoader(train_set, ...)``), for
    names bound once in the file: ``len(train_set)`` is then that loader's dataset's length."""
    a, setup = plan.analysis, plan.setup
    assert setup is not None
    bound = Counter(b.key for b in a.bindings)
    found = {}
    for b in a.bindings:
        name = loader_dataset_name(b.value)
        if (
            b.scope is setup.scope
            and b.key in setup.loaders
            and name is not None
            and bound[name] == 1
            and name not in setup.scope.params
        ):
            found[name] = b.key
    return found
