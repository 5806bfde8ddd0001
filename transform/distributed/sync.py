"""Gradient-sync toggles of the wrapped model keep the script's own schedule of synced backwards.

``with model.no_sync():`` becomes ``with accelerator.no_sync(model):``, which is DDP's
``no_sync()`` where the prepared model is wrapped and does nothing on one process, where nothing
syncs: every backward syncs exactly where it did. nanoGPT's ``model.require_backward_grad_sync =
(micro_step == last)`` stays as written: on the prepared model it sets the same flag of the same
DDP wrapper, and on one process an attribute nothing reads. Neither becomes ``accumulate()``,
which decides for itself which batches sync and step (it also syncs at the loader's end). Each is
refused where it is not the wrapped model's (the conversion could not tell what it toggles), and,
by :mod:`.resolve`, where the conversion adds its own accumulation: two schedules would nest.
"""

from __future__ import annotations

import libcst as cst

from accelify.transform.analysis import Analysis
from accelify.transform.distributed.context import Rewrite
from accelify.transform.patterns import placeholder
from accelify.transform.refusals import UNSYNCED_GRADIENTS
from accelify.transform.steps.unwrap import SYNC_TOGGLE
from accelify.transform.walk import nodes


def keep_sync_toggles(r: Rewrite) -> None:
    a = r.analysis
    for attribute in nodes(a.module, cst.Attribute):
        what = attribute.attr.value  # type: ignore[attr-defined]
        if what not in {"no_sync", SYNC_TOGGLE}:
            continue
        model = attribute.value  # type: ignore[attr-defined]
        if not r.is_wrapped(model):
            raise r.refuse(
                attribute,
                UNSYNCED_GRADIENTS,
                f"toggles gradient sync ({what}) of a model it did not wrap",
            )
        parent = a.parent(attribute)
        if what == SYNC_TOGGLE:
            if not _assigned(a, attribute):
                raise r.refuse(
                    attribute, UNSYNCED_GRADIENTS, f"reads {SYNC_TOGGLE}; convert it by hand"
                )
            r.info(
                attribute,
                f"kept {SYNC_TOGGLE}: it switches the prepared DDP model's gradient sync as it "
                "did (on one process nothing reads it)",
            )
            continue
        if not (isinstance(parent, cst.Call) and not parent.args and _entered(a, parent)):
            raise r.refuse(
                attribute,
                UNSYNCED_GRADIENTS,
                "uses no_sync() other than as `with model.no_sync():`",
            )
        r.edits.replace(parent, cst.Call(placeholder("no_sync"), [cst.Arg(model)]))
        r.changed(attribute, "model.no_sync() -> accelerator.no_sync(model)")


def _assigned(a: Analysis, attribute: cst.CSTNode) -> bool:
    target = a.parent(attribute)
    return isinstance(target, cst.AssignTarget) and isinstance(a.parent(target), cst.Assign)


def _entered(a: Analysis, call: cst.CSTNode) -> bool:
    item = a.parent(call)
    return isinstance(item, cst.WithItem) and item.asname is None
