"""Medians with their spread, and the wall time of a command.

The machine is shared and small, so every number is a median over repeats and carries its min and
max; ratios are taken between medians measured in the same run.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent  # console scripts of the interpreter running the benchmark


@dataclass(frozen=True)
class Stat:
    """A median over ``n`` samples, with the smallest and largest sample."""

    median: float
    low: float
    high: float
    n: int

    @classmethod
    def of(cls, samples: Sequence[float]) -> Stat:
        return cls(statistics.median(samples), min(samples), max(samples), len(samples))

    def scaled(self, factor: float) -> Stat:
        return Stat(self.median * factor, self.low * factor, self.high * factor, self.n)

    def inverse(self, numerator: float) -> Stat:
        """``numerator / x`` for each sample: turns a time into a rate (low and high swap)."""
        return Stat(numerator / self.median, numerator / self.high, numerator / self.low, self.n)

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


class CommandFailed(RuntimeError):
    pass


def run(cmd: Sequence[str], env: dict[str, str] | None = None, timeout: float = 900) -> str:
    """Run ``cmd`` and return its standard output; a failure raises with the tail of stderr."""
    result = subprocess.run(
        list(cmd),
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        timeout=timeout,
        check=False,
    )
    if result.returncode not in (0, 1):  # 1: linters and --check report findings
        # Six lines: enough to keep a native crash's own message above the launcher's report.
        tail = (result.stderr or result.stdout).strip().splitlines()[-6:]
        raise CommandFailed(f"{cmd[0]} exited {result.returncode}: {' | '.join(tail)}")
    return result.stdout


def wall(cmd: Sequence[str], env: dict[str, str] | None = None) -> float:
    """Seconds from start to exit of ``cmd``."""
    start = time.perf_counter()
    run(cmd, env)
    return time.perf_counter() - start


def tool(name: str) -> str:
    """A console script installed next to the running interpreter."""
    return str(BIN / name)
