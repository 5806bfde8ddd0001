"""``DDP(model, device_ids=[rank], **options)`` -> ``model``; ``model.module`` -> the bare model.

The single-process script trains the bare model and the conversion prepares it, which wraps it
again on several processes. The options that change what DistributedDataParallel does carry over
as ``DistributedDataParallelKwargs`` (the accelerator's ``kwargs_handlers``); where to put the
model (``device_ids``, ``output_device``) is the accelerator's to decide. ``model.module`` of a
wrapped model is the bare model: ``accelerator.unwrap_model(model)``, which is the model itself
on one process or before prepare(), and the module inside the wrapper after it (an alias such as
``raw_model = model.module`` keeps meaning the bare module wherever it is taken). Reached through
(``model.module.decode(z)``), it becomes ``model.decode(z)``, which the conversion's unwrap step
sends to the module. A parameter that every call of its function hands a wrapped model holds one
too (FixMatch's ``model.module if hasattr(model, "module") else model`` in ``train(args, model,
...)``). Any other ``.module`` in the file is refused: it may be a wrapper's that the rewrite did
not see.

``nn.DataParallel(model, device_ids=...)`` goes too, where the script wraps the model only in
an ``if`` with no ``else`` (``if torch.cuda.device_count() > 1:``, ``if device == "cuda":``,
DCGAN's ``ngpu > 1``): the script then trains the bare model on the full batch on the runs that
skip it, so its forward does not rely on the share of the batch each GPU gets, and one process
per GPU (``accel-run``) replaces one process driving them all. The ``if`` goes with it when it
only wrapped and printed; cuDNN flags set there stay, and so does a move of the model, for the
conversion's moves step to read. One on every path goes as well where it spreads the batch over
whatever GPUs there are (no ``device_ids``) and the script reads no GPU count: it then runs on
one GPU too, with the whole batch, so its forward relies on no share. Its checkpoints are keyed
``module.`` on every run, though, so one whose own ``state_dict()`` the script saves or loads
(not the ``.module``'s) stays. Any other DataParallel is refused.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator

import libcst as cst

from accelify.transform.analysis import Analysis, Scope, arguments, key_of, unwrap_moves
from accelify.transform.distributed.context import Rewrite
from accelify.transform.patterns import dotted_name, placeholder, runs_as_script, shows
from accelify.transform.refusals import DDP_WRAPPER
from accelify.transform.walk import nodes

# Options DistributedDataParallelKwargs takes, as DistributedDataParallel does.
CARRIED = frozenset(
    {
        "find_unused_parameters",
        "broadcast_buffers",
        "gradient_as_bucket_view",
        "static_graph",
        "bucket_cap_mb",
        "check_reduction",
    }
)
_PLACEMENT = frozenset({"device_ids", "output_device"})
_DP_PARAMETERS = ("module", "device_ids", "output_device", "dim")
# Names that count GPUs: ngpu, n_gpu, num_gpus, gpu_count, ngpus_per_node.
_GPU_COUNT = re.compile(r"(n|num)_?gpus?(_per_node)?|gpu_count")


# The wrappers, by the last part of their name in torch.
WRAPPERS = ("DistributedDataParallel", "DataParallel")


def wrapper_of(a: Analysis, call: cst.Call) -> str | None:
    """``"DistributedDataParallel"`` or ``"DataParallel"`` when ``call`` builds that wrapper."""
    last = a.names.last_part(call.func)
    if last in WRAPPERS and a.names.refers_to(call.func, ("torch",), last):
        return last
    return None


def unwrap_ddp(r: Rewrite) -> None:
    a = r.analysis
    everywhere: list[cst.Call] = []  # DataParallels that wrapped the model on every path
    for call, scope in a.calls:
        wrapper = wrapper_of(a, call)
        if wrapper is None:
            continue
        model = _options(r, call) if wrapper == WRAPPERS[0] else _data_parallel(r, call)
        parent = a.parent(call)
        if wrapper == WRAPPERS[1]:  # ``model = nn.DataParallel(model).cuda()`` assigns it too
            parent = _assigning(a, call) or parent
        line = a.parent(parent) if isinstance(parent, cst.Assign) else None
        target = parent.targets[0].target if isinstance(parent, cst.Assign) else None
        if target is not None and key_of(target) is not None:
            r.wrapped.add((r.owner(scope, key_of(target)), key_of(target)))  # type: ignore[arg-type]
        if wrapper == WRAPPERS[1]:
            if _drop_data_parallel(r, call, model, parent, scope):
                everywhere.append(call)
            continue
        same = target is not None and _already(r, scope, target, model)
        if same and isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1:
            r.remove(line)
        else:
            r.edits.replace(call, lambda _node, m=model: m)
        r.changed(call, "DistributedDataParallel removed: prepare() wraps the model")
    _handed_on(r)
    if everywhere:
        _keys_kept(r, everywhere[0])
    for attribute in nodes(a.module, cst.Attribute):
        if attribute.attr.value != "module":  # type: ignore[attr-defined]
            continue
        if not r.is_wrapped(attribute.value):  # type: ignore[attr-defined]
            raise r.refuse(
                attribute, DDP_WRAPPER, "reads .module of a model the conversion cannot follow"
            )
        parent = a.parent(attribute)
        if isinstance(parent, cst.Attribute) and parent.value is attribute:
            # ``model.module.decode(z)``: the unwrap step reaches what the model's class adds.
            r.edits.replace(attribute, lambda node: node.value)  # type: ignore[attr-defined]
            continue
        either = _either(a, attribute)  # ``model.module if ddp else model``: the bare model too
        r.edits.replace(
            either or attribute,
            lambda _node, m=attribute.value: cst.Call(placeholder("unwrap_model"), [cst.Arg(m)]),  # type: ignore[attr-defined]
        )


def _drop_data_parallel(
    r: Rewrite, call: cst.Call, model: cst.BaseExpression, parent: cst.CSTNode, scope: Scope
) -> bool:
    """Remove ``nn.DataParallel(model)`` (assigned by ``parent``, in ``scope``), and the ``if``
    around it where it only wrapped; True when it wrapped the model on every path."""
    a = r.analysis
    code = a.module.code_for_node
    line = a.parent(parent) if isinstance(parent, cst.Assign) else None
    target = parent.targets[0].target if isinstance(parent, cst.Assign) else None
    branch, kept = _optional_branch(r, call, line)
    already = target is not None and _already(r, scope, target, model)
    if target is None or (branch is not None and not already):
        raise r.refuse(call, DDP_WRAPPER, "DataParallel's wrapper is kept under another name")
    moved = unwrap_moves(parent.value) is not parent.value  # type: ignore[union-attr]
    if moved or not already:  # ``model = model.cuda()`` stays: the script's device choice
        r.edits.replace(call, lambda _node, m=model: m)
    elif kept or branch is None:
        r.remove(line)
    elif not r.edits.is_removed(branch):
        r.remove(branch)
    if branch is None:
        what = (
            "though it wrapped the model on every path: the script reads no GPU count, so its "
            "forward takes whatever share of the batch it is given (all of it on one GPU)"
        )
    elif moved or kept:
        what = f"from the `if {code(branch.test)}:`{_what_stays(kept, moved)}"
    else:
        what = f"with the `if {code(branch.test)}:` around it, which only wrapped or printed"
    r.changed(
        call,
        f"DataParallel removed {what}: prepare() wraps the model, and accel-run starts one "
        "process per GPU where DataParallel drove them all from one",
    )
    return branch is None


def _handed_on(r: Rewrite) -> None:
    """A parameter that every call of its function hands a wrapped model (``train(args, model,
    ...)`` given the DDP model, FixMatch's ``model.module if hasattr(model, "module") else
    model`` inside) holds it too; so do the parameters it is handed on to. A function also named
    other than as a call's callee (``mp.spawn(train, ...)``, a callback) may get anything, and
    one call that gives something else, or leaves the parameter to its default, is enough to
    leave the parameter out. Nor is one the function rebinds followed."""
    a = r.analysis
    calls: dict[int, tuple[Scope, list[cst.Call]]] = {}
    for call, _scope in a.calls:
        callee = a.callee(call)
        if callee is not None and not callee.is_module:
            calls.setdefault(id(callee.node), (callee, []))[1].append(call)
    named = Counter(n.value for n in nodes(a.module, cst.Name))  # type: ignore[attr-defined]
    attributes = Counter(n.attr.value for n in nodes(a.module, cst.Attribute))  # type: ignore[attr-defined]
    followed = [
        (callee, found)
        for callee, found in calls.values()
        if _only_called(callee, len(found), named, attributes)
    ]
    grown = True
    while grown:
        grown = False
        for callee, found in followed:
            for param in callee.params:
                key = (id(callee.node), param)
                if key in r.wrapped or any(
                    b.scope is callee and b.key == param for b in a.bindings
                ):
                    continue
                if all(
                    any(p == param and r.is_wrapped(v) for p, v in arguments(c, callee))
                    for c in found
                ):
                    r.wrapped.add(key)
                    grown = True


def _only_called(
    function: Scope, calls: int, named: Counter[str], attributes: Counter[str]
) -> bool:
    """Whether the function's name appears in the file only as the callee of its ``calls``:
    ``named`` counts every name in the file, ``attributes`` the names after a dot."""
    name = function.name
    if function.cls is not None:
        return attributes[name] == calls
    return named[name] - attributes[name] == calls + 1  # and its own ``def``


def _assigning(a: Analysis, call: cst.Call) -> cst.Assign | None:
    """The one-target assignment whose value is ``call``, moved or not (``.cuda()``)."""
    statement = a.statement_of(call)
    small = statement.body[0] if isinstance(statement, cst.SimpleStatementLine) else None
    if isinstance(small, cst.Assign) and len(small.targets) == 1:
        return small if unwrap_moves(small.value) is call else None
    return None


def _data_parallel(r: Rewrite, call: cst.Call) -> cst.BaseExpression:
    """The model ``nn.DataParallel`` wraps; its placement options go with it."""
    if any(arg.star for arg in call.args):
        raise r.refuse(call, DDP_WRAPPER, "DataParallel is given its arguments with *")
    given = {
        arg.keyword.value if arg.keyword is not None else _DP_PARAMETERS[min(i, 3)]: arg.value
        for i, arg in enumerate(call.args)
    }
    dim = given.get("dim")
    if dim is not None and not (isinstance(dim, cst.Integer) and dim.value == "0"):
        raise r.refuse(call, DDP_WRAPPER, "DataParallel's dim= splits the batch along another axis")
    if "module" not in given or set(given) - set(_DP_PARAMETERS):
        raise r.refuse(call, DDP_WRAPPER, "DataParallel is given arguments it does not take")
    return given["module"]


def _optional_branch(
    r: Rewrite, call: cst.Call, line: cst.CSTNode | None
) -> tuple[cst.If | None, list[cst.BaseStatement]]:
    """The ``if`` (with no ``else``) that wraps the model only on some runs (``if
    torch.cuda.device_count() > 1:``, ``if device == "cuda":``), and the lines of it that stay
    (none: it goes whole, as it does nothing else but wrap and print). The script runs the bare
    model on the full batch when the test fails, so its forward does not rely on the share of
    the batch each GPU gets (``x.view(batch_size // num_gpus, ...)``). Its other lines may only
    set cuDNN's flags or move a model it wraps (``net.cuda()``, read by the conversion's moves
    step), which stay; any other DataParallel is refused."""
    a = r.analysis
    block = a.parent(line) if line is not None else None
    branch = a.parent(block) if isinstance(block, cst.IndentedBlock) else None
    if isinstance(branch, cst.If) and branch.orelse is not None:
        raise r.refuse(
            call,
            DDP_WRAPPER,
            f"DataParallel wraps the model under an `if` whose `else` (line "
            f"{a.line(branch.orelse)}) takes another path, which dropping the wrapper would "
            "have to account for",
        )
    counted = _gpu_count_read(a)
    if counted is not None:
        raise r.refuse(
            counted,
            DDP_WRAPPER,
            "the script reads the GPU count here (beyond the test around DataParallel and "
            "what it prints), as for a batch DataParallel spread over them: launched one "
            "process per GPU, every process still sees them all and would read it too",
        )
    if not isinstance(branch, cst.If) or runs_as_script(branch):
        _on_any_gpus(r, call)
        return None, []
    more = [s for s in block.body if not _about_the_gpus(a, s)]  # type: ignore[union-attr]
    wrapped = [
        _data_parallel(r, c)
        for c in nodes(block, cst.Call)  # type: ignore[arg-type]
        if wrapper_of(a, c) == WRAPPERS[1]
    ]
    kept = [s for s in more if _sets_a_backend_flag(s) or _moves(s, wrapped)]
    if len(kept) < len(more):
        raise r.refuse(
            next(s for s in more if s not in kept),
            DDP_WRAPPER,
            f"the `if {a.module.code_for_node(branch.test)}:` around DataParallel does more than "
            "wrap, print and set cuDNN's flags: launched one process per GPU, every process "
            "still sees them all and would run it",
        )
    return branch, kept


def _on_any_gpus(r: Rewrite, call: cst.Call) -> None:
    """Refused unless DataParallel, wrapping the model on every path, spreads the batch over
    whatever GPUs the machine has (no ``device_ids``, or all of them): the script then runs on
    one GPU, where DataParallel hands the model the whole batch, so its forward cannot rely on
    a share. ``device_ids=[0, 1]`` or ``range(args.ngpu)`` fix how many GPUs split it."""
    ids = next(
        (
            arg.value
            for i, arg in enumerate(call.args)
            if (arg.keyword.value if arg.keyword else _DP_PARAMETERS[min(i, 3)]) == "device_ids"
        ),
        None,
    )
    if ids is None or _all_gpus(r.analysis, ids):
        counted = _gpu_count_named(r.analysis, call)
        if counted is None:
            return
        raise r.refuse(
            counted,
            DDP_WRAPPER,
            f"the script reads {r.analysis.module.code_for_node(counted)}, a count of GPUs, "
            "beside the DataParallel that wraps the model on every path: its forward may split "
            "the batch by it (batch_size // num_gpus), which one process per GPU does not give",
        )
    raise r.refuse(
        call,
        DDP_WRAPPER,
        f"DataParallel wraps the model on every path over the GPUs "
        f"`device_ids={r.analysis.module.code_for_node(ids)}` names: the script fixes how many "
        "GPUs split each batch, and its forward may rely on the share each one gets, which one "
        "process per GPU does not give; drop it by hand where the model does not",
    )


def _gpu_count_named(a: Analysis, wrapper: cst.Call) -> cst.BaseExpression | None:
    """A read, outside what is only printed and the wrapper's own arguments, of a name that
    counts GPUs (``num_gpus = 4`` read by a forward's ``view(batch_size // num_gpus, ...)``,
    ``args.ngpu``), or None."""
    for node in [*nodes(a.module, cst.Name), *nodes(a.module, cst.Attribute)]:
        name = node.value if isinstance(node, cst.Name) else node.attr.value  # type: ignore[attr-defined]
        if not _GPU_COUNT.fullmatch(name.lower()) or a.contains(wrapper, node):
            continue
        parent = a.parent(node)
        if isinstance(node, cst.Name) and isinstance(parent, cst.Attribute) and parent.attr is node:
            continue  # the attribute itself is the read
        assigned = a.parent(parent) if isinstance(parent, cst.AssignTarget) else None
        if assigned is not None or any(shows(c) for c in _calls_around(a, node)):
            continue
        return node  # type: ignore[return-value]
    return None


def _all_gpus(a: Analysis, ids: cst.BaseExpression) -> bool:
    """``None``, or ``range(torch.cuda.device_count())`` (in a ``list`` or not): every GPU."""
    if isinstance(ids, cst.Name):
        return ids.value == "None"
    if not isinstance(ids, cst.Call) or a.names.last_part(ids.func) not in {"list", "range"}:
        return False
    if len(ids.args) != 1 or ids.args[0].keyword is not None:
        return False
    inner = ids.args[0].value
    if isinstance(inner, cst.Call) and a.names.last_part(inner.func) == "device_count":
        return not inner.args
    return a.names.last_part(ids.func) == "list" and _all_gpus(a, inner)


def _keys_kept(r: Rewrite, wrapper: cst.Call) -> None:
    """Refused where the script reads the state dict of a model DataParallel wrapped on every
    path through the wrapper (``model.state_dict()``, not ``model.module.state_dict()``), or
    pickles the wrapper whole: every checkpoint it wrote is keyed ``module.``, which dropping
    the wrapper drops, so the ones it wrote before, and its loaders, no longer match."""
    a = r.analysis

    def wrapped(node: cst.CSTNode, value: cst.BaseExpression) -> bool:
        """``value`` holds the wrapper there: not the bare model above the wrap."""
        same = a.scope_of.get(id(node)) is a.scope_of[id(wrapper)]
        return r.is_wrapped(value) and not (same and a.line(node) < a.line(wrapper))

    for attribute in nodes(a.module, cst.Attribute):
        if attribute.attr.value in {"state_dict", "load_state_dict"} and wrapped(  # type: ignore[attr-defined]
            attribute,
            attribute.value,  # type: ignore[attr-defined]
        ):
            raise r.refuse(
                attribute,
                DDP_WRAPPER,
                f"{a.module.code_for_node(attribute)} reads the state of the DataParallel "
                f"(line {a.line(wrapper)}) that wraps the model on every path, keyed "
                "`module.`: dropping the wrapper drops the prefix, so checkpoints written "
                "before, and the loaders that expect it, would no longer match",
            )
    for call, _scope in a.calls:
        if a.names.last_part(call.func) == "save" and any(
            wrapped(call, arg.value) for arg in call.args
        ):
            raise r.refuse(
                call,
                DDP_WRAPPER,
                f"the script saves the DataParallel (line {a.line(wrapper)}) that wraps the "
                "model on every path whole: dropping the wrapper would pickle another class",
            )


def _gpu_count_read(a: Analysis) -> cst.Call | None:
    """A ``torch.cuda.device_count()`` outside the tests of the ``if``s that wrap a model in
    DataParallel, outside the wrappers' own arguments (``device_ids=range(...)``, which go with
    them) and outside what is only printed or logged (``batch_size *=
    torch.cuda.device_count()``), or None."""
    for call in nodes(a.module, cst.Call):
        if a.names.last_part(call.func) != "device_count":  # type: ignore[attr-defined]
            continue
        if any(wrapper_of(a, outer) == WRAPPERS[1] for outer in _calls_around(a, call)):
            continue
        branch = a.enclosing(call, (cst.If,))
        if (
            isinstance(branch, cst.If)
            and a.contains(branch.test, call)
            and any(wrapper_of(a, c) == WRAPPERS[1] for c in nodes(branch.body, cst.Call))  # type: ignore[arg-type]
        ):
            continue
        if not any(shows(outer) for outer in _calls_around(a, call)):
            return call  # type: ignore[return-value]
    return None


def _calls_around(a: Analysis, node: cst.CSTNode) -> Iterator[cst.Call]:
    """The calls ``node`` is an argument of, innermost first."""
    outer = a.enclosing(node, (cst.Call,))
    while outer is not None:
        yield outer  # type: ignore[misc]
        outer = a.enclosing(outer, (cst.Call,))


def _sets_a_backend_flag(statement: cst.BaseStatement) -> bool:
    """``cudnn.benchmark = True`` (or ``torch.backends.cudnn.deterministic = ...``)."""
    if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
        return False
    small = statement.body[0]
    if not isinstance(small, cst.Assign) or len(small.targets) != 1:
        return False
    target = dotted_name(small.targets[0].target)
    return target is not None and target.split(".")[-2:-1] == ["cudnn"]


def _what_stays(kept: list[cst.BaseStatement], moved: bool) -> str:
    """What the report says of the ``if``'s other lines: cuDNN flags stay; a move of the model
    is the conversion's to read (it removes it, as prepare() places the model)."""
    flags = sum(_sets_a_backend_flag(s) for s in kept)
    said = ", whose cuDNN flags stay" if flags else ""
    if moved or flags < len(kept):
        said += " (the move of the model there is read like any other)"
    return said


