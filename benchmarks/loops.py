"""One training loop written four ways (raw PyTorch, accelify, HF Accelerate, Lightning Fabric).

Run in a fresh process per measurement (HF Accelerate keeps process-wide state), by itself or under
a launcher. Rank 0 writes ``{"us_per_step": [...], "first_step_at": ...}`` to ``--result``: the mean
step time of each block of steps after warm-up, and the wall clock when the first step finished
(the launch-to-first-step latency is that minus the launch time the parent recorded). The GPT
models add their tokens per step, training FLOPs per token and parameter count, for MFU.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


@dataclass(frozen=True)
class GPTShape:
    """A decoder-only transformer's size, and the batch of ``batch`` x ``context`` tokens it is
    timed with."""

    layers: int
    width: int
    heads: int
    vocab: int
    context: int
    batch: int


GPTS = {
    # Little work per step: on a GPU the loop is launch-bound, so per-step overhead shows.
    "gpt": GPTShape(layers=4, width=256, heads=4, vocab=1024, context=128, batch=16),
    # GPT-2 small (124M): enough work per step to load an 80 GB GPU, so MFU means something.
    "gpt2": GPTShape(layers=12, width=768, heads=12, vocab=50257, context=1024, batch=8),
}
BATCH = {"mlp": 32, **{name: shape.batch for name, shape in GPTS.items()}}


class GPT(nn.Module):
    """GPT-2's layout on torch's own layers: pre-norm blocks with tanh GELU, a final norm, and the
    output head tied to the token embedding (so GPT-2 small counts 124,439,808 parameters). No
    dropout, as in nanoGPT's pre-training, so no framework pays for it."""

    def __init__(self, shape: GPTShape) -> None:
        super().__init__()
        self.shape = shape
        width = shape.width
        self.embed = nn.Embedding(shape.vocab, width)
        # GPT-2's scale: nn.Embedding's N(0, 1) would start the tied head's logits at std ~28.
        nn.init.normal_(self.embed.weight, std=0.02)
        self.pos = nn.Parameter(torch.zeros(shape.context, width))
        layer = nn.TransformerEncoderLayer(
            width,
            shape.heads,
            4 * width,
            dropout=0.0,
            activation=nn.GELU(approximate="tanh"),
            batch_first=True,
            norm_first=True,
        )
        self.blocks = nn.TransformerEncoder(
            layer, shape.layers, norm=nn.LayerNorm(width), enable_nested_tensor=False
        )
        self.head = nn.Linear(width, shape.vocab, bias=False)
        self.head.weight = self.embed.weight
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(shape.context))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        # is_causal with need_weights off hands attention to SDPA's causal kernels, mask unused.
        h = self.blocks(self.embed(tokens) + self.pos, mask=self.mask, is_causal=True)
        return self.head(h).flatten(0, 1)


def flops_per_token(model: GPT) -> int:
    """Training FLOPs per token by PaLM's estimate (appendix B), as nanoGPT's MFU applies it:
    6N + 12 * layers * heads * head width * context, where N counts every parameter but the
    position table (the token table does its matmul as the tied head, and is counted once)."""
    shape = model.shape
    weights = sum(p.numel() for p in model.parameters()) - model.pos.numel()
    return 6 * weights + 12 * shape.layers * shape.width * shape.context


def _model_and_data(kind: str, steps: int) -> tuple[nn.Module, TensorDataset]:
    torch.manual_seed(0)
    n = BATCH[kind] * min(steps, 64)  # a few dozen batches, cycled
    if kind == "mlp":
        model: nn.Module = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))
        return model, TensorDataset(torch.randn(n, 32), torch.randint(0, 10, (n,)))
    shape = GPTS[kind]
    tokens = torch.randint(0, shape.vocab, (n, shape.context + 1))
    return GPT(shape), TensorDataset(tokens[:, :-1], tokens[:, 1:])


def _batches(loader: DataLoader, sampler: object = None) -> Iterator[tuple[torch.Tensor, ...]]:
    epoch = 0
    while True:
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(epoch)
        yield from loader
        epoch += 1


def _loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(model(x), y.flatten())


Step = Callable[[int, tuple[torch.Tensor, ...]], None]


