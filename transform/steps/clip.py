"""``torch.nn.utils.clip_grad_norm_/value_`` become the accelerator's own.

The accelerator's versions unscale fp16 gradients first and work on sharded parameters. Inside
an accumulate block clipping only makes sense when gradients are synced, so it gets
``if accelerator.sync_gradients:``.
"""

from __future__ import annotations

import libcst as cst

from accelify.transform.plan import Plan

_CLIPS = frozenset({"clip_grad_norm_", "clip_grad_value_"})


def clip(plan: Plan) -> None:
    a = plan.analysis
    for call, _scope in plan.training_calls():
        name = a.names.last_part(call.func)
        if name not in _CLIPS or not a.names.refers_to(call.func, ("torch",), name):
            continue
        accelerator = plan.accelerator(call)
        plan.edits.replace(
            call,
            lambda node, acc=accelerator, n=name: node.with_changes(
                func=cst.Attribute(acc, cst.Name(n))
            ),
        )
        plan.changed(call, f"{name} -> accelerator.{name}")
        loop = a.enclosing(call, (cst.For, cst.While))
        statement = a.statement_of(call)
        guard = a.enclosing(call, cst.If)
        kept = (
            guard is not None
            and loop is not None
            and a.contains(loop, guard)
            and (id(guard) not in plan.unwrapped)
        )
        if loop is not None and id(loop) in plan.accumulating and statement and not kept:
            test = cst.Attribute(accelerator, cst.Name("sync_gradients"))
            plan.edits.replace(
                statement,
                lambda node, test=test: cst.If(
                    test=test,
                    body=cst.IndentedBlock(body=[node.with_changes(leading_lines=())]),
                    leading_lines=node.leading_lines,
                ),
            )
