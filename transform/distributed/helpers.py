"""``utils.init_distributed_mode(args)``: research code's own helper that starts the processes.

DETR, DeiT, MAE and torchvision's references keep it in ``util/misc.py``: it reads the launcher's
variables into ``args.rank``, ``args.world_size`` and ``args.gpu``, sets ``args.distributed`` and
calls ``dist.init_process_group``. The helper's file stays as it is (the neighbours reader finds
it, nothing is run); its call goes, as a process group's does, and what it set on ``args`` is
read from the accelerator: ``args.distributed`` is the distributed/single-process switch, whose
distributed path is kept (as :mod:`.switch` keeps ``if ddp:``), ``args.rank`` the process index,
``args.gpu`` and ``args.local_rank`` the local one, ``args.world_size`` the number of processes.
Refused: another attribute it sets that the script reads (``args.dist_url``), one the script
also sets or reads outside the function that calls the helper, and a call passed anything but
one name, or whose result is used.
"""

from __future__ import annotations

import libcst as cst

from accelify.transform.distributed.context import Rewrite
from accelify.transform.distributed.switch import collapse
from accelify.transform.neighbours import assigned_attributes, distributing_functions
from accelify.transform.patterns import placeholder
from accelify.transform.refusals import DDP_LAUNCH
from accelify.transform.walk import nodes

SWITCH = "distributed"
RANKS = {
    "rank": "process_index",
    "gpu": "local_process_index",
    "local_rank": "local_process_index",
    "world_size": "num_processes",
}


def drop_helpers(r: Rewrite) -> None:
    a = r.analysis
    calls = [(call, q) for call, _scope in a.calls if (q := a.names.qualify(call.func))]
    helpers = distributing_functions(r.path, {q for _call, q in calls})
    for call, qualified in calls:
        if qualified not in helpers:
            continue
        code = a.module.code_for_node(call.func)
        statement = r.bare_statement(call, DDP_LAUNCH)
        arg = call.args[0].value if len(call.args) == 1 and not call.args[0].keyword else None
        attributes = assigned_attributes(r.path, qualified)
        if not isinstance(arg, cst.Name) or attributes is None:
            raise r.refuse(
                call, DDP_LAUNCH, f"{code}() starts the processes and is not passed one namespace"
            )
        r.remove(statement)
        r.changed(call, f"{code}() removed: accel-run and the accelerator start the processes")
        _read_from_the_accelerator(r, call, arg.value, attributes, code)


def _read_from_the_accelerator(
    r: Rewrite, call: cst.Call, namespace: str, attributes: frozenset[str], helper: str
) -> None:
    a = r.analysis
    scope = a.scope_of[id(call)]
    for node in nodes(a.module, cst.Attribute):
        base = node.value  # type: ignore[attr-defined]
        attr = node.attr.value  # type: ignore[attr-defined]
        if not (isinstance(base, cst.Name) and base.value == namespace and attr in attributes):
            continue
        spelled = f"{namespace}.{attr}"
        if a.scope_of.get(id(node)) is not scope or isinstance(
            a.parent(node), cst.AssignTarget | cst.AugAssign
        ):
            raise r.refuse(
                node,
                DDP_LAUNCH,
                f"{spelled} is set by {helper}(), whose call goes, and is also set or read "
                "outside the function that calls it",
            )
        if attr == SWITCH:
            collapse(r, node, spelled)  # type: ignore[arg-type]
        elif attr in RANKS:
            r.rank_reads[id(node)] = RANKS[attr]
            r.edits.replace(node, placeholder(RANKS[attr]))
            r.changed(node, f"{spelled} -> the accelerator's {RANKS[attr]}")
        else:
            raise r.refuse(
                node,
                DDP_LAUNCH,
                f"{spelled} is set by {helper}(), whose call goes: set it in the script, then "
                "convert again",
            )
