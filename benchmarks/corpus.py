"""A deterministic corpus of training scripts (and non-torch files) to time the linters on.

Each script is one of the project's own fixture scripts (plain PyTorch and Accelerate-style)
grown to a target length with helper code of the kinds real training scripts carry: model classes,
datasets, metrics, evaluation loops, configs. Lengths are log-uniform over 50-2,000 lines, so there
are many small files and a few big ones, as in a real repository. One file in five never mentions
torch, so the tools' "does this file matter?" prefilters are exercised too.
"""

from __future__ import annotations

import ast
import math
import random
from dataclasses import dataclass
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
MIN_LINES, MAX_LINES = 50, 2000
PLAIN_SHARE = 0.2  # files with no torch in them

# Helper blocks; ``{n}`` makes every name unique within a file.
TORCH_BLOCKS = (
    '''
class Block{n}(nn.Module):
    """A residual MLP block."""

    def __init__(self, width: int = 64, dropout: float = 0.1) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.fc1 = nn.Linear(width, 4 * width)
        self.fc2 = nn.Linear(4 * width, width)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc2(torch.nn.functional.gelu(self.fc1(self.norm(x))))
        return x + self.drop(h)
''',
    '''
class Samples{n}(torch.utils.data.Dataset):
    """Synthetic samples, generated once from a seed."""

    def __init__(self, size: int = 256, features: int = 20, seed: int = {n}) -> None:
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(size, features, generator=g)
        self.y = self.x[:, :4].argmax(dim=1)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int):
        return self.x[index], self.y[index]
''',
    '''
def evaluate{n}(model, loader, device="cpu"):
    """Accuracy and mean loss over ``loader``."""
    model.eval()
    correct, total, loss_sum = 0, 0, 0.0
    with torch.no_grad():
        for inputs, targets in loader:
            inputs, targets = inputs.to(device), targets.to(device)
            logits = model(inputs)
            loss_sum += torch.nn.functional.cross_entropy(logits, targets).item()
            correct += (logits.argmax(dim=-1) == targets).sum().item()
            total += targets.numel()
    model.train()
    return {{"accuracy": correct / max(total, 1), "loss": loss_sum / max(len(loader), 1)}}
''',
    """
def top_k_accuracy{n}(logits: torch.Tensor, targets: torch.Tensor, k: int = 5) -> float:
    top = logits.topk(min(k, logits.shape[-1]), dim=-1).indices
    hits = (top == targets.unsqueeze(-1)).any(dim=-1)
    return hits.float().mean().item()
""",
    """
def build_optimizer{n}(model, lr=1e-3, weight_decay=0.01):
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        (no_decay if name.endswith("bias") or "norm" in name else decay).append(param)
    groups = [
        {{"params": decay, "weight_decay": weight_decay}},
        {{"params": no_decay, "weight_decay": 0.0}},
    ]
    return torch.optim.AdamW(groups, lr=lr)
""",
)

PLAIN_BLOCKS = (
    '''
@dataclass
class Settings{n}:
    """Run settings, read from the command line."""

    learning_rate: float = 3e-4
    batch_size: int = 32
    epochs: int = 10
    output_dir: str = "runs/{n}"
    tags: list = field(default_factory=list)

    def describe(self) -> str:
        return ", ".join(f"{{k}}={{v}}" for k, v in sorted(vars(self).items()))
''',
    """
def parse_args{n}(argv=None):
    parser = argparse.ArgumentParser(description="experiment {n}")
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--seed", type=int, default={n})
    parser.add_argument("--name", default="exp-{n}")
    return parser.parse_args(argv)
""",
    '''
def moving_average{n}(values, window=10):
    """Smoothed curve for logging."""
    out, total = [], 0.0
    for i, value in enumerate(values):
        total += value
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out
''',
    '''
class Tokenizer{n}:
    """Whitespace tokenizer with a growing vocabulary."""

    def __init__(self) -> None:
        self.vocab = {{"<pad>": 0, "<unk>": 1}}

    def encode(self, text: str) -> list:
        ids = []
        for word in text.lower().split():
            if word not in self.vocab:
                self.vocab[word] = len(self.vocab)
            ids.append(self.vocab[word])
        return ids

    def decode(self, ids) -> str:
        inverse = {{v: k for k, v in self.vocab.items()}}
        return " ".join(inverse.get(i, "<unk>") for i in ids)
''',
)

PLAIN_HEADER = '''"""Experiment helpers {n}."""

import argparse
import json
from dataclasses import dataclass, field
'''


@dataclass(frozen=True)
class Corpus:
    root: Path
    files: int
    lines: int
    plain_files: int  # files without torch


def _scripts() -> list[str]:
    """The fixture training scripts: plain PyTorch inputs and Accelerate-style outputs."""
    paths = sorted(FIXTURES.glob("convert/**/*.py")) + sorted(FIXTURES.glob("lint/*.py"))
    paths += sorted(FIXTURES.glob("runtime/*.py")) + sorted(FIXTURES.glob("launch/*.py"))
    return [p.read_text() for p in paths if "torch" in p.read_text()]


def _after_imports(text: str) -> int:
    """Line index just after the last top-level import, where helper code can go."""
    tree = ast.parse(text)
    ends = [n.end_lineno or 0 for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    return max(ends, default=0)


def _grow(head: str, tail: str, blocks: tuple[str, ...], target: int, rng: random.Random) -> str:
    """``head`` + helper blocks until about ``target`` lines + ``tail``."""
    parts, lines, n = [head], head.count("\n") + tail.count("\n"), 0
    while lines < target:
        block = rng.choice(blocks).format(n=n)
        parts.append(block + "\n")
        lines += block.count("\n") + 1
        n += 1
    parts.append(tail)
    return "".join(parts)


def grow_script(script: str, target: int, rng: random.Random) -> str:
    """``script`` with helper code inserted after its imports, to about ``target`` lines."""
    lines = script.splitlines(keepends=True)
    cut = _after_imports(script)
    head = "".join(lines[:cut]) + "import torch\nimport torch.nn as nn\n\n"
    return _grow(head, "\n" + "".join(lines[cut:]), TORCH_BLOCKS, target, rng)


def build(root: Path, files: int, seed: int = 0) -> Corpus:
    """Write ``files`` Python files under ``root`` (same files for the same arguments)."""
    rng = random.Random(seed)
    scripts = _scripts()
    root.mkdir(parents=True, exist_ok=True)
    total_lines = plain = 0
    for index in range(files):
        target = round(math.exp(rng.uniform(math.log(MIN_LINES), math.log(MAX_LINES))))
        if rng.random() < PLAIN_SHARE:
            text = _grow(PLAIN_HEADER.format(n=index), "", PLAIN_BLOCKS, target, rng)
            plain += 1
        else:
            text = grow_script(scripts[index % len(scripts)], target, rng)
        folder = root / f"project_{index % 8}"
        folder.mkdir(exist_ok=True)
        (folder / f"train_{index:04d}.py").write_text(text)
        total_lines += text.count("\n")
    return Corpus(root, files, total_lines, plain)
