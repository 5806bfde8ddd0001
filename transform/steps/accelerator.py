"""Import the runtime and create ``accelerator = Accelerator(...)`` in the training setup.

:func:`place` (run once the amp and accumulate steps have filled in its arguments) picks the spot:
before the device is chosen and the first training object is built, after whatever its
arguments read (``args = parser.parse_args()`` when the accumulation steps come from ``args``),
in the block that holds every later use. :func:`accelerator` (run last) writes it there, with
the import.
"""

from __future__ import annotations

from collections.abc import Iterator

import libcst as cst

from accelify.transform.analysis import Analysis, Binding, Scope, key_of, mentions, names_in
from accelify.transform.flow import Block, Point
from accelify.transform.patterns import Role, dotted_name, is_device, keyword_arg, method_call
from accelify.transform.plan import Plan
from accelify.transform.refusals import BUILD_ORDER, BUILT_IN_LOOP, NAME_TAKEN, Refusal
from accelify.transform.setup import Refused
from accelify.transform.steps.moves import device_move
from accelify.transform.steps.prepare import LINE_LENGTH, insert_paragraph
from accelify.transform.steps.prepare import depth as _depth
from accelify.transform.steps.writes import first_statement, side_effects
from accelify.transform.walk import nodes

_SOURCES = {
    "accelify": dict.fromkeys(
        ("Accelerator", "set_seed", "DistributedDataParallelKwargs", "PartialState"),
        "accelify.runtime",
    ),
    "accelerate": {
        "Accelerator": "accelerate",
        "set_seed": "accelerate.utils",
        "DistributedDataParallelKwargs": "accelerate",
        "PartialState": "accelerate",
    },
}


def place(plan: Plan) -> None:
    """Fix where the accelerator is created; later steps may only use it after that point."""
    setup = plan.setup
    if setup is None:
        return
    setup.create_at = _creation_point(plan)
    if plan.cpu_choice is None:
        return
    # The script's choice of the CPU is carried over only where what it reads is set by then:
    # it may not move the accelerator later (after a download it must guard, say).
    chosen_at, flag = plan.cpu_choice
    code = plan.analysis.module.code_for_node(flag)
    point = setup.create_at
    attributes = list(nodes(flag, cst.Attribute))
    named = {id(node.attr) for node in attributes}  # ``device`` of ``args.device`` is no name
    read = {name.value for name in names_in(flag) if id(name) not in named}
    read |= {key for node in attributes if (key := dotted_name(node))}  # ``args.cuda`` set apart
    if all(after <= point.index for _b, after in _set_in(plan, point.block, read)):
        plan.accelerator_kwargs["cpu"] = flag
        plan.changed(chosen_at, f"the script's choice of the CPU carries over: cpu={code}")
        return
    plan.needs_human(
        chosen_at,
        f"the accelerator now picks the device: Accelerator(cpu={code}) would keep this choice "
        "of the CPU, but it is decided after the accelerator must exist",
    )


def accelerator(plan: Plan) -> None:
    if plan.setup is None:
        return
    if not picks_device(plan.analysis):
        plan.changed(
            plan.setup.create_at.next or plan.setup.create_at.previous,  # type: ignore[union-attr,arg-type]
            "the script never puts anything on a device, so it stays on the CPU (cpu=True): "
            "tensors it creates would not follow a model on a GPU",
        )
    _create(plan)
    plan.imports.add("Accelerator")
    _import(plan)


def _kwargs(plan: Plan) -> dict[str, cst.BaseExpression]:
    kwargs = dict(plan.accelerator_kwargs)
    options = plan.options
    if options.mixed_precision is not None:
        kwargs["mixed_precision"] = cst.SimpleString(f'"{options.mixed_precision}"')
    if options.gradient_accumulation_steps is not None:
        kwargs["gradient_accumulation_steps"] = cst.Integer(
            str(options.gradient_accumulation_steps)
        )
    if not picks_device(plan.analysis):
        kwargs["cpu"] = cst.Name("True")
    return kwargs


def _creation_point(plan: Plan) -> Point:
    """Before the device is chosen and the first object built, after what its arguments read."""
    setup = plan.setup
    assert setup is not None
    a = plan.analysis
    t = setup.timeline
    scope = setup.scope
    taken = a.names.imports.get("Accelerator") or ("Accelerator" in a.names.defined)
    if taken:
        raise Refused(a.module, NAME_TAKEN, "the name Accelerator is already taken in this file")
    if setup.prepare_at is None:  # a snippet: before its first use of the training objects
        body = t.body()
        keys = set(setup.keys)
        first = next(
            (i for i, s in enumerate(body.body) if _chooses_device(plan, s) or mentions(s, keys)),
            0,
        )
        return Point(body, first)
    devices = [
        b.node for b in a.bindings if b.scope is scope and a.role(scope, b.key) is Role.DEVICE
    ]
    prepare = setup.prepare_at
    block = next(
        (
            b
            for b in [prepare.block, *t.enclosing_blocks(prepare.block)]
            if all(t.top_in(b, d) is not None for d in devices)
        ),
        t.body(),
    )
    limit = (
        prepare.index if block is prepare.block else t.index(block, t.top_in(block, prepare.block))  # type: ignore[arg-type]
    )
    musts = [t.index(block, t.top_in(block, d)) for d in devices]  # type: ignore[arg-type]
    builds = [
        t.index(block, top)
        for b in a.bindings
        if b.scope is scope and b.key in setup.keys and (top := t.top_in(block, b.node))
    ]
    # Disk effects before the builds (a download, a folder made) go to the main process: the
    # accelerator should exist by then.
    early = [
        n
        for _c, statement, how in side_effects(plan)
        if how != "shares its line"  # reported, not guarded: it needs no accelerator
        for n in t.anchors(first_statement(plan, statement, how)) or ()
    ]
    builds += [t.index(block, top) for n in early if (top := t.top_in(block, n)) is not None]
    index = min([limit, *musts, *builds])
    needed = {name.value for v in _kwargs(plan).values() for name in names_in(v)}
    for b, after in _set_in(plan, block, needed):
        if after > min([limit, *musts]):
            raise Refused(
                b.node,
                BUILD_ORDER,
                f"Accelerator(...) reads {b.key}, which is set only after the training objects "
                "need the accelerator",
            )
        index = max(index, after)
    point = Point(block, index)
    if t.in_loop(point):
        raise Refused(block, BUILT_IN_LOOP, "the accelerator would be created inside a loop")
    return point


