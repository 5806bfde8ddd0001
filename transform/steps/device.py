"""``device = "cuda"`` (or ``torch.device(...)``) becomes ``device = accelerator.device``.

The name stays, so every other use of ``device`` keeps working, and it keeps its type: a device
chosen as a string that the script also reads as one (``"cuda" in device``,
``autocast(device_type=device)``) becomes ``accelerator.device.type``, a string too. There is one
device now: later choices of the same name go, and an ``if``/``elif``/``else`` whose every branch
only picks a device collapses into the one assignment. A branch that does more keeps its other
statements and is followed by the accelerator's choice. A name derived from the device
(``device_type = "cuda" if "cuda" in device else "cpu"``) is left to follow it.

A script that sets ``CUDA_VISIBLE_DEVICES`` itself keeps the line, with a note: every launched
process would run it and see only the GPUs it lists, while the launcher gives process *i* the
GPU *i*; the choice belongs on the launch (``accel-run --gpu-ids``).
"""

from __future__ import annotations

import libcst as cst

from accelify.transform.analysis import Analysis, Binding, key_of, mentions, names_in
from accelify.transform.patterns import Role, is_device, pins_visible_devices, runs_as_script
from accelify.transform.plan import Plan
from accelify.transform.refusals import ACCELERATOR_UNREACHABLE, BUILT_IN_LOOP, HAND_PICKED_DEVICE
from accelify.transform.setup import Refused
from accelify.transform.steps.accelerator import process_state
from accelify.transform.walk import nodes

# Uses that need a string: comparisons, string methods, concatenation, autocast's device_type.
_STRING_METHODS = frozenset({"startswith", "endswith", "split", "replace", "lower", "upper"})


def device(plan: Plan) -> None:
    setup = plan.setup
    if setup is None:
        return
    a = plan.analysis
    devices = {
        b.key
        for b in a.bindings
        if a.role(b.scope, b.key) is Role.DEVICE and isinstance(b.node, cst.Assign | cst.AnnAssign)
    }
    choices: dict[tuple[int, str], list[Binding]] = {}
    for b in a.bindings:
        if not isinstance(b.node, cst.Assign) or a.role(b.scope, b.key) is not Role.DEVICE:
            continue
        if b.value is None:
            continue  # unpacked from a call's result: it follows the choice made there
        # A GPU's number handed in as a parameter (a Trainer's ``self.gpu = gpu``) is no choice
        # the conversion rewrites, so nothing to follow: it becomes the accelerator's device.
        ordinals = {p for p in b.scope.params if a.holds_ordinal(b.scope, p)}
        if mentions(b.value, devices - {b.key} - ordinals):
            continue  # derived from another device: it follows that one
        if b.scope not in plan.training:
            _read_global(plan, b)
            continue
        choices.setdefault((a.owner(b.scope, b.key), b.key), []).append(b)
    for bindings in choices.values():
        _one_device(plan, bindings)
    for statement in nodes(a.module, (cst.Assign, cst.Expr)):
        if pins_visible_devices(statement):
            plan.needs_human(
                statement,
                "sets CUDA_VISIBLE_DEVICES in every process: each sees only the GPUs listed, so "
                "on more processes than that the others find no GPU of their own; choose the "
                "GPUs on the launch (accel-run --gpu-ids ...)",
            )


