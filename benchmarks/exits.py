"""Section 8: clean exits. A clean 2-process job that never calls ``end_training()`` (most scripts)
is run again and again; every non-zero exit is a good job reported as failed.

The same job runs on accelify's runtime under accel-run (DDP and FSDP2) and on HF Accelerate's
under torchrun, the launcher its own multi-process path uses; HF Accelerate cannot run FSDP on a
CPU, so it has the DDP row only. One more row launches FSDP2 as users do (issue 25):
``accel-run --config-file`` with accelerate's YAML (blocks wrapped by the config), DataLoader
workers and ``save_state`` at the end.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections import Counter
from pathlib import Path

from report import Section, Target
from static import installed
from timing import ROOT, tool

SCRIPT = str(ROOT / "fixtures" / "launch" / "no_end_training.py")
CONFIG_JOB = str(ROOT / "fixtures" / "launch" / "fsdp_config_job.py")
TWO_CPUS = ["--cpu", "--num-processes=2"]
# accelerate's FSDP2 YAML for 2 CPU processes (tests/launch/test_exit.py launches the same).
FSDP_YAML = """\
distributed_type: FSDP
fsdp_config:
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
  fsdp_state_dict_type: FULL_STATE_DICT
  fsdp_sync_module_states: false
  fsdp_transformer_layer_cls_to_wrap: Block
  fsdp_version: 2
mixed_precision: bf16
num_processes: 2
use_cpu: true
"""
# (runtime, launcher) -> the command before the script, the script, and its own arguments;
# "{dir}" is a fresh folder for the run (the YAML file, the checkpoint).
JOBS = {
    ("accelify, DDP", "accel-run"): ([tool("accel-run"), *TWO_CPUS], SCRIPT, []),
    ("accelify, FSDP2", "accel-run"): ([tool("accel-run"), *TWO_CPUS, "--use-fsdp"], SCRIPT, []),
    ("accelify, FSDP2 (YAML, workers, save_state)", "accel-run --config-file"): (
        [tool("accel-run"), "--config-file", "{dir}/fsdp.yaml"],
        CONFIG_JOB,
        ["--save-state", "{dir}/checkpoint"],
    ),
    ("HF Accelerate, DDP", "torchrun"): (
        [tool("torchrun"), "--standalone", "--nproc-per-node=2"],
        SCRIPT,
        ["--hf"],
    ),
}


def _exit_code(command: list[str]) -> int:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with tempfile.TemporaryDirectory(prefix="exits-") as folder:
        (Path(folder) / "fsdp.yaml").write_text(FSDP_YAML)
        command = [part.replace("{dir}", folder) for part in command]
        done = subprocess.run(
            command, cwd=ROOT, env=env, capture_output=True, timeout=300, check=False
        )
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
        for key, (launcher, script, args) in jobs.items():
            codes[key][_exit_code([*launcher, script, *args])] += 1
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
