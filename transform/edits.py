"""Edits keyed by nodes of the original tree, and the single pass that applies them.

Steps describe what should change (replace this expression, drop that statement, put these
statements before it, wrap those statements in a ``with`` block) and :func:`apply` does all of it
in one bottom-up traversal. Because every edit names an *original* node, an outer edit sees the
inner edits already applied: a wrapped loop body still gets its ``accelerator.backward`` swap.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import libcst as cst

Rebuild = Callable[[cst.CSTNode], cst.CSTNode]


@dataclass
class _Wrap:
    first: cst.BaseStatement
    last: cst.BaseStatement
    header: cst.With


@dataclass
class Edits:
    """Everything the steps want changed, collected before anything is changed."""

    replacements: dict[int, Rebuild] = field(default_factory=dict)
    removals: set[int] = field(default_factory=set)
    before: dict[int, list[cst.BaseStatement]] = field(default_factory=dict)
    after: dict[int, list[cst.BaseStatement]] = field(default_factory=dict)
    wraps: list[_Wrap] = field(default_factory=list)
    unwraps: set[int] = field(default_factory=set)

    def replace(self, node: cst.CSTNode, new: cst.CSTNode | Rebuild) -> None:
        """Replace ``node``; a callable receives the node with inner edits already applied.

        Two replacements of one node compose, the later one seeing the earlier one's result.
        """
        rebuild: Rebuild = new if callable(new) else (lambda _updated: new)
        earlier = self.replacements.get(id(node))
        if earlier is not None:
            rebuild = _compose(earlier, rebuild)
        self.replacements[id(node)] = rebuild

    def remove(self, statement: cst.BaseStatement) -> None:
        self.removals.add(id(statement))

    def insert_before(
        self, statement: cst.BaseStatement, *new: cst.BaseStatement, first: bool = False
    ) -> None:
        """Put ``new`` above ``statement``; ``first`` puts it above earlier insertions too."""
        pending = self.before.setdefault(id(statement), [])
        pending[0:0] = new if first else ()
        if not first:
            pending.extend(new)

    def insert_after(self, statement: cst.BaseStatement, *new: cst.BaseStatement) -> None:
        self.after.setdefault(id(statement), []).extend(new)

    def wrap(self, first: cst.BaseStatement, last: cst.BaseStatement, header: cst.With) -> None:
        """Move the statements from ``first`` to ``last`` (same block) into ``header``'s body."""
        self.wraps.append(_Wrap(first, last, header))

    def unwrap(self, statement: cst.BaseCompoundStatement) -> None:
        """Replace a compound statement (``if ...:``) by the statements of its body."""
        self.unwraps.add(id(statement))

    def is_removed(self, statement: cst.CSTNode) -> bool:
        return id(statement) in self.removals

    def remove_emptying(
        self, statement: cst.CSTNode, parent: Callable[[cst.CSTNode], cst.CSTNode | None]
    ) -> None:
        """Remove a statement; an ``if`` left with nothing but removed statements goes too."""
        self.remove(statement)  # type: ignore[arg-type]
        block = parent(statement)
        owner = parent(block) if isinstance(block, cst.IndentedBlock) else None
        if (
            isinstance(owner, cst.If)
            and owner.orelse is None
            and all(self.is_removed(s) for s in block.body)  # type: ignore[union-attr]
        ):
            self.remove_emptying(owner, parent)

    def __bool__(self) -> bool:
        return bool(
            self.replacements
            or self.removals
            or self.before
            or self.after
            or self.wraps
            or self.unwraps
        )


def _compose(first: Rebuild, second: Rebuild) -> Rebuild:
    return lambda node: second(first(node))


def apply(
    module: cst.Module, edits: Edits, parents: Mapping[int, cst.CSTNode] | None = None
) -> cst.Module:
    """Apply ``edits`` to ``module`` (the tree the edits were planned on).

    With the tree's ``parents`` (node id -> parent), subtrees that hold no edit are not walked:
    a Python traversal of a libcst tree costs as much as the parse, and most of it is untouched.
    """
    if not edits:
        return module
    return module.visit(_Applier(edits, _dirty(edits, parents) if parents is not None else None))


