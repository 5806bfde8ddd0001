"""Run a training script as written and record what it did, without a line of it changed.

    python probe.py SCRIPT [ARGS...]          # one run; results in $ORACLE_OUT/rank{RANK}.pt
    accel-run --cpu --num-processes 2 probe.py SCRIPT   # the same on every rank
    python probe.py --zygote                  # serve runs over stdin/stdout by forking (runner.py)

The hooks see what any PyTorch script does, whichever runtime (none, accelify, HF Accelerate)
drives it:

- every ``Tensor.backward()`` records the value it is called on, in order (the loss);
- every index a ``DataLoader`` fetches from a map-style dataset is recorded with the dataset's
  length (which tells the training set from the test set) and the loader pass it belongs to;
- every optimizer is remembered when built; at the end its parameters are the final weights;
- ``accelify.runtime.notebook_launcher`` makes each worker it launches save its own record.

A run launched fresh pays about two seconds to import torch. The zygote imports torch, HF
Accelerate and accelify's runtime once and forks a child per run; the child gets a fresh working
directory, argv and environment, installs the hooks and runs the script. Nothing in the zygote
touches a process group, HF Accelerate's singleton state or torch's thread pools before forking.
It can also fork two ranks with torch elastic's variables (rank 0 hosting the store): about 25
times faster than accel-run. The shrinker uses that to try many candidates; verdicts launch
through accel-run (unless ``sweep.py --fork-two`` asks for speed instead).
"""

from __future__ import annotations

import json
import os
import runpy
import sys
import time
import traceback
from typing import Any

import torch
from torch.utils.data import DataLoader
from torch.utils.data._utils.fetch import _MapDatasetFetcher


