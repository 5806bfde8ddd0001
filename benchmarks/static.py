"""Sections 1 and 2: lint/convert throughput on the generated corpus, and CLI start-up on one file.

Every tool, ours and the anchors, is timed as a whole process over the same folder, the way users
run it, so interpreter start-up and imports are paid by all alike.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import shutil
import sys
from pathlib import Path

import corpus
from report import Section, Target, spread
from timing import ROOT, Stat, tool, wall

ANCHORS = str(Path(__file__).with_name("anchors.py"))
SMALL_FILE = ROOT / "fixtures" / "convert" / "mnist.in.py"


def installed(module: str, dist: str) -> str | None:
    """The installed version of an optional anchor, or None."""
    if importlib.util.find_spec(module) is None:
        return None
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:  # shipped inside another distribution
        return getattr(importlib.import_module(module), "__version__", "unknown")


def _throughput_tools(folder: Path) -> tuple[dict[str, list[str]], list[str]]:
    """Name -> command (``{jobs}`` left to fill in); plus a note per anchor not installed."""
    jobs = "--jobs={jobs}"
    tools = {
        "ast.parse": [sys.executable, ANCHORS, "ast", jobs, str(folder)],
        "libcst.parse_module": [sys.executable, ANCHORS, "libcst", jobs, str(folder)],
        "accel-lint": [tool("accel-lint"), "--exit-zero", jobs, str(folder)],
        "accel-convert --check": [tool("accel-convert"), "--check", "--quiet", jobs, str(folder)],
    }
    missing = []
    for label, module, dist in (("Fixit", "fixit", "fixit"), ("TorchFix", "torchfix", "torchfix")):
        version = installed(module, dist)
        if version is None:
            missing.append(f"{label}: not installed (`pip install -e .[bench]`)")
        else:
            tools[f"{label} {version}"] = [sys.executable, ANCHORS, module, jobs, str(folder)]
    return tools, missing


def throughput(work: Path, files: int, repeats: int) -> Section:
    """Lines/s and files/s at 1 job and at all cores, tools interleaved within each repeat."""
    made = corpus.build(work / "corpus", files)
    tools, missing = _throughput_tools(made.root)
    all_jobs = os.cpu_count() or 1
    job_counts = sorted({1, all_jobs})
    samples: dict[tuple[str, int], list[float]] = {(t, j): [] for t in tools for j in job_counts}
    for _ in range(repeats):
        for (name, jobs), times in samples.items():
            times.append(wall([part.format(jobs=jobs) for part in tools[name]]))
    seconds = {key: Stat.of(times) for key, times in samples.items()}
    lines_per_s = {key: s.inverse(made.lines) for key, s in seconds.items()}
    section = Section(
        "throughput",
        f"1. Lint and convert throughput ({made.files} files, {made.lines:,} lines, "
        f"{made.plain_files} without torch)",
        ["Tool", "Jobs", "Lines/s", "Files/s", "vs libcst parse"],
        notes=missing,
        data={"corpus": {"files": made.files, "lines": made.lines, "plain": made.plain_files}},
    )
    for (name, jobs), rate in lines_per_s.items():
        floor = lines_per_s[("libcst.parse_module", jobs)].median
        section.rows.append(
            [
                name,
                str(jobs),
                spread(rate),
                spread(seconds[(name, jobs)].inverse(made.files), "{:,.1f}"),
                f"{rate.median / floor:.2f}x",
            ]
        )
        section.data[f"{name} / {jobs} jobs"] = {"seconds": seconds[(name, jobs)].as_dict()}

    def ratio(tool_name: str, anchor_name: str, jobs: int = 1) -> float | None:
        anchor = lines_per_s.get((anchor_name, jobs))
        return None if anchor is None else lines_per_s[(tool_name, jobs)].median / anchor.median

    fixit = next((name for name in tools if name.startswith("Fixit")), "Fixit")
    section.targets = [
        Target(
            "lint vs raw libcst parse (1 job)",
            ratio("accel-lint", "libcst.parse_module"),
            0.6,
            True,
        ),
        Target("lint vs Fixit (1 job)", ratio("accel-lint", fixit), 5, True),
        Target(
            "convert vs raw libcst parse (1 job)",
            ratio("accel-convert --check", "libcst.parse_module"),
            0.4,
            True,
        ),
    ]
    return section


def startup(work: Path, repeats: int) -> Section:
    """Wall time of each CLI on one small file, with the bare interpreter as the floor."""
    small = work / "small" / "train.py"
    small.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(SMALL_FILE, small)
    commands = {
        "python -c pass (floor)": [sys.executable, "-c", "pass"],
        "accel-lint": [tool("accel-lint"), str(small)],
        "accel-convert --check": [tool("accel-convert"), "--check", "--quiet", str(small)],
    }
    ruff = shutil.which("ruff", path=str(Path(tool("ruff")).parent)) or shutil.which("ruff")
    notes = []
    if ruff:
        commands["ruff check"] = [ruff, "check", "--isolated", "--no-cache", str(small)]
    else:
        notes.append("ruff: not installed")
    samples: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(repeats):
        for name, cmd in commands.items():
            samples[name].append(wall(cmd))
    stats = {name: Stat.of(times).scaled(1000) for name, times in samples.items()}
    section = Section(
        "startup",
        f"2. CLI start-up on one {SMALL_FILE.read_text().count(chr(10))}-line file",
        ["Command", "Wall ms"],
        rows=[[name, spread(stat)] for name, stat in stats.items()],
        data={name: stat.as_dict() for name, stat in stats.items()},
        notes=notes,
    )
    # 0.4 s: the budget for CLIs on typer (parsing, help, completion), which costs ~0.05 s of it.
    section.targets = [
        Target(f"{name} start-up", stats[name].median / 1000, 0.4, False, " s")
        for name in ("accel-lint", "accel-convert --check")
    ]
    return section
