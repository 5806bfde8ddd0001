"""Whole-file verdicts, taken before any setup is looked at.

A file that already uses an Accelerator (HF's or ours, under any import) is an Accelerate script:
converting it again would prepare prepared objects and divide divided losses, so it is left as it
is (accel-lint is the tool for it). A file that distributes itself (``init_process_group``, a DDP
or FSDP wrapper under any alias, a ``DistributedSampler``, ``mp.spawn``, a model shared with
worker processes) would end up distributed twice; it is left unchanged, with the first such line.
A script that hands its model to ``transformers.Trainer`` (or trl's trainers) trains on Accelerate
already: launched by accel-run or torchrun, the Trainer distributes itself.
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from accelify.transform.analysis import Analysis
from accelify.transform.names import Names
from accelify.transform.patterns import dotted_name
from accelify.transform.refusals import (
    ALREADY_DISTRIBUTED,
    OTHER_PARALLELISM,
    TRAINER_AND_LOOP,
    Refusal,
)

# Packages whose objects already own the training loop's distribution.
_ACCELERATE_PACKAGES = ("accelerate", "accelify.runtime")
_ENGINES = {
    "lightning": "Lightning",
    "pytorch_lightning": "Lightning",
    "lightning_fabric": "Lightning Fabric",
    "horovod": "Horovod",
    "torch_xla": "torch_xla",
}
# Packages whose ``...Trainer`` classes run the training loop on Accelerate themselves.
_TRAINER_PACKAGES = frozenset({"transformers", "trl", "setfit", "sentence_transformers"})
# Calls of torch.distributed that do more than ask whether it is there.
_DIST_QUERIES = frozenset(
    {"is_available", "is_initialized", "get_rank", "get_world_size", "is_torchelastic_launched"}
)
# (package, last part of the name) -> what the script does with it.
_DISTRIBUTING = {
    "DistributedDataParallel": "wraps the model in DistributedDataParallel",
    "DataParallel": "wraps the model in DataParallel",
    "FullyShardedDataParallel": "shards the model with FSDP",
    "fully_shard": "shards the model with FSDP",
    "DistributedSampler": "shards the data with a DistributedSampler",
    "init_device_mesh": "builds a DeviceMesh",
    "DeviceMesh": "builds a DeviceMesh",
    "parallelize_module": "parallelises tensors by hand",
    "spawn": "starts its own processes (mp.spawn)",
    "start_processes": "starts its own processes",
    "Process": "trains in worker processes it starts itself",
    "initialize": "hands the model to deepspeed.initialize",
}
# Names too common to trust without an import from these packages.
_NEEDS_IMPORT = {
    "spawn": ("torch.multiprocessing",),
    "start_processes": ("torch.multiprocessing",),
    "Process": ("torch.multiprocessing",),
    "initialize": ("deepspeed",),
}


@dataclass(frozen=True)
class Verdict:
    """Why a whole file is left alone; ``skip``: it needs nothing (it is already converted)."""

    node: cst.CSTNode
    reason: str
    skip: bool
    family: Refusal


def file_verdict(a: Analysis, names: Names) -> Verdict | None:
    """The first reason to leave the whole file unchanged, or None."""
    for local, qualified in names.imports.items():
        if any(qualified == p or qualified.startswith(f"{p}.") for p in _ACCELERATE_PACKAGES):
            node = names.statements[local]
            why = f"already an Accelerate script (imports {qualified})"
            return Verdict(node, why, skip=True, family=ALREADY_DISTRIBUTED)
        engine = _ENGINES.get(qualified.split(".", 1)[0])
        if engine is not None:
            node = names.statements[local]
            why = f"{engine} already runs this training (imports {qualified})"
            return Verdict(node, why, skip=True, family=ALREADY_DISTRIBUTED)
    for call, _scope in a.calls:
        trainer = _library_trainer(call, names)
        if trainer is not None:
            return _trained_by(a, call, trainer)
        reason = _distributes(call, names)
        if reason is not None and not _forward_only(a, reason):
            return Verdict(
                call,
                f"left unchanged: the script {reason}; accel-convert does not rewrite "
                "hand-written distribution",
                skip=False,
                family=OTHER_PARALLELISM,
            )
    return None


def _forward_only(a: Analysis, reason: str) -> bool:
    """DataParallel in a file that never calls backward spreads one process's forward over its
    GPUs (a predictor class, an evaluation script): nothing an accelerator would change."""
    return reason == _DISTRIBUTING["DataParallel"] and not a.backward_calls


def _library_trainer(call: cst.Call, names: Names) -> str | None:
    """``transformers.Trainer``, ``Seq2SeqTrainer``, ``trl.SFTTrainer``, ... built here."""
    qualified = names.qualify(call.func)
    if qualified is None or qualified.split(".", 1)[0] not in _TRAINER_PACKAGES:
        return None
    return qualified if qualified.endswith("Trainer") else None


def _trained_by(a: Analysis, call: cst.Call, trainer: str) -> Verdict:
    if a.backward_calls:  # a loop of its own beside the Trainer's: which one runs is the script's
        line = a.line(a.backward_calls[0][0])
        return Verdict(
            call,
            f"left unchanged: the script trains through {trainer} and also by hand (line "
            f"{line}); convert the hand-written loop by hand",
            skip=False,
            family=TRAINER_AND_LOOP,
        )
    return Verdict(
        call,
        f"{trainer} already distributes this training (on Accelerate): launch the script with "
        "accel-run; what the script writes outside it runs on every process, so guard that with "
        "trainer.is_world_process_zero()",
        skip=True,
        family=ALREADY_DISTRIBUTED,
    )


def _distributes(call: cst.Call, names: Names) -> str | None:
    func = call.func
    dotted = dotted_name(func)
    if dotted is None:
        return None
    last = names.last_part(func) or dotted
    if names.from_package(func, "torch.distributed") and last not in _DIST_QUERIES:
        return _DISTRIBUTING.get(last, f"calls torch.distributed ({dotted})")
    if last == "share_memory" and isinstance(func, cst.Attribute):
        return "shares a model with other processes (share_memory)"
    if last not in _DISTRIBUTING:
        return None
    packages = _NEEDS_IMPORT.get(last)
    if packages is None:  # a name only torch uses: its last part is enough without an import
        return _DISTRIBUTING[last] if names.refers_to(func, ("torch",), last) else None
    return _DISTRIBUTING[last] if names.from_package(func, *packages) else None
