"""``Accelerator.profile``: ``torch.profiler`` configured by HF's ``ProfileKwargs``.

With ``output_trace_dir`` every process writes ``profile_<process_index>.json`` (a Chrome trace,
HF's file name) there after the block, then waits for the others, as HF Accelerate does.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import Any

import torch.profiler

from .handlers import ProfileKwargs

_ACTIVITIES = {"cpu": "CPU", "cuda": "CUDA", "xpu": "XPU", "mtia": "MTIA", "hpu": "HPU"}


def build(handler: Any) -> torch.profiler.profile:
    """The profiler ``handler`` (ours or HF's ``ProfileKwargs``) describes."""
    activities = None
    if handler.activities is not None:
        activities = [_activity(name) for name in handler.activities]
    schedule = None
    if handler.schedule_option is not None:
        schedule = torch.profiler.schedule(**handler.schedule_option)
    return torch.profiler.profile(
        activities=activities,
        schedule=schedule,
        on_trace_ready=handler.on_trace_ready,
        record_shapes=handler.record_shapes,
        profile_memory=handler.profile_memory,
        with_stack=handler.with_stack,
        with_flops=handler.with_flops,
        with_modules=handler.with_modules,
    )


def _activity(name: str) -> torch.profiler.ProfilerActivity:
    member = getattr(torch.profiler.ProfilerActivity, _ACTIVITIES.get(name, ""), None)
    if member is None:
        known = [n for n, m in _ACTIVITIES.items() if hasattr(torch.profiler.ProfilerActivity, m)]
        raise ValueError(f"Invalid profiler activity: {name}. Must be one of {known}.")
    return member


@contextlib.contextmanager
def profile(
    handler: Any, process_index: int, barrier: Callable[[], None]
) -> Iterator[torch.profiler.profile]:
    """Profile the block; export the trace afterwards when ``output_trace_dir`` is set."""
    handler = handler or ProfileKwargs()
    with build(handler) as profiler:
        yield profiler
    if handler.output_trace_dir is None:
        return
    os.makedirs(handler.output_trace_dir, exist_ok=True)
    profiler.export_chrome_trace(
        os.path.join(handler.output_trace_dir, f"profile_{process_index}.json")
    )
    barrier()
