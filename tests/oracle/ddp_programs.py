"""Hand-written DDP training scripts for the differential oracle, and the judge that runs them.

One program, written in every combination of: how its processes start (``torchrun``, ``mp.spawn``
from the script, or the PyTorch DDP tutorial's ``run_demo(demo_fn, world_size)`` that spawns the
function it is given), whether the wrapped model is the tutorial's second name
(``ddp_model = DDP(model)``, trained and saved through it) or research code's bare one
(``model_without_ddp``, optimized and saved through it, wrapped only on several processes),
whether its ``DistributedSampler`` shuffles, whether it reaches the loader straight or through a
``BatchSampler`` (DETR's ``batch_sampler=``), whether it saves a checkpoint under a rank guard
every epoch (or through a function that unwraps what it is handed with ``model.module if
hasattr(model, "module") else model``), whether it all-reduces its loss sum, and whether it
accumulates gradients over two batches, skipping DDP's sync of the first under ``no_sync()``
or with nanoGPT's ``require_backward_grad_sync`` switch, and whether it names its backend or
looks it up for its device (``dist.get_default_backend_for_device``, as pytorch/examples' DDP
scripts do now).
Each script writes, from rank 0, what it did: optimizer steps, samples seen by that rank, the
last epoch's mean loss, the final weights and their loss on the whole dataset (to
``$DDP_OUT/result.pt``).

The original runs under ``torchrun --nproc-per-node 2`` (gloo; ``mp.spawn`` scripts start their
two processes themselves) and the conversion under ``accel-run --cpu --num-processes 2``:

- unshuffled, each optimizer step sees the same union of samples under both (DistributedSampler
  interleaves samples over ranks, the prepared loader deals out whole batches), and DDP averages
  the two ranks' gradients either way, so the final weights agree within fp32 rounding, and so
  does the epoch's loss where it is summed over both ranks (``all_reduce``);
- shuffled, the order differs (the sampler's and the loader's generators are not the same), so
  steps and samples per rank must agree exactly and the final weights' loss on the whole dataset
  within ``LOSS_TOLERANCE``. (Rank 0's own epoch loss is over different samples under the two
  launchers, shuffled or not, so it is compared only where it is summed over both ranks.)
"""

from __future__ import annotations

import itertools
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
from runner import BIN, _free_port, clean_env, transient

from accelify.transform.convert import Options, convert

AXES: dict[str, tuple[str, ...]] = {
    "launch": ("torchrun", "spawn", "tutorial"),
    "wrap": ("inline", "ddp_model", "without_ddp"),
    "shuffle": ("False", "True"),
    "batching": ("loader", "batch_sampler"),
    "save": ("none", "guarded", "helper"),
    "reduce": ("none", "all_reduce"),
    "accumulate": ("none", "no_sync", "toggle"),
    "backend": ("literal", "lookup"),
}
# A linear model fits a linear target with noise of variance 0.01 (a convex problem): after four
# epochs the whole-data loss of its weights depends on the sample order only. Simulated for this
# program over 40 shuffles (two ranks, their batches from one permutation), it ranges over
# 0.00913..0.01078 (spread 0.0017) stepping every batch and 0.0193..0.0225 (spread 0.0032)
# accumulating two; each tolerance is 1.5 times its spread.
LOSS_TOLERANCE = {"none": 0.0025, "no_sync": 0.005, "toggle": 0.005}