class Recorder:
    """The hooks and what they saw."""

    def __init__(self) -> None:
        self.losses: list[float] = []
        self.fetches: list[tuple[int, int, int]] = []  # (dataset length, loader pass, index)
        self.passes: dict[int, int] = {}  # dataset length -> loader passes started
        self.optimizers: list[torch.optim.Optimizer] = []
        self.launched = False  # a notebook_launcher call started: its workers save the records

    def install(self) -> None:
        backward, init = torch.Tensor.backward, torch.optim.Optimizer.__init__
        fetch, loader_iter = _MapDatasetFetcher.fetch, DataLoader.__iter__
        rec = self

        def hooked_backward(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            if self.numel() == 1:
                rec.losses.append(self.detach().double().item())
            return backward(self, *args, **kwargs)

        def hooked_init(self: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> None:
            init(self, *args, **kwargs)
            rec.optimizers.append(self)

        def hooked_fetch(self: Any, possibly_batched_index: Any) -> Any:
            size = _length(self.dataset)
            indices = possibly_batched_index if self.auto_collation else [possibly_batched_index]
            rec.fetches += [(size, rec.passes.get(size, 0), int(i)) for i in indices]
            return fetch(self, possibly_batched_index)

        def hooked_iter(self: DataLoader) -> Any:
            size = _length(self.dataset)
            rec.passes[size] = rec.passes.get(size, 0) + 1
            return loader_iter(self)

        torch.Tensor.backward = hooked_backward  # type: ignore[method-assign]
        torch.optim.Optimizer.__init__ = hooked_init  # type: ignore[method-assign]
        _MapDatasetFetcher.fetch = hooked_fetch  # type: ignore[method-assign]
        DataLoader.__iter__ = hooked_iter  # type: ignore[method-assign]

    def weights(self) -> list[torch.Tensor]:
        """Every optimizer's parameters in construction order, each tensor once."""
        seen: set[int] = set()
        out = []
        for optimizer in self.optimizers:
            for group in optimizer.param_groups:
                for p in group["params"]:
                    if id(p) not in seen:
                        seen.add(id(p))
                        out.append(p.detach().clone().cpu())
        return out

    def save(self, out_dir: str) -> None:
        rank = int(os.environ.get("RANK", "0"))
        record = {"losses": self.losses, "fetches": self.fetches, "weights": self.weights()}
        torch.save(record, os.path.join(out_dir, f"rank{rank}.pt"))


def _length(dataset: Any) -> int:
    try:
        return len(dataset)
    except TypeError:
        return -1


def _record_launched_workers(recorder: Recorder, out_dir: str) -> None:
    """Make ``accelify.runtime.notebook_launcher`` save each launched worker's record as
    rank{RANK}.pt when the function returns: a notebook's training runs in workers forked from
    the script's process, which never sees it (and so saves nothing once a launch starts, which
    would overwrite rank 0's record). Port "0" (a free one) unless the call names one, so that
    two judged notebooks may launch at once."""
    import accelify.runtime

    def notebook_launcher(function: Any, args: Any = (), *rest: Any, **options: Any) -> None:
        from accelify.runtime.launch.notebook import notebook_launcher as launch

        def worker(*arguments: Any) -> Any:
            result = function(*arguments)
            recorder.save(out_dir)
            return result

        recorder.launched = True
        launch(worker, args, *rest, **{"use_port": "0", **options})

    accelify.runtime.notebook_launcher = notebook_launcher  # type: ignore[attr-defined]


def run(script: str, argv: list[str], out_dir: str) -> int:
    """Run ``script`` as ``__main__`` with the hooks in; its exit code (1 for an exception)."""
    torch.set_num_threads(1)
    recorder = Recorder()
    recorder.install()
    _record_launched_workers(recorder, out_dir)
    sys.argv = [script, *argv]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))  # as ``python script`` does
    code = 0
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
        if isinstance(exit_.code, str):
            print(exit_.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
        code = 1
    try:
        if not recorder.launched:
            recorder.save(out_dir)
    except Exception:
        traceback.print_exc()
        code = code or 1
    return code


# ----------------------------------------------------------------------------------------------
# The fork server.


def _child(request: dict[str, Any], rank: int) -> None:
    """In a forked child: redirect output, take the run's directory and environment, run."""
    code = 1
    try:
        out = request["out"]
        for fd, path, flags in (
            (0, os.devnull, os.O_RDONLY),
            (1, f"{out}/stdout{rank}.txt", os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
            (2, f"{out}/stderr{rank}.txt", os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
        ):
            opened = os.open(path, flags, 0o644)
            os.dup2(opened, fd)
            os.close(opened)
        sys.stdout = sys.__stdout__  # the zygote pointed it at stderr; fd 1 is the file now
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        if request["ranks"] > 1:  # what torch elastic gives its workers, without the agent
            n = str(request["ranks"])
            os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), GROUP_RANK="0",
                              ROLE_RANK=str(rank), WORLD_SIZE=n, LOCAL_WORLD_SIZE=n,
                              ROLE_WORLD_SIZE=n, GROUP_WORLD_SIZE="1")  # fmt: skip
        code = run(request["script"], request["argv"], out)
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _wait(pids: list[int], timeout: float, grace: float = 3.0) -> dict[str, Any]:
    """Exit codes (negative signal numbers when killed) in the order the children ended.

    When one rank fails, the others get ``grace`` seconds and are then killed: a rank waiting in
    a collective for a dead peer would otherwise wait for gloo's half-hour timeout.
    """
    deadline = time.monotonic() + timeout
    codes: dict[int, int] = {}
    order: list[int] = []
    delay = 0.002
    while len(codes) < len(pids):
        for rank, pid in enumerate(pids):
            if rank in codes:
                continue
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                codes[rank] = os.waitstatus_to_exitcode(status)
                order.append(rank)
                if codes[rank] != 0:
                    deadline = min(deadline, time.monotonic() + grace)
        timed_out = time.monotonic() > deadline
        if timed_out:
            for rank, pid in enumerate(pids):
                if rank not in codes:
                    os.kill(pid, 9)
                    codes[rank] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
                    order.append(rank)
            break
        time.sleep(delay)
        delay = min(delay * 2, 0.05)
    failed = any(c != 0 for c in codes.values())
    return {"codes": [codes[r] for r in order], "order": order,
            "timed_out": timed_out and not failed}  # fmt: skip


def serve() -> None:
    """Answer one JSON request per stdin line with one JSON reply line, forking the run's ranks.

    A request names the script, its argv, working directory, output folder, environment,
    timeout and number of ranks; the reply gives the exit codes in the order the ranks ended.
    """
    # Imported once here so that each child has them for free. torch._dynamo is what the first
    # optimizer would otherwise import (two seconds); nothing here starts a thread.
    import accelerate
    import accelerate.state
    import numpy  # noqa: F401
    import torch._dynamo  # noqa: F401
    import tqdm  # noqa: F401

    import accelify.runtime  # noqa: F401

    assert not accelerate.state.PartialState._shared_state, "HF state exists before forking"
    reply = sys.stdout
    sys.stdout = sys.stderr  # nothing but replies on the reply pipe
    for line in sys.stdin:
        request = json.loads(line)
        pids = []
        for rank in range(request["ranks"]):
            pid = os.fork()
            if pid == 0:
                _child(request, rank)
            pids.append(pid)
        reply.write(json.dumps(_wait(pids, request["timeout"])) + "\n")
        reply.flush()


def main(argv: list[str]) -> int:
    if argv[:1] == ["--zygote"]:
        serve()
        return 0
    if not argv:
        print("usage: probe.py SCRIPT [ARGS...]   (results in $ORACLE_OUT)", file=sys.stderr)
        return 2
    return run(argv[0], argv[1:], os.environ.get("ORACLE_OUT", "."))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
