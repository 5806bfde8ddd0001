"""Line numbers: where nodes start in a tree, and where lines went when a source was rewritten.

``PositionProvider`` builds two ``CodePosition`` objects and a ``CodeRange`` per node and enters a
generator-based context manager for each: on a training script that costs more than the parse.
Reports need only the start line, so :func:`start_lines` regenerates the code once, counting
newlines and storing one int per node, with the same rule for where a node starts (its syntactic
start, else the start of its whitespace), so line numbers are the ones ``PositionProvider`` gives.

The report is made on the original tree; once the result is written, :class:`LineMap` moves each
line number into the written file, and its hunks are the places a review would annotate.
"""

from __future__ import annotations

import difflib
import re
from contextlib import AbstractContextManager, nullcontext

import libcst as cst

# The codegen hooks PositionProvider itself subclasses; libcst exports no public name for them.
# tests/convert/test_walk.py compares the lines with PositionProvider's on every fixture.
from libcst._nodes.internal import CodegenState

_NO_OP = nullcontext()
# Where libcst ends a line ("\r\n", "\r" or "\n"); str.splitlines would also split at form feeds.
_LINE_END = re.compile(r"\r\n|\r|\n")


class _LineState(CodegenState):
    """A codegen state that remembers the line each node starts on."""

    def __init__(self, module: cst.Module) -> None:
        super().__init__(module.default_indent, module.default_newline)
        self.line = 1
        self.starts: dict[int, int] = {}
        self.hoisted: dict[int, cst.CSTNode] = {}  # node -> the child its start is taken from

    def add_token(self, value: str) -> None:
        self.tokens.append(value)
        if "\n" in value or "\r" in value:  # "\r\n", "\r" and "\n" each end one line
            self.line += value.count("\n") + value.count("\r") - value.count("\r\n")

    def before_codegen(self, node: cst.CSTNode) -> None:
        self.starts[id(node)] = self.line

    def record_syntactic_position(
        self,
        node: cst.CSTNode,
        *,
        start_node: cst.CSTNode | None = None,
        end_node: cst.CSTNode | None = None,
    ) -> AbstractContextManager[None]:
        if start_node is not None:
            self.hoisted[id(node)] = start_node
        else:
            self.starts[id(node)] = self.line
        return _NO_OP


def start_lines(module: cst.Module) -> dict[int, int]:
    """``id(node) -> 1-based start line`` for every node of ``module``."""
    state = _LineState(module)
    module._codegen(state)
    starts = state.starts
    for node_id, child in state.hoisted.items():
        starts[node_id] = starts[id(child)]
    return starts


class LineMap:
    """How the lines of ``before`` moved in ``after``: one difflib pass, then asked per line."""

    def __init__(self, before: str, after: str) -> None:
        self.old = _LINE_END.split(before)
        self.new = _LINE_END.split(after)
        matcher = difflib.SequenceMatcher(None, self.old, self.new, autojunk=False)
        self.blocks = matcher.get_opcodes()

    def new_line(self, line: int) -> int:
        """The 1-based line of ``after`` that holds what line ``line`` of ``before`` held.

        A rewritten line maps to the most similar line its block became (inserted lines around it
        are not it); a deleted line maps to the line that now stands where it stood.
        """
        index = line - 1
        for tag, i1, i2, j1, j2 in self.blocks:
            if not i1 <= index < i2:
                continue
            if tag == "equal":
                return j1 + index - i1 + 1
            if j1 == j2:
                return min(j1 + 1, len(self.new))
            text = self.old[index].strip()
            return 1 + max(range(j1, j2), key=lambda j: _similarity(text, self.new[j].strip()))
        return line  # past the end (a note at EOF)

    def written_line(self, line: int, start: str, reach: int = 10) -> int | None:
        """The line of ``after`` nearest to where line ``line`` of ``before`` went that starts
        (indentation aside) with ``start``: a line a change inserted next to it."""
        near = self.new_line(line) - 1
        for distance in range(reach + 1):
            for index in (near - distance, near + distance):
                if 0 <= index < len(self.new) and self.new[index].lstrip().startswith(start):
                    return index + 1
        return None

    def hunks(self) -> list[tuple[int, int, list[str], list[str]]]:
        """``(first, last, removed, added)`` per changed block; lines of ``before``, 1-based.

        An insertion has ``last == first - 1``: it goes between those two lines.
        """
        return [
            (i1 + 1, i2, self.old[i1:i2], self.new[j1:j2])
            for tag, i1, i2, j1, j2 in self.blocks
            if tag != "equal"
        ]


def _similarity(a: str, b: str) -> float:
    return difflib.SequenceMatcher(None, a, b, autojunk=False).ratio()
