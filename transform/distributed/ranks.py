"""Rank values keep their meaning; only their source changes.

``int(os.environ["LOCAL_RANK"])``, ``dist.get_rank()`` and ``dist.get_world_size()`` (and the
``RANK``/``WORLD_SIZE`` variables) become the accelerator's ``local_process_index``,
``process_index`` and ``num_processes``, so every name assigned from them holds the same number
under ``accel-run`` as under ``torchrun``. A comparison of such a name with 0 (``if rank == 0``,
``master_process = ddp_rank == 0``) becomes ``is_main_process`` (global rank) or
``is_local_main_process`` (local rank). A rank used as a device (``model.to(rank)``,
``f"cuda:{local_rank}"``) becomes the accelerator's device, which is that GPU.
"""

from __future__ import annotations

import libcst as cst

from accelify.transform.analysis import Binding, arguments
from accelify.transform.distributed.context import Rewrite
from accelify.transform.names import Names
from accelify.transform.neighbours import process_query
from accelify.transform.patterns import dotted_name, keyword_arg, placeholder
from accelify.transform.walk import nodes

ENVIRONMENT = {
    "RANK": "process_index",
    "LOCAL_RANK": "local_process_index",
    "WORLD_SIZE": "num_processes",
}
_QUERIES = {"get_rank": "process_index", "get_world_size": "num_processes"}
_MAIN = {"process_index": "is_main_process", "local_process_index": "is_local_main_process"}
# The option torch.distributed.launch passes each process (its spelling since torch 2.0, too).
_LAUNCH_OPTIONS = frozenset({"--local_rank", "--local-rank"})


def environment_variable(names: Names, expr: cst.BaseExpression) -> str | None:
    """``X`` for ``os.environ["X"]``, ``os.environ.get("X", ...)``, ``os.getenv("X", ...)``."""
    if isinstance(expr, cst.Subscript):
        if not names.refers_to(expr.value, ("os",), "environ") or len(expr.slice) != 1:
            return None
        index = expr.slice[0].slice
        key = index.value if isinstance(index, cst.Index) else None
    elif isinstance(expr, cst.Call) and expr.args:
        func = expr.func
        getter = (
            isinstance(func, cst.Attribute)
            and func.attr.value == "get"
            and names.refers_to(func.value, ("os",), "environ")
        )
        if not (getter or names.refers_to(func, ("os",), "getenv")):
            return None
        key = expr.args[0].value
    else:
        return None
    value = key.evaluated_value if isinstance(key, cst.SimpleString) else None
    return value if isinstance(value, str) else None


def source(names: Names, expr: cst.BaseExpression) -> str | None:
    """The accelerator attribute a rank read stands for, else None. An environment variable
    counts only read as a number: as a string (``== "0"``) it must stay one."""
    if isinstance(expr, cst.Call) and dotted_name(expr.func) == "int" and len(expr.args) == 1:
        variable = environment_variable(names, expr.args[0].value)
        return ENVIRONMENT.get(variable) if variable is not None else None
    if isinstance(expr, cst.Call) and not expr.args:
        last = names.last_part(expr.func)
        if last in _QUERIES and names.from_package(expr.func, "torch.distributed"):
            return _QUERIES[last]
    return None


def rank_sources(r: Rewrite) -> None:
    """Replace every rank read, and remember the names that hold one."""
    names = r.analysis.names
    for node in nodes(r.analysis.module, cst.Call):
        what = source(names, node)  # type: ignore[arg-type]
        if what is None or r.edits.is_removed(r.analysis.statement_of(node)):  # type: ignore[arg-type]
            continue
        r.edits.replace(node, placeholder(what))
        r.changed(node, f"{r.analysis.module.code_for_node(node)} -> the accelerator's {what}")
    for node in launch_option_reads(r):
        r.rank_reads[id(node)] = "local_process_index"
        r.edits.replace(node, placeholder("local_process_index"))
        r.changed(
            node,
            f"{r.analysis.module.code_for_node(node)} -> the accelerator's "
            "local_process_index (accel-run passes no --local_rank)",
        )
    grouped = _bindings(r)
    for _copies in range(3):  # ``local_rank = rank``, ``Trainer(gpu_id=rank)`` hold it too
        for key, bindings in grouped.items():
            kinds = {kind_of(r, b.value) for b in bindings if b.value is not None}
            if len(kinds) == 1 and None not in kinds:
                r.ranks[key] = kinds.pop()  # type: ignore[assignment]
        _parameters(r)


def launch_option_reads(r: Rewrite) -> list[cst.Attribute]:
    """``args.local_rank`` read (not assigned) in a script that declares ``--local_rank``."""
    a = r.analysis
    declared = any(
        a.names.last_part(call.func) == "add_argument"
        and any(
            isinstance(arg.value, cst.SimpleString) and arg.value.evaluated_value in _LAUNCH_OPTIONS
            for arg in call.args
        )
        for call, _scope in a.calls
    )
    if not declared:
        return []
    return [
        node
        for node in nodes(a.module, cst.Attribute)
        if node.attr.value == "local_rank"  # type: ignore[attr-defined]
        and isinstance(node.value, cst.Name)  # type: ignore[attr-defined]
        and not isinstance(a.parent(node), cst.AssignTarget | cst.AugAssign)
    ]