_HEADER = """import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

"""
_SPAWN_SETUP = """def setup(rank, world_size):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = os.environ["DDP_PORT"]
    dist.init_process_group("gloo", rank=rank, world_size=world_size)


def main(rank, world_size, epochs=4):
    setup(rank, world_size)
"""
_TORCHRUN_SETUP = """def main(epochs=4):
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    world_size = dist.get_world_size()
"""
_BODY = """    torch.manual_seed(0)
    inputs = torch.randn(96, 8)
    data = TensorDataset(inputs, inputs @ torch.randn(8, 1) + 0.1 * torch.randn(96, 1))
    sampler = DistributedSampler(data, shuffle={shuffle})
    loader = DataLoader(data, batch_size=4, sampler=sampler)
    model = DDP(nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    steps = 0
    seen = 0
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        total = torch.zeros(1)
        for i, (x, y) in enumerate(loader):
{step}            seen += len(x)
            total += F.mse_loss(model(x), y).detach()
{reduce}{save}    result = {{"steps": steps, "seen": seen, "epoch": total / len(loader)}}
    result["weights"] = model.module.state_dict()
    with torch.no_grad():
        result["final"] = F.mse_loss(model(inputs), data.tensors[1])
    if rank == 0:
        torch.save(result, os.path.join(os.environ["DDP_OUT"], "result.pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
"""
_STEP = """            optimizer.zero_grad()
            F.mse_loss(model(x), y).backward()
            optimizer.step()
            steps += 1
"""
_NO_SYNC_STEP = """            if i % 2 == 0:
                with model.no_sync():
                    (F.mse_loss(model(x), y) / 2).backward()
                continue
            (F.mse_loss(model(x), y) / 2).backward()
            optimizer.step()
            optimizer.zero_grad()
            steps += 1
"""
_TOGGLE_STEP = """            model.require_backward_grad_sync = i % 2 == 1
            (F.mse_loss(model(x), y) / 2).backward()
            if i % 2 == 0:
                continue
            optimizer.step()
            optimizer.zero_grad()
            steps += 1
"""
_STEPS = {"none": _STEP, "no_sync": _NO_SYNC_STEP, "toggle": _TOGGLE_STEP}
_WITHOUT_DDP = """model = nn.Linear(8, 1)
    model_without_ddp = model
    if world_size > 1:
        model = DDP(model)
        model_without_ddp = model.module
"""
_BATCH_SAMPLER = """batches = torch.utils.data.BatchSampler(sampler, 4, drop_last=False)
    loader = DataLoader(data, batch_sampler=batches)
"""
_REDUCE = "        dist.all_reduce(total)\n        total = total / world_size\n"
_SAVE = """        if rank == 0:
            torch.save(model.module.state_dict(), os.path.join(os.environ["DDP_OUT"], "epoch.pt"))
"""
_SAVE_BY_HELPER = """        if rank == 0:
            save_checkpoint(model, os.path.join(os.environ["DDP_OUT"], "epoch.pt"))
"""
# Research code's unwrap in a function every call hands the wrapped model (FixMatch's shape).
_SAVE_HELPER = """def save_checkpoint(model, path):
    model_to_save = model.module if hasattr(model, "module") else model
    torch.save(model_to_save.state_dict(), path)


"""
_SAVES = {"none": "", "guarded": _SAVE, "helper": _SAVE_BY_HELPER}


def variants() -> list[dict[str, str]]:
    return [dict(zip(AXES, values, strict=True)) for values in itertools.product(*AXES.values())]


def name(choice: dict[str, str]) -> str:
    return "-".join(f"{k}={v}" for k, v in choice.items())


_STARTS = {
    "torchrun": "    main()\n",
    "spawn": "    mp.spawn(main, args=(2,), nprocs=2)\n",
    "tutorial": "    run_demo(main, 2)\n",
}
_RUN_DEMO = """def run_demo(demo_fn, world_size):
    mp.spawn(demo_fn, args=(world_size,), nprocs=world_size, join=True)


"""


_LOOKUP = """device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    backend = dist.get_default_backend_for_device(device)
    dist.init_process_group(backend"""