def _set_in(plan: Plan, block: Block, names: set[str]) -> Iterator[tuple[Binding, int]]:
    """(binding, the index just after it) for each assignment of ``names`` in the setup scope
    that sits in ``block``: an accelerator created there reads them only after that index."""
    setup = plan.setup
    assert setup is not None
    t = setup.timeline
    for b in plan.analysis.bindings:
        if b.scope is not setup.scope or b.key not in names:
            continue
        top = t.top_in(block, b.node)
        if top is not None:  # else set before the block, or after it (the last one counts)
            yield b, t.index(block, top) + 1


def picks_device(a: Analysis) -> bool:
    """Whether the script puts anything on a device: ``.cuda()``, ``.to(<device>)``, ``device=``
    given a device. A device chosen and never used leaves everything on the CPU."""
    for call, scope in a.calls:
        if method_call(call, "cuda") is not None or device_move(call, a) is not None:
            return True
        device = keyword_arg(call, "device")
        if device is not None and (
            is_device(device.value, names=a.names) or _holds_device(a, scope, device)
        ):
            return True
    return False


def process_state(
    plan: Plan, node: cst.CSTNode, refusal: Refusal, subject: str
) -> cst.BaseExpression:
    """The accelerator, or before it exists the process state, made with the accelerator's own
    ``cpu=`` choice: HF's shared state is settled by whichever is made first, and a
    ``PartialState()`` made first on a CPU host would settle on one process (every process then
    trains alone on all the data). Where that choice is made later, HF cannot have it, and
    ``subject`` (what ``node`` does) is refused with ``refusal``."""
    accelerator = plan.accelerator(node, optional=True)
    if accelerator is not None:
        return accelerator
    plan.imports.add("PartialState")
    cpu = plan.accelerator_kwargs.get("cpu")
    if cpu is None and not picks_device(plan.analysis):
        cpu = cst.Name("True")
    if cpu is None:
        return cst.parse_expression("PartialState()")
    if not (isinstance(cpu, cst.Name) and cpu.value in {"True", "False"}):
        if plan.options.target == "accelerate":
            raise Refused(
                node,
                refusal,
                f"{subject} before the accelerator exists, and its cpu= choice "
                f"({plan.analysis.module.code_for_node(cpu)}) is made later: HF's PartialState "
                "made here would settle the process state without it",
            )
        return cst.parse_expression("PartialState()")
    return cst.parse_expression(f"PartialState(cpu={cpu.value})")


def _holds_device(a: Analysis, scope: Scope, arg: cst.Arg) -> bool:
    key = key_of(arg.value)
    return key is not None and a.role(scope, key) is Role.DEVICE


def _chooses_device(plan: Plan, statement: cst.BaseStatement) -> bool:
    a = plan.analysis
    scope = plan.setup.scope  # type: ignore[union-attr]
    return any(
        b.statement is statement and b.scope is scope and a.role(scope, b.key) is Role.DEVICE
        for b in a.bindings
    )


def _create(plan: Plan) -> None:
    setup = plan.setup
    assert setup is not None and setup.create_at is not None
    a = plan.analysis
    kwargs = _kwargs(plan)
    args = ", ".join(f"{k}={a.module.code_for_node(v)}" for k, v in kwargs.items())
    code = f"{setup.accelerator} = Accelerator({args})"
    if len(code) + 4 * _depth(plan, setup.create_at.block) > LINE_LENGTH:  # wrap like black
        lines = "".join(f"    {k}={a.module.code_for_node(v)},\n" for k, v in kwargs.items())
        code = f"{setup.accelerator} = Accelerator(\n{lines})"
    statement = plan.statement(code + "\n")
    point = setup.create_at
    anchor = point.next
    if anchor is not None:
        insert_paragraph(plan, anchor, statement)
    else:
        plan.edits.insert_after(point.previous, statement)  # type: ignore[arg-type]
    plan.changed(  # type: ignore[arg-type]
        anchor or point.previous, f"created {setup.accelerator}", shows=code.split("(")[0] + "("
    )


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
        where = next((s for s in module.body if not is_docstring(s)), None)
        if where is None:
            return
        plan.edits.insert_before(where, *statements, first=True)
    names = ", ".join(sorted(plan.imports - present))
    plan.changed(
        where, f"imported {names} from the runtime", shows=f"from {next(iter(by_module))} "
    )


def _leading(module: cst.Module) -> list[cst.BaseStatement]:
    """The docstring and imports at the top, up to the first other statement."""
    out = []
    for statement in module.body:
        if not (_is_import(statement) or is_docstring(statement)):
            break
        out.append(statement)
    return out


def _is_import(statement: cst.BaseStatement) -> bool:
    return isinstance(statement, cst.SimpleStatementLine) and all(
        isinstance(s, cst.Import | cst.ImportFrom) for s in statement.body
    )


def is_docstring(statement: cst.BaseStatement) -> bool:
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
