"""Wrap model, optimizers, loaders and schedulers in one ``accelerator.prepare(...)``.

The call goes right after the last of them is built. A scheduler sized from
``len(train_dataloader)`` is therefore sized from the *unprepared* length and then prepared itself:
under HF Accelerate's semantics a prepared scheduler steps once per process per optimizer step,
so it runs exactly the schedule it was sized for on any number of processes. A scheduler stepped
once per *epoch* must not be multiplied that way: then the accelerator gets
``step_scheduler_with_optimizer=False``.
"""

from __future__ import annotations

from collections.abc import Sequence

import libcst as cst

from accelify.transform.analysis import Analysis, Loop, key_of, mentions, unwrap_moves
from accelify.transform.beside_models import Idle, idle_beside
from accelify.transform.flow import Point
from accelify.transform.participation import (
    cut_layers,
    idle_submodules,
    partly_used,
    random_layers,
    replaced_parameters,
)
from accelify.transform.patterns import (
    RANK_NAMES,
    Role,
    callee_name,
    dotted_name,
    placeholder_of,
    returned_shards,
)
from accelify.transform.plan import Plan
from accelify.transform.refusals import SCHEDULE_FROM_A_SHARD, STEP_ORDER, UNSYNCED_GRADIENTS
from accelify.transform.setup import Refused, Setup, origins
from accelify.transform.walk import nodes

# Wrap the call like black would past this width (the guide's own example is wrapped).
LINE_LENGTH = 88


def insert_paragraph(plan: Plan, anchor: cst.BaseStatement, statement: cst.BaseStatement) -> None:
    """Put ``statement`` above ``anchor`` as a paragraph of its own.

    It takes the blank lines above ``anchor``; comments stay with the code they describe, and
    one blank line separates the two.
    """

    def first_comment(lines: Sequence[cst.EmptyLine]) -> int:
        return next((i for i, line in enumerate(lines) if line.comment), len(lines))

    blank = list(anchor.leading_lines[: first_comment(anchor.leading_lines)])
    plan.edits.insert_before(anchor, statement.with_changes(leading_lines=blank), first=True)
    plan.edits.replace(  # on the anchor as other steps left it (a rewrite may have added lines)
        anchor,
        lambda node: node.with_changes(
            leading_lines=[
                cst.EmptyLine(indent=False),
                *node.leading_lines[first_comment(node.leading_lines) :],
            ]
        ),
    )


def _with_creation(setup: Setup, point: Point) -> bool:
    """Whether the accelerator is created at ``point`` too (both before a ``try`` the training
    runs in): it goes first, so prepare() follows it."""
    created = setup.create_at
    return created is not None and created.block is point.block and created.index == point.index


def prepare(plan: Plan) -> None:
    setup = plan.setup
    if setup is None or not setup.prepared:
        return
    keys = setup.keys
    point = setup.prepare_at
    if point is None:  # objects the snippet never builds: prepare them before their first use
        body = setup.timeline.body().body
        live = (s for s in body if not plan.edits.is_removed(s) and mentions(s, set(keys)))
        where = next(live, None)
        if where is None:
            return
        indent = 0
    else:
        where = point.previous or point.next  # type: ignore[assignment]
        indent = 4 * depth(plan, point.block)
    _lengths_read_later(plan)
    statement = plan.statement(_prepare_code(keys, setup.accelerator, indent))
    if point is None:
        plan.edits.insert_before(where, statement)  # type: ignore[arg-type]
    elif point.next is not None and (point.previous is None or _with_creation(setup, point)):
        where = point.next  # first, or right after the accelerator made here
        plan.edits.insert_before(where, statement)
    elif point.next is not None and isinstance(point.previous, cst.FunctionDef | cst.ClassDef):
        where = point.next  # a paragraph of its own, not glued to the end of a definition
        insert_paragraph(plan, where, statement)
    else:
        plan.edits.insert_after(point.previous, statement)  # type: ignore[arg-type]
    plan.changed(  # type: ignore[arg-type]
        where,
        f"prepared {', '.join(keys)} with {setup.accelerator}.prepare()",
        shows=_prepare_code(keys, setup.accelerator, 0).split("(")[0],
    )
    for key, binding in setup.kept_loaders.items():
        if any(returned_shards(mark) for mark in nodes(binding.node, cst.Call)):
            continue  # its DistributedSampler comes back: the DDP rewrite's resolver says so
        plan.info(
            binding.node,
            f"{key} is not prepared: only evaluation reads it, and every process evaluates all "
            "of it (prepare it and gather per-sample results with "
            "accelerator.gather_for_metrics to split that work)",
        )
    for key, node in setup.factory_loaders.items():
        plan.info(
            node,
            f"{key} comes from {setup.factory_calls[key]}, which this file does not show: "
            "prepare() shards it if it is a torch DataLoader",
        )
    _zipped_shuffles(plan)
    discarded = partly_used(plan.analysis, setup)
    idle = idle_submodules(plan.analysis, setup)
    drawn = random_layers(plan.analysis, setup)
    cut = cut_layers(plan.analysis, setup)
    for model, node in replaced_parameters(plan.analysis, setup).items():
        raise Refused(
            node,
            UNSYNCED_GRADIENTS,
            f"{model}'s class puts a new nn.Parameter in place of one while training: "
            "DistributedDataParallel keeps to the parameters it was given, so each process "
            "updates the new one apart from the others and the replicas part",
        )
    beside = _idle_beside(plan)
    if setup.partly_trained or discarded or idle or drawn or cut or beside:
        _unused_parameters(
            plan,
            sorted(setup.partly_trained),
            discarded=discarded,
            idle=idle,
            drawn=drawn,
            cut=cut,
            beside=beside,
        )
    by_rank = bool(setup.unsharded) and _reads_rank(plan.analysis)
    for node, reason, advice in setup.unsharded:
        if by_rank:  # as accel-lint's ACL211, which stays quiet there
            plan.info(
                node,
                f"{reason}: every process draws from all the data, and the script reads which "
                "process it is, so it may split or seed its data per process itself (kept)",
            )
            continue
        plan.needs_human(
            node,
            f"{reason}, so every process trains on all the data; {advice}",
        )
    _epoch_schedulers(plan)


