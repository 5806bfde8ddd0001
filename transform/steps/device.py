"""``device = "cuda"`` (or ``torch.device(...)``) becomes ``device = accelerator.device``.

The name stays, so every other use of ``device`` in the script keeps working. There is one device
now: later choices of the same name (``if use_cuda: device = "cuda"``) go away, and an
``if``/``elif``/``else`` whose every branch only picks a device collapses into the one assignment.
A device picked in a branch that does more than that is left for a human.
"""

from __future__ import annotations

import libcst as cst

from accelify.transform.analysis import Analysis, Binding, key_of
from accelify.transform.patterns import Role, is_device
from accelify.transform.plan import Plan


def device(plan: Plan) -> None:
    if plan.setup is None:
        return
    a = plan.analysis
    choices: dict[tuple[int, str], list[Binding]] = {}
    for b in a.bindings:
        if (
            b.scope in plan.training
            and isinstance(b.node, cst.Assign)
            and a.role(b.scope, b.key) is Role.DEVICE
        ):
            choices.setdefault((a.owner(b.scope, b.key), b.key), []).append(b)
    for bindings in choices.values():
        accelerator = plan.accelerator(bindings[0].node)
        if accelerator is not None:
            _one_device(plan, bindings, cst.Attribute(accelerator, cst.Name("device")))


def _one_device(plan: Plan, bindings: list[Binding], value: cst.Attribute) -> None:
    a = plan.analysis
    first, key = bindings[0], bindings[0].key
    chain = _device_chain(a, first) if first.nested else None
    if first.nested and chain is None:
        plan.needs_human(first.node, f"{key} is chosen in a branch: set it to the accelerator's")
        return
    if chain is None:
        plan.edits.replace(first.value, value)  # type: ignore[arg-type]
    else:
        assign = plan.statement(f"{key} = {a.module.code_for_node(value)}\n")
        plan.edits.replace(
            chain, lambda node: assign.with_changes(leading_lines=node.leading_lines)
        )
    plan.changed(first.node, f"{key} = {a.module.code_for_node(value)}")
    for later in bindings[1:]:
        if chain is None or not a.contains(chain, later.node):
            plan.remove(a.statement_of(later.node))
            plan.changed(later.node, f"removed a second choice of {key}")


def _device_chain(a: Analysis, binding: Binding) -> cst.If | None:
    """The ``if``/``elif``/``else`` around ``binding`` when each branch only sets it to a device."""
    top: cst.CSTNode | None = a.enclosing(binding.node, cst.If)
    while isinstance(a.parent(top), cst.If):  # an ``elif`` hangs off the ``if`` above it
        top = a.parent(top)
    return top if isinstance(top, cst.If) and _only_sets(top, binding.key) else None


def _only_sets(branch: cst.If | cst.Else | None, key: str) -> bool:
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
        and is_device(assign.value, by_name=False)
    )
    return ok and (isinstance(branch, cst.Else) or _only_sets(branch.orelse, key))
