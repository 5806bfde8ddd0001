"""What a name in a script refers to, read through the file's own imports.

``DDP(model)`` is ``torch.nn.parallel.DistributedDataParallel`` when the file says
``from torch.nn.parallel import DistributedDataParallel as DDP``; ``DataLoader`` is torch's only
when it was imported from ``torch``. Matching the last part of a name alone misses aliases (a
second wrapper around an already wrapped model) and confuses namesakes (a torchtext iterator
"prepared" as if it were a DataLoader). A name the file neither imports nor defines (a snippet
without imports, a ``from x import *``) can only be judged by its last part, as a fallback.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from accelify.transform.patterns import dotted_name
from accelify.transform.walk import Visitor, walk


@dataclass
class Names:
    """Local name -> qualified name for every import in a file, and the names it defines."""

    imports: dict[str, str] = field(default_factory=dict)
    defined: set[str] = field(default_factory=set)  # classes and functions of the file
    statements: dict[str, cst.CSTNode] = field(default_factory=dict)  # the import binding a name
    stars: set[str] = field(default_factory=set)  # modules imported with ``from x import *``

    def qualify(self, node: cst.BaseExpression) -> str | None:
        """``nn.parallel.DistributedDataParallel`` -> ``torch.nn.parallel.Distributed...`` when
        ``nn`` was imported as ``torch.nn``; None when the head of the name is not an import."""
        dotted = dotted_name(node)
        if dotted is None:
            return None
        head, dot, rest = dotted.partition(".")
        qualified = self.imports.get(head)
        if qualified is None:
            return None
        return f"{qualified}{dot}{rest}"

    def local_name(self, qualified: str) -> str | None:
        """The name ``qualified`` was imported as (``torch`` for ``import torch``), if it was."""
        return next((local for local, q in self.imports.items() if q == qualified), None)

    def last_part(self, node: cst.BaseExpression) -> str | None:
        """The name ``node`` stands for, without its package: ``DS`` imported as
        ``DistributedSampler as DS`` is ``DistributedSampler``."""
        dotted = self.qualify(node) or dotted_name(node)
        return dotted.rsplit(".", 1)[-1] if dotted else None

    def refers_to(self, node: cst.BaseExpression, packages: tuple[str, ...], name: str) -> bool:
        """Whether ``node`` names ``name`` from one of ``packages`` (any submodule of them).

        A name that is not imported matches by its last part, unless the file defines it.
        """
        dotted = dotted_name(node)
        if dotted is None or self.last_part(node) != name:
            return False
        qualified = self.qualify(node)
        if qualified is None:
            head = dotted.split(".", 1)[0]
            return head not in self.defined
        return qualified.split(".", 1)[0] in packages

    def from_package(self, node: cst.BaseExpression, *packages: str) -> bool:
        """Whether ``node`` is a name imported from one of ``packages`` (or a submodule)."""
        qualified = self.qualify(node)
        return qualified is not None and any(
            qualified == p or qualified.startswith(f"{p}.") for p in packages
        )


def collect_names(module: cst.Module) -> Names:
    """Every import of the file, wherever it is (functions import too), and its definitions."""
    collector = NameCollector(Names())
    walk(module, collector)
    return collector.names


class NameCollector(Visitor):
    """Fills a :class:`Names`; the analysis' own traversal inherits it, so no extra walk."""

    def __init__(self, names: Names) -> None:
        super().__init__()
        self.names = names

    def visit_Import(self, node: cst.Import) -> None:
        for alias in node.names:
            full = dotted_name(alias.name) or ""
            if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
                self._record_import(alias.asname.name.value, full, node)
            elif (head := full.split(".", 1)[0]) not in self.names.imports:  # binds ``a``
                self._record_import(head, head, node)

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        dots = "." * len(node.relative)
        base = dots + (dotted_name(node.module) or "" if node.module is not None else "")
        if isinstance(node.names, cst.ImportStar):
            self.names.stars.add(base)
            return
        for alias in node.names:
            name = dotted_name(alias.name) or ""
            local = (
                alias.asname.name.value
                if alias.asname is not None and isinstance(alias.asname.name, cst.Name)
                else name
            )
            joiner = "" if base.endswith(".") or not base else "."
            self._record_import(local, f"{base}{joiner}{name}", node)

    def _record_import(self, local: str, qualified: str, node: cst.CSTNode) -> None:
        self.names.imports[local] = qualified
        self.names.statements[local] = node

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self.names.defined.add(node.name.value)

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.names.defined.add(node.name.value)
