"""The shape shared by the rules about work every process repeats (prints, bars, file writes)."""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from accelify.rules.facts import Facts, Where
from accelify.rules.rule import Report, Rule


@dataclass(frozen=True)
class Reach:
    """The accelerator that advice or a fix at a call may name."""

    name: str | None  # one visible there ("accelerator" when it is), None when none is
    fix: str | None  # the one a fix may write: the only one visible, when the rule fixes

    def test(self, attribute: str = "is_main_process") -> str:
        """The process test that advice writes: through the accelerator in reach, else through
        ``PartialState``, which needs none (a name that is not bound there is a NameError)."""
        return f"{self.name or 'PartialState()'}.{attribute}"


class EveryProcessRule(Rule):
    """Collects calls during the traversal and judges them at the end of the module.

    Whether a script creates an Accelerator, and so runs on many processes, is only known once
    the whole file is read; a call counts when nothing restricts it to one process.
    """

    def __init__(self, facts: Facts, reports: list[Report]) -> None:
        super().__init__(facts, reports)
        self._candidates: list[tuple[cst.Call, Where, Reach]] = []

    def candidate(self, call: cst.Call, *, fixable: bool = True) -> None:
        """Remember ``call``, with the accelerator its advice (and, when ``fixable``, its fix)
        can name."""
        self._candidates.append((call, self.facts.where(), self.reach(fixable=fixable)))

    def reach(self, *, fixable: bool = True) -> Reach:
        """The accelerator in reach at this point of the traversal."""
        names = self.facts.visible_accelerators()
        name = "accelerator" if "accelerator" in names else min(names, default=None)
        return Reach(name, name if fixable and len(names) == 1 else None)

    def leave_Module(self, node: cst.Module) -> None:
        if not self.facts.creates_accelerator:
            return
        for call, where, reach in self._candidates:
            if self.facts.runs_on(where) == "all" and not self.excused(call, where):
                self.flag(call, reach)

    def excused(self, call: cst.Call, where: Where) -> bool:
        """Whether a rule lets code every process runs pass there (a download run on the main
        process first)."""
        return False

    def flag(self, call: cst.Call, reach: Reach) -> None:
        """Report ``call``, which every process runs; ``reach`` names an accelerator for advice."""
        raise NotImplementedError
