"""Collectives over nested data (tensors inside lists, tuples, mappings, dataclasses).

``gather``, ``gather_object``, ``broadcast``, ``broadcast_object_list``, ``pad_across_processes``
and ``reduce`` are also public (``accelify.runtime``), as HF Accelerate's ``accelerate.utils``
functions of those names.

Each op is a thin walk over the structure around one torch.distributed call; on a single process
they return their input (``reduce`` a copy) and never touch torch.distributed.

In debug mode (``accel-run --debug``, ``ACCELERATE_DEBUG_MODE=1``, ``state.debug = True``)
``gather``, ``broadcast``, ``reduce`` and ``pad_across_processes`` first compare every process's
shapes, as HF Accelerate does, and raise :class:`DistributedOperationException` on every process
where they differ; otherwise gloo aborts the job and NCCL hangs.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Mapping, MutableMapping
from typing import Any

import torch
import torch.distributed as dist

from .config import env_flag


def apply(
    fn: Callable[[Any], Any],
    data: Any,
    *,
    is_leaf: Callable[[Any], bool] | None = None,
    skip_keys: tuple = (),
) -> Any:
    """Rebuild ``data`` with ``fn`` applied to every tensor in it, keeping container types.

    ``is_leaf`` widens what counts as a leaf (``send_to_device`` moves anything with ``.to``);
    values under ``skip_keys`` in any mapping are kept as they are.
    """
    if isinstance(data, torch.Tensor) or (is_leaf is not None and is_leaf(data)):
        return fn(data)

    def _apply(item: Any) -> Any:
        return apply(fn, item, is_leaf=is_leaf, skip_keys=skip_keys)

    if isinstance(data, (list, tuple)):
        items = [_apply(item) for item in data]
        return type(data)(*items) if hasattr(data, "_fields") else type(data)(items)
    if isinstance(data, Mapping):
        values = {k: v if k in skip_keys else _apply(v) for k, v in data.items()}
        return _rebuild_mapping(data, values)
    if dataclasses.is_dataclass(data) and not isinstance(data, type):
        fields = dataclasses.fields(data)
        return dataclasses.replace(
            data, **{f.name: _apply(getattr(data, f.name)) for f in fields if f.init}
        )
    return data


def _rebuild_mapping(original: Mapping, values: dict) -> Mapping:
    if isinstance(original, MutableMapping):
        rebuilt = copy.copy(original)  # keeps extras such as a defaultdict's factory
        rebuilt.update(values)
        return rebuilt
    try:
        return type(original)(values)
    except TypeError:
        return values


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


DEBUG_ENV = "ACCELERATE_DEBUG_MODE"


class DistributedOperationException(Exception):
    """A collective the processes called with tensors of different shapes (debug mode).

    HF Accelerate's exception (``accelerate.utils.operations``), so scripts catch it by name.
    """


def debug_from_env() -> bool:
    """``ACCELERATE_DEBUG_MODE``, read as every other flag of the launch contract."""
    return env_flag(DEBUG_ENV)


def _check_shapes(operation: str, data: Any, *, ndim_only: bool = False) -> None:
    """In debug mode, refuse on every process a collective whose processes hold other shapes.

    One ``all_gather_object`` of the shapes, HF Accelerate's check and message. ``ndim_only``
    compares the structure and dimensions only (``pad_across_processes`` evens out the rest).
    """
    from . import state  # state imports this module

    known = state.current()
    if not (known.debug if known is not None else debug_from_env()):
        return
    mine = (apply(lambda tensor: list(tensor.shape), data), apply(lambda t: t.ndim, data))
    every: list = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    compared = 1 if ndim_only else 0
    if any(shapes[compared] != every[0][compared] for shapes in every):
        listed = "\n  - ".join(f"Process {i}: {shapes[0]}" for i, shapes in enumerate(every))
        raise DistributedOperationException(
            "Cannot apply desired operation due to shape mismatches. All shapes across devices "
            f"must be valid.\n\nOperation: `{__name__}.{operation}`\nInput shapes:\n  - {listed}"
        )


def gather(data: Any) -> Any:
    """Concatenate every process's tensors along dim 0 (0-d tensors become 1-d).

    Anything but tensors raises TypeError on several processes, as in HF Accelerate: passed
    through, a Python number would stand for every process while holding one process's value.
    """
    if not is_distributed():
        return data
    if not only_tensors(data):
        raise TypeError(
            f"gather takes tensors (in lists, tuples, dicts), not {type(data).__name__} "
            "holding other values: gather the tensor before `.item()`, or use "
            "`gather_for_metrics`, which gathers Python objects"
        )
    _check_shapes("gather", data)
    return apply(_gather_tensor, data)


def _gather_tensor(tensor: torch.Tensor) -> torch.Tensor:
    tensor = (tensor[None] if tensor.ndim == 0 else tensor).contiguous()
    parts = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, tensor)
    return torch.cat(parts, dim=0)


def gather_object(obj: Any) -> list:
    """Every process's ``obj`` (a list is flattened one level, like HF Accelerate)."""
    if not is_distributed():
        return obj if isinstance(obj, list) else [obj]
    parts: list = [None] * dist.get_world_size()
    dist.all_gather_object(parts, obj)
    return [item for part in parts for item in (part if isinstance(part, list) else [part])]


_REDUCE_OPS = {
    "sum": dist.ReduceOp.SUM,
    "mean": dist.ReduceOp.SUM,  # then divided by the number of processes
    "max": dist.ReduceOp.MAX,
    "min": dist.ReduceOp.MIN,
}


