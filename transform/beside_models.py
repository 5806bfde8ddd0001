"""Parameters a model class of a module beside the script may leave without a gradient.

powerful-gnns' ``GraphCNN`` builds ``self.eps = nn.Parameter(...)`` and reads it only under
``if self.learn_eps:``: with the flag off, no step gives it a gradient, and DistributedDataParallel
stops at the second forward ("Expected to have finished reduction in the prior iteration"). The
file's own model classes are read by :mod:`participation`; a class from a module beside the
script is read here, with :mod:`ast`: a parameter or a module its ``__init__`` builds that its
methods never read, or read only under an ``if``, may get none. DistributedDataParallel is then
told to expect that, which costs a search of the graph per step and is right either way.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from accelify.transform.neighbours import class_beside, defined_in
from accelify.transform.participation import NO_PARAMETERS

_BY_NAME = frozenset({"getattr", "modules", "named_modules", "children", "named_children"})


@dataclass(frozen=True)
class Idle:
    """``self.<attribute>`` of a class beside the script, built at ``line`` of ``file``."""

    attribute: str
    file: str
    line: int
    conditional: bool  # read only under an ``if`` (else: never read)


def idle_beside(path: str, qualified: str) -> Idle | None:
    """The first parameter or module the class ``qualified`` (``models.graphcnn.GraphCNN``)
    builds and reads only under an ``if``, or never; None when there is none, when the class
    is not beside ``path``, or when it reaches its attributes by name (``getattr``,
    ``self.modules()``)."""
    found = class_beside(path, qualified)
    if found is None:
        return None
    cls, file = found
    init = defined_in(cls, "__init__", ast.FunctionDef)
    methods = [n for n in cls.body if isinstance(n, ast.FunctionDef) and n is not init]
    if init is None or not methods or any(_by_name(m) for m in methods):
        return None
    gated = _gated_methods(methods)
    for attribute, line in _built(init):
        reads = [r or m.name in gated for m in methods for r in _reads(m, attribute)]
        if not reads:
            return Idle(attribute, file, line, conditional=False)
        if all(conditional for conditional in reads):
            return Idle(attribute, file, line, conditional=True)
    return None


def _built(init: ast.FunctionDef) -> list[tuple[str, int]]:
    """``self.x = nn.Parameter(...)`` or ``self.x = nn.Linear(...)`` (a module with parameters)
    in ``__init__``'s own body, outside any ``if``."""
    found = []
    for statement in init.body:
        if not (isinstance(statement, ast.Assign) and len(statement.targets) == 1):
            continue
        target, value = statement.targets[0], statement.value
        if not (
            isinstance(target, ast.Attribute)
            and isinstance(target.value, ast.Name)
            and target.value.id == "self"
            and isinstance(value, ast.Call)
        ):
            continue
        name = value.func.attr if isinstance(value.func, ast.Attribute) else None
        dotted = ast.unparse(value.func)
        if name == "Parameter" or (
            dotted.startswith(("nn.", "torch.nn."))
            and name is not None
            and name[:1].isupper()
            and name not in NO_PARAMETERS  # ``if self.training: x = self.dropout(x)``
            and name not in {"ModuleList", "ModuleDict", "Sequential", "ParameterList"}
        ):
            found.append((target.attr, statement.lineno))
    return found


def _reads(method: ast.FunctionDef, attribute: str) -> list[bool]:
    """For each read of ``self.<attribute>`` in ``method``: whether it sits under an ``if``."""
    parents = {id(c): n for n in ast.walk(method) for c in ast.iter_child_nodes(n)}
    found = []
    for node in ast.walk(method):
        if not (
            isinstance(node, ast.Attribute)
            and node.attr == attribute
            and isinstance(node.value, ast.Name)
            and node.value.id == "self"
            and isinstance(node.ctx, ast.Load)
        ):
            continue
        found.append(_under_if(node, parents, method))
    return found


def _gated_methods(methods: list[ast.FunctionDef]) -> set[str]:
    """Methods the class runs itself (``self.next_layer_eps(...)``) only under an ``if`` of its
    other methods, or from such methods: what they read is read under that ``if`` too."""
    calls: dict[str, list[tuple[str, bool]]] = {m.name: [] for m in methods}
    for method in methods:
        parents = {id(c): n for n in ast.walk(method) for c in ast.iter_child_nodes(n)}
        for node in ast.walk(method):
            func = node.func if isinstance(node, ast.Call) else None
            if (
                isinstance(func, ast.Attribute)
                and isinstance(func.value, ast.Name)
                and func.value.id == "self"
                and func.attr in calls
            ):
                calls[func.attr].append((method.name, _under_if(node, parents, method)))
    gated: set[str] = set()
    while True:
        more = {
            name
            for name, sites in calls.items()
            if name not in gated
            and sites
            and all(under or caller in gated for caller, under in sites)
        }
        if not more:
            return gated
        gated |= more


def _under_if(node: ast.AST, parents: dict[int, ast.AST], method: ast.FunctionDef) -> bool:
    current = node
    while (parent := parents.get(id(current))) is not None and parent is not method:
        if isinstance(parent, ast.If | ast.IfExp) and current is not parent.test:
            return True
        current = parent
    return False


def _by_name(method: ast.FunctionDef) -> bool:
    return any(
        isinstance(n, ast.Call)
        and (
            (isinstance(n.func, ast.Name) and n.func.id in _BY_NAME)
            or (isinstance(n.func, ast.Attribute) and n.func.attr in _BY_NAME)
        )
        for n in ast.walk(method)
    )
