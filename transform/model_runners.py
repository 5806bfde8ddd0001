"""Whether a helper beside the script only runs the model it is handed.

``validate(net, valid_loader)`` or ``utils.print_network(G)`` from a module beside ``train.py``:
after prepare() the helper gets the wrapper (DistributedDataParallel on several processes), which
answers a forward call, ``eval()``, ``train()``, ``parameters()`` and ``print`` as the module it
wraps does, and nothing else (``net.init_hidden()``, ``net.fc``, ``net.module`` fail or differ).
Each forward of the wrapper may also be a collective (it broadcasts the module's buffers), so
every process has to run as many: the helper's forwards may only repeat over what it is handed
or a ``range``, never under an ``if``, a ``while`` or a ``break`` that its data could decide. A
helper that trains (``backward``, ``step``) is not one of these: its step would not be converted.
"""

from __future__ import annotations

import ast

from accelify.transform.neighbours import beside, callee, defined_in, parameter

_KEPT_METHODS = frozenset({"eval", "train"})
# What a counting loop may read of each parameter: ``sum(p.numel() for p in net.parameters())``.
_SIZES = frozenset({"numel", "nelement"})
_LOOP_HELPERS = frozenset({"enumerate", "tqdm", "zip", "range"})
_TRAINS = frozenset({"backward", "step", "zero_grad", "no_sync"})
_COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)


def only_runs(path: str, qualified: str, arg: int | str) -> bool:
    """Whether the function ``qualified`` of a module beside ``path`` uses the parameter a call
    hands ``arg`` (a position or a keyword) only as a model the wrapper stands in for."""
    tree, name = beside(path, qualified)
    function = defined_in(tree, name, ast.FunctionDef)
    if function is None or function.decorator_list:
        return False
    param = parameter(function, arg)
    if param is None or _trains_or_nests(function):
        return False
    parents = {id(c): n for n in ast.walk(function) for c in ast.iter_child_nodes(n)}
    params = {a.arg for a in (*function.args.posonlyargs, *function.args.args)}
    params |= {a.arg for a in function.args.kwonlyargs}
    uses = [n for n in ast.walk(function) if isinstance(n, ast.Name) and n.id == param]
    return bool(uses) and all(_runs(n, parents, function, params) for n in uses)


def _trains_or_nests(function: ast.FunctionDef) -> bool:
    """A step, a nested scope, or control flow that data may decide (how often the loops run:
    ``continue``, ``break``, a ``return`` in a loop, an exception caught)."""
    for node in ast.walk(function):
        if node is function:
            continue
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | ast.ClassDef):
            return True
        if isinstance(node, ast.While | ast.Break | ast.Continue | ast.Try):
            return True
        if isinstance(node, ast.Global | ast.Nonlocal):
            return True
        if isinstance(node, ast.For) and any(isinstance(n, ast.Return) for n in ast.walk(node)):
            return True
        if isinstance(node, ast.Attribute) and node.attr in _TRAINS:
            return True
    return False


def _runs(
    name: ast.Name, parents: dict[int, ast.AST], function: ast.FunctionDef, params: set[str]
) -> bool:
    parent = parents.get(id(name))
    if not isinstance(name.ctx, ast.Load):
        return False
    if isinstance(parent, ast.Call) and parent.func is name:  # a forward
        return _in_lockstep(parent, parents, function, params)
    if isinstance(parent, ast.Call) and callee(parent) == "print" and name in parent.args:
        return True
    if not isinstance(parent, ast.Attribute):
        return False
    call = parents.get(id(parent))
    if not isinstance(call, ast.Call) or call.func is not parent:
        return False
    if parent.attr in _KEPT_METHODS:
        return all(isinstance(a, ast.Constant) for a in call.args) and not call.keywords
    return parent.attr == "parameters" and _only_counted(call, parents)


def _only_counted(call: ast.Call, parents: dict[int, ast.AST]) -> bool:
    """``for p in net.parameters(): n += p.numel()`` (or a generator of it): each parameter is
    only measured."""
    holder = parents.get(id(call))
    if isinstance(holder, ast.For | ast.comprehension) and holder.iter is call:
        target = holder.target
        scope = holder if isinstance(holder, ast.For) else parents.get(id(holder))
        if not isinstance(target, ast.Name) or scope is None:
            return False
        reads = [
            n
            for n in ast.walk(scope)
            if isinstance(n, ast.Name) and n.id == target.id and n is not target
        ]
        return all(
            isinstance(attribute := parents.get(id(n)), ast.Attribute)
            and attribute.attr in _SIZES
            and isinstance(outer := parents.get(id(attribute)), ast.Call)
            and outer.func is attribute
            for n in reads
        )
    return False


def _in_lockstep(
    call: ast.Call, parents: dict[int, ast.AST], function: ast.FunctionDef, params: set[str]
) -> bool:
    """Whether every process runs this forward as often: under no ``if`` (nor a conditional
    expression), and in loops over the helper's own parameters or a ``range`` of them."""
    node: ast.AST | None = call
    while node is not None and node is not function:
        parent = parents.get(id(node))
        if isinstance(parent, ast.If | ast.IfExp) and node is not getattr(parent, "test", None):
            return False
        looped = isinstance(parent, ast.For) and node is not parent.iter
        if looped and not _fixed_length(parent.iter, params):  # type: ignore[union-attr]
            return False
        comprehension = isinstance(parent, _COMPREHENSIONS) and node not in parent.generators  # type: ignore[union-attr]
        if comprehension and not all(
            not g.ifs and _fixed_length(g.iter, params)
            for g in parent.generators  # type: ignore[union-attr]
        ):
            return False
        node = parent
    return True


def _fixed_length(iterable: ast.expr, params: set[str]) -> bool:
    """A parameter (the loader the caller hands), or ``enumerate``/``tqdm``/``zip``/``range`` of
    parameters and constants: the same number of items on every process."""
    if isinstance(iterable, ast.Name):
        return iterable.id in params
    if isinstance(iterable, ast.Constant):
        return isinstance(iterable.value, int)
    if isinstance(iterable, ast.Attribute):  # ``args.epochs``: a setting the caller hands
        return isinstance(iterable.value, ast.Name) and iterable.value.id in params
    if isinstance(iterable, ast.BinOp):
        return _fixed_length(iterable.left, params) and _fixed_length(iterable.right, params)
    if isinstance(iterable, ast.Call) and callee(iterable) in _LOOP_HELPERS:
        return not iterable.keywords and all(_fixed_length(a, params) for a in iterable.args)
    return False
