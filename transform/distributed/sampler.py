"""``DataLoader(ds, sampler=DistributedSampler(ds, shuffle=s))`` -> ``DataLoader(ds, shuffle=s)``.

A prepared loader shards the data itself, so the sampler goes and the loader gets the sampler's
``shuffle`` (True when the sampler was not told: its default). A sampler that feeds a
``BatchSampler`` (``DataLoader(ds, batch_sampler=BatchSampler(sampler, b, drop_last=d))``)
becomes the ``RandomSampler``/``SequentialSampler`` its ``shuffle`` stands for, and the prepared
loader shards the batches. ``seed=`` goes with a note: the prepared loader's processes share
one shuffle, drawn from torch's generator rather than from that seed. ``sampler.set_epoch(e)``
and ``loader.sampler.set_epoch(e)`` become ``loader.set_epoch(e)``, which a prepared loader
forwards to its own sampler. The loader is marked so that the conversion refuses a sharded loader
it would not prepare: every process would then see all of it, and a sum it all-reduces would
count it N times.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from accelify.transform.analysis import Analysis, key_of
from accelify.transform.distributed.context import Rewrite
from accelify.transform.distributed.ranks import kind_of
from accelify.transform.patterns import dataset_of, keyword_arg, placeholder
from accelify.transform.refusals import DDP_SAMPLER
from accelify.transform.walk import nodes

# The sampler's arguments that only say which shard: the prepared loader knows them.
# What each sharding argument must read for the shards to be the accelerator's (a local rank
# is the global one on one machine; on several, the prepared loader stops repeating shards).
_SHARD = {"num_replicas": {"num_processes"}, "rank": {"process_index", "local_process_index"}}
_PLAIN = {"True": "RandomSampler", "False": "SequentialSampler"}  # by shuffle


@dataclass
class _Named:
    """A ``DistributedSampler`` bound to a name, and where that name was handed over."""

    call: cst.Call
    shuffle: cst.BaseExpression
    binding: cst.CSTNode
    handed_to: set[str] = field(default_factory=set)  # "loader", "batches"
    printed: list[cst.CSTNode] = field(default_factory=list)  # ``print(f"{sampler}")`` lines


def drop_samplers(r: Rewrite) -> None:
    a = r.analysis
    names = a.names
    samplers: dict[tuple[int, str], _Named] = {}
    for call, scope in a.calls:
        if names.last_part(call.func) != "DistributedSampler" or not names.refers_to(
            call.func, ("torch",), "DistributedSampler"
        ):
            continue
        shuffle = _shuffle(r, call)
        parent = a.parent(call)
        batches = _batch_sampler_of(r, parent)
        if batches is not None:
            _batch_sampler_loader(r, batches)
            _to_plain(r, call, shuffle)
            continue
        if isinstance(parent, cst.Arg) and parent.keyword and parent.keyword.value == "sampler":
            _give_shuffle(r, a.parent(parent), parent, call, shuffle)  # type: ignore[arg-type]
            continue
        if isinstance(parent, cst.IfExp) and (
            (parent.body is call and parent.orelse in r.dropped)
            or (parent.orelse is call and parent.body in r.dropped)
        ):  # ``DistributedSampler(ds) if ddp else ...``, ``... if local_rank == -1 else ...``
            parent = a.parent(parent)
        target = parent.targets[0].target if isinstance(parent, cst.Assign) else None
        key = key_of(target) if target is not None and len(parent.targets) == 1 else None  # type: ignore[union-attr]
        if key is None or not isinstance(target, cst.Name):
            raise r.refuse(
                call, DDP_SAMPLER, "this DistributedSampler is not handed straight to a DataLoader"
            )
        samplers[(id(scope.node), key)] = _Named(call, shuffle, a.parent(parent))  # type: ignore[arg-type]
    _uses(r, samplers)
    for sampler in samplers.values():
        if sampler.handed_to == {"batches"}:
            _to_plain(r, sampler.call, sampler.shuffle)
        elif len(sampler.handed_to) > 1:
            raise r.refuse(
                sampler.call,
                DDP_SAMPLER,
                "this DistributedSampler feeds both a DataLoader and a BatchSampler",
            )
        else:
            r.remove(sampler.binding)
            for line in sampler.printed:
                r.remove(line)
                r.changed(line, "removed the print of the DistributedSampler, which goes")


def _shuffle(r: Rewrite, call: cst.Call) -> cst.BaseExpression:
    for arg in call.args[1:]:
        name = arg.keyword.value if arg.keyword is not None else None
        if name == "shuffle" or (name in _SHARD and kind_of(r, arg.value) in _SHARD[name]):
            continue
        if name == "drop_last" and _is_false(arg.value):
            continue  # the sampler's default
        if name == "seed":
            r.info(
                arg,
                f"DistributedSampler's seed={r.analysis.module.code_for_node(arg.value)} goes: "
                "the prepared loader's processes share one shuffle, drawn from torch's generator",
            )
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


def _is_false(value: cst.BaseExpression) -> bool:
    return isinstance(value, cst.Name) and value.value == "False"


def _batch_sampler_of(r: Rewrite, arg: cst.CSTNode | None) -> cst.Call | None:
    """The ``BatchSampler(...)`` call ``arg`` is the sampler of (its first positional argument,
    or ``sampler=``), else None."""
    if not isinstance(arg, cst.Arg):
        return None
    call = r.analysis.parent(arg)
    if not isinstance(call, cst.Call) or not r.analysis.names.refers_to(
        call.func, ("torch",), "BatchSampler"
    ):
        return None
    if arg.keyword is None and arg is call.args[0]:
        return call
    return call if arg.keyword is not None and arg.keyword.value == "sampler" else None


def _to_plain(r: Rewrite, call: cst.Call, shuffle: cst.BaseExpression) -> None:
    """``DistributedSampler(ds, shuffle=s)`` -> ``RandomSampler(ds)`` or ``SequentialSampler(ds)``,
    spelled through the file's ``torch`` import."""
    plain = _PLAIN.get(shuffle.value) if isinstance(shuffle, cst.Name) else None
    dataset = dataset_of(call)
    if plain is None or dataset is None:
        raise r.refuse(
            call,
            DDP_SAMPLER,
            "this DistributedSampler feeds a BatchSampler, and its shuffle= is not True or "
            "False or its dataset is not given: which plain sampler it stands for is not known",
        )
    torch = r.analysis.names.local_name("torch")
    if torch is None:
        raise r.refuse(
            call,
            DDP_SAMPLER,
            f"this DistributedSampler feeds a BatchSampler: it would become a {plain}, and the "
            "file has no `import torch` to spell it with",
        )
    func = cst.parse_expression(f"{torch}.utils.data.{plain}")
    r.edits.replace(call, cst.Call(func, args=[cst.Arg(dataset)]))
    r.changed(
        call,
        f"DistributedSampler -> {plain}: the prepared loader shards the batches its "
        "BatchSampler makes",
    )


