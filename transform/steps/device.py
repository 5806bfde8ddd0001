"""``device = "cuda"`` (or ``torch.device(...)``) becomes ``device = accelerator.device``.

The name stays, so every other use of ``device`` in the script keeps working. Later assignments
of the same name (``if use_cuda: device = "cuda"``) go away: there is one device now.
"""

from __future__ import annotations

import libcst as cst

from accelify.transform.patterns import Role
from accelify.transform.plan import Plan


def device(plan: Plan) -> None:
    a = plan.analysis
    if plan.setup is None:
        return
    seen: set[tuple[int, str]] = set()
    for b in a.bindings:
        if b.value is None or a.role(b.scope, b.key) is not Role.DEVICE:
            continue
        accelerator = plan.accelerator(b.node)
        if accelerator is None or not isinstance(b.node, cst.Assign):
            continue
        slot = (a.owner(b.scope, b.key), b.key)
        if slot in seen:
            plan.remove(a.statement_of(b.node))  # type: ignore[arg-type]
            plan.changed(b.node, f"removed second choice of {b.key}")
            continue
        seen.add(slot)
        new_value = cst.Attribute(accelerator, cst.Name("device"))
        plan.edits.replace(b.value, new_value)
        plan.changed(b.node, f"{b.key} = {plan.setup.accelerator}.device")
