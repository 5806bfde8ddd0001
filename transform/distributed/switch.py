"""``ddp = int(os.environ.get("RANK", -1)) != -1``: the script's switch between its distributed
and its single-process paths (nanoGPT's shape).

Under ``accel-run`` the distributed path is the one to keep: once its rank reads come from the
accelerator it is also right on one process (rank 0 of 1, a world of 1), which is what the other
path spelled out by hand. So ``if ddp:`` keeps its body and loses its ``else``, ``a if ddp else
b`` becomes ``a``, and the switch itself goes. Any other read of it is refused: what it decides
there is not known.
"""

from __future__ import annotations

import libcst as cst

from accelify.transform.distributed.context import Rewrite
from accelify.transform.distributed.ranks import (
    ENVIRONMENT,
    environment_variable,
    launch_option_reads,
)
from accelify.transform.edits import comments_in
from accelify.transform.patterns import names_a_rank
from accelify.transform.refusals import DDP_LAUNCH
from accelify.transform.walk import nodes


def collapse_switches(r: Rewrite) -> None:
    a = r.analysis
    _collapse_launch_tests(r)
    switches = {(r.owner(b.scope, b.key), b.key): b for b in a.bindings if _is_switch(r, b.value)}
    if not switches:
        return
    for name in nodes(a.module, cst.Name):
        scope = a.scope_of.get(id(name))
        key = (r.owner(scope, name.value), name.value) if scope is not None else None  # type: ignore[attr-defined]
        binding = switches.get(key)  # type: ignore[arg-type]
        if binding is None or a.contains(binding.node, name):
            continue
        collapse(r, name, name.value)  # type: ignore[arg-type, attr-defined]
    for binding in switches.values():
        if not isinstance(binding.node, cst.Assign) or len(binding.node.targets) != 1:
            raise r.refuse(
                binding.node,
                DDP_LAUNCH,
                "this distributed/single-process switch is also bound otherwise",
            )
        r.remove(a.parent(binding.node))  # type: ignore[arg-type]
        r.changed(
            binding.node, "the distributed path is kept: under accel-run it also runs one process"
        )


def _collapse_launch_tests(r: Rewrite) -> None:
    """``if args.local_rank == -1:`` / ``!= -1`` with ``--local_rank`` declared (the HF examples'
    and FixMatch's test of whether ``torch.distributed.launch`` started the script): the
    distributed path is kept, as for a named switch; ``== -1`` keeps the ``else``."""
    a = r.analysis
    reads = {id(node) for node in launch_option_reads(r)}
    for test in nodes(a.module, cst.Comparison):
        single = _launch_test(test, reads)  # type: ignore[arg-type]
        parent = a.parent(test)
        if single is None or not isinstance(parent, cst.If | cst.IfExp) or parent.test is not test:
            continue
        collapse(r, test, a.module.code_for_node(test), single=single)  # type: ignore[arg-type]
        r.changed(test, "the distributed path is kept: under accel-run it also runs one process")


def _launch_test(test: cst.Comparison, reads: set[int]) -> bool | None:
    """True for ``<launch read> == -1``, False for ``!= -1``, else None."""
    if len(test.comparisons) != 1:
        return None
    target = test.comparisons[0]
    sides = (test.left, target.comparator)
    minus_one = [
        isinstance(s, cst.UnaryOperation)
        and isinstance(s.operator, cst.Minus)
        and isinstance(s.expression, cst.Integer)
        and s.expression.value == "1"
        for s in sides
    ]
    if not any(minus_one) or not any(id(s) in reads for s in sides):
        return None
    if isinstance(target.operator, cst.Equal):
        return True
    return False if isinstance(target.operator, cst.NotEqual) else None


def _is_switch(r: Rewrite, value: cst.BaseExpression | None) -> bool:
    """A test of whether a launcher set the rank variables."""
    if not isinstance(value, cst.Comparison) or len(value.comparisons) != 1:
        return False
    names = r.analysis.names
    left, comparator = value.left, value.comparisons[0].comparator
    if isinstance(left, cst.Call) and len(left.args) == 1:  # int(os.environ.get(...))
        left = left.args[0].value
    if isinstance(value.comparisons[0].operator, cst.In):  # "RANK" in os.environ
        key = left.evaluated_value if isinstance(left, cst.SimpleString) else None
        return key in ENVIRONMENT and names.refers_to(comparator, ("os",), "environ")
    return environment_variable(names, left) in ENVIRONMENT