def _dirty(edits: Edits, parents: Mapping[int, cst.CSTNode]) -> set[int]:
    """Ids of the edited nodes and of everything above them."""
    edited = {
        *edits.replacements,
        *edits.removals,
        *edits.before,
        *edits.after,
        *edits.unwraps,
        *(id(w.first) for w in edits.wraps),
    }
    dirty: set[int] = set()
    for start in edited:
        node_id: int | None = start
        while node_id is not None and node_id not in dirty:
            dirty.add(node_id)
            parent = parents.get(node_id)
            node_id = id(parent) if parent is not None else None
    return dirty


class _Applier(cst.CSTTransformer):
    def __init__(self, edits: Edits, dirty: set[int] | None) -> None:
        super().__init__()
        self.edits = edits
        self.dirty = dirty

    def on_visit(self, node: cst.CSTNode) -> bool:
        return self.dirty is None or id(node) in self.dirty

    def on_leave(self, original_node: cst.CSTNode, updated_node: cst.CSTNode):  # type: ignore[override]
        updated = super().on_leave(original_node, updated_node)
        rebuild = self.edits.replacements.get(id(original_node))
        if rebuild is not None and isinstance(updated, cst.CSTNode):
            updated = rebuild(updated)
        if isinstance(updated, cst.Module | cst.IndentedBlock):
            updated = self._edit_body(original_node, updated)  # type: ignore[arg-type]
        return updated

    def _edit_body(
        self, original: cst.Module | cst.IndentedBlock, updated: cst.Module | cst.IndentedBlock
    ) -> cst.Module | cst.IndentedBlock:
        body: list[cst.BaseStatement] = []
        spans: dict[int, tuple[int, int]] = {}  # id(original) -> where its output sits in body
        # Lines above removed statements (blank ones and own-line comments), and the comments
        # they held: they go to the next statement, so a comment never disappears with its line.
        pending: list[cst.EmptyLine] = []
        for old, new in zip(original.body, updated.body, strict=True):
            emitted = [*self.edits.before.get(id(old), ())]
            start = len(body) + len(emitted)
            footer: Sequence[cst.EmptyLine] = ()
            if id(old) in self.edits.removals or self._emptied(old):
                pending.extend([*old.leading_lines, *comments_in(old)])
            elif id(old) in self.edits.unwraps:
                block = new.body  # type: ignore[attr-defined]
                inner = list(block.body)
                header = [cst.EmptyLine(indent=True, comment=block.header.comment)]
                lines = [
                    *new.leading_lines,
                    *(header if block.header.comment is not None else ()),
                    *inner[0].leading_lines,
                ]
                inner[0] = inner[0].with_changes(leading_lines=lines)
                emitted.extend(inner)
                footer = block.footer
            else:
                emitted.append(new)
            if new is not old and id(old) not in self.edits.removals and not self._emptied(old):
                _keep_comments(old, emitted, start - len(body))
            spans[id(old)] = (start, len(body) + len(emitted) - 1)
            emitted.extend(self.edits.after.get(id(old), ()))
            if emitted and pending:
                emitted[0] = _with_lines(emitted[0], pending)
                pending = []
            body.extend(emitted)
            pending.extend(footer)
        body = self._wrap(spans, body)
        if not body and isinstance(updated, cst.IndentedBlock):
            body = [cst.SimpleStatementLine([cst.Pass()])]
        comments = [line for line in pending if line.comment is not None]
        if comments:  # removed at the end of the block: the comments stay at its end
            updated = updated.with_changes(footer=[*comments, *updated.footer])
        return updated.with_changes(body=body)

    def _emptied(self, old: cst.BaseStatement) -> bool:
        """An ``if`` to unwrap whose every statement goes: nothing of it is left to keep."""
        body = getattr(old, "body", None)
        return id(old) in self.edits.unwraps and all(
            id(s) in self.edits.removals for s in getattr(body, "body", ())
        )

    def _wrap(
        self, spans: dict[int, tuple[int, int]], body: list[cst.BaseStatement]
    ) -> list[cst.BaseStatement]:
        """Fold each wrapped range of ``body`` into its ``with`` statement (last range first)."""
        ranges = [
            (spans[id(w.first)][0], spans[id(w.last)][1], w.header)
            for w in self.edits.wraps
            if id(w.first) in spans
        ]
        for start, end, header in sorted(ranges, key=lambda r: r[0], reverse=True):
            inner = body[start : end + 1]
            # Blank lines and comments above the first moved statement stay above the ``with``.
            lead = inner[0].leading_lines
            inner[0] = inner[0].with_changes(leading_lines=())
            statement = header.with_changes(body=cst.IndentedBlock(body=inner), leading_lines=lead)
            body[start : end + 1] = [statement]
        return body


