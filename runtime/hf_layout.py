"""HF Accelerate's ``save_state`` folder layout: the file names, and what only its folders need.

accelify writes the files HF's ``load_state`` reads under HF's names (``model.safetensors`` or
``pytorch_model.bin``, ``optimizer.bin``, ``scheduler.bin``, ``scaler.pt``,
``custom_checkpoint_{i}.pkl``, ``random_states_{rank}.pkl`` with HF's keys), numbered ``_1``,
``_2``... from the second object of a kind on, so either runtime resumes the other's folders.
Its own extra files (``accelify_state.json``, ``checksums.json``, ``dataloader*.bin``) match no
name HF looks for, so HF's loader never sees them.
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path
from typing import Any

import torch

SCALER = "scaler.pt"
# Written by HF only for its own loader classes (a pickled ``SeedableRandomSampler`` of an
# iterable-dataset shard, a ``StatefulDataLoader``'s state): accelify has neither.
_HF_ONLY_LOADER_STATE = re.compile(r"^(sampler|dl_state_dict)(_\d+)?\.bin$")
_CHECKPOINT = re.compile(r"^checkpoint_(\d+)$")


def numbered(kind: str, index: int, suffix: str) -> str:
    """``optimizer.bin``, ``optimizer_1.bin``...: the first object of a kind has no number."""
    return f"{kind}{'' if index == 0 else f'_{index}'}{suffix}"


def model_files(index: int) -> tuple[str, str]:
    """The safetensors and the torch file name of the ``index``-th model (HF's names)."""
    return numbered("model", index, ".safetensors"), numbered("pytorch_model", index, ".bin")


def random_states(process_index: int) -> str:
    return f"random_states_{process_index}.pkl"


def custom_state(index: int) -> str:
    """The file of the ``index``-th object given to ``register_for_checkpointing``."""
    return f"custom_checkpoint_{index}.pkl"


def numpy_globals() -> list[Any]:
    """What ``torch.load(weights_only=True)`` must also accept to read HF's random states.

    HF pickles ``numpy.random.get_state()`` as it is: a tuple holding a ``uint32`` array. These
    rebuild plain arrays and dtypes only; the old ``numpy.core`` path is for files written
    under numpy 1. Before torch 2.5 (no ``safe_globals``) HF's random states cannot be read.
    """
    try:
        import numpy
    except ImportError:
        return []
    if not hasattr(torch.serialization, "safe_globals"):
        return []
    rebuild = (getattr(numpy, "_core", None) or numpy.core).multiarray._reconstruct
    return [
        rebuild,
        (rebuild, "numpy.core.multiarray._reconstruct"),
        numpy.ndarray,
        numpy.dtype,
        type(numpy.dtype("uint32")),
    ]


def hf_meta(folder: Path, saved_step: int | None) -> dict[str, Any]:
    """The metadata of a folder HF wrote, which has no ``accelify_state.json``.

    HF keeps only the step counter (in the random states); the save iteration that follows is
    taken from a ``checkpoint_N`` name, as accelify's own folders record it. Loader states that
    only HF's loader classes produce are named in a warning, as they are not restored.
    """
    meta: dict[str, Any] = {} if saved_step is None else {"step": int(saved_step)}
    named = _CHECKPOINT.match(folder.name)
    if named:
        meta["next_iteration"] = int(named[1]) + 1
    skipped = sorted(p.name for p in folder.iterdir() if _HF_ONLY_LOADER_STATE.match(p.name))
    if skipped:
        warnings.warn(
            f"{folder}: {', '.join(skipped)} not restored: HF Accelerate writes them for its "
            "seedable samplers and stateful data loaders only, which accelify does not have; "
            "the data loaders start where prepare put them",
            stacklevel=4,
        )
    return meta
