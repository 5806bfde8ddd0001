"""Out-of-memory helpers: HF Accelerate's ``find_executable_batch_size`` and ``release_memory``.

Both are ``accelerate.utils`` functions scripts import directly; the signatures, the messages and
the errors recognised as out-of-memory are HF's.
"""

from __future__ import annotations

import functools
import gc
import inspect
from collections.abc import Callable
from typing import Any

import torch

# Messages of the errors that a smaller batch may avoid (HF's list): CUDA/ROCm/XPU/NPU say
# "... out of memory.", then MPS, cuDNN refusing a too-large problem, the CPU allocator, Gaudi.
_OUT_OF_MEMORY_MESSAGES = (
    " out of memory.",
    "MPS backend out of memory",
    "cuDNN error: CUDNN_STATUS_NOT_SUPPORTED.",
    "DefaultCPUAllocator: can't allocate memory",
    "FATAL ERROR :: MODULE:PT_DEVMEM Allocation failed",
)


def release_memory(*objects: Any) -> list[None]:
    """One ``None`` per object, for the caller to rebind its names to (``a, b =
    release_memory(a, b)``), after collecting garbage and emptying the device cache.

    As in HF Accelerate, the cache is emptied before the caller drops its references, so what
    those objects held returns to the device at the next emptying (or the next call).
    """
    _free_cached_memory()
    return [None] * len(objects)


def find_executable_batch_size(
    function: Callable[..., Any] | None = None,
    starting_batch_size: int = 128,
    reduce_batch_size_fn: Callable[[], int] | None = None,
) -> Any:
    """Decorator: call ``function(batch_size, *args, **kwargs)``, retrying with a smaller batch
    size after each out-of-memory error until one fits.

    As in HF Accelerate: the batch size shrinks to ``int(0.9 * batch_size)`` (or to what
    ``reduce_batch_size_fn()`` returns), the size found is kept for later calls, other errors
    propagate, a batch size of zero raises ``RuntimeError``, and the caller must not pass the
    batch size itself (``train(model)`` for ``def train(batch_size, model)``).
    """
    if function is None:
        return functools.partial(
            find_executable_batch_size,
            starting_batch_size=starting_batch_size,
            reduce_batch_size_fn=reduce_batch_size_fn,
        )
    batch_size = starting_batch_size

    def smaller() -> int:
        return reduce_batch_size_fn() if reduce_batch_size_fn is not None else int(batch_size * 0.9)

    @functools.wraps(function)
    def retrying(*args: Any, **kwargs: Any) -> Any:
        nonlocal batch_size
        _free_cached_memory()
        _refuse_batch_size_argument(function, args)
        while True:
            if batch_size <= 0:
                raise RuntimeError("No executable batch size found, reached zero.")
            try:
                return function(batch_size, *args, **kwargs)
            except Exception as error:
                if not _is_out_of_memory(error):
                    raise
            # Outside the except block: its traceback pins the failed attempt's tensors.
            _free_cached_memory()
            batch_size = smaller()

    return retrying


def _is_out_of_memory(error: BaseException) -> bool:
    """Whether ``error`` is one of the errors HF retries on (a one-argument RuntimeError)."""
    if not isinstance(error, RuntimeError) or len(error.args) != 1:
        return False
    message = str(error.args[0])
    return any(known in message for known in _OUT_OF_MEMORY_MESSAGES)


def _refuse_batch_size_argument(function: Callable[..., Any], args: tuple) -> None:
    """A ``TypeError`` when the call passes more positional arguments than ``function`` takes
    after its batch size: the caller passed the batch size the decorator supplies (HF's check;
    a function taking ``*args`` cannot be told apart, so it is not checked)."""
    parameters = list(inspect.signature(function).parameters.values())
    if any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in parameters):
        return
    if len(args) + 1 <= len(parameters):
        return
    passed = ", ".join(
        f"{p.name}={value!r}" for p, value in zip(parameters[1:], args[1:], strict=False)
    )
    name = getattr(function, "__name__", repr(function))
    raise TypeError(
        f"Batch size was passed into `{name}` as the first argument when called. "
        f"Remove this as the decorator already does so: `{name}({passed})`"
    )


def _free_cached_memory() -> None:
    """Collect garbage, then give the devices' cached blocks back (CUDA and MPS)."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()  # a no-op until CUDA is initialised
    if torch.backends.mps.is_available():
        torch.mps.empty_cache()