def _batch_sampler_loader(r: Rewrite, batches: cst.Call) -> cst.BaseExpression:
    """Mark the loader ``batches`` (a ``BatchSampler(...)`` call) is the ``batch_sampler=`` of,
    straight or through one name read once; the name that loader is bound to, for set_epoch."""
    a = r.analysis
    holder = a.parent(batches)
    if isinstance(holder, cst.Assign) and len(holder.targets) == 1:
        target = holder.targets[0].target
        scope = a.scope_of.get(id(target))
        reads = (
            _reads(r, (id(scope.node), target.value))
            if isinstance(target, cst.Name) and scope
            else []
        )  # type: ignore[attr-defined]
        holder = a.parent(reads[0]) if len(reads) == 1 else None
    if not (
        isinstance(holder, cst.Arg)
        and holder.keyword is not None
        and holder.keyword.value == "batch_sampler"
        and isinstance(loader := a.parent(holder), cst.Call)
        and a.names.last_part(loader.func) == "DataLoader"
    ):
        raise r.refuse(
            batches,
            DDP_SAMPLER,
            "this BatchSampler over a DistributedSampler is not handed straight to a "
            "DataLoader's batch_sampler=",
        )
    r.edits.replace(
        holder.value, lambda node: cst.Call(placeholder("sharded"), args=[cst.Arg(node)])
    )
    binding = a.parent(loader)
    if isinstance(binding, cst.Assign) and len(binding.targets) == 1:
        return binding.targets[0].target
    return loader