def _with_lines(statement: cst.BaseStatement, lines: list[cst.EmptyLine]) -> cst.BaseStatement:
    """Give ``statement`` the lines that were above removed statements before it.

    Comments always move (above the statement's own lines); blank lines only fill in where the
    statement had no spacing of its own, so paragraphs keep one separating line.
    """
    own = list(statement.leading_lines)
    if not any(line.comment is not None for line in lines):
        return statement if own else statement.with_changes(leading_lines=lines)
    while lines and lines[-1].comment is None and own:
        lines = lines[:-1]
    return statement.with_changes(leading_lines=[*lines, *own])


def comments_in(node: cst.CSTNode, blocks: bool = True) -> list[cst.EmptyLine]:
    """The comments ``node`` holds below its own leading lines, in order, as own lines: what a
    removed or rewritten statement hands on, so that no comment disappears. Without ``blocks``,
    those in its indented blocks are left out: their statements are edited, and kept, on their own.
    """
    own = {id(line) for line in getattr(node, "leading_lines", ())}
    found: list[cst.EmptyLine] = []
    stack: list[cst.CSTNode] = [node]
    while stack:
        current = stack.pop()
        if isinstance(current, cst.Comment):
            found.append(cst.EmptyLine(indent=True, comment=current))
            continue
        stack.extend(
            child
            for child in reversed(current.children)
            if id(child) not in own and (blocks or not isinstance(child, cst.IndentedBlock))
        )
    return found


def _keep_comments(old: cst.BaseStatement, emitted: list[cst.BaseStatement], at: int) -> None:
    """Put the comments a rewrite dropped from ``old`` (one inside a device expression, in the
    arguments of a rewritten call) above ``emitted[at]``, its first statement out.

    A statement rewritten into one of its kind keeps its blocks, whose statements keep their own
    comments; one rewritten into another kind (an ``if`` chain into one assignment) hands on all.
    """
    dropped = comments_in(old, blocks=type(emitted[at]) is not type(old))
    lost = _missing(dropped, emitted[at:], blocks=False)
    if lost:  # or moved into a block the rewrite made (a ``with`` around the statement)
        lost = _missing(dropped, emitted[at:], blocks=True)
    if lost:
        first = emitted[at]
        emitted[at] = first.with_changes(leading_lines=[*first.leading_lines, *lost])


def _missing(
    lines: list[cst.EmptyLine], statements: list[cst.BaseStatement], blocks: bool
) -> list[cst.EmptyLine]:
    """The comments of ``lines`` that ``statements`` do not hold, counting repeats."""
    kept = Counter(
        line.comment.value
        for new in statements
        for line in [*new.leading_lines, *comments_in(new, blocks)]
        if line.comment is not None
    )
    missing = []
    for line in lines:
        if kept[line.comment.value] > 0:  # type: ignore[union-attr]
            kept[line.comment.value] -= 1  # type: ignore[union-attr]
        else:
            missing.append(line)
    return missing
