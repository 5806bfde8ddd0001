"""Sections 4-7: runtime import cost, per-step overhead on 1 and 2 processes, and the GPU run.

Every loop runs in a fresh process (``loops.py``) with one intra-op thread, so frameworks cannot
share warm state and two processes fit two cores; frameworks are interleaved within each repeat so
load from elsewhere on the machine falls on all of them alike.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from loops import BATCH, SEQ
from report import Section, Target, spread
from static import installed
from timing import Stat, run, tool

LOOPS = str(Path(__file__).with_name("loops.py"))
THREADS = {"OMP_NUM_THREADS": "1"}
LABELS = {
    "raw": "raw PyTorch",
    "accelify": "accelify.runtime",
    "hf": "HF Accelerate",
    "fabric": "Lightning Fabric",
}
OPTIONAL = {"hf": ("accelerate", "accelerate"), "fabric": ("lightning_fabric", "lightning-fabric")}
CONFIGS = {"fp32": [], "grad accum 4": ["--accum=4"], "bf16 autocast": ["--precision=bf16"]}
# What a training script imports first: the front object, which pulls in the runtime behind it.
IMPORTS = {
    "from accelify.runtime import Accelerator": None,
    "from accelerate import Accelerator": ("accelerate", "accelerate"),
    "from lightning_fabric import Fabric": ("lightning_fabric", "lightning-fabric"),
}


def _available(names: Sequence[str], anchors: bool = True) -> tuple[list[str], list[str]]:
    """The frameworks that can run here, and a note for each that is not installed (or, with
    ``anchors`` off, left out)."""
    ok, notes = [], []
    for name in names:
        if name in OPTIONAL and not anchors:
            notes.append(f"{LABELS[name]}: left out (no anchors in this mode)")
        elif name in OPTIONAL and installed(*OPTIONAL[name]) is None:
            notes.append(f"{LABELS[name]}: not installed")
        else:
            ok.append(name)
    return ok, notes


def _loop(cmd: list[str], framework: str, args: Sequence[str], env: dict[str, str] | None = None):
    """Run one loop; return its result (µs per step for each block, first-step wall clock)."""
    with tempfile.TemporaryDirectory() as tmp:
        result = Path(tmp) / "result.json"
        launched = time.time()
        run([*cmd, LOOPS, framework, f"--result={result}", *args], {**THREADS, **(env or {})})
        data = json.loads(result.read_text())
    data["latency"] = data["first_step_at"] - launched
    return data


def imports(repeats: int) -> Section:
    """The import's own cost after ``import torch``, in a fresh interpreter each time."""
    section = Section("imports", "4. Runtime import, on top of `import torch`", ["Import", "ms"])
    for statement, optional in IMPORTS.items():
        if optional and installed(*optional) is None:
            section.notes.append(f"{optional[1]}: not installed")
            continue
        code = (
            "import time, torch; t = time.perf_counter(); "
            f"{statement}; print(time.perf_counter() - t)"
        )
        samples = [float(run([sys.executable, "-c", code])) * 1000 for _ in range(repeats)]
        stat = Stat.of(samples)
        section.rows.append([f"`{statement}`", spread(stat, "{:,.1f}")])
        section.data[statement] = stat.as_dict()
        if optional is None:
            section.targets.append(Target("accelify runtime import", stat.median, 30, False, " ms"))
    return section


def _pooled(results: list[dict]) -> Stat:
    """Every block of every repeat: the spread shows both noise within a run and between runs."""
    return Stat.of([us for result in results for us in result["us_per_step"]])


def per_step(repeats: int, steps: int, anchors: bool = True) -> Section:
    """Section 5: one process, tiny MLP, CPU; fp32, gradient accumulation 4 and bf16 autocast."""
    frameworks, notes = _available(list(LABELS), anchors)
    section = Section(
        "per_step",
        "5. Per-step overhead, 1 process, CPU, 2-layer MLP, batch 32",
        ["Loop", *(f"{c} µs/step" for c in CONFIGS), *(f"{c} vs raw" for c in CONFIGS)],
        notes=notes,
    )
    samples = {(c, f): [] for c in CONFIGS for f in frameworks}
    for _ in range(repeats):
        for (config, framework), runs in samples.items():
            runs.append(_loop([sys.executable], framework, [f"--steps={steps}", *CONFIGS[config]]))
    stats = {key: _pooled(runs) for key, runs in samples.items()}
    for framework in frameworks:
        cells = [spread(stats[(c, framework)]) for c in CONFIGS]
        ratios = [stats[(c, framework)].median / stats[(c, "raw")].median for c in CONFIGS]
        section.rows.append([LABELS[framework], *cells, *(f"{r:.3f}x" for r in ratios)])
        for config, ratio in zip(CONFIGS, ratios, strict=True):
            section.data[f"{framework} / {config}"] = {
                "us_per_step": stats[(config, framework)].as_dict(),
                "ratio_to_raw": ratio,
            }
            if framework == "accelify":
                section.targets.append(Target(f"accelify step time, {config}", ratio, 1.05, False))
    return section


