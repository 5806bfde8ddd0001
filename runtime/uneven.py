"""Uneven steps: a process that ends while another is still training.

Each backward pass of a data-parallel process meets the same pass of every other process in the
gradient all-reduce. When one process leaves the loop early (a stop decided on its own loss, an
episode of random length, its own number of batches), the others wait in that all-reduce for a
pass that never comes: gloo fails with "Connection closed by peer" once the early one exits, NCCL
hangs until its watchdog gives up (10 minutes), and neither says why.

Here ``accelerator.backward`` counts the passes. A process that ends (``end_training`` or the end
of its script) posts its count in the rendezvous store, and a watch thread in every other process
polls for that post: a process already past the posted count waits for a pass no one will make,
so it stops the job at once with both counts, both lines and its own stack. A correct job posts
equal counts and prints nothing. ``join_uneven_inputs`` (torch's ``Join``) makes uneven counts
legitimate, so it turns the watch off.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

import torch
import torch.distributed as dist

from .launch.bootstrap import OWN_FRAMES, is_library_file, write_error

POLL_S = 0.5  # how often the watch asks the store; one small request per process
FORWARD_GRACE_S = 5.0  # a forward pass past the ended process's count, lasting this long, waits
_KEY = "accelify/ended/{restart}/{generation}"
_ADVICE = (
    "the processes ran different numbers of steps: a stop or a loop length decided by each "
    "process alone (its own loss, a random episode length, its own number of batches) leaves the "
    "others waiting in the gradient all-reduce; decide it on all processes together "
    "(accelerator.set_trigger()/check_trigger(), or reduce the stop flag with accelerator.reduce)"
)


class UnevenStepsError(RuntimeError):
    """A process went on training after another one ended."""


@dataclass(frozen=True)
class _Post:
    """What the first process to end posted: its rank, counts and how it ended."""

    rank: int
    passes: int
    forwards: int
    where: str

    def __str__(self) -> str:
        return f"{self.rank} {self.passes} {self.forwards} {self.where}"

    @classmethod
    def read(cls, text: str) -> _Post:
        rank, passes, forwards, where = text.split(" ", 3)
        return cls(int(rank), int(passes), int(forwards), where)


class _Watch:
    """This process's counts of backward and forward passes, and the thread that compares them.

    A backward pass beyond the posted count can never complete. A forward pass beyond it may
    (a main-process-only evaluation of a model without buffers has no collective), so it counts
    only once it has lasted ``FORWARD_GRACE_S``: DDP's forward waits in a collective when it
    rebuilds its buckets (the second step) or broadcasts buffers (BatchNorm statistics).
    """

    def __init__(self) -> None:
        self.passes = 0
        self.forwards = 0
        self.forward_began = 0.0  # monotonic start of the forward pass under way; 0: none
        self.generation = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, rank: int) -> None:
        """Watch for another process's end (call once the process group exists)."""
        self.stop()
        self._stop = threading.Event()
        store = dist.distributed_c10d._get_default_store()
        args = (store, rank, self._key(), self._stop)
        self._thread = threading.Thread(
            target=self._run, args=args, name="accelify-uneven", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """No more watching (this process ended, or joined uneven inputs on purpose).

        Waits for the thread to finish: a daemon thread still inside a store request when the
        interpreter shuts down is ended by unwinding through torch's C++ frames, which aborts the
        process (SIGABRT, "terminate called without an active exception") after a clean run.
        """
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)  # a store that stopped answering must not hold the exit

    def watch_forwards(self, model: torch.nn.Module) -> None:
        """Count ``model``'s forward passes and time the one under way."""
        model.register_forward_pre_hook(self._forward_began)
        model.register_forward_hook(self._forward_ended)

    def _forward_began(self, *_: object) -> None:
        self.forwards += 1
        self.forward_began = time.monotonic()

    def _forward_ended(self, *_: object) -> None:
        self.forward_began = 0.0

    def ended(self, rank: int, where: str) -> None:
        """Post this process's counts as final (the first process to end is the one compared)."""
        self.stop()
        post = _Post(rank, self.passes, self.forwards, where)
        dist.distributed_c10d._get_default_store().compare_set(self._key(), "", str(post))
        self.passes = self.forwards = 0
        self.generation += 1  # an Accelerator created after end_training starts a new round

    def _key(self) -> str:
        restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        return _KEY.format(restart=restart, generation=self.generation)

    def _run(self, store: dist.Store, rank: int, key: str, stop: threading.Event) -> None:
        post = None
        while not stop.wait(POLL_S):
            if post is None:
                try:
                    if not store.check([key]):
                        continue
                    post = _Post.read(store.get(key).decode())
                except (RuntimeError, ValueError):  # the store is gone: the job is ending
                    return
                if post.rank == rank:
                    return
            waiting = self._waiting(post)
            if waiting and not stop.is_set():
                frame = sys._current_frames().get(threading.main_thread().ident)
                _stop_the_job(rank, waiting, post, frame)

    def _waiting(self, post: _Post) -> str:
        """What this process waits in for the ended one, or '' while it may still finish."""
        if self.passes > post.passes:
            return f"backward pass {self.passes}"
        began = self.forward_began
        if self.forwards > post.forwards and began and time.monotonic() - began > FORWARD_GRACE_S:
            return f"the forward pass after backward pass {self.passes}"
        return ""


WATCH = _Watch()


def _stop_the_job(rank: int, waiting: str, post: _Post, frame: FrameType | None) -> None:
    """Report and leave: this process waits for a collective that can never complete."""
    message = (
        f"{UnevenStepsError.__name__}: rank {rank} is still training after rank {post.rank} "
        f"ended: rank {post.rank} ended after {post.passes} backward passes ({post.where}); "
        f"rank {rank} waits for it in {waiting} at {_user_line(frame)}; {_ADVICE}"
    )
    stack = "".join(traceback.format_list(_from_the_script(frame)))
    if not write_error(message, f"{stack}{message}\n"):
        print(f"{stack}{message}", file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1)


def _from_the_script(frame: FrameType | None) -> traceback.StackSummary:
    """The stack of ``frame`` without the launcher's frames above the script."""
    stack = traceback.extract_stack(frame) if frame is not None else traceback.StackSummary()
    while len(stack) > 1 and stack[0].filename in OWN_FRAMES:
        stack.pop(0)
    return stack


def caller_line() -> str:
    """``file:line`` of the user's code that called into the runtime."""
    return _user_line(sys._getframe(1))


def _user_line(frame: FrameType | None) -> str:
    """The innermost frame outside torch, the standard library and accelify: the script's."""
    while frame is not None and is_library_file(frame.f_code.co_filename):
        frame = frame.f_back
    if frame is None:
        return "an unknown line"
    return f"{Path(frame.f_code.co_filename).name}:{frame.f_lineno}"