def render(choice: dict[str, str]) -> str:
    spawned = spawns(choice)
    body = _BODY.format(
        shuffle=choice["shuffle"],
        step=_STEPS[choice["accumulate"]],
        reduce=_REDUCE if choice["reduce"] == "all_reduce" else "",
        save=_SAVES[choice["save"]],
    )
    if choice["batching"] == "batch_sampler":
        body = body.replace(
            "loader = DataLoader(data, batch_size=4, sampler=sampler)\n", _BATCH_SAMPLER
        )
    if choice["wrap"] == "ddp_model":  # every use of the wrapped model goes through the new name
        second = "model = nn.Linear(8, 1)\n    ddp_model = DDP(model)"
        body = re.sub(r"\bmodel\b", "ddp_model", body)
        body = body.replace("ddp_model = DDP(nn.Linear(8, 1))", second)
    if choice["wrap"] == "without_ddp":  # research code's bare-module name (DETR's shape)
        body = body.replace("model = DDP(nn.Linear(8, 1))\n", _WITHOUT_DDP)
        body = body.replace("SGD(model.parameters()", "SGD(model_without_ddp.parameters()")
        body = body.replace("model.module.state_dict()", "model_without_ddp.state_dict()")
    if choice["launch"] == "tutorial":
        body = body.replace('if __name__ == "__main__":', _RUN_DEMO + 'if __name__ == "__main__":')
    setup = _SPAWN_SETUP if spawned else _TORCHRUN_SETUP
    if choice["backend"] == "lookup":
        setup = setup.replace('dist.init_process_group("gloo"', _LOOKUP)
    helper = _SAVE_HELPER if choice["save"] == "helper" else ""
    return _HEADER + helper + setup + body + _STARTS[choice["launch"]]


def spawns(choice: dict[str, str]) -> bool:
    """Whether the script starts its own processes (else torchrun starts them)."""
    return choice["launch"] != "torchrun"


@dataclass
class Outcome:
    """What one run left behind: its exit code, output, and rank 0's result (None if none)."""

    code: int
    output: str
    result: dict | None


def run(source: str, command: list[str], timeout: float = 300) -> Outcome:
    with tempfile.TemporaryDirectory(prefix="ddp-oracle-") as tmp:
        script = Path(tmp) / "train.py"
        script.write_text(source)
        env = {**clean_env(), "DDP_OUT": tmp, "DDP_PORT": str(_free_port())}
        try:
            done = subprocess.run(
                [*command, str(script)], cwd=tmp, env=env, capture_output=True, text=True,
                timeout=timeout, check=False,
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            return Outcome(-9, "timed out", None)
        path = Path(tmp) / "result.pt"
        result = torch.load(path, weights_only=True) if path.exists() else None
        return Outcome(done.returncode, (done.stdout + done.stderr)[-3000:], result)


# Runs of the original after a transient failure (runner.transient): two tries failed a
# clean-clone CI run once.
_ORIGINAL_TRIES = 5


def original(source: str, choice: dict[str, str]) -> Outcome:
    """The hand-written script's own run; one that failed for the machine runs again (the
    question is what it trains, and the conversion's run gets no such second chance)."""
    for _attempt in range(_ORIGINAL_TRIES):
        if spawns(choice):
            outcome = run(source, [sys.executable])
        else:
            port = str(_free_port())
            torchrun = [str(BIN / "torchrun"), "--nproc-per-node", "2", "--master-port", port]
            outcome = run(source, torchrun)
        if not transient(outcome.code, outcome.output):
            break
    return outcome


def converted(code: str) -> Outcome:
    return run(code, [str(BIN / "accel-run"), "--cpu", "--num-processes", "2"])


def differences(choice: dict[str, str], a: dict, b: dict) -> list[str]:
    """What differs between the original's result ``a`` and the conversion's ``b``."""
    out = [f"{k}: {a[k]} != {b[k]}" for k in ("steps", "seen") if a[k] != b[k]]
    if choice["shuffle"] == "False":
        for key, value in a["weights"].items():
            if not torch.allclose(value, b["weights"][key], rtol=1e-5, atol=1e-6):
                out.append(f"weight {key} differs by {(value - b['weights'][key]).abs().max()}")
        if choice["reduce"] == "all_reduce" and not torch.allclose(a["epoch"], b["epoch"]):
            out.append(f"epoch loss {float(a['epoch']):.6f} vs {float(b['epoch']):.6f}")
    if abs(float(a["final"]) - float(b["final"])) > LOSS_TOLERANCE[choice["accumulate"]]:
        out.append(f"final loss {float(a['final']):.5f} vs {float(b['final']):.5f}")
    return out


def convert_script(source: str) -> str:
    return convert(source, Options(), path="train.py").code