def _moves(statement: cst.BaseStatement, models: list[cst.BaseExpression]) -> bool:
    """``net.cuda()`` or ``net = net.to(device)``: a line that only moves one of ``models``."""
    if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
        return False
    small = statement.body[0]
    if isinstance(small, cst.Assign):
        if len(small.targets) != 1:
            return False
        target: cst.BaseExpression | None = small.targets[0].target
    elif isinstance(small, cst.Expr):
        target = None
    else:
        return False
    moved = unwrap_moves(small.value)
    return moved is not small.value and any(
        moved.deep_equals(m) and (target is None or target.deep_equals(m)) for m in models
    )


def _about_the_gpus(a: Analysis, statement: cst.BaseStatement) -> bool:
    """A line that only prints, or only wraps a model in DataParallel."""
    if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
        return False
    small = statement.body[0]
    value = small.value if isinstance(small, cst.Expr | cst.Assign) else None
    if not isinstance(value, cst.Call):
        return False
    if isinstance(small, cst.Assign):
        wrapped = unwrap_moves(value)
        return isinstance(wrapped, cst.Call) and wrapper_of(a, wrapped) == WRAPPERS[1]
    return isinstance(value.func, cst.Name) and value.func.value == "print"


def _either(a: Analysis, attribute: cst.Attribute) -> cst.IfExp | None:
    """The ``x.module if c else x`` (or ``x if c else x.module``) around ``attribute``."""
    parent = a.parent(attribute)
    if not isinstance(parent, cst.IfExp) or parent.test is attribute:
        return None
    other = parent.orelse if parent.body is attribute else parent.body
    return parent if other.deep_equals(attribute.value) else None


