"""HF Accelerate's own test scripts, run against accelify: the drop-in claim, checked by HF.

``hf_runner.py`` runs one script per launch (1 process: plain ``python``, as ``accelerate launch
--num_processes 1`` does; 2 processes: ``accel-run --cpu``, gloo) and records each check that the
script's ``main()`` calls. ``scope.toml`` is the reviewed list: where each check runs, where it
passes under HF Accelerate on CPU (the baseline) and, for those accelify does not claim, why.
Every check not out of scope must pass; one out of scope that starts passing, or a check the list
does not know (a new upstream one), fails here so the list gets reviewed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import tomllib

pytestmark = pytest.mark.slow

HERE = Path(__file__).resolve().parent
RUNNER = HERE / "hf_runner.py"
SCOPE = tomllib.loads((HERE / "scope.toml").read_text())
_LAUNCH = "from accelify.runtime.launch.cli import main; main()"
_LAUNCHER_PREFIXES = ("ACCELERATE_", "FSDP_", "DS_", "WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_")


def run_script(script: str, processes: int, out: Path) -> dict[str, dict[str, Any]]:
    """Each check's outcome under accelify, merged over ranks (a check passes if all ranks do)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_LAUNCHER_PREFIXES)}
    env.update(OMP_NUM_THREADS="1", HF_HOME=str(out / "hf_home"))
    env.update(SCOPE["scripts"][script].get("env", {}))
    launch = [sys.executable]
    if processes > 1:
        launch += ["-c", _LAUNCH, "--cpu", "--num-processes", str(processes)]
    hangs = [
        e["name"]
        for e in SCOPE["function"]
        if e["script"] == script and e.get("hangs_under_accelify")
    ]
    command = [*launch, str(RUNNER), "accelify", script, str(out), ",".join(hangs)]
    # The bound only catches a hang: a script takes about 30 s, and ten times that on a loaded
    # 2-core machine (a clean-clone CI run beside other work lost one to a bound of 240 s).
    done = subprocess.run(
        command, env=env, cwd=out, capture_output=True, text=True, timeout=900, check=False
    )
    outcomes: dict[str, dict[str, Any]] = {}
    for rank in range(processes):
        path = out / f"rank{rank}.jsonl"
        assert path.exists(), (
            f"rank {rank} recorded nothing:\n{done.stdout[-2000:]}{done.stderr[-3000:]}"
        )
        for line in path.read_text().splitlines():
            record = json.loads(line)
            known = outcomes.setdefault(record["function"], {"ok": True, "error": ""})
            if known["ok"] and not record["ok"]:
                known.update(ok=False, error=f"rank {rank}: {record['error']}")
    assert done.returncode == 0, f"exit {done.returncode}:\n{done.stderr[-3000:]}"
    return outcomes


def expected(script: str, processes: int) -> dict[str, dict[str, Any]]:
    return {
        entry["name"]: entry
        for entry in SCOPE["function"]
        if entry["script"] == script and processes in entry["runs"]
    }


CASES = [
    pytest.param(script, processes, id=f"{script}-{processes}proc")
    for script, settings in SCOPE["scripts"].items()
    for processes in settings["processes"]
]


@pytest.mark.parametrize(("script", "processes"), CASES)
def test_hf_script_checks_pass_under_accelify(script: str, processes: int, tmp_path: Path) -> None:
    outcomes = run_script(script, processes, tmp_path)
    listed = expected(script, processes)
    left = outcomes.pop("<hf-left>", None)
    problems = [f"the script still uses HF's runtime: {left['error']}"] if left else []
    problems += [
        f"{name}: not in scope.toml (new upstream check?), review it; "
        f"{outcomes[name]['error'] or 'it passes'}"
        for name in outcomes.keys() - listed.keys()
    ]
    problems += [
        f"{name}: listed but main() did not run it" for name in listed.keys() - outcomes.keys()
    ]
    for name, entry in listed.items():
        outcome = outcomes.get(name)
        if outcome is None:
            continue
        reason = entry.get("out_of_scope")
        if processes not in entry.get("out_of_scope_on", entry["runs"]):
            reason = None
        if reason is None and not outcome["ok"]:
            problems.append(f"{name}: fails under accelify: {outcome['error']}")
        elif reason is not None and outcome["ok"]:
            problems.append(f"{name}: out of scope ({reason}) but passes now; move it in scope")
    assert not problems, f"{script} on {processes} process(es):\n" + "\n".join(problems)


def test_scope_list_covers_every_shipped_script() -> None:
    """A script added upstream shows up here until it is run or excluded with a reason."""
    import accelerate.test_utils.scripts as shipped

    names = {path.stem for path in Path(shipped.__file__).parent.glob("test_*.py")}
    assert names == SCOPE["scripts"].keys() | SCOPE["excluded"].keys()


def test_scope_list_is_consistent() -> None:
    """Every entry names a script that runs; a check HF fails where it runs says why."""
    scripts = SCOPE["scripts"]
    for entry in SCOPE["function"]:
        where = f"{entry['script']}.{entry['name']}"
        assert entry["script"] in scripts, where
        assert set(entry["hf_passes"]) <= set(entry["runs"]), where
        hf_fails_somewhere = set(entry["hf_passes"]) != set(entry["runs"])
        assert not hf_fails_somewhere or entry.get("hf_fails") or entry.get("out_of_scope"), where