def _launchers(processes: int) -> dict[str, tuple[list[str], dict[str, str]]]:
    """Launcher name -> (command prefix, environment) starting ``processes`` CPU workers."""
    n = str(processes)
    return {
        "torchrun": ([tool("torchrun"), "--standalone", f"--nproc-per-node={n}"], {}),
        "accel-run": ([tool("accel-run"), "--cpu", f"--num-processes={n}"], {}),
        # `--cpu` would make `accelerate launch` start one plain process: multi_gpu is its
        # torch.distributed launcher, and ACCELERATE_USE_CPU makes the Accelerator use gloo.
        "accelerate launch": (
            [
                *(tool("accelerate"), "launch", "--multi_gpu", f"--num_processes={n}"),
                *("--num_machines=1", "--mixed_precision=no", "--dynamo_backend=no"),
            ],
            {"ACCELERATE_USE_CPU": "1"},
        ),
    }


def distributed(repeats: int, steps: int, anchors: bool = True) -> Section:
    """Section 6: 2 gloo processes. Step time of each framework under its own launcher, and
    launch-to-first-step latency of the three launchers running the same raw DDP script."""
    launchers = _launchers(2)
    runs = {
        ("raw DDP", "torchrun"): "raw",
        ("accelify", "accel-run"): "accelify",
        ("HF Accelerate", "accelerate launch"): "hf",
        ("raw DDP", "accel-run"): "raw",
        ("raw DDP", "accelerate launch"): "raw",
    }
    if not anchors or installed("accelerate", "accelerate") is None:
        runs = {key: fw for key, fw in runs.items() if key[1] != "accelerate launch"}
    if not anchors:
        runs = {key: fw for key, fw in runs.items() if key != ("raw DDP", "accel-run")}
    samples: dict[tuple[str, str], list[dict]] = {key: [] for key in runs}
    for _ in range(repeats):
        for (name, launcher), framework in runs.items():
            cmd, env = launchers[launcher]
            result = _loop(cmd, framework, [f"--steps={steps}"], env)
            if result["world_size"] != 2:
                raise RuntimeError(f"{name} under {launcher} ran on {result['world_size']} process")
            samples[(name, launcher)].append(result)
    section = Section(
        "distributed",
        "6. Two processes on CPU (gloo), 2-layer MLP, batch 32 per process",
        ["Loop", "Launcher", "µs/step", "vs raw DDP", "Launch to first step, s"],
        notes=[] if anchors else ["HF Accelerate, and raw DDP under accel-run: left out"],
    )
    raw = _pooled(samples[("raw DDP", "torchrun")])
    for (name, launcher), results in samples.items():
        step = _pooled(results)
        latency = Stat.of([r["latency"] for r in results])
        ratio = step.median / raw.median
        row = [name, launcher, spread(step), f"{ratio:.3f}x", spread(latency, "{:.2f}")]
        section.rows.append(row)
        section.data[f"{name} / {launcher}"] = {
            "us_per_step": step.as_dict(),
            "ratio_to_raw_ddp": ratio,
            "latency_s": latency.as_dict(),
        }
        if name == "accelify":
            section.targets.append(Target("accelify DDP step time vs raw DDP", ratio, 1.03, False))
    return section


def gpu(repeats: int, steps: int) -> Section:
    """Section 7: CUDA, small GPT-style model, bf16, one GPU; tokens/s against raw DDP."""
    import torch

    section = Section(
        "gpu",
        "7. One GPU, GPT-style model (4 layers, width 256, 16x128 tokens), bf16",
        ["Loop", "Launcher", "tokens/s", "vs raw DDP"],
    )
    if not torch.cuda.is_available():
        section.status = "skipped: no CUDA device"
        return section
    args = [f"--steps={steps}", "--model=gpt", "--device=cuda", "--precision=bf16"]
    frameworks, section.notes = _available(["accelify", "hf", "fabric"])
    runs = {("raw", "torchrun"): [tool("torchrun"), "--standalone", "--nproc-per-node=1"]}
    runs.update({(f, "python"): [sys.executable] for f in frameworks})
    samples = {key: [] for key in runs}
    for _ in range(repeats):
        for (framework, launcher), cmd in runs.items():
            samples[(framework, launcher)].append(_loop(cmd, framework, args))
    tokens = BATCH["gpt"] * SEQ
    rates = {key: _pooled(results).inverse(tokens * 1e6) for key, results in samples.items()}
    raw = rates[("raw", "torchrun")].median
    for (framework, launcher), rate in rates.items():
        label = "raw DDP (1 process)" if framework == "raw" else LABELS[framework]
        section.rows.append([label, launcher, spread(rate), f"{rate.median / raw:.3f}x"])
        section.data[framework] = {
            "tokens_per_s": rate.as_dict(),
            "ratio_to_raw": rate.median / raw,
        }
    return section
