"""Edits keyed by nodes of the original tree, and the single pass that applies them.

Steps describe what should change (replace this expression, drop that statement, put these
statements before it, wrap those statements in a ``with`` block) and :func:`apply` does all of it
in one bottom-up traversal. Because every edit names an *original* node, an outer edit sees the
inner edits already applied: a wrapped loop body still gets its ``accelerator.backward`` swap.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
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

    def replace(self, node: cst.CSTNode, new: cst.CSTNode | Rebuild) -> None:
        """Replace ``node``; a callable receives the node with inner edits already applied."""
        self.replacements[id(node)] = new if callable(new) else (lambda _updated: new)

    def remove(self, statement: cst.BaseStatement) -> None:
        self.removals.add(id(statement))

    def insert_before(self, statement: cst.BaseStatement, *new: cst.BaseStatement) -> None:
        self.before.setdefault(id(statement), []).extend(new)

    def insert_after(self, statement: cst.BaseStatement, *new: cst.BaseStatement) -> None:
        self.after.setdefault(id(statement), []).extend(new)

    def wrap(self, first: cst.BaseStatement, last: cst.BaseStatement, header: cst.With) -> None:
        """Move the statements from ``first`` to ``last`` (same block) into ``header``'s body."""
        self.wraps.append(_Wrap(first, last, header))

    def is_removed(self, statement: cst.CSTNode) -> bool:
        return id(statement) in self.removals

    def __bool__(self) -> bool:
        return bool(self.replacements or self.removals or self.before or self.after or self.wraps)


def apply(module: cst.Module, edits: Edits) -> cst.Module:
    """Apply ``edits`` to ``module`` (the tree the edits were planned on)."""
    if not edits:
        return module
    return module.visit(_Applier(edits))


class _Applier(cst.CSTTransformer):
    def __init__(self, edits: Edits) -> None:
        super().__init__()
        self.edits = edits

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
        pairs = list(zip(original.body, updated.body, strict=True))
        body: list[cst.BaseStatement] = []
        blank: tuple[cst.EmptyLine, ...] = ()  # blank lines above a removed statement
        for old, new in pairs:
            emitted = [*self.edits.before.get(id(old), ())]
            if id(old) in self.edits.removals:
                blank = blank or tuple(ln for ln in old.leading_lines if ln.comment is None)
            else:
                emitted.append(new)
            emitted.extend(self.edits.after.get(id(old), ()))
            if emitted and blank:
                emitted[0] = _with_blank_lines(emitted[0], blank)
                blank = ()
            body.extend(emitted)
        body = self._wrap(pairs, body)
        if not body and isinstance(updated, cst.IndentedBlock):
            body = [cst.SimpleStatementLine([cst.Pass()])]
        return updated.with_changes(body=body)

    def _wrap(
        self, pairs: Sequence[tuple[cst.BaseStatement, cst.BaseStatement]], body: list
    ) -> list[cst.BaseStatement]:
        """Fold each wrapped range of ``body`` into its ``with`` statement."""
        ids = {id(old) for old, _ in pairs}
        for wrap in self.edits.wraps:
            if id(wrap.first) not in ids:
                continue
            first = next(new for old, new in pairs if old is wrap.first)
            last = next(new for old, new in pairs if old is wrap.last)
            start = _index(body, first)
            end = _index(body, last)
            inner = body[start : end + 1]
            # The first moved statement's leading blank lines/comments stay above the ``with``.
            head = inner[0]
            lead = getattr(head, "leading_lines", ())
            inner[0] = head.with_changes(leading_lines=()) if lead else head
            block = cst.IndentedBlock(body=inner)
            statement = wrap.header.with_changes(body=block, leading_lines=lead)
            body[start : end + 1] = [statement]
        return body


def _index(body: list, node: cst.CSTNode) -> int:
    return next(i for i, statement in enumerate(body) if statement is node)


def _with_blank_lines(
    statement: cst.BaseStatement, blank: tuple[cst.EmptyLine, ...]
) -> cst.BaseStatement:
    """Keep the spacing of a removed statement on the one that takes its place."""
    if statement.leading_lines:
        return statement
    return statement.with_changes(leading_lines=blank)
