"""Does a script take part in distributed training? Read, never run, before N processes start.

A script with no Accelerator, no ``torch.distributed`` and nothing else that splits work between
processes, started on N processes, trains N times side by side on all the data. The check reads the
script and the modules beside it that it imports (``ast``, no libcst: the runtime never imports
it) and looks for any sign of a distributed framework; when in doubt it finds one, since a warning
about a script that is in fact distributed would teach users to ignore it.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

# Module names (any part of a dotted import) that bring their own process coordination.
_MODULES = frozenset(
    {
        "accelerate", "accelify", "distributed", "deepspeed", "lightning", "pytorch_lightning",
        "lightning_fabric", "horovod", "torch_xla", "transformers", "trl", "ray", "colossalai",
    }
)  # fmt: skip
# Names and attributes that only a script that coordinates processes uses.
_NAMES = frozenset(
    {
        "Accelerator", "PartialState", "AcceleratorState", "notebook_launcher",
        "init_process_group", "DistributedDataParallel", "FullyShardedDataParallel",
        "fully_shard", "DistributedSampler", "Trainer", "Fabric",
    }
)  # fmt: skip
# Libraries whose workers learn the process count from HF Accelerate's state.
_HF_STATE = frozenset({"accelerate", "transformers", "trl", "peft", "setfit", "diffusers"})
# Environment variables a script reads to split the work itself.
_VARIABLES = frozenset({"RANK", "LOCAL_RANK", "WORLD_SIZE"})


def is_distributed(script: Path) -> bool:
    """True when ``script`` (or a module beside it that it imports) shows any sign of
    coordinating processes; also True when it cannot be read or parsed (no warning then)."""
    for tree, imports in _modules(script):
        if tree is None:
            return True
        if any(set(name.split(".")) & (_MODULES | _NAMES) for name in imports) or _uses_names(tree):
            return True
    return False


def uses_hf_state(script: Path) -> bool:
    """Whether ``script`` (or a module beside it) imports a library whose processes take their
    count from HF Accelerate's state (accelerate, or transformers' Trainer, trl, ...)."""
    return any(
        name.split(".")[0] in _HF_STATE for _, imports in _modules(script) for name in imports
    )


def _modules(script: Path) -> Iterator[tuple[ast.Module | None, list[str]]]:
    """The parsed script and the modules beside it that it imports, each with what it imports;
    ``(None, [])`` for one that cannot be read or parsed."""
    seen: set[Path] = set()
    pending = [script.resolve()]
    while pending:
        path = pending.pop()
        if path in seen:
            continue
        seen.add(path)
        try:
            tree = ast.parse(path.read_bytes(), str(path))
        except (OSError, SyntaxError, ValueError):
            yield None, []
            continue
        imports = _imported(tree)
        yield tree, imports
        pending += _beside(script.resolve().parent, imports)


def _imported(tree: ast.Module) -> list[str]:
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            names.append(base)
            names += [f"{base}.{alias.name}".lstrip(".") for alias in node.names]
    return names


def _uses_names(tree: ast.Module) -> bool:
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id in _NAMES:
            return True
        if isinstance(node, ast.Attribute) and node.attr in _NAMES:
            return True
        if isinstance(node, ast.Constant) and node.value in _VARIABLES:
            return True
    return False


def _beside(folder: Path, imports: list[str]) -> list[Path]:
    """The script's own modules among ``imports``: files and packages in its folder."""
    found = []
    for name in imports:
        parts = [part for part in name.split(".") if part]
        for depth in range(1, len(parts) + 1):
            stem = folder.joinpath(*parts[:depth])
            found += [p for p in (stem.with_suffix(".py"), stem / "__init__.py") if p.is_file()]
    return found
