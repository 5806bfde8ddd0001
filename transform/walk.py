"""Read-only traversal of a libcst tree, in source order, without rebuilding it.

``node.visit(visitor)`` and ``node.children`` rebuild every node they pass (libcst's
``_visit_and_replace_children`` constructs a new node even for a read-only visitor), so each full
traversal costs about as much as the parse. :func:`walk` drives the same visitor hooks by reading
the nodes' fields instead, and leaves out whitespace and comments (half of all nodes, and no
step or rule looks at them). It is for visitors, never for transformers.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Iterator

import libcst as cst

# Node types whose dataclass fields are not in source order: these fields come first, in the
# order libcst's own traversal visits them. Whitespace and bracket fields are left where they fall
# (nothing reads them); tests/convert/test_walk.py checks the order against libcst's.
_SOURCE_ORDER: dict[type[cst.CSTNode], tuple[str, ...]] = {
    cst.Arg: ("keyword", "value"),
    cst.ClassDef: ("decorators", "name", "type_parameters", "bases", "keywords", "body"),
    cst.CompFor: ("asynchronous", "target", "iter", "ifs", "inner_for_in"),
    cst.ExceptHandler: ("type", "name", "body"),
    cst.ExceptStarHandler: ("type", "name", "body"),
    cst.For: ("asynchronous", "target", "iter", "body", "orelse"),
    cst.FunctionDef: (
        "decorators",
        "asynchronous",
        "name",
        "type_parameters",
        "params",
        "returns",
        "body",
    ),
    cst.IfExp: ("body", "test", "orelse"),
    cst.ImportFrom: ("relative", "module", "names"),
    cst.MatchCase: ("pattern", "guard", "body"),
    cst.Parameters: (
        "posonly_params",
        "posonly_ind",
        "params",
        "star_arg",
        "kwonly_params",
        "star_kwarg",
    ),
    cst.TypeAlias: ("name", "type_parameters", "value"),
    cst.With: ("asynchronous", "items", "body"),
}
_FIELDS: dict[type[cst.CSTNode], tuple[str, ...]] = {}
# Half the nodes of a script are whitespace; nothing here reads them, so no walk enters them.
_LAYOUT = (
    cst.BaseParenthesizableWhitespace,
    cst.Newline,
    cst.TrailingWhitespace,
    cst.EmptyLine,
    cst.Comment,
)
_NODE_TYPES: dict[type, bool] = {}


def _fields(kind: type[cst.CSTNode]) -> tuple[str, ...]:
    names = _FIELDS.get(kind)
    if names is None:
        first = _SOURCE_ORDER.get(kind, ())
        rest = (f.name for f in dataclasses.fields(kind) if f.name not in first)  # type: ignore[arg-type]
        names = _FIELDS[kind] = (*first, *rest)
    return names


def children(node: cst.CSTNode) -> Iterator[cst.CSTNode]:
    """The direct children of ``node`` in source order, like ``node.children`` but free (and
    without whitespace and comments)."""
    for name in _fields(type(node)):
        value = getattr(node, name)
        if isinstance(value, (tuple, list)):
            yield from (item for item in value if _is_node(type(item)))
        elif _is_node(type(value)):
            yield value


def walk(node: cst.CSTNode, visitor: cst.CSTVisitor, *, fields: Collection[str] = ()) -> None:
    """Call ``visitor``'s hooks on ``node`` and below, as ``node.visit(visitor)`` would.

    ``on_visit_attribute``/``on_leave_attribute`` (for ``visit_If_body``-style handlers) are
    called only around the fields of node types named in ``fields``: elsewhere they cost a call
    per field for nothing. They fire for fields holding a node, a list of nodes, or None.
    """
    if visitor.on_visit(node):
        hooks = bool(fields) and type(node).__name__ in fields
        for name in _fields(type(node)):
            value = getattr(node, name)
            kind = type(value)
            if hooks:
                if not (value is None or kind is tuple or kind is list or _is_node(kind)):
                    continue  # a plain value (``Name.value``): libcst has no hook for it
                visitor.on_visit_attribute(node, name)
            if kind is tuple or kind is list:
                for item in value:
                    if _is_node(type(item)):
                        walk(item, visitor, fields=fields)
            elif _is_node(kind):
                walk(value, visitor, fields=fields)
            if hooks:
                visitor.on_leave_attribute(node, name)
    visitor.on_leave(node)


def _is_node(kind: type) -> bool:
    """Whether to walk into a value of type ``kind``: a node, but not whitespace or a comment.

    Cached: the ``CSTNode`` ABC's own check runs Python code per call.
    """
    found = _NODE_TYPES.get(kind)
    if found is None:
        found = issubclass(kind, cst.CSTNode) and not issubclass(kind, _LAYOUT)
        _NODE_TYPES[kind] = found
    return found


class Visitor(cst.CSTVisitor):
    """A ``CSTVisitor`` that finds its ``visit_<Node>``/``leave_<Node>`` once per node type.

    libcst formats the method name and calls a no-op stub for every node; on a whole module that
    costs as much as the walk itself. Subclasses are module-level classes (the cache keeps them).
    """

    def on_visit(self, node: cst.CSTNode) -> bool:
        handler = _handler(_VISITS, "visit_", type(self), type(node))
        return handler is None or handler(self, node) is not False

    def on_leave(self, original_node: cst.CSTNode) -> None:
        handler = _handler(_LEAVES, "leave_", type(self), type(original_node))
        if handler is not None:
            handler(self, original_node)


_Handlers = dict[tuple[type, type], Callable[..., object] | None]
_VISITS: _Handlers = {}
_LEAVES: _Handlers = {}


def _handler(
    cache: _Handlers, prefix: str, visitor: type, kind: type
) -> Callable[..., object] | None:
    try:
        return cache[visitor, kind]
    except KeyError:
        name = prefix + kind.__name__
        found = getattr(visitor, name, None)
        if found is getattr(cst.CSTVisitor, name, None):  # libcst's no-op stub
            found = None
        cache[visitor, kind] = found
        return found


NodeKind = type[cst.CSTNode] | tuple[type[cst.CSTNode], ...]


def nodes(root: cst.CSTNode, kind: NodeKind) -> Iterator[cst.CSTNode]:
    """Every node of type ``kind`` under ``root``, in source order."""
    found: list[cst.CSTNode] = []
    walk(root, _Collect(kind, found))
    return iter(found)


class _Collect(Visitor):
    def __init__(self, kind: NodeKind, found: list[cst.CSTNode]) -> None:
        super().__init__()
        self.kind = kind
        self.found = found

    def on_visit(self, node: cst.CSTNode) -> bool:
        if isinstance(node, self.kind):
            self.found.append(node)
        return True

    def on_leave(self, original_node: cst.CSTNode) -> None:
        return None
