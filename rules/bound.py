"""Names bound, in the function being walked, to a value of one kind: a tensor whose length
differs between processes, a Python number. Rules ask about the argument of a collective.

The last binding in source order decides, as it does for a reader of the code; a name bound to
anything else forgets the kind. What comes from another function is not followed: such a rule
stays silent rather than guess.
"""

from __future__ import annotations

from collections.abc import Callable

import libcst as cst

from accelify.rules.facts import Facts
from accelify.transform.patterns import target_names

# Whether a value is of the kind, given whether a name (in this function) already is.
Kind = Callable[[cst.BaseExpression, Callable[[str], bool]], bool]


class Bound:
    """The names of one kind, per function; fed by a rule's ``leave_Assign``/``leave_AugAssign``."""

    def __init__(self, facts: Facts, kind: Kind) -> None:
        self._facts = facts
        self._kind = kind
        self._names: dict[cst.FunctionDef | None, set[str]] = {}

    def here(self) -> bool:
        """Whether some name of this function is of the kind: rules skip work while none is."""
        return bool(self._names.get(self._facts.function()))

    def holds(self, value: cst.BaseExpression) -> bool:
        """Whether ``value`` is of the kind: by what it is, or by the name it reads."""
        return self._kind(value, self._named)

    def _named(self, name: str) -> bool:
        return name in self._names.get(self._facts.function(), ())

    def assign(self, node: cst.Assign | cst.AugAssign | cst.AnnAssign) -> None:
        """Record what ``node`` binds; ``total += x`` is of the kind when ``total + x`` is."""
        value: cst.BaseExpression | None = node.value
        if isinstance(node, cst.Assign):
            targets = [t.target for t in node.targets]
        else:
            targets = [node.target]
            if isinstance(node, cst.AugAssign):
                value = cst.BinaryOperation(node.target, cst.Add(), node.value)
        for target in targets:
            self._bind(target, value)

    def mark(self, target: cst.BaseExpression) -> None:
        """Make every name ``target`` binds of the kind (a loop over what yields such values)."""
        self._names.setdefault(self._facts.function(), set()).update(target_names(target))

    def _bind(self, target: cst.BaseExpression, value: cst.BaseExpression | None) -> None:
        pairs = isinstance(target, cst.Tuple | cst.List) and isinstance(value, cst.Tuple | cst.List)
        if pairs and len(target.elements) == len(value.elements):  # a, b = 0, 0
            for one, other in zip(target.elements, value.elements, strict=True):
                self._bind(one.value, other.value)
            return
        function = self._facts.function()
        if value is not None and self._kind(value, self._named):
            self._names.setdefault(function, set()).update(target_names(target))
        elif self._names.get(function):
            self._names[function].difference_update(target_names(target))
