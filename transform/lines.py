"""Start lines of nodes, at a fraction of what libcst's ``PositionProvider`` costs.

``PositionProvider`` builds two ``CodePosition`` objects and a ``CodeRange`` per node and enters a
generator-based context manager for each: on a training script that costs more than the parse.
Reports need only the start line, so :func:`start_lines` regenerates the code once, counting
newlines and storing one int per node, with the same rule for where a node starts (its syntactic
start, else the start of its whitespace), so line numbers are the ones ``PositionProvider`` gives.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext

import libcst as cst

# The codegen hooks PositionProvider itself subclasses; libcst exports no public name for them.
# tests/convert/test_walk.py compares the lines with PositionProvider's on every fixture.
from libcst._nodes.internal import CodegenState

_NO_OP = nullcontext()


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
