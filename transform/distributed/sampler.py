"""``DataLoader(ds, sampler=DistributedSampler(ds, shuffle=s))`` -> ``DataLoader(ds, shuffle=s)``.

A prepared loader shards the data itself, so the sampler goes and the loader gets the sampler's
``shuffle`` (True when the sampler was not told: its default). ``sampler.set_epoch(e)`` and
``loader.sampler.set_epoch(e)`` become ``loader.set_epoch(e)``, which a prepared loader forwards
to its own sampler. The loader is marked so that the conversion refuses a sharded loader it would
not prepare: every process would then see all of it, and a sum it all-reduces would count it N
times.
"""

from __future__ import annotations

import libcst as cst

from accelify.transform.analysis import Analysis, key_of
from accelify.transform.distributed.context import Rewrite
from accelify.transform.distributed.ranks import kind_of
from accelify.transform.patterns import keyword_arg, placeholder
from accelify.transform.refusals import DDP_SAMPLER
from accelify.transform.walk import nodes

# The sampler's arguments that only say which shard: the prepared loader knows them.
_SHARD = frozenset({"num_replicas", "rank"})


def drop_samplers(r: Rewrite) -> None:
    a = r.analysis
    names = a.names
    samplers: dict[tuple[int, str], cst.BaseExpression] = {}  # a sampler's name -> its shuffle
    for call, scope in a.calls:
        if names.last_part(call.func) != "DistributedSampler" or not names.refers_to(
            call.func, ("torch",), "DistributedSampler"
        ):
            continue
        shuffle = _shuffle(r, call)
        parent = a.parent(call)
        if isinstance(parent, cst.Arg) and parent.keyword and parent.keyword.value == "sampler":
            _give_shuffle(r, a.parent(parent), parent, shuffle)  # type: ignore[arg-type]
            continue
        if isinstance(parent, cst.IfExp) and parent.body is call and parent.orelse in r.dropped:
            parent = a.parent(parent)  # ``DistributedSampler(ds) if ddp else ...``: ddp is kept
        target = parent.targets[0].target if isinstance(parent, cst.Assign) else None
        key = key_of(target) if target is not None and len(parent.targets) == 1 else None  # type: ignore[union-attr]
        if key is None or not isinstance(target, cst.Name):
            raise r.refuse(
                call, DDP_SAMPLER, "this DistributedSampler is not handed straight to a DataLoader"
            )
        samplers[(id(scope.node), key)] = shuffle
        r.remove(a.parent(parent))  # type: ignore[arg-type]
    _uses(r, samplers)


def _shuffle(r: Rewrite, call: cst.Call) -> cst.BaseExpression:
    for arg in call.args[1:]:
        name = arg.keyword.value if arg.keyword is not None else None
        if name == "shuffle" or (name in _SHARD and kind_of(r, arg.value) is not None):
            continue
        if name in _SHARD:
            code = r.analysis.module.code_for_node(arg.value)
            raise r.refuse(
                call,
                DDP_SAMPLER,
                f"this DistributedSampler's {name}={code} is not one accel-convert recognises as "
                "the process's own (a prepared loader shards by the accelerator's), so it cannot "
                "show the shards stay the same",
            )
        raise r.refuse(
            call,
            DDP_SAMPLER,
            f"this DistributedSampler's {name or 'positional'} argument has no equivalent in a "
            "prepared loader",
        )
    given = keyword_arg(call, "shuffle")
    return given.value if given is not None else cst.Name("True")


def _give_shuffle(
    r: Rewrite, loader: cst.Call, sampler: cst.Arg, shuffle: cst.BaseExpression
) -> None:
    """Swap ``sampler=`` for ``shuffle=`` in the loader's call (replacing its ``shuffle=False``)."""
    if not isinstance(loader, cst.Call) or r.analysis.names.last_part(loader.func) != "DataLoader":
        raise r.refuse(
            sampler, DDP_SAMPLER, "this DistributedSampler is not handed straight to a DataLoader"
        )
    marked = cst.Call(placeholder("sharded"), args=[cst.Arg(shuffle)])
    old = keyword_arg(loader, "shuffle")
    if old is not None:
        r.edits.replace(old.value, lambda _n: marked)
        r.edits.replace(loader, _without_sampler)  # type: ignore[arg-type]
    else:
        r.edits.replace(
            sampler, lambda node: node.with_changes(keyword=cst.Name("shuffle"), value=marked)
        )
    r.changed(
        sampler,
        "DistributedSampler removed: the prepared loader shards the data "
        f"(shuffle={r.analysis.module.code_for_node(shuffle)})",
    )


def _without_sampler(call: cst.Call) -> cst.Call:
    """``call`` without its ``sampler=`` argument; when that was the last one, the argument
    before it takes over its comma and the layout before ``)``."""
    args = list(call.args)
    i = next(i for i, arg in enumerate(args) if arg.keyword and arg.keyword.value == "sampler")
    gone = args.pop(i)
    if i == len(args) and args:
        args[-1] = args[-1].with_changes(
            comma=gone.comma, whitespace_after_arg=gone.whitespace_after_arg
        )
    return call.with_changes(args=args)


def _uses(r: Rewrite, samplers: dict[tuple[int, str], cst.BaseExpression]) -> None:
    """Where each named sampler was handed over and set to an epoch."""
    a = r.analysis
    loaders: dict[tuple[int, str], cst.BaseExpression] = {}
    for name in nodes(a.module, cst.Name):
        scope = a.scope_of.get(id(name))
        key = (id(scope.node), name.value) if scope is not None else None  # type: ignore[attr-defined]
        if key not in samplers:
            continue
        parent = a.parent(name)
        if isinstance(parent, cst.AssignTarget | cst.Arg | cst.Attribute) and (
            getattr(parent, "keyword", None) is name or getattr(parent, "attr", None) is name
        ):
            continue  # a keyword or attribute spelled like the sampler
        if isinstance(parent, cst.AssignTarget):
            continue  # the binding, removed
        if isinstance(parent, cst.Arg) and parent.keyword and parent.keyword.value == "sampler":
            loader = a.parent(parent)
            _give_shuffle(r, loader, parent, samplers[key])  # type: ignore[arg-type]
            binding = a.parent(loader)
            if isinstance(binding, cst.Assign) and isinstance(binding.targets[0].target, cst.Name):
                loaders[key] = binding.targets[0].target  # type: ignore[index]
            continue
        epoch = _set_epoch(a, parent)
        if epoch is None or key not in loaders:
            raise r.refuse(
                name,
                DDP_SAMPLER,
                "this DistributedSampler is used other than by its DataLoader and set_epoch",
            )
        r.edits.replace(epoch, _epoch(loaders[key], epoch))  # type: ignore[index]
    for attribute in nodes(a.module, cst.Attribute):
        if attribute.attr.value != "sampler":  # type: ignore[attr-defined]
            continue
        epoch = _set_epoch(a, a.parent(attribute))
        if epoch is not None:
            r.edits.replace(epoch, _epoch(attribute.value, epoch))  # type: ignore[attr-defined]


def _set_epoch(a: Analysis, node: cst.CSTNode | None) -> cst.Call | None:
    """The ``X.set_epoch(e)`` call ``node`` (the ``X.set_epoch`` attribute) belongs to."""
    if not isinstance(node, cst.Attribute) or node.attr.value != "set_epoch":
        return None
    call = a.parent(node)
    return call if isinstance(call, cst.Call) and len(call.args) == 1 else None


def _epoch(loader: cst.BaseExpression, call: cst.Call) -> cst.Call:
    return cst.Call(placeholder("set_epoch"), args=[cst.Arg(loader), call.args[0]])
