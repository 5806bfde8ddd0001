"""``mp.spawn(main, args=(a, world_size), nprocs=world_size)`` -> ``main(a)``.

``accel-run`` starts the processes now, so the spawned function is called once per process, as
a plain call. Its first parameter (the rank ``spawn`` passes) and any parameter given the
``nprocs`` value (the world size) become its first statements, read from the accelerator: the
function then reads exactly as the same program written for ``torchrun`` does
(``rank = dist.get_rank()``), and both convert to the same code.
"""

from __future__ import annotations

import libcst as cst

from accelify.transform.analysis import Scope, name_nodes
from accelify.transform.distributed.context import Rewrite
from accelify.transform.patterns import dotted_name, keyword_arg, placeholder
from accelify.transform.refusals import DDP_LAUNCH


def unspawn(r: Rewrite) -> None:
    a = r.analysis
    for call, scope in a.calls:
        if a.names.last_part(call.func) != "spawn" or not a.names.from_package(
            call.func, "torch.multiprocessing"
        ):
            continue
        _unspawn(r, call, scope)


def _unspawn(r: Rewrite, call: cst.Call, scope: Scope) -> None:
    a = r.analysis
    statement = r.bare_statement(call, DDP_LAUNCH)
    allowed = {"args", "nprocs", "join"}
    if (
        not call.args
        or call.args[0].keyword is not None
        or any(
            arg.keyword is not None and arg.keyword.value not in allowed for arg in call.args[1:]
        )
    ):
        raise r.refuse(
            call, DDP_LAUNCH, "this mp.spawn call has options accel-run cannot take over"
        )
    spawned = keyword_arg(call, "args")
    values = _arguments(spawned.value if spawned is not None else None)
    if values is None:
        raise r.refuse(call, DDP_LAUNCH, "mp.spawn's args are not a literal tuple")
    nprocs = keyword_arg(call, "nprocs")
    size = a.module.code_for_node(nprocs.value) if nprocs is not None else None
    sized = {
        i
        for i, value in enumerate(values)
        if size is not None and a.module.code_for_node(value) == size
    }
    targets = _spawned(r, call, scope)
    for target in targets:
        _receive_rank(r, call, target, len(values), sized)
    passed = [cst.Arg(v) for i, v in enumerate(values) if i not in sized]
    plain = cst.Expr(cst.Call(call.args[0].value, args=_commas_args(passed)))
    r.edits.replace(statement, lambda node: node.with_changes(body=[plain]))
    spawned_names = ", ".join(f"{target.name}()" for target in targets)
    r.changed(call, f"mp.spawn -> a plain call of {spawned_names}: accel-run starts the processes")


def _spawned(r: Rewrite, call: cst.Call, scope: Scope) -> list[Scope]:
    """The functions ``mp.spawn`` starts: the one it names, or, where it starts a parameter of
    the function around it (the PyTorch tutorial's ``run_demo(demo_fn, world_size)``), every
    function this file's calls of that function pass for it."""
    a = r.analysis
    name = dotted_name(call.args[0].value) or ""
    target = a.functions.get(name)
    if target is not None and target.cls is None:
        return [target]
    if scope.is_module or scope.cls is not None or name not in _positional(scope):
        raise r.refuse(call, DDP_LAUNCH, "the spawned function is not a function of this file")
    runner = scope.name
    calls = [c for c, _s in a.calls if dotted_name(c.func) == runner]
    named = {id(scope.node.name), *(id(c.func) for c in calls)}  # type: ignore[union-attr]
    others = [n for n in name_nodes(a.module, runner) if id(n) not in named]
    if not calls or others:
        how = "is not called in this file" if not calls else "is also used other than called"
        raise r.refuse(
            call, DDP_LAUNCH, f"the spawned {name} is {runner}()'s parameter, and {runner}() {how}"
        )
    found = []
    for c in calls:
        given = _argument_for(c, _positional(scope).index(name), name)
        target = a.functions.get(dotted_name(given) or "") if given is not None else None
        if target is None or target.cls is not None:
            raise r.refuse(
                c, DDP_LAUNCH, f"{runner}() is given a {name} that is not a function of this file"
            )
        if target not in found:
            found.append(target)
    return found


def _positional(scope: Scope) -> list[str]:
    params = scope.node.params  # type: ignore[union-attr]
    return [p.name.value for p in (*params.posonly_params, *params.params)]


def _argument_for(call: cst.Call, index: int, keyword: str) -> cst.BaseExpression | None:
    """What ``call`` passes for the parameter at ``index`` named ``keyword``."""
    for position, arg in enumerate(call.args):
        if arg.star:
            return None
        if arg.keyword is None and position == index:
            return arg.value
        if arg.keyword is not None and arg.keyword.value == keyword:
            return arg.value
    return None


def _receive_rank(r: Rewrite, call: cst.Call, target: Scope, given: int, sized: set[int]) -> None:
    """``target``, started by mp.spawn with the rank and ``given`` arguments, reads the rank (and
    the arguments at ``sized``, the world size) from the accelerator instead of parameters."""
    a = r.analysis
    if sum(dotted_name(c.func) == target.name for c, _s in a.calls) != 0:
        raise r.refuse(call, DDP_LAUNCH, f"{target.name}() is also called directly")
    function: cst.FunctionDef = target.node  # type: ignore[assignment]
    params = function.params
    if (
        params.star_arg is not cst.MaybeSentinel.DEFAULT
        or params.posonly_params
        or len(params.params) < given + 1
        or any(p.default is not None for p in params.params[: given + 1])
    ):
        raise r.refuse(
            function, DDP_LAUNCH, f"{target.name}()'s parameters do not match mp.spawn's args"
        )
    rest = params.params[1:]
    reads = [(params.params[0].name.value, "process_index")]
    reads += [(rest[i].name.value, "num_processes") for i in sorted(sized)]
    kept = [p for i, p in enumerate(rest) if i not in sized]
    r.edits.replace(params, params.with_changes(params=_commas(kept)))
    statements = [
        cst.parse_statement(f"{name} = {placeholder(what).value}\n") for name, what in reads
    ]
    _insert_at_top(r, function, statements)
    for name, what in reads:
        r.ranks[(id(function), name)] = what


def _arguments(expr: cst.BaseExpression | None) -> list[cst.BaseExpression] | None:
    if expr is None:
        return []
    if isinstance(expr, cst.Tuple | cst.List) and all(
        isinstance(e, cst.Element) for e in expr.elements
    ):
        return [e.value for e in expr.elements]
    return None


def _commas(params: list[cst.Param]) -> list[cst.Param]:
    return [
        p.with_changes(comma=cst.MaybeSentinel.DEFAULT) if i == len(params) - 1 else p
        for i, p in enumerate(params)
    ]


def _commas_args(args: list[cst.Arg]) -> list[cst.Arg]:
    comma = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
    return [a.with_changes(comma=comma) for a in args[:-1]] + args[-1:]


def _insert_at_top(r: Rewrite, function: cst.FunctionDef, new: list[cst.BaseStatement]) -> None:
    """Put ``new`` first in the body, after its docstring."""
    body = list(function.body.body)  # type: ignore[union-attr]
    docstring = function.get_docstring(clean=False) is not None
    anchor = body[1] if docstring and len(body) > 1 else body[0]
    if docstring and len(body) == 1:
        r.edits.insert_after(body[0], *new)
    else:
        r.edits.insert_before(anchor, *new, first=True)
