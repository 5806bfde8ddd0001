"""``torch.manual_seed(s)`` (and the ``random``/``numpy`` seeds beside it) becomes ``set_seed(s)``.

``set_seed`` seeds Python, NumPy, torch and every CUDA device in one call, the same on every
process, so all ranks start from identical weights.
"""

from __future__ import annotations

import libcst as cst

from accelify.transform.patterns import dotted_name
from accelify.transform.plan import Plan

_SIBLINGS = frozenset(
    {"random.seed", "np.random.seed", "numpy.random.seed", "torch.cuda.manual_seed",
     "torch.cuda.manual_seed_all"}
)  # fmt: skip


def seed(plan: Plan) -> None:
    if plan.setup is None:
        return
    a = plan.analysis
    module = a.module
    for call, _scope in a.calls:
        if dotted_name(call.func) != "torch.manual_seed" or not isinstance(
            a.parent(call), cst.Expr
        ):
            continue
        statement = a.statement_of(call)
        block = a.parent(statement)  # type: ignore[arg-type]
        arg = module.code_for_node(call.args[0].value) if call.args else None
        plan.edits.replace(call.func, cst.Name("set_seed"))
        plan.imports.add("set_seed")
        plan.changed(call, "torch.manual_seed -> set_seed (Python, NumPy, torch, CUDA)")
        for sibling in getattr(block, "body", ()):
            small = sibling.body[0] if isinstance(sibling, cst.SimpleStatementLine) else None
            inner = small.value if isinstance(small, cst.Expr) else None
            if (
                isinstance(inner, cst.Call)
                and dotted_name(inner.func) in _SIBLINGS
                and len(sibling.body) == 1
                and inner.args
                and module.code_for_node(inner.args[0].value) == arg
            ):
                plan.remove(sibling)
                plan.changed(inner, f"removed {dotted_name(inner.func)}: set_seed covers it")
