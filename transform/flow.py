"""When code runs relative to a point of the training setup's scope.

An inserted statement (``accelerator = Accelerator()``, ``... = accelerator.prepare(...)``) is a
:class:`Point` between two statements of one block. Code runs after it when it sits later in that
block (or inside a later statement), or when it is in a function whose every call from the setup
does. That is the whole question behind "the accelerator exists before its first use" and
"``prepare`` sees every object built, in every branch, before the first training step".
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import libcst as cst

from accelify.transform.analysis import Analysis, Scope, key_of
from accelify.transform.patterns import dotted_name, target_names

Block = cst.Module | cst.IndentedBlock


@dataclass(frozen=True, eq=False)
class Point:
    """Before ``block.body[index]``; ``index == len(block.body)`` is the end of the block."""

    block: Block
    index: int

    @property
    def statements(self) -> Sequence[cst.BaseStatement]:
        return self.block.body  # type: ignore[return-value]

    @property
    def next(self) -> cst.BaseStatement | None:
        return self.statements[self.index] if self.index < len(self.statements) else None

    @property
    def previous(self) -> cst.BaseStatement | None:
        return self.statements[self.index - 1] if self.index > 0 else None


class Timeline:
    """Positions of code relative to points in ``scope``, the training setup's scope."""

    def __init__(self, analysis: Analysis, scope: Scope) -> None:
        self.a = analysis
        self.scope = scope
        self._index: dict[int, dict[int, int]] = {}
        self._entries = _entries(analysis, scope)

    # blocks -------------------------------------------------------------------------------
    def body(self) -> Block:
        node = self.scope.node
        return node if isinstance(node, cst.Module) else node.body  # type: ignore[return-value]

    def block_of(self, statement: cst.CSTNode) -> Block | None:
        parent = self.a.parent(statement)
        return parent if isinstance(parent, cst.Module | cst.IndentedBlock) else None

    def index(self, block: Block, statement: cst.CSTNode) -> int:
        table = self._index.get(id(block))
        if table is None:
            table = self._index[id(block)] = {id(s): i for i, s in enumerate(block.body)}
        return table[id(statement)]

    def top_in(self, block: Block, node: cst.CSTNode) -> cst.BaseStatement | None:
        """The statement of ``block`` that is or contains ``node``."""
        current: cst.CSTNode | None = node
        while current is not None:
            parent = self.a.parent(current)
            if parent is block:
                return current  # type: ignore[return-value]
            current = parent
        return None

    def point_before(self, statement: cst.CSTNode) -> Point:
        block = self.block_of(statement)
        assert block is not None
        return Point(block, self.index(block, statement))

    def point_after(self, statement: cst.CSTNode) -> Point:
        block = self.block_of(statement)
        assert block is not None
        return Point(block, self.index(block, statement) + 1)

    def enclosing_blocks(self, node: cst.CSTNode) -> list[Block]:
        """The blocks of the setup scope around ``node``, innermost first."""
        out: list[Block] = []
        current = self.a.parent(node)
        while current is not None:
            if isinstance(current, cst.Module | cst.IndentedBlock):
                out.append(current)
            if current is self.scope.node:
                break
            current = self.a.parent(current)
        return out

    # where code runs ----------------------------------------------------------------------
    def anchors(self, node: cst.CSTNode) -> list[cst.CSTNode] | None:
        """Nodes of the setup scope through which ``node`` runs: itself, or the calls that reach
        its function. ``[]`` means after the whole scope (other methods of a setup's class but
        ``__init__``); None means never from the setup, or from nowhere we can see."""
        scope = self.a.scope_of.get(id(node))
        if scope is self.scope:
            return [node]
        if scope is None:
            return None
        entries = self._entries.get(scope)
        if entries:
            return entries
        if self.scope.cls is not None and scope.cls is self.scope.cls:
            # __init__ runs before any other method of its instance: never after the setup.
            return None if scope.name == "__init__" else []
        return None

    def after(self, point: Point, node: cst.CSTNode) -> bool:
        """Whether every run of ``node`` from the setup comes after ``point``."""
        anchors = self.anchors(node)
        if anchors is None:
            return False
        if not anchors:  # a method of the setup's class, run once the setup has returned
            return point.block is self.body()
        for anchor in anchors:
            top = self.top_in(point.block, anchor)
            if top is None or self.index(point.block, top) < point.index:
                return False
        return True

    def may_follow(self, point: Point, node: cst.CSTNode) -> bool:
        """Whether some run of ``node`` may come after ``point``: it is not shown to run before.
        Code after the block that holds the point (``if cond: ...prepare...``, a ``try`` whose
        handler may run first) is neither surely after nor surely before it. Code that never
        runs from the setup (a function this file does not call) follows nothing."""
        return self.anchors(node) is not None and not self.before(point, node)

    def before(self, point: Point, node: cst.CSTNode) -> bool:
        """Whether every run of ``node`` from the setup comes before ``point``."""
        anchors = self.anchors(node)
        if not anchors:
            return False
        for anchor in anchors:
            top = self.top_in(point.block, anchor)
            if top is not None and self.index(point.block, top) >= point.index:
                return False
            if top is None and not self.precedes_block(anchor, point.block):
                return False
        return True

    def precedes_block(self, node: cst.CSTNode, block: Block) -> bool:
        """``node`` sits in an enclosing block of ``block``, before the statement holding it."""
        for outer in self.enclosing_blocks(block):
            holder = self.top_in(outer, block)
            mine = self.top_in(outer, node)
            if holder is not None and mine is not None:
                return self.index(outer, mine) < self.index(outer, holder)
        return False

    def in_loop(self, point: Point) -> bool:
        """Whether code at ``point`` may run more than once per run of the scope."""
        current: cst.CSTNode | None = point.block
        while current is not None and current is not self.scope.node:
            if isinstance(current, cst.For | cst.While):
                return True
            current = self.a.parent(current)
        return False

    # assignments --------------------------------------------------------------------------
    def assigned_at(self, point: Point, key: str) -> bool:
        """Whether ``key`` is bound on every path that reaches ``point``."""
        if key in self.scope.params or (
            key.startswith("self.") and self.scope.cls is not None and self.scope.name != "__init__"
        ):
            return True
        block: cst.CSTNode | None = point.block
        index = point.index
        while block is not None:
            statements = block.body if isinstance(block, cst.Module | cst.IndentedBlock) else ()
            if any(assigns(s, key) for s in list(statements)[:index]):  # type: ignore[arg-type]
                return True
            if block is self.scope.node or block is self.body():
                return False
            owner = self.a.parent(block)
            while owner is not None and not isinstance(
                self.a.parent(owner), cst.Module | cst.IndentedBlock
            ):
                owner = self.a.parent(owner)
            if owner is None:
                return False
            block = self.a.parent(owner)
            index = self.index(block, owner)  # type: ignore[arg-type]
        return False


