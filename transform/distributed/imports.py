"""Imports of ``torch.distributed`` and friends that nothing reads once DDP is gone are removed,
so the converted script says what it uses (and a second conversion sees no distribution).
Only module-level import lines are touched; a removed line's comments move to the next one."""

from __future__ import annotations

import libcst as cst

from accelify.transform.edits import Edits, apply
from accelify.transform.names import collect_names
from accelify.transform.walk import nodes

_DISTRIBUTING = (
    "torch.distributed",
    "torch.multiprocessing",
    "torch.nn.parallel.DistributedDataParallel",
    "torch.nn.parallel.distributed",
    "torch.utils.data.distributed",
    "torch.utils.data.DistributedSampler",
    # The single-process sampler a launch test chose instead (``RandomSampler(ds) if
    # args.local_rank == -1 else DistributedSampler(ds)``): the loader's shuffle replaces both.
    "torch.utils.data.RandomSampler",
    "torch.utils.data.SequentialSampler",
)


def drop_unused_imports(module: cst.Module) -> cst.Module:
    names = collect_names(module)
    counts: dict[str, int] = {}
    for n in nodes(module, cst.Name):
        counts[n.value] = counts.get(n.value, 0) + 1  # type: ignore[attr-defined]
    unused = {
        local
        for local, qualified in names.imports.items()
        if counts.get(local) == 1  # the import's own name only
        and any(qualified == p or qualified.startswith(f"{p}.") for p in _DISTRIBUTING)
    }
    edits = Edits()
    for line in module.body:
        if not isinstance(line, cst.SimpleStatementLine) or len(line.body) != 1:
            continue
        statement = line.body[0]
        if not isinstance(statement, cst.Import | cst.ImportFrom) or isinstance(
            statement.names, cst.ImportStar
        ):
            continue
        kept = [a for a in statement.names if _local(a) not in unused]
        if not kept:
            edits.remove(line)
        elif len(kept) < len(statement.names):
            kept[-1] = kept[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
            edits.replace(statement, statement.with_changes(names=kept))
    return apply(module, edits)


def _local(alias: cst.ImportAlias) -> str:
    if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
        return alias.asname.name.value
    name = alias.name
    while isinstance(name, cst.Attribute):
        name = name.value  # type: ignore[assignment]
    return name.value  # type: ignore[union-attr]
