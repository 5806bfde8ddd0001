"""Sections 4-7: runtime import cost, per-step overhead on 1 and 2 processes, the replica check's
cost, and the GPU run.

Every loop runs in a fresh process (``loops.py``) with one intra-op thread, so frameworks cannot
share warm state and two processes fit two cores; frameworks are interleaved within each repeat so
load from elsewhere on the machine falls on all of them alike.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from unittest import mock

from loops import GPTS
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
SYNC_CHECK = "ACCELIFY_SYNC_CHECK"  # the runtime's replica check: off, first (its default), every:N
PEAK_FLOPS = "ACCELIFY_PEAK_FLOPS"  # the GPU's dense bf16 FLOP/s, where it is not known by name
MODELS = {"gpt2": "GPT-2 small", "gpt": "small GPT"}  # the GPU section's, in its order
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


def sync_check(repeats: int, steps: int) -> Section:
    """accelify's replica check on 2 gloo processes: step time with it off, at its default (the
    variable unset) and every 100 steps, each against off in the same run."""
    launch, launch_env = _launchers(2)["accel-run"]
    settings = {"off": "off", "unset (the default)": None, "every:100": "every:100"}
    samples: dict[str, list[dict]] = {label: [] for label in settings}
    with mock.patch.dict(os.environ):  # restored afterwards
        os.environ.pop(SYNC_CHECK, None)  # "default" must mean unset, whatever the shell says
        for _ in range(repeats):
            for label, value in settings.items():
                env = {**launch_env, **({} if value is None else {SYNC_CHECK: value})}
                result = _loop(launch, "accelify", [f"--steps={steps}"], env)
                if result["world_size"] != 2:
                    raise RuntimeError(f"accelify ran on {result['world_size']} process")
                samples[label].append(result)
    section = Section(
        "sync_check",
        "6b. accelify's replica check: 2 CPU processes (gloo), 2-layer MLP, batch 32 per process",
        [SYNC_CHECK, "µs/step", "vs off"],
        notes=[
            f"{steps} timed steps after 50 of warm-up. The default checks once, after the first "
            "optimizer step (inside the warm-up); every:100 checks every 100th step."
        ],
    )
    off = _pooled(samples["off"]).median
    for label, results in samples.items():
        step = _pooled(results)
        ratio = step.median / off
        section.rows.append([label, spread(step), f"{ratio:.3f}x"])
        section.data[label] = {"us_per_step": step.as_dict(), "ratio_to_off": ratio}
    ratio = section.data["unset (the default)"]["ratio_to_off"]
    section.targets.append(
        Target("accelify replica check at its default, vs off", ratio, 1.01, False)
    )
    return section


def peak_flops(device: str) -> float | None:
    """The GPU's dense bf16 peak in FLOP/s, for MFU: ``ACCELIFY_PEAK_FLOPS`` when set, else the
    datasheet figure for a GPU known by name, else None. H100 PCIe and NVL and H200 NVL peak lower
    than the SXM parts and are left to the variable."""
    if PEAK_FLOPS in os.environ:
        text = os.environ[PEAK_FLOPS]
        try:
            value = float(text)
        except ValueError:
            value = 0.0
        if not value > 0:  # also NaN
            raise RuntimeError(f"{PEAK_FLOPS}={text!r}: not a positive number of FLOP/s")
        return value
    name = device.upper()
    if "H100" in name and ("HBM3" in name or "SXM" in name):
        return 989.4e12
    if "H200" in name and "NVL" not in name:
        return 989.4e12
    if "A100" in name:
        return 312e12
    return None


def gpu(repeats: int, steps: int, gpt2: tuple[int, int], anchors: bool = True) -> Section:
    """Section 7: one GPU, bf16 autocast; tokens/s and MFU of the same loop in each framework,
    against the plain loop (``python loops.py raw``: one process, no launcher, no DDP). ``steps``
    for the small GPT, ``gpt2`` = (warm-up, timed) steps for GPT-2 small."""
    import torch

    sizes = []
    for name, label in MODELS.items():
        s = GPTS[name]
        sizes.append(f"{label} ({s.layers} layers x {s.width}, {s.batch}x{s.context} tokens)")
    section = Section(
        "gpu",
        f"7. One GPU, bf16 autocast, SGD: {' and '.join(sizes)}",
        ["Model", "Loop", "tokens/s", "vs raw", "MFU"],
    )
    if not torch.cuda.is_available():
        section.status = "skipped: no CUDA device"
        return section
    device = torch.cuda.get_device_name()
    peak = peak_flops(device)
    frameworks, section.notes = _available(["raw", "accelify", "hf", "fabric"], anchors)
    runs = {(model, LABELS[framework]): framework for model in MODELS for framework in frameworks}
    common = ["--device=cuda", "--precision=bf16"]
    args = {"gpt": [f"--steps={steps}"], "gpt2": [f"--warmup={gpt2[0]}", f"--steps={gpt2[1]}"]}
    samples: dict[tuple[str, str], list[dict]] = {key: [] for key in runs}
    for _ in range(repeats):
        for (model, label), framework in runs.items():
            cmd = [f"--model={model}", *common, *args[model]]
            samples[(model, label)].append(_loop([sys.executable], framework, cmd))
    rates = {
        key: _pooled(results).inverse(results[0]["tokens_per_step"] * 1e6)
        for key, results in samples.items()
    }
    for (model, label), rate in rates.items():
        ratio = rate.median / rates[(model, LABELS["raw"])].median
        flops = samples[(model, label)][0]["flops_per_token"]
        mfu = None if peak is None else rate.median * flops / peak
        mfu_cell = "n/a" if mfu is None else f"{mfu:.1%}"
        section.rows.append([MODELS[model], label, spread(rate), f"{ratio:.3f}x", mfu_cell])
        section.data[f"{model} / {label}"] = {
            "tokens_per_s": rate.as_dict(),
            "ratio_to_raw": ratio,
            "flops_per_token": flops,
            "mfu": mfu,
        }
    section.data["peak_flops"] = peak
    peak_text = f"unknown (set {PEAK_FLOPS})" if peak is None else f"{peak / 1e12:g} TFLOP/s"
    section.notes += [
        "Each loop is `python loops.py FRAMEWORK` in its own process: no launcher, no DDP. "
        f"GPT-2 small times {gpt2[1]} steps after {gpt2[0]} of warm-up.",
        "MFU: tokens/s x (6N + 12 x layers x width x context) FLOPs per token (PaLM's estimate, as "
        "nanoGPT uses it; N: every parameter but the position table, the tied token table once) "
        f"over the dense bf16 peak of the {device}: {peak_text}.",
        "Every loop reads the same DataLoader over CPU tensors (~0.1 ms to collate a batch on a "
        "small VM, under 1% of a GPT-2 step) and moves batches the way its framework does by "
        "default (raw: `.to(device, non_blocking=True)`).",
        "One GPU runs one process, where the replica check never runs; `benchmarks/gpu_check.sh "
        "fingerprint` times the fingerprint it would take of GPT-2 small instead.",
    ]
    return section