def reduce(data: Any, reduction: str = "mean", scale: float = 1.0) -> Any:
    """Average, sum, max or min tensors over processes (copies); ``"none"`` only copies.

    HF Accelerate's ``accelerate.utils.reduce``: ``mean`` by default, and ``scale`` accepted but
    ignored (HF applies it on TPUs only).
    """
    if reduction not in (*_REDUCE_OPS, "none"):
        raise ValueError(f"reduction must be one of {[*_REDUCE_OPS, 'none']}, not {reduction!r}")
    distributed = is_distributed() and reduction != "none"
    if distributed:
        _check_shapes("reduce", data)

    def _reduce(tensor: torch.Tensor) -> torch.Tensor:
        out = tensor.clone()
        if distributed:
            dist.all_reduce(out, _REDUCE_OPS[reduction])
            if reduction == "mean":
                out /= dist.get_world_size()
        return out

    return apply(_reduce, data)


def broadcast(data: Any, from_process: int = 0) -> Any:
    """Overwrite every process's tensors with those of ``from_process`` (in place)."""
    if is_distributed():
        _check_shapes("broadcast", data)
        apply(lambda tensor: dist.broadcast(tensor, src=from_process), data)
    return data


def copy_tensor_to_devices(tensor: torch.Tensor | None = None) -> torch.Tensor:
    """The tensor one process holds, on every process (the others pass ``None`` and need not know
    its shape or dtype): HF Accelerate's helper, a sum of the holder's tensor with zeros."""
    from .state import PartialState

    described = gather_object([None if tensor is None else (tuple(tensor.shape), tensor.dtype)])
    shape, dtype = next(d for d in described if d is not None)
    if tensor is None:
        tensor = torch.zeros(shape, dtype=dtype, device=PartialState().device)
    return reduce(tensor, reduction="sum")


def broadcast_object_list(object_list: list, from_process: int = 0) -> list:
    """Replace, in place, every process's picklable objects with those of ``from_process``.

    HF Accelerate's ``accelerate.utils.broadcast_object_list``; the list's length must be the
    same on every process (torch pickles item by item into it). Returns the same list.
    """
    if is_distributed():
        dist.broadcast_object_list(object_list, src=from_process)
    return object_list


def pad_across_processes(
    data: Any, dim: int = 0, pad_index: int = 0, pad_first: bool = False
) -> Any:
    """Pad tensors along ``dim`` to the largest size any process holds, so they can be gathered."""
    if not is_distributed():
        return data
    try:
        _check_shapes("pad_across_processes", data, ndim_only=True)
    except DistributedOperationException as err:  # HF's message, chained as in HF
        raise DistributedOperationException(
            f"Error found while calling `{__name__}.pad_across_processes`. Please see the "
            "earlier error for more details."
        ) from err

    def _pad(tensor: torch.Tensor) -> torch.Tensor:
        if dim >= tensor.ndim:
            return tensor
        size = torch.tensor([tensor.shape[dim]], device=tensor.device)
        longest = int(_gather_tensor(size).max())
        if longest == tensor.shape[dim]:
            return tensor
        shape = list(tensor.shape)
        shape[dim] = longest
        padded = tensor.new_full(shape, pad_index)
        start = longest - tensor.shape[dim] if pad_first else 0
        index = [slice(None)] * tensor.ndim
        index[dim] = slice(start, start + tensor.shape[dim])
        padded[tuple(index)] = tensor
        return padded

    return apply(_pad, data)


def only_tensors(data: Any) -> bool:
    """Whether ``data`` holds nothing but tensors (in lists, tuples, mappings, dataclasses)."""
    if isinstance(data, torch.Tensor):
        return True
    if isinstance(data, (list, tuple)):
        return all(only_tensors(item) for item in data)
    if isinstance(data, Mapping):
        return all(only_tensors(value) for value in data.values())
    if dataclasses.is_dataclass(data) and not isinstance(data, type):
        return all(only_tensors(getattr(data, f.name)) for f in dataclasses.fields(data) if f.init)
    return False


def split(inputs: Any, num_processes: int, process_index: int, apply_padding: bool) -> Any:
    """This process's contiguous share of ``inputs``; the first processes take the extras.

    With ``apply_padding`` every share is as long as the longest one (the last element is
    repeated), so the results can be gathered.
    """
    if num_processes == 1:
        return inputs
    if isinstance(inputs, Mapping):
        lengths = {len(value) for value in inputs.values()}
        if len(lengths) > 1:
            raise ValueError("split_between_processes needs dict values of one length")
        length = lengths.pop() if lengths else 0
    else:
        length = len(inputs)
    per, extras = divmod(length, num_processes)
    start = process_index * per + min(process_index, extras)
    end = start + per + (1 if process_index < extras else 0)
    longest = per + (1 if extras else 0)

    def _share(values: Any) -> Any:
        if not isinstance(values, (list, tuple, torch.Tensor)):
            return values
        share = values[start:end] if start < len(values) else values[-1:]
        if apply_padding and len(share) < longest:
            missing = longest - len(share)
            if isinstance(share, torch.Tensor):
                return torch.cat([share, share[-1:].expand(missing, *share.shape[1:])])
            return share + type(share)([share[-1]] * missing)
        return share

    if isinstance(inputs, Mapping):
        return {key: _share(value) for key, value in inputs.items()}
    return _share(inputs)