def _raw(args: argparse.Namespace, model: nn.Module, data: TensorDataset):
    """Hand-written loop; under a launcher, hand-written DDP."""
    device = torch.device(args.device)
    model = model.to(device)
    sampler = None
    distributed = "RANK" in os.environ
    if distributed:
        backend = "nccl" if device.type == "cuda" else "gloo"
        torch.distributed.init_process_group(backend)
        sampler = torch.utils.data.DistributedSampler(data)
        model = nn.parallel.DistributedDataParallel(model)
    loader = DataLoader(data, BATCH[args.model], sampler=sampler, shuffle=sampler is None)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    bf16 = args.precision == "bf16"

    def step(i: int, batch: tuple[torch.Tensor, ...]) -> None:
        x, y = (t.to(device, non_blocking=True) for t in batch)
        boundary = (i + 1) % args.accum == 0
        no_sync = distributed and not boundary
        # What a hand-written loop does: no autocast context and no loss scaling unless asked.
        with model.no_sync() if no_sync else contextlib.nullcontext():  # type: ignore[operator]
            with torch.autocast(device.type, torch.bfloat16) if bf16 else contextlib.nullcontext():
                loss = _loss(model, x, y)
            (loss / args.accum if args.accum > 1 else loss).backward()
        if boundary:
            optimizer.step()
            optimizer.zero_grad()

    # No destroy_process_group: called right after DDP's last gloo all-reduce it kills a rank
    # now and then ("terminate called without an active exception", 1 of 30 runs here), and a
    # hand-written loop has no store-side barrier to call first. Process exit tears it down.
    quiet = distributed and torch.distributed.get_rank() != 0
    return step, _batches(loader, sampler), quiet, lambda: None


def _accelerator(args: argparse.Namespace, model: nn.Module, data: TensorDataset, cls: type):
    """accelify and HF Accelerate share the API, so they share the loop."""
    accelerator = cls(
        cpu=args.device == "cpu",
        mixed_precision=args.precision,
        gradient_accumulation_steps=args.accum,
    )
    loader = DataLoader(data, BATCH[args.model], shuffle=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)

    def step(_: int, batch: tuple[torch.Tensor, ...]) -> None:
        x, y = batch
        with accelerator.accumulate(model):
            accelerator.backward(_loss(model, x, y))
            optimizer.step()
            optimizer.zero_grad()

    return step, _batches(loader), not accelerator.is_main_process, accelerator.end_training


def _accelify(args: argparse.Namespace, model: nn.Module, data: TensorDataset):
    from accelify.runtime import Accelerator

    return _accelerator(args, model, data, Accelerator)


def _hf(args: argparse.Namespace, model: nn.Module, data: TensorDataset):
    from accelerate import Accelerator

    return _accelerator(args, model, data, Accelerator)


def _fabric(args: argparse.Namespace, model: nn.Module, data: TensorDataset):
    from lightning_fabric import Fabric

    precision = "bf16-mixed" if args.precision == "bf16" else "32-true"
    fabric = Fabric(accelerator=args.device, devices=1, precision=precision)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model, optimizer = fabric.setup(model, optimizer)
    loader = fabric.setup_dataloaders(DataLoader(data, BATCH[args.model], shuffle=True))

    def step(i: int, batch: tuple[torch.Tensor, ...]) -> None:
        x, y = batch
        boundary = (i + 1) % args.accum == 0
        with fabric.no_backward_sync(model, enabled=not boundary):
            fabric.backward(_loss(model, x, y) / args.accum)
        if boundary:
            optimizer.step()
            optimizer.zero_grad()

    return step, _batches(loader), False, lambda: None


FRAMEWORKS = {"raw": _raw, "accelify": _accelify, "hf": _hf, "fabric": _fabric}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("framework", choices=FRAMEWORKS)
    parser.add_argument("--result", type=Path, required=True)
    parser.add_argument("--model", choices=BATCH, default="mlp")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--precision", choices=("no", "bf16"), default="no")
    parser.add_argument("--accum", type=int, default=1)
    parser.add_argument("--steps", type=int, default=1000, help="timed steps, after warm-up")
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--blocks", type=int, default=5, help="timed steps are reported in blocks")
    args = parser.parse_args()
    model, data = _model_and_data(args.model, args.steps)
    facts = {}
    if isinstance(model, GPT):  # before a framework wraps it
        facts = {"tokens_per_step": model.shape.batch * model.shape.context}
        facts["flops_per_token"] = flops_per_token(model)
        facts["parameters"] = sum(p.numel() for p in model.parameters())
    step, batches, quiet, finish = FRAMEWORKS[args.framework](args, model, data)
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else lambda: None
    first_step_at = None
    marks = []
    for i in range(args.warmup + args.steps):
        step(i, next(batches))
        if i == 0:
            sync()
            first_step_at = time.time()
        if i >= args.warmup and (i - args.warmup) % (args.steps // args.blocks) == 0:
            sync()
            marks.append(time.perf_counter())
    sync()
    marks.append(time.perf_counter())
    per_block = args.steps // args.blocks
    us = [(b - a) / per_block * 1e6 for a, b in itertools.pairwise(marks)][: args.blocks]
    if not quiet:
        world = torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1
        result = {"us_per_step": us, "first_step_at": first_step_at, "world_size": world, **facts}
        args.result.write_text(json.dumps(result))
    finish()


if __name__ == "__main__":
    main()
