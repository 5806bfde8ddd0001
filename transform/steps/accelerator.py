"""Import the runtime and create ``accelerator = Accelerator(...)`` in the training setup.

It goes right before the first statement that picks the device or builds a training object, and
after whatever its arguments need (``args = parser.parse_args()`` when the accumulation steps
come from ``args``). Runs after the steps that fill in its arguments.
"""

from __future__ import annotations

import libcst as cst

from accelify.transform.analysis import Binding, mentions, names_in
from accelify.transform.patterns import Role
from accelify.transform.plan import Plan

_SOURCES = {
    "accelify": {"Accelerator": "accelify.runtime", "set_seed": "accelify.runtime"},
    "accelerate": {"Accelerator": "accelerate", "set_seed": "accelerate.utils"},
}


def accelerator(plan: Plan) -> None:
    setup = plan.setup
    if setup is None:
        return
    if not setup.exists:
        _create(plan)
        plan.imports.add("Accelerator")
    _import(plan)


def _create(plan: Plan) -> None:
    setup = plan.setup
    a = plan.analysis
    kwargs = dict(plan.accelerator_kwargs)
    options = plan.options
    if options.mixed_precision is not None:
        kwargs["mixed_precision"] = cst.SimpleString(f'"{options.mixed_precision}"')
    if options.gradient_accumulation_steps is not None:
        kwargs["gradient_accumulation_steps"] = cst.Integer(
            str(options.gradient_accumulation_steps)
        )
    args = ", ".join(f"{k}={a.module.code_for_node(v)}" for k, v in kwargs.items())
    statement = plan.statement(f"{setup.accelerator} = Accelerator({args})\n")  # type: ignore[union-attr]
    body = list(setup.scope.body)  # type: ignore[union-attr]
    anchors = [
        i
        for i, s in enumerate(body)
        if any(b.statement is s for b in _anchoring(plan)) or _is_prepare_site(plan, s)
    ]
    needed = {name.value for v in kwargs.values() for name in names_in(v)}
    after = [
        i
        for i, s in enumerate(body)
        if any(b.statement is s and b.key in needed for b in a.bindings)
    ]
    index = min(anchors) if anchors else len(body) - 1
    if after and max(after) >= index:
        index = max(after) + 1
    if index >= len(body):
        plan.edits.insert_after(body[-1], statement)
    else:
        _insert_paragraph(plan, body[index], statement)
    plan.changed(body[min(index, len(body) - 1)], f"created {setup.accelerator}")  # type: ignore[union-attr]


def _insert_paragraph(plan: Plan, anchor: cst.BaseStatement, statement: cst.BaseStatement) -> None:
    """Put ``statement`` above ``anchor`` as a paragraph of its own.

    It takes the blank lines above ``anchor``; comments stay with the code they describe, and
    one blank line separates the two.
    """
    lines = list(anchor.leading_lines)
    blank = [
        ln for ln in lines[: next((i for i, ln in enumerate(lines) if ln.comment), len(lines))]
    ]
    rest = lines[len(blank) :]
    plan.edits.insert_before(anchor, statement.with_changes(leading_lines=blank), first=True)
    plan.edits.replace(
        anchor, lambda node: node.with_changes(leading_lines=[cst.EmptyLine(indent=False), *rest])
    )


def _anchoring(plan: Plan) -> list[Binding]:
    """Bindings the accelerator must precede: the device and the prepared objects."""
    a = plan.analysis
    setup = plan.setup
    return [
        b
        for b in a.bindings
        if b.scope is setup.scope  # type: ignore[union-attr]
        and a.role(b.scope, b.key)
        in (Role.DEVICE, Role.MODEL, Role.OPTIMIZER, Role.DATALOADER, Role.SCHEDULER, Role.SCALER)
    ]


def _is_prepare_site(plan: Plan, statement: cst.BaseStatement) -> bool:
    """For snippets that build nothing: the first statement using the training objects."""
    setup = plan.setup
    free = {b.key for b in setup.prepared if b.node is setup.scope.node}  # type: ignore[union-attr]
    return bool(free) and mentions(statement, free)


def _import(plan: Plan) -> None:
    """``from <runtime> import ...`` after the module's leading imports, unless already there."""
    a = plan.analysis
    module = a.module
    sources = _SOURCES[plan.options.target]
    present = _imported_names(module)
    by_module: dict[str, list[str]] = {}
    for name in sorted(plan.imports - present):
        by_module.setdefault(sources[name], []).append(name)
    if not by_module:
        return
    statements = [
        plan.statement(f"from {mod} import {', '.join(names)}\n")
        for mod, names in by_module.items()
    ]
    imports = [s for s in _leading(module) if _is_import(s)]
    if imports:
        where = imports[-1]
        plan.edits.insert_after(where, *statements)
    else:
        where = next((s for s in module.body if not _is_docstring(s)), None)
        if where is None:
            return
        plan.edits.insert_before(where, *statements, first=True)
    plan.changed(where, f"imported {', '.join(sorted(plan.imports - present))} from the runtime")


def _leading(module: cst.Module) -> list[cst.BaseStatement]:
    """The docstring and imports at the top, up to the first other statement."""
    out = []
    for statement in module.body:
        if not (_is_import(statement) or _is_docstring(statement)):
            break
        out.append(statement)
    return out


def _is_import(statement: cst.BaseStatement) -> bool:
    return isinstance(statement, cst.SimpleStatementLine) and all(
        isinstance(s, cst.Import | cst.ImportFrom) for s in statement.body
    )


def _is_docstring(statement: cst.BaseStatement) -> bool:
    return (
        isinstance(statement, cst.SimpleStatementLine)
        and isinstance(statement.body[0], cst.Expr)
        and isinstance(statement.body[0].value, cst.SimpleString | cst.ConcatenatedString)
    )


def _imported_names(module: cst.Module) -> set[str]:
    names = set()
    for statement in module.body:
        if not isinstance(statement, cst.SimpleStatementLine):
            continue
        for small in statement.body:
            if isinstance(small, cst.ImportFrom) and not isinstance(small.names, cst.ImportStar):
                names.update(
                    (alias.asname.name.value if alias.asname else alias.name.value)  # type: ignore[union-attr]
                    for alias in small.names
                    if isinstance(alias.name, cst.Name)
                )
    return names
