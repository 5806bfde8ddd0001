"""Loss scalers that run the backward pass and the optimizer step for the script, and with them
which module beside a script trains.

MAE's and ConvNeXt's ``util/misc.py`` (after timm's ``NativeScaler``) train through
``loss_scaler(loss, optimizer, clip_grad=..., parameters=model.parameters(), update_grad=...)``:
the instance scales the loss, runs its backward, and, when ``update_grad`` says so, unscales,
clips, steps the optimizer and updates the scale. Such a call is the training step, in a file
that shows no ``.backward()``.

A class counts only when it does nothing else (read with :mod:`ast`, never run):

- ``__init__`` binds one ``GradScaler`` to an attribute, and nothing more;
- ``__call__(self, loss, optimizer, ...)`` first runs ``self.<s>.scale(loss).backward(...)``,
  then, under tests of its own parameters, only ``unscale_(optimizer)``, ``step(optimizer)``,
  ``update()``, a clip or norm of its parameters bound to a name, ``assert`` and ``return``;
- its other methods run no backward and step nothing (``state_dict`` hands the scaler's on);
- it has no base class and no decorator, so no method is inherited from code not read here.

A norm is a ``clip_grad_norm_``/``clip_grad_value_`` of torch, or a function of the same module
that changes nothing: no in-place call (torch's end in ``_``), no backward or step, no store
into an attribute or an item.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import NamedTuple

from accelify.transform.neighbours import (
    beside,
    callee,
    calls_in,
    class_beside,
    defined_in,
    docstring,
    module_file,
)

__all__ = [
    "is_loss_scaler",
    "loss_scaler_beside",
    "method_trains",
    "module_trains",
    "trains_beside",
]

_CLIPS = frozenset({"clip_grad_norm_", "clip_grad_value_"})
_STEPS = frozenset({"backward", "step", "zero_grad", "unscale_", "update"})


def loss_scaler_beside(path: str, qualified: str) -> bool:
    """Whether ``qualified`` (``util.misc.NativeScalerWithGradNormCount``) names such a class in
    a module beside ``path``."""
    tree, name = beside(path, qualified)
    return tree is not None and is_loss_scaler(tree, name)


def trains_beside(path: str, qualified: str) -> tuple[str, bool] | None:
    """The module beside ``path`` that defines ``qualified`` (``engine.train_one_epoch``), named
    as a file, and whether it trains (:func:`module_trains`); None when there is no such module."""
    module = qualified.lstrip(".").rpartition(".")[0]
    tree, name = beside(path, qualified)
    if tree is None or defined_in(tree, name, ast.FunctionDef) is None:
        return None
    return module_file(Path(path).parent, module).name, module_trains(tree)


class Trains(NamedTuple):
    """Where a class beside the script runs the backward of one of its methods."""

    method: str  # the method with the ``.backward()``
    file: str  # its module's path from the script's folder
    defined: bool  # the method called is the class's own (not inherited)


def method_trains(path: str, qualified: str, method: str) -> Trains | None:
    """Where the class ``qualified`` (``sac.SAC``), in a module beside ``path``, runs a
    ``.backward()`` when ``method`` is called, or None. ``method`` defined in the class is read
    (``update_parameters``), with the methods it calls on ``self``; one it inherits
    (pytorch-template's ``trainer.train()`` from ``BaseTrainer``) is not, and then the class's
    own method with a backward is named (``_train_epoch``). A package that re-exports the
    class from one of its modules (``from .trainer import *``) is followed there."""
    found = class_beside(path, qualified)
    if found is None:
        return None
    cls, file = found
    function = defined_in(cls, method, ast.FunctionDef)
    candidates = (
        _through_self(cls, function)
        if function is not None
        else [n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name != "__init__"]
    )
    for candidate in candidates:
        if any(callee(c) == "backward" for c in calls_in(candidate)):
            return Trains(candidate.name, file, function is not None)
    return None


def _through_self(cls: ast.ClassDef, method: ast.FunctionDef) -> list[ast.FunctionDef]:
    """``method`` and the methods of ``cls`` it calls on ``self``, theirs in turn, in the order
    they are reached: disentangling-vae's ``Trainer.__call__`` runs ``self._train_epoch``,
    which runs ``self._train_iteration``, where the backward is."""
    methods = {n.name: n for n in cls.body if isinstance(n, ast.FunctionDef)}
    reached, todo = [method], [method]
    while todo:
        for call in calls_in(todo.pop(0)):
            func = call.func
            if not (
                isinstance(func, ast.Attribute)
                and isinstance(func.value, ast.Name)
                and func.value.id == "self"
            ):
                continue
            found = methods.get(func.attr)
            if found is not None and found not in reached:
                reached.append(found)
                todo.append(found)
    return reached


def module_trains(tree: ast.Module) -> bool:
    """A ``.backward()`` call, or a ``.zero_grad()`` one: a step whose backward a loss scaler
    runs (:mod:`~accelify.transform.loss_scaler`). The backward inside such a scaler's own class
    is not one: the module that defines it is a helper, read beside the script, never edited."""
    scalers = [
        node
        for node in tree.body
        if isinstance(node, ast.ClassDef) and is_loss_scaler(tree, node.name)
    ]
    inside = {id(n) for cls in scalers for n in ast.walk(cls)}
    return any(
        callee(node) in {"backward", "zero_grad"} and id(node) not in inside
        for node in calls_in(tree)
        if isinstance(node.func, ast.Attribute)
    )


def is_loss_scaler(tree: ast.Module, name: str) -> bool:
    """Whether the top-level class ``name`` of ``tree`` is such a loss scaler."""
    cls = defined_in(tree, name, ast.ClassDef)
    if cls is None or cls.bases or cls.keywords or cls.decorator_list:
        return False
    methods = {n.name: n for n in cls.body if isinstance(n, ast.FunctionDef)}
    if any(
        not isinstance(n, ast.FunctionDef | ast.Assign) and not docstring(n) for n in cls.body
    ) or len(methods) != sum(isinstance(n, ast.FunctionDef) for n in cls.body):
        return False
    scaler = _grad_scaler(methods.get("__init__"))
    call = methods.get("__call__")
    if scaler is None or call is None or call.decorator_list:
        return False
    others = [m for m in methods.values() if m.name not in {"__init__", "__call__"}]
    if any(callee(c) in _STEPS for m in others for c in calls_in(m)):
        return False
    return _steps(call, scaler, _functions(tree))


def _grad_scaler(init: ast.FunctionDef | None) -> str | None:
    """The attribute ``__init__`` binds its one ``GradScaler`` to."""
    if init is None or init.decorator_list:
        return None
    body = [s for s in init.body if not docstring(s)]
    if len(body) != 1 or not isinstance(body[0], ast.Assign) or len(body[0].targets) != 1:
        return None
    target, value = body[0].targets[0], body[0].value
    if not (_on_self(target) and isinstance(value, ast.Call) and callee(value) == "GradScaler"):
        return None
    return target.attr  # type: ignore[attr-defined]


def _steps(call: ast.FunctionDef, scaler: str, functions: dict[str, ast.FunctionDef]) -> bool:
    params = [a.arg for a in call.args.args]
    if len(params) < 3 or call.args.vararg or call.args.kwarg:
        return False
    loss, optimizer = params[1], params[2]
    body = [s for s in call.body if not docstring(s)]
    if not body or not _scaled_backward(body[0], scaler, loss, set(params)):
        return False
    names = set(params)
    return all(_after(s, scaler, optimizer, names, functions) for s in body[1:])


def _scaled_backward(statement: ast.stmt, scaler: str, loss: str, params: set[str]) -> bool:
    """``self.<scaler>.scale(<loss>).backward(<parameters only>)``."""
    if not isinstance(statement, ast.Expr) or not isinstance(statement.value, ast.Call):
        return False
    backward = statement.value
    scale = backward.func.value if isinstance(backward.func, ast.Attribute) else None
    return (
        callee(backward) == "backward"
        and not backward.args
        and all(_reads_only(k.value, params) for k in backward.keywords)
        and isinstance(scale, ast.Call)
        and _method_of(scale, scaler) == "scale"
        and [ast.unparse(a) for a in scale.args] == [loss]
        and not scale.keywords
    )


def _after(
    statement: ast.stmt,
    scaler: str,
    optimizer: str,
    names: set[str],
    functions: dict[str, ast.FunctionDef],
) -> bool:
    """One statement after the backward: a test of the parameters around more of the same, an
    assert, the scaler's unscale/step/update, a norm bound to a name, a return of one."""
    if isinstance(statement, ast.If):
        return _reads_only(statement.test, names) and all(
            _after(s, scaler, optimizer, names, functions)
            for s in [*statement.body, *statement.orelse]
        )
    if isinstance(statement, ast.Assert):
        return _reads_only(statement.test, names)
    if isinstance(statement, ast.Return):
        return statement.value is None or _reads_only(statement.value, names)
    if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Call):
        method = _method_of(statement.value, scaler)
        args = [ast.unparse(a) for a in statement.value.args]
        return not statement.value.keywords and (
            (method in {"unscale_", "step"} and args == [optimizer])
            or (method == "update" and not args)
        )
    if isinstance(statement, ast.Assign) and len(statement.targets) == 1:
        target = statement.targets[0]
        if not isinstance(target, ast.Name):
            return False
        value = statement.value
        fine = (isinstance(value, ast.Constant) and value.value is None) or (
            isinstance(value, ast.Call) and _a_norm(value, names, functions)
        )
        names.add(target.id)  # the norm, returned at the end
        return fine
    return False


