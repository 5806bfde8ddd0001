"""The shape shared by the rules about work every process repeats (prints, bars, file writes)."""

from __future__ import annotations

import libcst as cst

from accelify.rules.facts import Facts, Where
from accelify.rules.rule import Report, Rule


class EveryProcessRule(Rule):
    """Collects calls during the traversal and judges them at the end of the module.

    Whether a script creates an Accelerator, and so runs on many processes, is only known once
    the whole file is read; a call counts when nothing restricts it to one process.
    """

    def __init__(self, facts: Facts, reports: list[Report]) -> None:
        super().__init__(facts, reports)
        self._candidates: list[tuple[cst.Call, Where, str | None]] = []

    def candidate(self, call: cst.Call, *, fixable: bool = True) -> None:
        """Remember ``call``, with the accelerator a fix could use when ``fixable``."""
        accelerator = self.facts.accelerator_here() if fixable else None
        self._candidates.append((call, self.facts.where(), accelerator))

    def leave_Module(self, node: cst.Module) -> None:
        if not self.facts.creates_accelerator:
            return
        for call, where, accelerator in self._candidates:
            if self.facts.runs_on(where) == "all" and not self.excused(where):
                self.flag(call, accelerator)

    def excused(self, where: Where) -> bool:
        """Whether a rule lets code every process runs pass there (a download run on the main
        process first)."""
        return False

    def flag(self, call: cst.Call, accelerator: str | None) -> None:
        """Report ``call``, which every process runs; ``accelerator`` names one for a fix."""
        raise NotImplementedError