def _give_shuffle(
    r: Rewrite,
    loader: cst.Call,
    sampler: cst.Arg,
    call: cst.Call,
    shuffle: cst.BaseExpression,
) -> None:
    """Swap ``sampler=`` for ``shuffle=`` in the loader's call (replacing its ``shuffle=False``).
    The mark carries the loader's dataset when the sampler is over that same dataset: a loader
    the conversion keeps for evaluation then gets the sampler back (see ``resolve``)."""
    if not isinstance(loader, cst.Call) or r.analysis.names.last_part(loader.func) != "DataLoader":
        raise r.refuse(
            sampler, DDP_SAMPLER, "this DistributedSampler is not handed straight to a DataLoader"
        )
    dataset = _same_dataset(r.analysis, call, loader)
    marked = cst.Call(
        placeholder("sharded"),
        args=[cst.Arg(shuffle), *([cst.Arg(dataset)] if dataset is not None else [])],
    )
    old = keyword_arg(loader, "shuffle")
    if old is not None:
        r.edits.replace(old.value, lambda _n: marked)
        r.edits.replace(loader, _without_sampler)  # type: ignore[arg-type]
    else:
        r.edits.replace(
            sampler, lambda node: node.with_changes(keyword=cst.Name("shuffle"), value=marked)
        )


def _same_dataset(a: Analysis, sampler: cst.Call, loader: cst.Call) -> cst.Name | None:
    """The dataset name both calls take first, when it is bound once where they are."""
    first = [dataset_of(c) for c in (sampler, loader)]
    if not all(isinstance(d, cst.Name) for d in first) or len({d.value for d in first}) != 1:  # type: ignore[union-attr]
        return None
    name = first[0].value  # type: ignore[union-attr]
    scope = a.scope_of.get(id(loader))
    bound = [b for b in a.bindings if b.scope is scope and b.key == name]
    return cst.Name(name) if scope is not None and len(bound) <= 1 else None


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


def _reads(r: Rewrite, key: tuple[int, str]) -> list[cst.Name]:
    """The names that read ``key`` (its scope's node id, its name): not its bindings, nor
    keywords or attributes spelled like it."""
    a = r.analysis
    found = []
    for name in nodes(a.module, cst.Name):
        scope = a.scope_of.get(id(name))
        if scope is None or (id(scope.node), name.value) != key:  # type: ignore[attr-defined]
            continue
        parent = a.parent(name)
        if isinstance(parent, cst.AssignTarget | cst.Arg | cst.Attribute) and (
            getattr(parent, "keyword", None) is name or getattr(parent, "attr", None) is name
        ):
            continue
        if not isinstance(parent, cst.AssignTarget):
            found.append(name)
    return found


