"""``torch.save`` in training code writes once; a model is saved unwrapped, after everyone is done.

Every process runs the script, so a plain ``torch.save`` writes the same file N times at once;
``accelerator.save`` writes on the main process only. A prepared model is wrapped (DDP, FSDP,
...): its state dict has the wrapper's key prefixes and will not load into a plain model, so it
is unwrapped, and ``wait_for_everyone()`` makes sure no process is still training when it is saved.
"""

from __future__ import annotations

import libcst as cst

from accelify.transform.analysis import key_of
from accelify.transform.patterns import Role, dotted_name, method_call
from accelify.transform.plan import Plan
from accelify.transform.walk import walk


def save(plan: Plan) -> None:
    a = plan.analysis
    for call, scope in plan.training_calls():
        if dotted_name(call.func) != "torch.save" or len(call.args) < 2:
            continue
        models = _model_uses(plan, call.args[0].value, scope)
        statement = a.statement_of(call)
        if not isinstance(a.parent(call), cst.Expr):
            continue
        accelerator = plan.accelerator(call)
        if accelerator is None:
            plan.needs_human(call, "torch.save where the accelerator is not reachable")
            continue
        plan.edits.replace(call.func, cst.Attribute(accelerator, cst.Name("save")))
        if not models:
            plan.changed(call, "torch.save -> accelerator.save (main process only)")
            continue
        for node in models:
            unwrap = cst.Call(
                cst.Attribute(accelerator, cst.Name("unwrap_model")), args=[cst.Arg(node)]
            )
            plan.edits.replace(node, unwrap)
        wait = plan.statement(f"{a.module.code_for_node(accelerator)}.wait_for_everyone()\n")
        # Blank lines and comments above the save now sit above the pair.
        wait = wait.with_changes(leading_lines=statement.leading_lines)  # type: ignore[union-attr]
        plan.edits.insert_before(statement, wait)  # type: ignore[arg-type]
        plan.edits.replace(statement, lambda node: node.with_changes(leading_lines=()))  # type: ignore[arg-type]
        plan.changed(call, "torch.save -> accelerator.save of the unwrapped model")


def _model_uses(plan: Plan, value: cst.BaseExpression, scope) -> list[cst.BaseExpression]:
    """The model expressions inside the saved object: ``model`` in ``model.state_dict()`` etc."""
    a = plan.analysis
    found: list[cst.BaseExpression] = []

    class _Finder(cst.CSTVisitor):
        def visit_Call(self, node: cst.Call) -> bool:
            inner = method_call(node, "state_dict")
            key = key_of(inner.func.value) if inner is not None else None  # type: ignore[union-attr]
            if key is not None and a.role(scope, key) is Role.MODEL:
                found.append(inner.func.value)  # type: ignore[union-attr]
                return False
            return True

    if (key := key_of(value)) is not None and a.role(scope, key) is Role.MODEL:
        return [value]
    walk(value, _Finder())
    return found
