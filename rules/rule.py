"""What a rule is: a code, a kebab-case name, docs, cases, and ``visit_``/``leave_`` handlers.

Rules never walk the tree themselves: the engine walks it once and calls every rule's handlers
(Fixit's batched visitor), so adding a rule costs one more method call per matching node, not one
more traversal. A rule reports a node, a message and optionally a replacement node; positions are
computed later, only for files that have findings.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, ClassVar

import libcst as cst

if TYPE_CHECKING:
    from accelify.rules.facts import Facts


class Severity(str, Enum):
    ERROR = "error"  # a crash, a hang or a corrupt checkpoint on many processes
    WARNING = "warning"  # wrong results or wasted work
    INFO = "info"  # noise; off by default


@dataclass(frozen=True)
class Invalid:
    """A snippet the rule must flag; ``fixed``: what ``--fix --unsafe-fixes`` must make of it."""

    code: str
    fixed: str | None = None


@dataclass(eq=False)
class Report:
    """A finding before positions are known: the node it is about and an optional fix."""

    rule: type[Rule]
    node: cst.CSTNode
    message: str
    # The fix replaces ``old`` by ``new`` (or removes it, for a whole statement line).
    old: cst.CSTNode | None = None
    new: cst.CSTNode | cst.RemovalSentinel | None = None
    safe: bool = True


class Rule:
    """Base class; subclasses set the class attributes and define handlers."""

    code: ClassVar[str]
    name: ClassVar[str]
    severity: ClassVar[Severity] = Severity.WARNING
    enabled_by_default: ClassVar[bool] = True
    VALID: ClassVar[tuple[str, ...]] = ()
    INVALID: ClassVar[tuple[Invalid, ...]] = ()

    def __init__(self, facts: Facts, reports: list[Report]) -> None:
        self.facts = facts
        self._reports = reports

    def report(
        self,
        node: cst.CSTNode,
        message: str,
        *,
        replace: cst.CSTNode | None = None,
        new: cst.CSTNode | cst.RemovalSentinel | None = None,
        safe: bool = True,
    ) -> None:
        """Report ``node``; with ``new``, the fix replaces ``replace`` (default: ``node``) by it."""
        old = (replace or node) if new is not None else None
        self._reports.append(Report(type(self), node, message, old, new, safe))

    @classmethod
    def docs(cls) -> str:
        return inspect.cleandoc(cls.__doc__ or "")

    @classmethod
    def summary(cls) -> str:
        return cls.docs().splitlines()[0] if cls.__doc__ else cls.name
