"""One pass over a script: which names are the training objects, where the loops are."""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst
from libcst.metadata import CodeRange, MetadataWrapper, PositionProvider


@dataclass
class Analysis:
    module: cst.Module
    positions: dict[cst.CSTNode, CodeRange] = field(default_factory=dict)

    def line(self, node: cst.CSTNode) -> int:
        position = self.positions.get(node)
        return position.start.line if position else 0


def analyse(module: cst.Module) -> Analysis:
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    return Analysis(module, dict(wrapper.resolve(PositionProvider)))
