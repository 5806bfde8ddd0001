"""The process group is the launcher's and the accelerator's now.

``init_process_group(...)``, ``torch.cuda.set_device(...)`` and the ``MASTER_ADDR``/
``MASTER_PORT`` the script sets for itself go (``accel-run`` sets up the group and each process's
GPU); ``destroy_process_group()`` becomes ``accelerator.end_training()``. A function left with
nothing to do (``ddp_setup()``) goes with every call of it.
"""

from __future__ import annotations

import libcst as cst

from accelify.transform.distributed.context import Rewrite
from accelify.transform.distributed.ranks import environment_variable
from accelify.transform.patterns import dotted_name, placeholder
from accelify.transform.refusals import DDP_LAUNCH
from accelify.transform.walk import nodes

_LAUNCHER_VARIABLES = frozenset({"MASTER_ADDR", "MASTER_PORT"})


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
        elif last == "set_device" and names.refers_to(call.func, ("torch",), "set_device"):
            r.remove(r.bare_statement(call, DDP_LAUNCH))
            r.changed(
                call, "torch.cuda.set_device removed: the accelerator picks each process's GPU"
            )
        elif _sets_launcher_variable(r, call):
            r.remove(r.bare_statement(call, DDP_LAUNCH))
    for statement in _launcher_assignments(r):
        r.remove(statement)
        r.changed(statement, "the launcher's address and port are accel-run's to set")
    _drop_emptied_functions(r)


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