def _parameters(r: Rewrite) -> None:
    """A parameter every call of its function passes the same kind of rank value."""
    a = r.analysis
    passed: dict[tuple[int, str], set[str | None]] = {}
    for call, _scope in a.calls:
        callee = a.callee(call)
        if callee is None or any(arg.star for arg in call.args):
            continue
        for param, value in arguments(call, callee):
            passed.setdefault((id(callee.node), param), set()).add(kind_of(r, value))
    for key, kinds in passed.items():
        if len(kinds) == 1 and None not in kinds and key not in r.ranks:
            r.ranks[key] = kinds.pop()  # type: ignore[assignment]


def _bindings(r: Rewrite) -> dict[tuple[int, str], list[Binding]]:
    """Every binding by where its name lives, but those in branches the rewrite drops."""
    out: dict[tuple[int, str], list[Binding]] = {}
    for b in r.analysis.bindings:
        if any(r.analysis.contains(gone, b.node) for gone in r.dropped):
            continue
        out.setdefault((r.owner(b.scope, b.key), b.key), []).append(b)
    return out


def rank_uses(r: Rewrite) -> None:
    """Comparisons with 0 become the accelerator's main-process flags; ranks used as devices
    become its device."""
    for comparison in nodes(r.analysis.module, cst.Comparison):
        _guard(r, comparison)  # type: ignore[arg-type]
    for call in nodes(r.analysis.module, cst.Call):
        _device(r, call)  # type: ignore[arg-type]
    for string in nodes(r.analysis.module, cst.FormattedString):
        if _cuda_of_rank(r, string):  # type: ignore[arg-type]
            r.edits.replace(string, cst.SimpleString('"cuda"'))


def kind_of(r: Rewrite, expr: cst.BaseExpression) -> str | None:
    """What a rank read or a name holding one stands for."""
    return (
        r.rank_reads.get(id(expr))
        or source(r.analysis.names, expr)
        or _helper_query(r, expr)
        or r.rank_of(expr)
    )


def _helper_query(r: Rewrite, expr: cst.BaseExpression) -> str | None:
    """``utils.get_world_size()`` whose function, beside the file, answers torch.distributed's
    query (:func:`~accelify.transform.neighbours.process_query`). The call stays: it reads the
    process group the accelerator starts, so it equals the accelerator's answer once one exists,
    which is where the rewrite reads it (a sampler's ``num_replicas``)."""
    if not isinstance(expr, cst.Call) or expr.args:
        return None
    qualified = r.analysis.names.qualify(expr.func)
    if qualified is None or "." not in qualified:
        return None
    if qualified not in r.queries:
        r.queries[qualified] = process_query(r.path, qualified)
    query = r.queries[qualified]
    return _QUERIES[query] if query is not None else None


def _guard(r: Rewrite, comparison: cst.Comparison) -> None:
    if len(comparison.comparisons) != 1:
        return
    target = comparison.comparisons[0]
    if not isinstance(target.operator, cst.Equal | cst.NotEqual):
        return
    left, right = comparison.left, target.comparator
    if _zero(left):
        left, right = right, left
    flag = _MAIN.get(kind_of(r, left) or "") if _zero(right) else None
    if flag is None:
        return
    new: cst.BaseExpression = placeholder(flag)
    if isinstance(target.operator, cst.NotEqual):
        new = cst.UnaryOperation(cst.Not(), new)
    r.edits.replace(comparison, new.with_changes(lpar=comparison.lpar, rpar=comparison.rpar))
    r.changed(comparison, f"{r.analysis.module.code_for_node(comparison)} -> {flag}")


def _zero(expr: cst.BaseExpression) -> bool:
    return isinstance(expr, cst.Integer) and expr.value == "0"


def _device(r: Rewrite, call: cst.Call) -> None:
    """``x.to(rank)``/``x.cuda(rank)``, ``device=rank``, ``torch.device("cuda", rank)``."""
    func = call.func
    if isinstance(func, cst.Attribute) and func.attr.value in {"to", "cuda"} and call.args:
        first = call.args[0]
        if first.keyword is None and _rank_device(r, first.value):
            moved = cst.Attribute(func.value, cst.Name("to"))
            args = [first.with_changes(value=placeholder("device")), *call.args[1:]]
            r.edits.replace(call, lambda node: node.with_changes(func=moved, args=args))
            return
    if r.analysis.names.refers_to(func, ("torch",), "device") and len(call.args) == 2:
        kind, index = call.args
        if _rank_device(r, index.value) and isinstance(kind.value, cst.SimpleString):
            # The process's own device, the CPU under ``accel-run --cpu`` too (a bare "cuda"
            # would ask for a GPU there).
            r.edits.replace(call, placeholder("device"))
            return
    device = keyword_arg(call, "device")
    if device is not None and _rank_device(r, device.value):
        r.edits.replace(device.value, placeholder("device"))


def _rank_device(r: Rewrite, expr: cst.BaseExpression) -> bool:
    return kind_of(r, expr) in _MAIN


def _cuda_of_rank(r: Rewrite, string: cst.FormattedString) -> bool:
    """``f"cuda:{local_rank}"``: the device of this process."""
    parts = string.parts
    return (
        len(parts) == 2
        and isinstance(parts[0], cst.FormattedStringText)
        and parts[0].value == "cuda:"
        and isinstance(parts[1], cst.FormattedStringExpression)
        and _rank_device(r, parts[1].expression)
    )