def collapse(r: Rewrite, switch: cst.BaseExpression, spelled: str, *, single: bool = False) -> None:
    """Keep the distributed path where ``switch`` (spelled ``spelled``) chooses it: the side it
    is true on, or with ``single`` (``args.local_rank == -1``, true on one process) the other."""
    a = r.analysis
    parent = a.parent(switch)
    if isinstance(parent, cst.If) and parent.test is switch:
        if isinstance(parent.orelse, cst.If):
            raise r.refuse(
                parent, DDP_LAUNCH, "an elif follows the distributed/single-process switch"
            )
        kept, dropped = (parent.orelse, parent.body) if single else (parent, parent.orelse)
        if kept is None:  # ``if args.local_rank == -1:`` alone: nothing runs distributed
            r.dropped.append(dropped)  # type: ignore[arg-type]
            r.remove(parent)
            return
        _refuse_distributed_only_checks(r, kept, spelled)
        if dropped is not None:
            r.dropped.append(dropped)
            # The dropped branch's comments stay, above the kept body.
            lines = [*getattr(dropped, "leading_lines", ()), *comments_in(dropped)]
            lines = [line for line in lines if line.comment is not None]
            r.edits.replace(
                parent,
                lambda node: node.with_changes(
                    leading_lines=[*node.leading_lines, *lines],
                    **({"body": node.orelse.body, "orelse": None} if single else {}),
                ),
            )
        r.edits.unwrap(parent)
        return
    if isinstance(parent, cst.IfExp) and parent.test is switch:
        r.dropped.append(parent.body if single else parent.orelse)
        r.edits.replace(parent, lambda node: node.orelse if single else node.body)  # type: ignore[attr-defined]
        return
    raise r.refuse(
        switch, DDP_LAUNCH, f"{spelled} switches between distributed and single-process code here"
    )


def _refuse_distributed_only_checks(r: Rewrite, branch: cst.If | cst.Else, switch: str) -> None:
    """An ``assert`` under ``if ddp:`` checked only distributed runs; kept, it would check the
    one-process run too, which it did not. One that reads the rank or the world size (``assert
    steps % world_size == 0``) holds on one process, where they are 0 and 1. ``assert
    torch.cuda.is_available()`` beside the ``init_process_group`` of that branch asked for what
    the hand-started group (NCCL, one GPU per rank) needed: it goes with it."""
    starts = any(
        r.analysis.names.last_part(c.func) == "init_process_group"
        and r.analysis.names.from_package(c.func, "torch.distributed")
        for c in nodes(branch.body, cst.Call)
    )
    for check in nodes(branch.body, cst.Assert):
        if starts and _asks_for_cuda(r, check):
            r.remove(r.analysis.statement_of(check))  # type: ignore[arg-type]
            r.changed(
                check,
                "assert torch.cuda.is_available() removed: it held for the process group the "
                "script started by hand; accel-run picks the device and its backend",
            )
            continue
        if not any(_reads_rank(n.value) for n in nodes(check, cst.Name)):  # type: ignore[attr-defined]
            raise r.refuse(
                check,
                DDP_LAUNCH,
                f"this assert ran only on the distributed path (if {switch}:); kept as that path "
                "is, it would also run on one process, where it did not",
            )


def _asks_for_cuda(r: Rewrite, check: cst.Assert) -> bool:
    """``assert torch.cuda.is_available()``: build-nanogpt's "for now i think we need CUDA for
    DDP", beside its ``init_process_group(backend="nccl")``."""
    test = check.test
    return (
        isinstance(test, cst.Call)
        and not test.args
        and r.analysis.names.qualify(test.func) == "torch.cuda.is_available"
    )


def _reads_rank(name: str) -> bool:
    """``rank``, ``ddp_world_size``, ``local_rank``: the distributed configuration's names."""
    return names_a_rank(name) or "world_size" in name
