"""What every conversion step gets: the analysis, the user's options, and places to put its work."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

import libcst as cst

from accelify.transform.edits import Edits

if TYPE_CHECKING:
    from accelify.transform.analysis import Analysis

Target = Literal["accelify", "accelerate"]
MixedPrecision = Literal["no", "fp16", "bf16"]


@dataclass(frozen=True)
class Options:
    """What the user asked for on the command line."""

    target: Target = "accelify"
    mixed_precision: MixedPrecision | None = None
    gradient_accumulation_steps: int | None = None


@dataclass(frozen=True, order=True)
class Note:
    """One line of the report: a change made, or code left alone that needs a human."""

    line: int
    message: str
    manual: bool = False


@dataclass
class Plan:
    """Shared by the steps of one conversion: they read ``analysis`` and write ``edits``/notes."""

    analysis: Analysis
    options: Options
    edits: Edits = field(default_factory=Edits)
    notes: list[Note] = field(default_factory=list)

    def changed(self, node: cst.CSTNode, message: str) -> None:
        self.notes.append(Note(self.analysis.line(node), message))

    def needs_human(self, node: cst.CSTNode, message: str) -> None:
        self.notes.append(Note(self.analysis.line(node), message, manual=True))


Step = Callable[[Plan], None]