def _uses(r: Rewrite, samplers: dict[tuple[int, str], _Named]) -> None:
    """Where each named sampler was handed over and set to an epoch."""
    a = r.analysis
    loaders: dict[tuple[int, str], cst.BaseExpression] = {}
    for key, sampler in samplers.items():
        for name in _reads(r, key):
            parent = a.parent(name)
            batches = _batch_sampler_of(r, parent)
            if batches is not None:
                sampler.handed_to.add("batches")
                loaders[key] = _batch_sampler_loader(r, batches)
                continue
            if isinstance(parent, cst.Arg) and parent.keyword and parent.keyword.value == "sampler":
                loader = a.parent(parent)
                sampler.handed_to.add("loader")
                _give_shuffle(r, loader, parent, sampler.call, sampler.shuffle)  # type: ignore[arg-type]
                binding = a.parent(loader)
                if isinstance(binding, cst.Assign) and isinstance(
                    binding.targets[0].target, cst.Name
                ):
                    loaders[key] = binding.targets[0].target  # type: ignore[index]
                continue
            printed = _printed(a, name)
            if printed is not None:
                sampler.printed.append(printed)
                continue
            _epoch_of(r, name, loaders.get(key))
    for attribute in nodes(a.module, cst.Attribute):
        if attribute.attr.value != "sampler":  # type: ignore[attr-defined]
            continue
        epoch = _set_epoch(a, a.parent(attribute))
        if epoch is not None:
            r.edits.replace(epoch, _epoch(attribute.value, epoch))  # type: ignore[attr-defined]


def _printed(a: Analysis, name: cst.Name) -> cst.CSTNode | None:
    """The line ``print(...)`` that only formats ``name`` (``"%s" % str(sampler)``, ``f"{s}"``,
    ``repr(s)``): a DistributedSampler has no ``__repr__`` of its own, so it prints its address."""
    node: cst.CSTNode = name
    while True:
        parent = a.parent(node)
        if isinstance(parent, cst.Arg) and not parent.keyword and not parent.star:
            call = a.parent(parent)
            if not isinstance(call, cst.Call):
                return None
            if _builtin(a, call, "print"):
                statement = a.parent(call)
                line = a.parent(statement) if isinstance(statement, cst.Expr) else None
                alone = isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1
                return line if alone and not any(arg.keyword for arg in call.args) else None
            if len(call.args) != 1 or not (_builtin(a, call, "str") or _builtin(a, call, "repr")):
                return None
            node = call
        elif isinstance(parent, cst.BinaryOperation) and isinstance(parent.operator, cst.Modulo):
            if parent.right is not node:
                return None
            node = parent
        elif isinstance(parent, cst.FormattedStringExpression) and parent.format_spec is None:
            node = a.parent(parent)  # type: ignore[assignment]
        elif isinstance(parent, cst.Tuple | cst.Element | cst.FormattedString):
            node = parent
        else:
            return None


def _builtin(a: Analysis, call: cst.Call, name: str) -> bool:
    return (
        isinstance(call.func, cst.Name)
        and call.func.value == name
        and name not in a.names.defined
        and a.names.qualify(call.func) is None
    )


def _epoch_of(r: Rewrite, name: cst.Name, loader: cst.BaseExpression | None) -> None:
    """``name.set_epoch(e)`` -> ``loader.set_epoch(e)``; any other use is refused."""
    epoch = _set_epoch(r.analysis, r.analysis.parent(name))
    if epoch is None or loader is None:
        raise r.refuse(
            name,
            DDP_SAMPLER,
            "this DistributedSampler is used other than by its DataLoader and set_epoch",
        )
    r.edits.replace(epoch, _epoch(loader, epoch))


def _set_epoch(a: Analysis, node: cst.CSTNode | None) -> cst.Call | None:
    """The ``X.set_epoch(e)`` call ``node`` (the ``X.set_epoch`` attribute) belongs to."""
    if not isinstance(node, cst.Attribute) or node.attr.value != "set_epoch":
        return None
    call = a.parent(node)
    return call if isinstance(call, cst.Call) and len(call.args) == 1 else None


def _epoch(loader: cst.BaseExpression, call: cst.Call) -> cst.Call:
    return cst.Call(placeholder("set_epoch"), args=[cst.Arg(loader), call.args[0]])