def _read_global(plan: Plan, binding: Binding) -> None:
    """A module-level device read by the training: the accelerator, created in a function,
    cannot reach back to rewrite it. When the setup function is its only reader, and reads it
    only after the accelerator exists, a local ``device = accelerator.device`` shadows it there.
    When other functions read it, it becomes the process state's device (``PartialState()``,
    which the accelerator made later shares), provided it is the module's one choice of that
    name; anything else would keep the script's own choice of device, and is refused."""
    a = plan.analysis
    setup = plan.setup
    if not binding.scope.is_module or setup is None or setup.create_at is None:
        return
    readers = {}
    for scope in plan.training:
        if scope.is_module or not a.reads_global(scope, binding.key):
            continue
        names = [
            n
            for n in names_in(scope.node)
            if n.value == binding.key
            and not (isinstance(a.parent(n), cst.Attribute) and a.parent(n).attr is n)  # self.gpu
        ]
        if names:
            readers[scope] = names
    if not readers:
        return
    # A local ``device`` makes the name local to the whole function, so the accelerator's own
    # arguments may not read the module's (``cpu=not ("cuda" in str(device))``).
    local = (
        set(readers) == {setup.scope}
        and all(setup.timeline.after(setup.create_at, n) for n in readers[setup.scope])
        and not any(mentions(v, {binding.key}) for v in plan.accelerator_kwargs.values())
    )
    if not local:
        _from_process_state(plan, binding, sorted(s.name + "()" for s in readers))
        return
    if binding.key in plan.shadowed:
        return
    plan.shadowed.add(binding.key)
    accelerator = plan.accelerator(readers[setup.scope][0])
    value: cst.BaseExpression = cst.Attribute(accelerator, cst.Name("device"))  # type: ignore[arg-type]
    if _string_device(plan, [binding]):
        value = cst.Attribute(value, cst.Name("type"))
    code = f"{binding.key} = {a.module.code_for_node(value)}"
    point = setup.create_at
    statement = plan.statement(code + "\n")
    if point.next is not None:
        plan.edits.insert_before(point.next, statement)
    else:
        plan.edits.insert_after(point.previous, statement)  # type: ignore[arg-type]
    plan.changed(point.next or point.previous, f"{code} in {setup.scope.name}()")  # type: ignore[arg-type]


def _from_process_state(plan: Plan, binding: Binding, readers: list[str]) -> None:
    """``DEVICE = PartialState().device`` in place of the module's one plain choice: made at
    import, before the setup function creates the accelerator, which then shares that state.
    The accelerator's ``cpu=`` must be known by then (a constant), as HF settles the state at
    its first making."""
    a = plan.analysis
    read_by = ", ".join(readers)
    where = f"{binding.key} is chosen at module level and read by {read_by}"
    statement = a.statement_of(binding.node)
    declared = {n.name.value for g in nodes(a.module, cst.Global) for n in g.names}  # type: ignore[attr-defined]
    alone = (
        _top_level(a, statement)
        and binding.key not in declared
        and not any(
            other is not binding and other.key == binding.key and other.scope is a.scopes[0]
            for other in a.bindings
        )
    )
    if not alone or not isinstance(binding.node, cst.Assign) or len(binding.node.targets) != 1:
        raise Refused(
            binding.node,
            ACCELERATOR_UNREACHABLE,
            f"{binding.key} is chosen at module level more than once, or inside another "
            f"statement, and read by {read_by}: one process state cannot stand for every "
            "choice; choose it once in a plain statement, or in "
            f"{plan.setup.scope.name}(), where the accelerator is created",  # type: ignore[union-attr]
        )
    cpu = plan.accelerator_kwargs.get("cpu")
    if cpu is not None and not (isinstance(cpu, cst.Name) and cpu.value in {"True", "False"}):
        raise Refused(
            binding.node,
            ACCELERATOR_UNREACHABLE,
            f"{where}, before the accelerator's cpu= choice "
            f"({a.module.code_for_node(cpu)}) is made: the process state made there would "
            "settle the device without it",
        )
    state = process_state(plan, binding.node, ACCELERATOR_UNREACHABLE, where)
    value: cst.BaseExpression = cst.Attribute(state, cst.Name("device"))
    if _string_device(plan, [binding]):
        value = cst.Attribute(value, cst.Name("type"))
    plan.edits.replace(binding.value, value)  # type: ignore[arg-type]
    code = a.module.code_for_node(value)
    plan.changed(
        binding.node,
        f"{binding.key} = {code}: the process state, made here, gives {read_by} "
        "this process's device before the accelerator exists, and the accelerator shares it",
    )


def _top_level(a: Analysis, statement: cst.CSTNode) -> bool:
    """A statement of the module's body, or of its ``if __name__ == "__main__":`` block (which
    runs before anything there calls the functions that read the device)."""
    block = a.parent(statement)
    if isinstance(block, cst.Module):
        return True
    branch = a.parent(block) if isinstance(block, cst.IndentedBlock) else None
    return runs_as_script(branch) and isinstance(a.parent(branch), cst.Module)  # type: ignore[arg-type]