def _zipped_shuffles(plan: Plan) -> None:
    """``zip(train_loader_in, train_loader_out)`` of two prepared loaders: a prepared loader
    starts, and draws its shuffle, at its first batch, not when ``zip()`` takes it as the
    original does, so the two draw from the random state in another order (HF Accelerate's
    loaders do the same). Said, since even one process then sees other batches."""
    a = plan.analysis
    setup = plan.setup
    assert setup is not None
    for loop in a.loops:
        walked = [
            k for k in loop.iterables if origins(a, setup.scope, loop.scope, k) & setup.loaders
        ]
        if len(walked) > 1:
            plan.info(
                loop.node,
                f"{' and '.join(walked)} are walked together: each prepared loader draws its "
                "shuffle at its first batch, not when zip() takes it, so they draw from the "
                "random state in another order than the originals (as under HF Accelerate): "
                "the same data in other batches, even on one process",
            )


def _lengths_read_later(plan: Plan) -> None:
    """outlier-exposure's ``LambdaLR(optimizer, lambda step: cosine(step, epochs *
    len(train_loader), ...))``: the lambda reads the loader's length each time the scheduler
    runs it, after prepare() the length of one process's share. That ``len(train_loader)``
    reads ``train_loader_batches`` instead, bound to it right above the scheduler (whose
    constructor already runs the lambda once). A function of the file handed to the scheduler
    that reads it, or a loader bound again after the scheduler, is refused: the function's
    other callers would read the new name too, and the length would be the older loader's."""
    a = plan.analysis
    setup = plan.setup
    assert setup is not None
    loaders = {k for k in setup.keys if a.role(setup.scope, k) is Role.DATALOADER}
    taken = {n.value for n in nodes(a.module, cst.Name)}  # type: ignore[attr-defined]
    bound: dict[str, str] = {}
    for b in setup.prepared:
        if a.role(setup.scope, b.key) is not Role.SCHEDULER or not isinstance(b.value, cst.Call):
            continue
        named = [
            function.node
            for arg in b.value.args
            if isinstance(arg.value, cst.Name)
            and (function := a.functions.get(arg.value.value)) is not None
        ]
        lambdas = list(nodes(b.value, cst.Lambda))
        for call in (c for node in [*lambdas, *named] for c in nodes(node, cst.Call)):
            read = call.args[0].value if callee_name(call) == "len" and call.args else None  # type: ignore[attr-defined]
            key = key_of(read) if read is not None else None
            if key is None or key not in loaders:
                continue
            later = any(
                x.scope is b.scope and x.key == key and a.line(x.node) > a.line(b.node)
                for x in a.bindings
            )
            if key.startswith("self.") or later or not any(a.contains(f, call) for f in lambdas):
                raise Refused(
                    call,
                    SCHEDULE_FROM_A_SHARD,
                    f"{b.key} runs a function that reads len({key}) each time it steps: after "
                    f"prepare() that is one process's share of {key}, so on N processes the "
                    "schedule would end after 1/N of the training; bind the total to a name "
                    "before prepare() and read that",
                )
            if key not in bound:
                name = f"{key}_batches"
                while name in taken:
                    name += "_"
                bound[key] = name
                taken.add(name)
                length = plan.statement(f"{name} = len({key})\n")
                insert_paragraph(plan, a.statement_of(b.node), length)  # type: ignore[arg-type]
            plan.edits.replace(call, lambda _node, n=bound[key]: cst.Name(n))
            plan.changed(
                call,
                f"{b.key}'s lambda reads {bound[key]}, the length of {key} bound before "
                f"prepare(): the prepared {key} is one process's share, and the prepared "
                f"{b.key} steps once per process",
            )


