"""The process group is the launcher's and the accelerator's now.

``init_process_group(...)``, ``torch.cuda.set_device(...)`` and the ``MASTER_ADDR``/
``MASTER_PORT`` the script sets for itself go (``accel-run`` sets up the group and each process's
GPU); ``destroy_process_group()`` becomes ``accelerator.end_training()``. A backend the script
looks up only to start the group with (``backend = dist.get_default_backend_for_device(device)``)
goes too: accel-run picks the device's backend the same way. A function left with nothing to do
(``ddp_setup()``) goes with every call of it.
"""

from __future__ import annotations

from dataclasses import replace

import libcst as cst

from accelify.transform.analysis import Analysis
from accelify.transform.distributed.context import Rewrite
from accelify.transform.distributed.ranks import environment_variable
from accelify.transform.patterns import dotted_name, placeholder
from accelify.transform.refusals import DDP_LAUNCH
from accelify.transform.walk import nodes

_LAUNCHER_VARIABLES = frozenset({"MASTER_ADDR", "MASTER_PORT"})
_SET_DEVICE = frozenset({"set_device", "set_device_index"})  # torch.cuda's, torch.accelerator's
_BACKEND_QUERIES = frozenset({"get_default_backend_for_device"})


def drop_process_group(r: Rewrite) -> None:
    a = r.analysis
    names = a.names
    for call, _scope in a.calls:
        last = names.last_part(call.func)
        if last == "init_process_group" and names.from_package(call.func, "torch.distributed"):
            r.remove(r.bare_statement(call, DDP_LAUNCH))
            r.changed(call, "init_process_group removed: accel-run and the accelerator set it up")
        elif last == "destroy_process_group" and names.from_package(call.func, "torch.distributed"):
            r.edits.replace(call.func, placeholder("end_training"))
            r.changed(call, "destroy_process_group() -> accelerator.end_training()")
        elif last in _SET_DEVICE and names.refers_to(call.func, ("torch",), last):
            r.remove(r.bare_statement(call, DDP_LAUNCH))
            r.changed(
                call,
                f"{dotted_name(call.func)} removed: the accelerator picks each process's GPU",
            )
        elif _sets_launcher_variable(r, call):
            r.remove(r.bare_statement(call, DDP_LAUNCH))
    for statement in _launcher_assignments(r):
        r.remove(statement)
        r.changed(statement, "the launcher's address and port are accel-run's to set")
    _drop_backend_queries(r)
    _drop_emptied_functions(r)


def _drop_backend_queries(r: Rewrite) -> None:
    """``backend = dist.get_default_backend_for_device(d)`` read only by the removed
    ``init_process_group``: the line goes. Any other use of the answer is refused."""
    a = r.analysis
    for call, scope in a.calls:
        last = a.names.last_part(call.func)
        if last not in _BACKEND_QUERIES or not a.names.from_package(call.func, "torch.distributed"):
            continue
        if _inside_removed(r, call):
            continue  # ``init_process_group(backend=dist.get_default_backend_for_device(d))``
        assign = a.parent(call)
        line = a.parent(assign) if isinstance(assign, cst.Assign) else None
        target = assign.targets[0].target if isinstance(assign, cst.Assign) else None
        reads = _reads(r, scope.node, target.value) if isinstance(target, cst.Name) else None
        if (
            not isinstance(line, cst.SimpleStatementLine)
            or len(line.body) != 1
            or len(assign.targets) != 1  # type: ignore[union-attr]
            or reads is None
            or not all(_inside_removed(r, n) for n in reads)
        ):
            raise r.refuse(
                call,
                DDP_LAUNCH,
                f"{dotted_name(call.func)}(...) is used other than to start the process group, "
                "which accel-run starts",
            )
        r.remove(line)
        r.changed(call, "the backend lookup removed: accel-run picks the device's backend")
        _drop_dead_inputs(r, scope.node)


# What the values a backend lookup was computed from may call: reads, nothing else.
_PURE = frozenset(
    {"int", "str", "torch.device", "torch.accelerator.current_accelerator", "os.environ.get",
     "os.getenv", "torch.cuda.is_available", "torch.accelerator.is_available"}
)  # fmt: skip


