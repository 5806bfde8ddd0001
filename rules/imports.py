"""What a name refers to through the file's imports, for rules that must not guess (``DDP`` is
``DistributedDataParallel`` only when it was imported as that).

The converter's own :class:`~accelify.transform.names.NameCollector` fills the table during the
engine's one traversal: imports sit at the top of a file, so a rule asking at a call has them.
"""

from __future__ import annotations

import libcst as cst

from accelify.rules.facts import Facts
from accelify.rules.rule import Report, Rule
from accelify.transform.names import NameCollector, Names
from accelify.transform.patterns import callee_name

TORCH = ("torch",)
# Modules that wrap a model for distributed training, as torch names them.
WRAPPERS = ("DistributedDataParallel", "FullyShardedDataParallel", "DataParallel")


class ImportsRule(Rule):
    """A rule with ``self.names``: the file's imports read so far."""

    def __init__(self, facts: Facts, reports: list[Report]) -> None:
        super().__init__(facts, reports)
        self.names = Names()
        self._collector = NameCollector(self.names)

    def visit_Import(self, node: cst.Import) -> None:
        self._collector.visit_Import(node)

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        self._collector.visit_ImportFrom(node)

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self._collector.visit_ClassDef(node)

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self._collector.visit_FunctionDef(node)

    def wrapper(self, value: cst.BaseExpression | None) -> str | None:
        """Which torch wrapper ``value`` builds (``DDP(model)``), if it builds one."""
        return next((w for w in WRAPPERS if self.builds(value, w)), None)

    def builds(self, value: cst.BaseExpression | None, torch_name: str) -> bool:
        """Whether ``value`` calls torch's ``torch_name``, under its name or an alias of it."""
        if not isinstance(value, cst.Call):
            return False
        name = callee_name(value)
        if name != torch_name and name not in self.names.imports:  # cheap: most calls stop here
            return False
        return self.names.refers_to(value.func, TORCH, torch_name)
