"""Checksums of a checkpoint's files, so damaged bytes are an error instead of wrong weights.

Flipped bytes in tensor data load without complaint: neither safetensors nor ``torch.load``
checks the data it reads. ``save_state`` writes ``checksums.json`` (the SHA-256 of every file,
by its path in the folder) last, once every file is in place, so the manifest also marks the
folder complete; ``load_state`` checks each file it reads against it. Folders written without one
(by HF Accelerate, or an older accelify) load as before.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

MANIFEST = "checksums.json"
_CHUNK = 1 << 20


def write(folder: Path) -> None:
    """Record every file under ``folder`` (call once they are all written)."""
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST)
    digests = {p.relative_to(folder).as_posix(): _digest(p) for p in files}
    (folder / MANIFEST).write_text(json.dumps(digests, indent=1, sort_keys=True) + "\n")


def complete(folder: Path) -> bool:
    """Whether ``folder`` holds a finished checkpoint (its manifest is written last)."""
    return (folder / MANIFEST).is_file()


def recorded(folder: Path) -> dict[str, str]:
    """The digests ``save_state`` recorded for ``folder``, by relative path; none without one."""
    manifest = folder / MANIFEST
    return json.loads(manifest.read_text()) if manifest.is_file() else {}


def verify(digests: dict[str, str], folder: Path, path: Path) -> None:
    """Raise unless ``path`` still has the bytes recorded in ``digests`` (see :func:`recorded`)."""
    expected = digests.get(path.relative_to(folder).as_posix())
    if expected is not None and _digest(path) != expected:
        raise ValueError(
            f"{path}: damaged: its bytes differ from those save_state wrote ({MANIFEST}), so it "
            "would load wrong values; restore it from a copy or resume from another checkpoint"
        )


def _digest(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()