def _already(
    r: Rewrite, scope: Scope, target: cst.BaseExpression, model: cst.BaseExpression
) -> bool:
    """Whether ``target`` already holds ``model`` (``self.model = model.to(rank)`` above
    ``self.model = DDP(model)``: a module's ``.to`` moves it in place and returns it)."""
    code = r.analysis.module.code_for_node
    if code(target) == code(model):
        return True
    line = r.analysis.line(target)
    earlier = [
        b
        for b in r.analysis.bindings
        if b.scope is scope and b.key == key_of(target) and r.analysis.line(b.node) < line
    ]
    last = max(earlier, key=lambda b: r.analysis.line(b.node), default=None)
    return (
        last is not None
        and last.value is not None
        and not last.nested
        and code(unwrap_moves(last.value)) == code(model)
    )


def _options(r: Rewrite, call: cst.Call) -> cst.BaseExpression:
    """The wrapped model; the options that carry over go to ``r.ddp_options``."""
    model = next((arg.value for arg in call.args if arg.keyword is None), None)
    positional = [arg for arg in call.args if arg.keyword is None]
    if model is None or len(positional) > 2 or any(arg.star for arg in call.args):
        raise r.refuse(call, DDP_WRAPPER, "DistributedDataParallel is given options by position")
    for arg in call.args:
        if arg.keyword is None or arg.keyword.value in _PLACEMENT:
            continue
        name = arg.keyword.value
        if name not in CARRIED:
            raise r.refuse(
                call, DDP_WRAPPER, f"DistributedDataParallel's {name}= has no Accelerate equivalent"
            )
        if not isinstance(arg.value, cst.Name | cst.Integer | cst.Float) or (
            isinstance(arg.value, cst.Name) and arg.value.value not in {"True", "False"}
        ):
            raise r.refuse(
                arg, DDP_WRAPPER, f"{name}= is computed; set DistributedDataParallelKwargs by hand"
            )
        earlier = r.ddp_options.get(name)
        if earlier is not None and earlier.deep_equals(arg.value) is False:
            raise r.refuse(arg, DDP_WRAPPER, f"the models are wrapped with different {name}=")
        r.ddp_options[name] = arg.value
    return model