def _drop_dead_inputs(r: Rewrite, function: cst.CSTNode) -> None:
    """``acc = torch.accelerator.current_accelerator()``, ``device = torch.device(...)``: a
    name bound once in ``function`` to a value that only reads, and read only by removed code,
    goes, until none is left."""
    a = r.analysis
    body = function.body.body if isinstance(function, cst.FunctionDef) else ()  # type: ignore[union-attr]
    changed = True
    while changed:
        changed = False
        for line in body:
            assign = line.body[0] if isinstance(line, cst.SimpleStatementLine) else None
            if (
                r.edits.is_removed(line)
                or not isinstance(assign, cst.Assign)
                or len(line.body) != 1  # type: ignore[union-attr]
                or len(assign.targets) != 1
                or not isinstance(target := assign.targets[0].target, cst.Name)
                or not _only_reads(a, assign.value)
                or sum(b.key == target.value and b.scope.node is function for b in a.bindings) != 1
                or not all(_inside_removed(r, n) for n in _reads(r, function, target.value))
            ):
                continue
            r.remove(line)
            gone = f"{target.value} removed: it only fed the process group's set-up"
            for i, note in enumerate(r.notes):  # in place: the steps' notes are counted by index
                if note.line == a.line(line):
                    r.notes[i] = replace(note, message=gone)
            changed = True


def _only_reads(a: Analysis, value: cst.BaseExpression) -> bool:
    return all(
        (a.names.qualify(call.func) or dotted_name(call.func)) in _PURE
        for call in nodes(value, cst.Call)
    )


def _reads(r: Rewrite, function: cst.CSTNode, name: str) -> list[cst.Name]:
    """The loads of ``name`` in ``function``'s own scope."""
    a = r.analysis
    return [
        n
        for n in nodes(function, cst.Name)
        if n.value == name  # type: ignore[attr-defined]
        and a.scope_of.get(id(n)) is a.scope_of.get(id(function.body))  # type: ignore[attr-defined]
        and not isinstance(parent := a.parent(n), cst.AssignTarget)
        and not (isinstance(parent, cst.Attribute) and parent.attr is n)
    ]


def _inside_removed(r: Rewrite, node: cst.CSTNode) -> bool:
    current: cst.CSTNode | None = node
    while current is not None:
        if r.edits.is_removed(current):
            return True
        current = r.analysis.parent(current)
    return False


def _sets_launcher_variable(r: Rewrite, call: cst.Call) -> bool:
    """``os.environ.setdefault("MASTER_PORT", ...)``."""
    func = call.func
    return (
        isinstance(func, cst.Attribute)
        and func.attr.value == "setdefault"
        and r.analysis.names.refers_to(func.value, ("os",), "environ")
        and bool(call.args)
        and isinstance(call.args[0].value, cst.SimpleString)
        and call.args[0].value.evaluated_value in _LAUNCHER_VARIABLES
    )


def _launcher_assignments(r: Rewrite) -> list[cst.BaseStatement]:
    """``os.environ["MASTER_ADDR"] = "localhost"`` statement lines."""
    out = []
    for node in nodes(r.analysis.module, cst.Assign):
        target = node.targets[0].target  # type: ignore[attr-defined]
        line = r.analysis.parent(node)
        if (
            len(node.targets) == 1  # type: ignore[attr-defined]
            and environment_variable(r.analysis.names, target) in _LAUNCHER_VARIABLES
            and isinstance(line, cst.SimpleStatementLine)
            and len(line.body) == 1
        ):
            out.append(line)
    return out


def _drop_emptied_functions(r: Rewrite) -> None:
    """A module-level function whose every statement went is removed with its calls."""
    a = r.analysis
    for name, scope in a.functions.items():
        function = scope.node
        if scope.cls is not None or not isinstance(function, cst.FunctionDef):
            continue
        body = list(function.body.body)  # type: ignore[union-attr]
        if function.get_docstring(clean=False) is not None:
            body = body[1:]
        if not body or not all(r.edits.is_removed(s) for s in body):
            continue
        calls = [c for c, _s in a.calls if dotted_name(c.func) == name]
        for call in calls:
            r.remove(r.bare_statement(call, DDP_LAUNCH))
        if any(n.value == name for n in _name_reads(r, name)):  # passed around, not only called
            raise r.refuse(
                function,
                DDP_LAUNCH,
                f"{name}() only set up the process group, but is used as a value",
            )
        r.remove(function)
        r.changed(function, f"{name}() only set up the process group: removed with its calls")


def _name_reads(r: Rewrite, name: str) -> list[cst.Name]:
    calls = {id(c.func) for c, _s in r.analysis.calls}
    return [
        n
        for n in nodes(r.analysis.module, cst.Name)
        if n.value == name  # type: ignore[attr-defined]
        and id(n) not in calls
        and not isinstance(r.analysis.parent(n), cst.FunctionDef)
    ]
