"""What the rewrites of hand-written distribution share: the original's analysis, the edits they
plan on it, their report, and what they learnt about the script's rank values.

Every rewrite reads the *original* tree and records edits keyed by its nodes (as the conversion
steps do), so the report's lines are the user's and one traversal applies all of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from accelify.transform.analysis import Analysis, Scope, key_of
from accelify.transform.edits import Edits
from accelify.transform.plan import Note
from accelify.transform.refusals import Refusal
from accelify.transform.setup import Refused


@dataclass
class Rewrite:
    """Shared by the rewrites of one file, in the order :func:`dedistribute` runs them."""

    analysis: Analysis
    path: str = "<string>"  # the file, whose neighbours the helpers' rewrite reads
    edits: Edits = field(default_factory=Edits)
    notes: list[Note] = field(default_factory=list)
    # DistributedDataParallel keyword options that carry over (``find_unused_parameters=True``).
    ddp_options: dict[str, cst.BaseExpression] = field(default_factory=dict)
    # (id of the scope's node or its class, key) -> the placeholder its value now comes from.
    ranks: dict[tuple[int, str], str] = field(default_factory=dict)
    # id of a rank read no call spells (``args.local_rank``) -> what it now reads.
    rank_reads: dict[int, str] = field(default_factory=dict)
    dropped: list[cst.CSTNode] = field(default_factory=list)  # branches only a 1-process run took
    # (owner, key) of every name or ``self.`` attribute a DistributedDataParallel was bound to.
    wrapped: set[tuple[int, str]] = field(default_factory=set)
    # qualified name -> the torch.distributed query its function beside the file answers.
    queries: dict[str, str | None] = field(default_factory=dict)

    def changed(self, node: cst.CSTNode, message: str) -> None:
        self.notes.append(Note(self.analysis.line(node), message))

    def info(self, node: cst.CSTNode, message: str) -> None:
        self.notes.append(Note(self.analysis.line(node), message, info=True))

    def refuse(self, node: cst.CSTNode, family: Refusal, why: str) -> Refused:
        return Refused(node, family, why)

    def remove(self, statement: cst.CSTNode) -> None:
        """Remove a statement; an ``if`` left with nothing but removed statements goes too."""
        self.edits.remove_emptying(statement, self.analysis.parent)

    def bare_statement(self, call: cst.Call, family: Refusal) -> cst.BaseStatement:
        """The statement line that is only ``call``; :class:`Refused` (of ``family``) if its
        value is used."""
        parent = self.analysis.parent(call)
        line = self.analysis.parent(parent) if isinstance(parent, cst.Expr) else None
        if not isinstance(line, cst.SimpleStatementLine) or len(line.body) != 1:
            raise self.refuse(call, family, "its result is used; convert by hand")
        return line

    def owner(self, scope: Scope, key: str) -> int:
        """Where ``key`` lives: a ``self.`` attribute in its class, a name in its function (or
        at module level when the function only reads it)."""
        if key.startswith("self.") and scope.cls is not None:
            return id(scope.cls)
        if not scope.is_module and self.analysis.reads_global(scope, key):
            return id(self.analysis.scopes[0].node)
        return id(scope.node)

    def rank_of(self, expr: cst.BaseExpression) -> str | None:
        """The placeholder a name or ``self.`` attribute holding a rank value now reads."""
        key = key_of(expr)
        if key is None:
            return None
        scope = self.analysis.scope_of.get(id(expr))
        return self.ranks.get((self.owner(scope, key), key)) if scope is not None else None

    def is_wrapped(self, expr: cst.BaseExpression) -> bool:
        """Whether a name or ``self.`` attribute holds a model the script wrapped in DDP."""
        key = key_of(expr)
        scope = self.analysis.scope_of.get(id(expr))
        if key is None or scope is None:
            return False
        return (self.owner(scope, key), key) in self.wrapped