def assigns(statement: cst.CSTNode, key: str) -> bool:
    """Whether running ``statement`` always binds ``key``, or never goes on past it (a branch
    that raises or exits reaches no later point, so it leaves nothing unbound there)."""
    if isinstance(statement, cst.SimpleStatementLine):
        return any(_small_assigns(small, key) for small in statement.body)
    if isinstance(statement, cst.If):
        return _branch_assigns(statement.body, key) and _else_assigns(statement.orelse, key)
    if isinstance(statement, cst.With):
        return _branch_assigns(statement.body, key) or any(
            item.asname is not None and key in set(target_names(item.asname.name))
            for item in statement.items
        )
    if isinstance(statement, cst.Try):
        return _branch_assigns(statement.body, key) and all(
            _branch_assigns(h.body, key) for h in statement.handlers
        )
    return False


_EXITS = frozenset({"sys.exit", "exit", "quit", "os._exit"})


def _small_assigns(small: cst.BaseSmallStatement, key: str) -> bool:
    if isinstance(small, cst.Raise | cst.Return):
        return True
    value = getattr(small, "value", None)
    if isinstance(value, cst.Call) and _called_with(value, key):
        return True  # unbound, ``key`` fails here: the run never goes past it
    if isinstance(small, cst.Expr) and isinstance(small.value, cst.Call):
        return dotted_name(small.value.func) in _EXITS
    if isinstance(small, cst.Assign):
        return any(key in set(target_names(t.target)) for t in small.targets)
    if isinstance(small, cst.AnnAssign):
        return small.value is not None and key_of(small.target) == key
    return False


def _called_with(call: cst.Call, key: str) -> bool:
    """Whether evaluating ``call`` reads ``key`` before anything else can run: an argument, or
    the object of the method (``CosineAnnealingLR(optimizer, ...)`` right after an
    ``if``/``elif`` that may not build it)."""
    receiver = call.func.value if isinstance(call.func, cst.Attribute) else None
    if receiver is not None and key_of(receiver) == key:
        return True
    return any(key_of(arg.value) == key for arg in call.args)


def _branch_assigns(block: cst.BaseSuite, key: str) -> bool:
    body = block.body if isinstance(block, cst.IndentedBlock) else [block]
    return any(assigns(s, key) for s in body)  # type: ignore[arg-type]


def _else_assigns(orelse: cst.If | cst.Else | None, key: str) -> bool:
    if orelse is None:
        return False
    if isinstance(orelse, cst.If):
        return assigns(orelse, key)
    return _branch_assigns(orelse.body, key)


def _entries(a: Analysis, scope: Scope) -> dict[Scope, list[cst.CSTNode]]:
    """For each function reached from ``scope``, the calls in ``scope`` through which it runs."""
    entries: dict[Scope, list[cst.CSTNode]] = {}
    by_scope: dict[Scope, list[tuple[cst.Call, Scope]]] = {}
    for call, where in a.calls:
        callee = a.callee(call)
        if callee is not None and callee is not scope and not callee.is_module:
            by_scope.setdefault(where, []).append((call, callee))
    todo: list[tuple[Scope, Iterable[cst.CSTNode]]] = [(scope, ())]
    while todo:
        where, through = todo.pop()
        for call, callee in by_scope.get(where, ()):
            new = [call] if where is scope else list(through)
            known = entries.setdefault(callee, [])
            fresh = [n for n in new if all(n is not k for k in known)]
            if fresh:
                known.extend(fresh)
                todo.append((callee, list(known)))
    return entries
