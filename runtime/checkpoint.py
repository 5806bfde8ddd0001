"""Writing and reading weights and full training states.

Every file is written to a temporary name and renamed into place, and ``save_state`` builds the
whole checkpoint in a hidden ``.<name>.partial`` folder before renaming it, so a crash while saving
never damages the previous checkpoint. Loading uses safetensors or
``torch.load(weights_only=True)`` only, and every restore error is raised.

The folder has HF Accelerate's layout (:mod:`.hf_layout`), so each runtime resumes the other's.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import re
import secrets
import shutil
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import torch

from . import checksums, hf_layout, rng
from .hf_layout import model_files, numbered
from .hooks import StateHooks
from .precision import Precision
from .strategies import Strategy

SAFE_WEIGHTS = "model.safetensors"
TORCH_WEIGHTS = "pytorch_model.bin"
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]I?B|B)?\s*$", re.IGNORECASE)
_UNITS = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}
_UNITS.update({"KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40})
_CHECKPOINT = re.compile(r"^checkpoint_(\d+)$")
META = "accelify_state.json"


def parse_size(size: int | str) -> int:
    """``10GB`` -> 10**9 bytes, ``1GiB`` -> 2**30 (HF's units); ints are bytes already."""
    if isinstance(size, int):
        return size
    match = _SIZE.match(size)
    if not match:
        raise ValueError(f"max_shard_size {size!r} is not a size such as '500MB' or '2GiB'")
    return int(float(match[1]) * _UNITS[(match[2] or "B").upper()])


@contextlib.contextmanager
def _atomic(path: Path) -> Iterator[str]:
    """Yield a temporary name next to ``path``; rename it to ``path`` if the block succeeds."""
    if not path.parent.is_dir():
        raise FileNotFoundError(f"{path.parent}: no such folder to save {path.name} in")
    tmp = str(path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp"))
    # Created like open() would create it, so the umask applies (mkstemp's would be 0600).
    os.close(os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException as err:
        Path(tmp).unlink(missing_ok=True)
        # torch.save says "file write failed" without the file; a full disk must name it.
        if isinstance(err, OSError) or (isinstance(err, RuntimeError) and "write" in str(err)):
            raise OSError(f"{path}: not saved: {err}") from err
        raise


def save(obj: Any, f: str | os.PathLike | BinaryIO, safe_serialization: bool = False) -> None:
    """``torch.save`` (or safetensors for a flat dict of tensors), written atomically."""
    if hasattr(f, "write"):  # an open file: the caller owns atomicity
        if safe_serialization:
            from safetensors.torch import save as to_bytes

            f.write(to_bytes(_untie(obj), metadata={"format": "pt"}))
        else:
            torch.save(obj, f)
        return
    path = Path(f)
    with _atomic(path) as tmp:
        if safe_serialization:
            _save_safetensors(obj, tmp)
        else:
            torch.save(obj, tmp)


def _save_safetensors(state_dict: dict[str, torch.Tensor], path: str) -> None:
    from safetensors.torch import save_file

    save_file(_untie(state_dict), path, metadata={"format": "pt"})


def _storage_key(tensor: torch.Tensor) -> tuple:
    return (tensor.device, tensor.untyped_storage().data_ptr())


def _untie(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Drop names that alias an earlier tensor (tied weights); copy other shared storage.

    safetensors refuses tensors that share memory; loading restores the aliases by tying.
    """
    seen: dict[tuple, torch.Tensor] = {}
    out = {}
    for name, value in state_dict.items():
        tensor = value.detach()
        first = seen.setdefault(_storage_key(tensor), tensor)
        if first is tensor:
            out[name] = tensor.contiguous()
        elif first.storage_offset() != tensor.storage_offset() or first.shape != tensor.shape:
            out[name] = tensor.clone()
    return out


def save_model(
    state_dict: dict[str, torch.Tensor],
    directory: str | os.PathLike,
    max_shard_size: int | str = "10GB",
    safe_serialization: bool = True,
) -> None:
    """Write weights as one file, or as shards plus an index above ``max_shard_size``."""
    folder = Path(directory)
    if folder.is_file():
        raise ValueError(f"{folder}: is a file, save_model needs a directory")
    folder.mkdir(parents=True, exist_ok=True)
    weights = SAFE_WEIGHTS if safe_serialization else TORCH_WEIGHTS
    state_dict = _untie(state_dict) if safe_serialization else state_dict
    shards = _shard(state_dict, parse_size(max_shard_size))
    stem, suffix = weights.rsplit(".", 1)
    names = (
        [weights]
        if len(shards) == 1
        else [f"{stem}-{i:05d}-of-{len(shards):05d}.{suffix}" for i in range(1, len(shards) + 1)]
    )
    _remove_stale(folder, stem, suffix, keep=set(names))
    for name, shard in zip(names, shards, strict=True):
        save(shard, folder / name, safe_serialization)
    if len(shards) > 1:
        index = {
            "metadata": {"total_size": sum(_nbytes(t) for t in state_dict.values())},
            "weight_map": {
                key: name for name, shard in zip(names, shards, strict=True) for key in shard
            },
        }
        with _atomic(folder / f"{weights}.index.json") as tmp:
            Path(tmp).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def _shard(state_dict: dict[str, torch.Tensor], limit: int) -> list[dict[str, torch.Tensor]]:
    """Greedy, in order: start a new shard when the next tensor would overflow this one."""
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, tensor in state_dict.items():
        if shards[-1] and size + _nbytes(tensor) > limit:
            shards.append({})
            size = 0
        shards[-1][name] = tensor
        size += _nbytes(tensor)
    return shards


def _remove_stale(folder: Path, stem: str, suffix: str, keep: set[str]) -> None:
    """Delete an earlier save's shards and index that this save does not overwrite."""
    stale = re.compile(rf"^{re.escape(stem)}(-\d{{5}}-of-\d{{5}})?\.{suffix}(\.index\.json)?$")
    for path in folder.iterdir():
        if stale.match(path.name) and path.name not in keep and path.is_file():
            path.unlink()


def load_weights(checkpoint: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Read a weights file, an index file, or a folder holding either (sharded or not)."""
    path = Path(checkpoint)
    if path.is_dir():
        for name in (f"{SAFE_WEIGHTS}.index.json", SAFE_WEIGHTS, f"{TORCH_WEIGHTS}.index.json"):
            if (path / name).is_file():
                return load_weights(path / name)
        if (path / TORCH_WEIGHTS).is_file():
            return load_weights(path / TORCH_WEIGHTS)
        raise FileNotFoundError(f"{path}: no model weights found in this folder")
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such checkpoint file")
    if path.name.endswith(".index.json"):
        files = sorted(set(json.loads(path.read_text())["weight_map"].values()))
        return {k: v for name in files for k, v in load_weights(path.parent / name).items()}
    with _naming(path):
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            return load_file(path)
        return torch.load(path, map_location="cpu", weights_only=True)


def load_checkpoint_in_model(
    model: torch.nn.Module, checkpoint: str | os.PathLike, strict: bool = False
) -> None:
    """Load weights saved by ``save_model``/``save_state`` into ``model``.

    Names left out because they alias another weight (tied weights) are not missing. With
    ``strict`` any other missing or unexpected name is an error, otherwise a warning.
    """
    state_dict = load_weights(checkpoint)
    try:
        result = model.load_state_dict(state_dict, strict=False)
    except RuntimeError as err:  # shape mismatches; torch's message spans several lines
        reasons = "; ".join(line.strip() for line in str(err).splitlines()[1:])
        raise ValueError(f"{checkpoint}: weights do not fit the model: {reasons}") from None
    missing = _really_missing(model, set(result.missing_keys), set(state_dict))
    if missing or result.unexpected_keys:
        message = (
            f"{checkpoint}: weights do not match the model "
            f"(missing: {sorted(missing)[:5]}, unexpected: {sorted(result.unexpected_keys)[:5]})"
        )
        if strict:
            raise ValueError(message)
        warnings.warn(message, stacklevel=2)


def _really_missing(model: torch.nn.Module, missing: set[str], loaded: set[str]) -> set[str]:
    groups: dict[tuple, set[str]] = {}
    for name, tensor in model.state_dict(keep_vars=True).items():
        groups.setdefault(_storage_key(tensor), set()).add(name)
    aliased = {name for names in groups.values() if names & loaded for name in names}
    return missing - aliased


@dataclass
class Parts:
    """Everything ``save_state`` writes, in the order it was prepared."""

    models: list[torch.nn.Module]
    optimizers: list[Any]
    schedulers: list[Any]
    dataloaders: list[Any]
    custom: list[Any]
    precision: Precision
    strategy: Strategy
    hooks: StateHooks = field(default_factory=StateHooks)


def save_state(
    directory: str | os.PathLike,
    parts: Parts,
    meta: dict[str, Any],
    safe_serialization: bool = True,
) -> Path:
    """Write a full training state; every process calls this (each saves its RNG state)."""
    final = Path(directory)
    partial = final.parent / f".{final.name}.partial"
    state, strategy = parts.strategy.state, parts.strategy
    if state.is_main_process:
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
    strategy.barrier()
    try:
        _write_parts(partial, parts, meta, safe_serialization)
    except BaseException:
        if state.is_main_process:  # the previous checkpoint stays; the half-written one goes
            shutil.rmtree(partial, ignore_errors=True)
        raise
    strategy.barrier()
    if state.is_main_process:
        checksums.write(partial)  # last: its presence says the folder is complete
        _swap_in(partial, final)
    strategy.barrier()
    return final


def _write_parts(partial: Path, parts: Parts, meta: dict[str, Any], safe: bool) -> None:
    """Every file of the checkpoint, into the hidden folder (this process's share of them)."""
    state, strategy = parts.strategy.state, parts.strategy
    common = not strategy.save_checkpoint(partial, parts.models, parts.optimizers)
    weights = [strategy.model_state_dict(model) for model in parts.models] if common else []
    parts.hooks.before_save(list(parts.models), weights, str(partial))  # may take some away
    if state.is_main_process:
        for i, state_dict in enumerate(weights):
            name = model_files(i)[0 if safe else 1]
            save(state_dict, partial / name, safe)
        for kind, objects in (
            ("optimizer", parts.optimizers if common else []),
            ("scheduler", parts.schedulers),
            ("dataloader", parts.dataloaders),
        ):
            for i, obj in enumerate(objects):
                save(obj.state_dict(), partial / numbered(kind, i, ".bin"))
        scaler = parts.precision.state_dict()
        if scaler is not None:
            save(scaler, partial / hf_layout.SCALER)
        for i, obj in enumerate(parts.custom):
            save(obj.state_dict(), partial / hf_layout.custom_state(i))
        (partial / META).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    # HF restores its step counter from the random states, so it is kept there too.
    states = {"step": meta["step"], **rng.capture()}
    save(states, partial / hf_layout.random_states(state.process_index))


def _swap_in(partial: Path, final: Path) -> None:
    """Rename the finished checkpoint into place, replacing an older one of the same name."""
    if final.exists():
        old = final.parent / f".{final.name}.old"
        shutil.rmtree(old, ignore_errors=True)
        final.rename(old)
        partial.rename(final)
        shutil.rmtree(old)
    else:
        partial.rename(final)


def load_object(path: Path, allowed: list[Any] | None = None) -> Any:
    """``torch.load(weights_only=True)`` of ``path``, also accepting the ``allowed`` globals."""
    if not path.is_file():
        raise FileNotFoundError(f"{path}: missing from the checkpoint")
    allow = torch.serialization.safe_globals(allowed) if allowed else contextlib.nullcontext()
    with _naming(path), allow:
        return torch.load(path, map_location="cpu", weights_only=True)


@contextlib.contextmanager
def _naming(path: Path) -> Iterator[None]:
    """Say which file could not be read: torch and safetensors often do not (``EOFError``,
    ``basic_ios::clear: iostream error``, ``Invalid argument``)."""
    try:
        yield
    except (OSError, RuntimeError, ValueError, EOFError, pickle.UnpicklingError) as err:
        if str(path) in str(err):
            raise
        if "Weights only load failed" in str(err):
            raise ValueError(
                f"{path}: cannot be read with torch.load(weights_only=True): it holds objects "
                "other than tensors and plain data, or it is not a torch file"
            ) from err
        first = str(err).strip().splitlines()[0] if str(err).strip() else "no details"
        raise ValueError(f"{path}: cannot be read ({type(err).__name__}: {first})") from err


def _found(folder: Path) -> Path:
    """The checkpoint to read for ``folder``: itself, or what a save interrupted between its two
    renames left, the new one (complete) or else the previous one, with a warning."""
    if folder.is_dir():
        return folder
    new, old = (folder.parent / f".{folder.name}.{end}" for end in ("partial", "old"))
    for kept, which in ((new, "the new one, complete"), (old, "the previous one")):
        if kept.is_dir() and (which == "the previous one" or checksums.complete(kept)):
            warnings.warn(
                f"{folder}: missing, as a save_state was interrupted; loading {which} from {kept}",
                stacklevel=3,
            )
            return kept
    raise FileNotFoundError(f"{folder}: no such checkpoint folder")


def load_state(directory: str | os.PathLike, parts: Parts) -> dict[str, Any]:
    """Restore what :func:`save_state` (accelify's or HF's) wrote into ``parts``; return the
    saved metadata (:func:`.hf_layout.hf_meta` for HF's folders).

    A folder HF wrote has no ``accelify_state.json``, no data loader states of accelify's and no
    checksum manifest: its files are read as they are, with no checksum to verify them against.
    """
    folder = _found(Path(directory))
    digests = checksums.recorded(folder)  # read once; each file is checked as it is loaded

    def read(name: str, allowed: list[Any] | None = None) -> Any:
        if (folder / name).is_file():  # a missing one is named as missing by load_object
            checksums.verify(digests, folder, folder / name)
        return load_object(folder / name, allowed)

    meta_path = folder / META
    by_hf = not meta_path.is_file()
    if by_hf and digests:  # accelify's manifest without its metadata: not a folder HF wrote
        raise FileNotFoundError(f"{meta_path}: missing, though {checksums.MANIFEST} lists it")
    common = not parts.strategy.load_checkpoint(folder, parts.models, parts.optimizers)
    models = list(parts.models) if common else []
    parts.hooks.before_load(models, str(folder))  # may load some itself, taking them away
    for i, model in enumerate(models):
        found = [folder / name for name in model_files(i) if (folder / name).is_file()]
        if not found:
            raise FileNotFoundError(f"{folder / model_files(i)[0]}: missing from the checkpoint")
        weights = found[0]
        checksums.verify(digests, folder, weights)
        load_checkpoint_in_model(parts.strategy.unwrap_model(model), weights, strict=True)
    for kind, objects in (
        ("optimizer", parts.optimizers if common else []),
        ("scheduler", parts.schedulers),
    ):
        for i, obj in enumerate(objects):
            obj.load_state_dict(read(numbered(kind, i, ".bin")))
    for i, loader in enumerate([] if by_hf else parts.dataloaders):
        name = numbered("dataloader", i, ".bin")
        if not (folder / name).is_file() and name not in digests:
            # Prepared after the save (an evaluation loader, say): HF loads no loader state and
            # goes on, and so does this loader, from its start. One the save wrote must be there.
            warnings.warn(
                f"{folder}: no position saved for prepared data loader {i} (prepared after the "
                "save?); it starts from its beginning",
                stacklevel=3,
            )
            continue
        loader.load_state_dict(read(name))
    if parts.precision.state_dict() is not None:
        parts.precision.load_state_dict(read(hf_layout.SCALER))
    for i, obj in enumerate(parts.custom):
        obj.load_state_dict(read(hf_layout.custom_state(i)))
    rank = parts.strategy.state.process_index
    states = read(hf_layout.random_states(rank), hf_layout.numpy_globals())  # HF's hold numpy's
    rng.restore(states)
    if by_hf:
        return hf_layout.hf_meta(folder, states.get("step"))
    return json.loads(meta_path.read_text())


def numbered_checkpoints(folder: Path) -> list[tuple[int, Path]]:
    """``checkpoint_N`` folders under ``folder``, oldest first (partial ones are hidden)."""
    if not folder.is_dir():
        return []
    found = ((_CHECKPOINT.match(p.name), p) for p in folder.iterdir() if p.is_dir())
    return sorted((int(m[1]), p) for m, p in found if m)


def rotate(folder: Path, total_limit: int | None) -> None:
    """Keep the newest ``total_limit`` checkpoints (run after a save succeeded)."""
    if total_limit is None:
        return
    existing = numbered_checkpoints(folder)
    for _, path in existing[: max(0, len(existing) - total_limit)]:
        shutil.rmtree(path)
