"""``torch.manual_seed(s)`` with ``random.seed(s)`` and ``np.random.seed(s)`` beside it becomes
``set_seed(s)``.

``set_seed`` seeds Python, NumPy, torch and every CUDA device in one call. It is only the same
thing when the script already seeds all three with the same value: a lone ``torch.manual_seed``
stays, because seeding Python's and NumPy's generators where the script left them alone would
give every process the same random stream (a dataset drawing samples from ``random`` would then
feed every process the same data).
"""

from __future__ import annotations

import libcst as cst

from accelify.transform.patterns import dotted_name
from accelify.transform.plan import Plan

_TORCH = "torch.manual_seed"
_NEEDED = frozenset({"random.seed", "numpy.random.seed"})
_OPTIONAL = frozenset({"torch.cuda.manual_seed", "torch.cuda.manual_seed_all"})


def seed(plan: Plan) -> None:
    a = plan.analysis
    if plan.setup is None or "set_seed" in a.names.imports or "set_seed" in a.names.defined:
        return
    for call, _scope in plan.training_calls():
        if _seeds(plan, call) != _TORCH or not isinstance(a.parent(call), cst.Expr):
            continue
        statement = a.statement_of(call)
        block = a.parent(statement)  # type: ignore[arg-type]
        arg = a.module.code_for_node(call.args[0].value) if len(call.args) == 1 else None
        siblings = {}
        for sibling in getattr(block, "body", ()):
            small = sibling.body[0] if isinstance(sibling, cst.SimpleStatementLine) else None
            inner = small.value if isinstance(small, cst.Expr) else None
            if (
                isinstance(inner, cst.Call)
                and len(sibling.body) == 1
                and len(inner.args) == 1
                and _seeds(plan, inner) in _NEEDED | _OPTIONAL
                and a.module.code_for_node(inner.args[0].value) == arg
            ):
                siblings[sibling] = inner
        if arg is None or not {_seeds(plan, c) for c in siblings.values()} >= _NEEDED:
            continue
        plan.edits.replace(call.func, cst.Name("set_seed"))
        plan.imports.add("set_seed")
        plan.changed(call, "torch.manual_seed -> set_seed (Python, NumPy, torch, CUDA)")
        for sibling, inner in siblings.items():
            plan.remove(sibling)
            plan.changed(inner, f"removed {dotted_name(inner.func)}: set_seed covers it")


def _seeds(plan: Plan, call: cst.Call) -> str | None:
    """The qualified name of a seeding call (``np.random.seed`` -> ``numpy.random.seed``)."""
    names = plan.analysis.names
    qualified = names.qualify(call.func) or dotted_name(call.func)
    return qualified
