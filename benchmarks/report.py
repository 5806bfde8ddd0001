"""What a section of the benchmark hands back, and how the run is written down (JSON + markdown)."""

from __future__ import annotations

import json
import platform
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from timing import Stat


@dataclass
class Target:
    """One of the issue's targets: ``value`` compared with ``limit`` (``at_least`` or at most)."""

    name: str
    value: float | None  # None: could not be measured (an anchor not installed)
    limit: float
    at_least: bool
    unit: str = "x"

    @property
    def met(self) -> bool | None:
        if self.value is None:
            return None
        return self.value >= self.limit if self.at_least else self.value <= self.limit


@dataclass
class Section:
    """A table of results; ``status`` is "ok", "skipped: why" or "failed: why"."""

    key: str
    title: str
    columns: list[str]
    rows: list[list[str]] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)
    targets: list[Target] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    status: str = "ok"


def spread(stat: Stat, fmt: str = "{:,.0f}") -> str:
    """``median (low-high)``, the way every timing in the tables reads."""
    return f"{fmt.format(stat.median)} ({fmt.format(stat.low)}-{fmt.format(stat.high)})"


def machine() -> dict[str, Any]:
    import os

    import torch  # the benchmark may import torch; only accelify's converter and linter may not

    return {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }


def _target_line(t: Target) -> str:
    verdict = {True: "met", False: "**missed**", None: "not measured"}[t.met]
    sign = ">=" if t.at_least else "<="
    value = "-" if t.value is None else f"{t.value:.3g}{t.unit}"
    return f"| {t.name} | {value} | {sign} {t.limit:g}{t.unit} | {verdict} |"


def markdown(sections: list[Section], meta: dict[str, Any]) -> str:
    where = f"{meta['processor']}, {meta['cpus']} CPUs, {meta['platform']}"
    lines = [
        f"Measured {meta['date']} on {where}; Python {meta['python']}, torch {meta['torch']}"
        f"{', GPU ' + meta['cuda'] if meta['cuda'] else ''}. Mode: {meta['mode']}, "
        f"{meta['seconds']:.0f} s. Timings: median (min-max) over repeats.",
        "",
        "| Target | Measured | Wanted | |",
        "|---|---|---|---|",
        *(_target_line(t) for s in sections for t in s.targets),
    ]
    for section in sections:
        lines += ["", f"### {section.title}", ""]
        if section.status != "ok":
            lines.append(f"*{section.status}*")
            continue
        lines.append("| " + " | ".join(section.columns) + " |")
        lines.append("|" + "---|" * len(section.columns))
        lines += ["| " + " | ".join(row) + " |" for row in section.rows]
        lines += [""] + [f"- {note}" for note in section.notes] if section.notes else []
    return "\n".join(lines) + "\n"


def write(folder: Path, sections: list[Section], meta: dict[str, Any]) -> str:
    """Write ``latest.json`` and ``latest.md`` under ``folder``; return the markdown."""
    folder.mkdir(parents=True, exist_ok=True)
    record = {
        "machine": meta,
        "sections": [
            {**asdict(s), "targets": [{**asdict(t), "met": t.met} for t in s.targets]}
            for s in sections
        ],
    }
    (folder / "latest.json").write_text(json.dumps(record, indent=2) + "\n")
    text = markdown(sections, meta)
    (folder / "latest.md").write_text(text)
    return text
