"""Section 8: clean exits. A clean 2-process job that never calls ``end_training()`` (most scripts)
is run again and again; every non-zero exit is a good job reported as failed.

The same job runs on accelify's runtime under accel-run (DDP and FSDP2) and on HF Accelerate's
under torchrun, the launcher its own multi-process path uses; HF Accelerate cannot run FSDP on a
CPU, so it has the DDP row only.
"""

from __future__ import annotations

import os
import subprocess
from collections import Counter

from report import Section, Target
from static import installed
from timing import ROOT, tool

SCRIPT = str(ROOT / "fixtures" / "launch" / "no_end_training.py")
TWO_CPUS = ["--cpu", "--num-processes=2"]
# (runtime, launcher) -> the command before the script, and the script's own arguments.
JOBS = {
    ("accelify, DDP", "accel-run"): ([tool("accel-run"), *TWO_CPUS], []),
    ("accelify, FSDP2", "accel-run"): ([tool("accel-run"), *TWO_CPUS, "--use-fsdp"], []),
    ("HF Accelerate, DDP", "torchrun"): (
        [tool("torchrun"), "--standalone", "--nproc-per-node=2"],
        ["--hf"],
    ),
}


def _exit_code(command: list[str]) -> int:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, timeout=300, check=False)
    return done.returncode


def exits(runs: int) -> Section:
    section = Section(
        "exits",
        f"8. Clean exits: 2 CPU processes, no end_training(), {runs} runs each",
        ["Runtime", "Launcher", "Runs", "Non-zero exits", "Exit codes seen"],
    )
    jobs = dict(JOBS)
    if installed("accelerate", "accelerate") is None:
        section.notes.append("accelerate: not installed")
        jobs = {key: job for key, job in jobs.items() if not key[0].startswith("HF")}
    codes: dict[tuple[str, str], Counter[int]] = {key: Counter() for key in jobs}
    for _ in range(runs):  # interleaved, so load from elsewhere falls on every job alike
        for key, (launcher, args) in jobs.items():
            codes[key][_exit_code([*launcher, SCRIPT, *args])] += 1
    for (runtime, launcher), seen in codes.items():
        failed = runs - seen[0]
        spelled = ", ".join(f"{code}: {count}" for code, count in sorted(seen.items()))
        section.rows.append([runtime, launcher, str(runs), str(failed), spelled])
        section.data[f"{runtime} / {launcher}"] = {"runs": runs, "exit_codes": dict(seen)}
        if runtime.startswith("accelify"):
            section.targets.append(
                Target(f"non-zero clean exits, {runtime}", float(failed), 0, False, "")
            )
    return section