def _reads_rank(a: Analysis) -> bool:
    """Whether the script reads which process it is (in a rewritten DDP script, through a
    placeholder such as ``__accelify_process_index__``)."""
    return any(
        (placeholder_of(name) or name.value) in RANK_NAMES  # type: ignore[arg-type]
        for name in nodes(a.module, cst.Name)
    )


def _unused_parameters(
    plan: Plan,
    models: list[str],
    *,
    discarded: dict[str, cst.Call],
    idle: dict[str, cst.Attribute],
    drawn: dict[str, cst.CSTNode],
    cut: dict[str, cst.CSTNode],
    beside: dict[str, tuple[cst.CSTNode, Idle]],
) -> None:
    """The optimizer trains part of a model (``encoder.fc.parameters()``), a training step
    discards some of a model's outputs (``validity, _ = D(x)``), a model's class builds a
    submodule nothing calls, draws how often its forward uses a layer, or cuts a value off the
    graph: some parameters may get no gradient, which DistributedDataParallel stops on unless it
    is told to expect it."""
    handler = cst.parse_expression("[DistributedDataParallelKwargs(find_unused_parameters=True)]")
    plan.accelerator_kwargs["kwargs_handlers"] = handler
    plan.imports.add("DistributedDataParallelKwargs")
    expect = "DistributedDataParallel is told to expect parameters without gradients"
    if models:
        plan.changed(
            plan.setup.prepared[0].node,  # type: ignore[union-attr]
            f"the optimizer trains part of {', '.join(models)}: {expect} "
            "(find_unused_parameters=True)",
        )
    for model, call in discarded.items():
        plan.changed(
            call,
            f"this step discards some of {model}'s outputs, so parameters that only feed them "
            f"get no gradient here: {expect} (find_unused_parameters=True)",
        )
    for model, attribute in idle.items():
        name = attribute.attr.value
        what = (
            f"{model} builds {name} here and nothing in this file uses it, so its parameters "
            "never get a gradient"
            if key_of(attribute.value) == "self"
            else f"{name} is attached to {model} here and no code in this file reads it, so its "
            "parameters may get no gradient"
        )
        plan.changed(attribute, f"{what}: {expect} (find_unused_parameters=True)")
    for model, control in drawn.items():
        plan.changed(
            control,
            f"{model}'s forward uses the layers under this a random number of times, so a step "
            f"that draws none leaves their parameters without a gradient: {expect} "
            "(find_unused_parameters=True)",
        )
    for model, node in cut.items():
        plan.changed(
            node,
            f"{model}'s class cuts a value off the graph here, so parameters that only feed it "
            f"may get no gradient: {expect} (find_unused_parameters=True)",
        )
    for model, (node, found) in beside.items():
        how = "reads only under an if" if found.conditional else "never reads"
        plan.changed(
            node,
            f"{model}'s class builds {found.attribute} ({found.file}, line {found.line}) and "
            f"{how}, so a step may leave its parameters without a gradient: {expect} "
            "(find_unused_parameters=True)",
        )


def _idle_beside(plan: Plan) -> dict[str, tuple[cst.CSTNode, Idle]]:
    """Models built from a class of a module beside the script that builds a parameter its
    methods read only under an ``if``, or never (:mod:`beside_models`)."""
    a = plan.analysis
    setup = plan.setup
    assert setup is not None
    found = {}
    for b in setup.prepared:
        value = unwrap_moves(b.value) if b.value is not None else None
        if b.key not in setup.models(a) or not isinstance(value, cst.Call):
            continue
        qualified = a.names.qualify(value.func)
        if qualified is not None and "." in qualified:
            idle = idle_beside(a.path, qualified)
            if idle is not None:
                found[b.key] = (b.node, idle)
    return found


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
        raise Refused(
            per_batch[False][0],
            STEP_ORDER,
            "schedulers step per epoch and per batch: a prepared scheduler steps either once "
            "per process or once per call, not both",
        )
    if per_batch[False]:
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
    """The loops over a loader, alone or zipped with others (``zip(in_loader, out_loader)``)."""
    return [
        lp
        for lp in a.loops
        if any(a.role(lp.scope, key) is Role.DATALOADER for key in lp.iterables)
    ]


def _prepare_code(keys: list[str], accelerator: str, indent: int) -> str:
    names = ", ".join(keys)
    line = f"{names} = {accelerator}.prepare({names})"
    if indent + len(line) <= LINE_LENGTH:
        return line + "\n"
    return f"{names} = {accelerator}.prepare(\n    {names}\n)\n"


def depth(plan: Plan, block: cst.CSTNode) -> int:
    """How many blocks deep the statements of ``block`` are (their indentation, in levels)."""
    levels = 0
    current: cst.CSTNode | None = block
    while current is not None:
        levels += isinstance(current, cst.IndentedBlock)
        current = plan.analysis.parent(current)
    return levels