def _a_norm(call: ast.Call, names: set[str], functions: dict[str, ast.FunctionDef]) -> bool:
    arguments = [*call.args, *(k.value for k in call.keywords)]
    if not all(_reads_only(a, names) for a in arguments):
        return False
    callee = ast.unparse(call.func)
    if callee in {f"torch.nn.utils.{clip}" for clip in _CLIPS}:
        return True
    function = functions.get(callee)
    return function is not None and _changes_nothing(function)


def _changes_nothing(function: ast.FunctionDef) -> bool:
    """No in-place call, no backward or step, no store into an attribute or an item, no
    decorator, no global."""
    if function.decorator_list:
        return False
    for node in ast.walk(function):
        name = callee(node) or "" if isinstance(node, ast.Call) else ""
        if isinstance(node, ast.Global | ast.Nonlocal) or name.endswith("_") or name in _STEPS:
            return False
        stored = isinstance(node, ast.Attribute | ast.Subscript) and not isinstance(
            node.ctx, ast.Load
        )
        if stored:
            return False
    return True


def _reads_only(expr: ast.expr, names: set[str]) -> bool:
    """An expression of ``names`` and constants, with no call."""
    return all(
        not isinstance(n, ast.Call | ast.NamedExpr | ast.Lambda)
        and (not isinstance(n, ast.Name) or n.id in names or n.id in {"None", "True", "False"})
        for n in ast.walk(expr)
    )


def _method_of(call: ast.Call, scaler: str) -> str | None:
    """``m`` of ``self.<scaler>.m(...)``."""
    func = call.func
    if isinstance(func, ast.Attribute) and _on_self(func.value) and func.value.attr == scaler:  # type: ignore[attr-defined]
        return func.attr
    return None


def _on_self(node: ast.expr) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
    )


def _functions(tree: ast.Module) -> dict[str, ast.FunctionDef]:
    found: dict[str, list[ast.FunctionDef]] = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            found.setdefault(node.name, []).append(node)
    return {name: nodes[0] for name, nodes in found.items() if len(nodes) == 1}