def _one_device(plan: Plan, bindings: list[Binding]) -> None:
    a = plan.analysis
    first, key = bindings[0], bindings[0].key
    accelerator = plan.accelerator(first.node)
    value: cst.BaseExpression = cst.Attribute(accelerator, cst.Name("device"))  # type: ignore[arg-type]
    if _string_device(plan, bindings):
        value = cst.Attribute(value, cst.Name("type"))
    code = a.module.code_for_node(value)
    holder = _holder(plan, first)
    chain = device_chain(a, first)  # also outside the accelerator's block (a factory's)
    if chain is not None:
        assign = plan.statement(f"{key} = {code}\n")
        plan.edits.replace(
            chain, lambda node: assign.with_changes(leading_lines=node.leading_lines)
        )
    elif holder is not None:  # chosen in a branch that does more: follow it
        plan.accelerator(holder)
        plan.edits.insert_after(holder, plan.statement(f"{key} = {code}\n"))
        plan.changed(first.node, f"{key} = {code} after the branch that chose it")
        return
    else:
        plan.edits.replace(first.value, value)  # type: ignore[arg-type]
    plan.changed(first.node, f"{key} = {code}")
    for later in bindings[1:]:
        if chain is not None and a.contains(chain, later.node):
            continue
        statement = a.statement_of(later.node)
        if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
            raise Refused(
                later.node,
                HAND_PICKED_DEVICE,
                f"{key} is chosen again here, among other statements",
            )
        plan.remove(statement)
        plan.changed(later.node, f"removed a second choice of {key}")


def _holder(plan: Plan, binding: Binding) -> cst.BaseStatement | None:
    """The compound statement of the accelerator's block that chooses the device (an ``if`` with
    its ``elif``s, a ``try``, a ``with``), or None when the choice is a plain statement there."""
    setup = plan.setup
    point = setup.create_at  # type: ignore[union-attr]
    if point is None:
        return None
    top = setup.timeline.top_in(point.block, binding.node)  # type: ignore[union-attr]
    if top is None or isinstance(top, cst.SimpleStatementLine):
        return None
    if isinstance(top, cst.For | cst.While):
        raise Refused(binding.node, BUILT_IN_LOOP, f"{binding.key} is chosen in a loop")
    return top


def _string_device(plan: Plan, bindings: list[Binding]) -> bool:
    """A device chosen as a string and read as one somewhere."""
    if not any(_is_string(b.value) for b in bindings if b.value is not None):
        return False
    key = bindings[0].key
    a = plan.analysis
    for scope in plan.training:
        for name in names_in(scope.node):
            if name.value == key and _string_use(a, name):
                return True
    return False


def _is_string(value: cst.BaseExpression) -> bool:
    if isinstance(value, cst.IfExp):
        return _is_string(value.body) or _is_string(value.orelse)
    return isinstance(value, cst.SimpleString | cst.FormattedString) or (
        isinstance(value, cst.Attribute) and value.attr.value == "type"
    )


def _string_use(a: Analysis, name: cst.Name) -> bool:
    parent = a.parent(name)
    if isinstance(parent, cst.Comparison | cst.ComparisonTarget | cst.BinaryOperation):
        return True
    if isinstance(parent, cst.Attribute) and parent.value is name:
        return parent.attr.value in _STRING_METHODS
    if isinstance(parent, cst.Arg):
        call = a.parent(parent)
        if parent.keyword is not None:
            return parent.keyword.value == "device_type"
        return isinstance(call, cst.Call) and "autocast" in (a.module.code_for_node(call.func))
    return False


def device_chain(a: Analysis, binding: Binding) -> cst.If | None:
    """The ``if``/``elif``/``else`` right around ``binding`` when each branch only sets it to a
    device."""
    top: cst.CSTNode | None = a.enclosing(binding.node, cst.If)
    while isinstance(a.parent(top), cst.If):  # an ``elif`` hangs off the ``if`` above it
        top = a.parent(top)
    return top if isinstance(top, cst.If) and _only_sets(a, top, binding.key) else None


def _only_sets(a: Analysis, branch: cst.If | cst.Else | None, key: str) -> bool:
    if branch is None:
        return False  # without an else the name may stay unset
    body = branch.body.body
    ok = (
        len(body) == 1
        and isinstance(body[0], cst.SimpleStatementLine)
        and len(body[0].body) == 1
        and isinstance(assign := body[0].body[0], cst.Assign)
        and len(assign.targets) == 1
        and key_of(assign.targets[0].target) == key
        and is_device(assign.value, by_name=False, names=a.names)
    )
    return ok and (isinstance(branch, cst.Else) or _only_sets(a, branch.orelse, key))
