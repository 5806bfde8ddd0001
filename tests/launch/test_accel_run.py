"""accel-run end to end on CPU: real worker processes on gloo, real failures."""

from __future__ import annotations

import importlib.util
import json
import socket
import subprocess
from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "launch"
ALLREDUCE = str(FIXTURES / "allreduce.py")
FAULTY = str(FIXTURES / "faulty.py")

pytestmark = pytest.mark.slow


def results(stdout: str) -> list[dict]:
    """The ``RESULT {...}`` lines fixtures/launch/allreduce.py prints, sorted by rank."""
    found = [json.loads(line[7:]) for line in stdout.splitlines() if line.startswith("RESULT ")]
    return sorted(found, key=lambda r: r["rank"])


@pytest.mark.parametrize(
    "flags",
    [
        ["--cpu", "--num-processes", "2", "--mixed-precision", "bf16"],
        ["--cpu", "--num_processes", "2", "--mixed_precision", "fp16",
         "--gradient_accumulation_steps", "4"],
    ],
    ids=["dashes", "accelerate-underscores"],
)  # fmt: skip
def test_two_cpu_processes_all_reduce_and_see_the_accelerate_env(accel_run, flags) -> None:
    done = accel_run(*flags, ALLREDUCE, "--lr", "3", "--num_processes", "5")

    assert done.returncode == 0, done.stderr
    ranks = results(done.stdout)
    assert [r["rank"] for r in ranks] == [0, 1]
    assert {r["world_size"] for r in ranks} == {2}
    assert [r["sum"] for r in ranks] == [1.0, 1.0]  # all_reduce of ranks 0 + 1
    assert ranks[0]["words"] == ranks[1]["words"]  # one string hash: a set iterates alike
    for r in ranks:
        assert r["env"]["ACCELERATE_USE_CPU"] == "True"
        assert r["env"]["ACCELERATE_MIXED_PRECISION"] == flags[4]
        # Everything after the script is the script's, even accel-run's own flag names.
        assert r["argv"] == ["--lr", "3", "--num_processes", "5"]
        assert r["main"] == "__main__"
    accumulation = {r["env"].get("ACCELERATE_GRADIENT_ACCUMULATION_STEPS") for r in ranks}
    assert accumulation == ({"4"} if "--gradient_accumulation_steps" in flags else {None})


def test_module_target_with_settings_from_the_config_file_and_a_flag_over_it(
    accel_run, tmp_path: Path
) -> None:
    config = tmp_path / "two_cpus.yaml"
    config.write_text("use_cpu: true\nnum_processes: 2\nmixed_precision: fp16\n")

    done = accel_run(
        "--config-file", str(config), "--mixed-precision", "no", "-m", "allreduce", "x",
        cwd=FIXTURES,
    )  # fmt: skip

    assert done.returncode == 0, done.stderr
    ranks = results(done.stdout)
    assert [r["rank"] for r in ranks] == [0, 1]
    assert {r["env"]["ACCELERATE_MIXED_PRECISION"] for r in ranks} == {"no"}
    assert ranks[0]["argv"] == ["x"]


@pytest.mark.parametrize(
    ("mode", "exit_code", "first_lines"),
    [
        ("raise", 1, ["Traceback (most recent call last):"]),
        ("kill", 128 + 9, ["  no traceback: killed from outside"]),
    ],
)
def test_a_failing_rank_stops_all_and_is_reported_first(
    accel_run, mode: str, exit_code: int, first_lines: list[str]
) -> None:
    # The timeout is the "never a hang" check: the other rank waits in all_reduce forever.
    done = accel_run("--cpu", "--num-processes", "2", FAULTY, mode, "1", timeout=30)

    assert done.returncode == exit_code
    report = done.stderr[done.stderr.index("accel-run: rank") :].splitlines()
    assert report[0].startswith("accel-run: rank 1 failed first")
    assert report[1].startswith(first_lines[0])
    if mode == "raise":
        assert report[report.index("RuntimeError: boom on rank 1") + 1].startswith("accel-run")
        assert 'faulty.py", line' in report[2]  # the user's frame, not bootstrap/runpy ones
        # Only the root cause's traceback is shown; rank 0's "connection closed" is one line.
        assert done.stderr.count("Traceback") == 1
    assert report[-1].startswith("accel-run: rank 0 also failed")
    assert "Traceback" not in done.stdout


def test_a_busy_main_process_port_is_a_usage_error(accel_run) -> None:
    with socket.socket() as busy:
        busy.bind(("", 0))
        busy.listen()
        port = str(busy.getsockname()[1])
        done = accel_run("--cpu", "--num-processes", "2", "--main-process-port", port, ALLREDUCE)

    assert done.returncode == 2
    assert done.stderr.strip() == (
        f"accel-run: error: port {port} is already in use; pick another (--main-process-port, "
        "or use_port in notebook_launcher), or 0 on a single machine to get a free one"
    )
    assert not done.stdout


def test_an_accelerator_script_trains_in_sync_on_two_cpu_processes(accel_run) -> None:
    done = accel_run("--cpu", "--num_processes", "2", str(FIXTURES / "train_accelerator.py"))

    assert done.returncode == 0, done.stderr
    ranks = results(done.stdout)
    assert [(r["rank"], r["world_size"]) for r in ranks] == [(0, 2), (1, 2)]
    assert all(r["type"].endswith("MULTI_CPU") for r in ranks)
    # Each rank saw different data; equal weights mean the gradients were all-reduced.
    assert ranks[0]["weights"] == ranks[1]["weights"]


def test_max_restarts_restarts_all_workers_after_a_failure(accel_run) -> None:
    # Rank 1 raises on the first attempt only; the restarted attempt must rendezvous afresh.
    done = accel_run("--cpu", "--num-processes", "2", "--max-restarts", "1", FAULTY, "flaky", "1",
                     timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "failed" not in done.stderr


def test_hf_accelerate_reads_the_same_env_as_under_its_own_launcher(accel_run) -> None:
    pytest.importorskip("accelerate")
    done = accel_run(
        "--cpu", "--num_processes", "2", "--mixed_precision", "bf16",
        "--gradient_accumulation_steps", "3", str(FIXTURES / "hf_accelerate.py"),
    )  # fmt: skip

    assert done.returncode == 0, done.stderr
    ranks = results(done.stdout)
    assert [(r["rank"], r["world_size"]) for r in ranks] == [(0, 2), (1, 2)]
    assert {(r["type"], r["mixed_precision"], r["accumulation"]) for r in ranks} == {
        ("DistributedType.MULTI_CPU", "bf16", 3)
    }


def test_two_machines_on_one_host_form_one_world(accel_run_argv: list[str]) -> None:
    with socket.socket() as probe:
        probe.bind(("", 0))
        port = str(probe.getsockname()[1])
    common = ["--cpu", "--num_machines", "2", "--main_process_ip", "127.0.0.1",
              "--main_process_port", port, "--num_processes", "2"]  # fmt: skip
    machines = [
        subprocess.Popen(
            [*accel_run_argv, *common, "--machine_rank", rank, ALLREDUCE],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in ("0", "1")
    ]
    outputs = [machine.communicate(timeout=60) for machine in machines]

    assert [m.returncode for m in machines] == [0, 0], [err for _, err in outputs]
    # Machine 0 runs global rank 0, machine 1 rank 1, in one world of two.
    assert [[r["rank"] for r in results(out)] for out, _ in outputs] == [[0], [1]]
    assert {r["sum"] for out, _ in outputs for r in results(out)} == {1.0}
    assert len({tuple(r["words"]) for out, _ in outputs for r in results(out)}) == 1


def test_a_plain_script_on_two_processes_is_warned_about_before_it_starts(
    accel_run, tmp_path: Path
) -> None:
    script = tmp_path / "plain.py"
    script.write_text("print('trained')\n")
    done = accel_run("launch", "--cpu", "--num_processes", "2", str(script))
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("trained") == 2
    assert done.stderr.startswith(f"accel-run: warning: {script} uses no Accelerator")
    quiet = accel_run("--cpu", "--num_processes", "2", "-q", str(script))
    assert quiet.returncode == 0 and quiet.stderr == ""


@pytest.mark.skipif(
    importlib.util.find_spec("accelerate") is None, reason="needs HF Accelerate, the reference"
)
def test_hf_accelerate_that_would_run_alone_on_each_process_is_warned_about(
    accel_run, tmp_path: Path
) -> None:
    """Without GPUs and without --cpu, HF's Accelerator forms no group: each process sees 1."""
    pytest.importorskip("torch").cuda.is_available() and pytest.skip("a GPU host forms a group")
    script = tmp_path / "hf.py"
    script.write_text(
        "import sys\n"
        "from accelerate import Accelerator\n"
        # One write per process: two processes' prints may interleave word by word.
        "sys.stdout.write(f'processes={Accelerator().num_processes}\\n')\n"
    )
    alone = accel_run("--num_processes", "2", str(script))
    assert alone.returncode == 0, alone.stderr
    assert sorted(alone.stdout.split()) == ["processes=1"] * 2  # what the warning says happens
    assert alone.stderr.startswith("accel-run: warning: no GPU here and no --cpu: HF Accelerate")
    together = accel_run("--cpu", "--num_processes", "2", str(script))
    assert together.returncode == 0, together.stderr
    assert sorted(together.stdout.split()) == ["processes=2"] * 2
    assert "warning" not in together.stderr


def test_accel_run_test_trains_briefly_on_the_resolved_config(accel_run, tmp_path: Path) -> None:
    config = tmp_path / "two_cpus.yaml"
    config.write_text("distributed_type: MULTI_CPU\nnum_processes: 2\nmixed_precision: bf16\n")
    done = accel_run("test", "--config-file", str(config))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (
        "accel-run test: ok: 2 process(es), MULTI_CPU, mixed precision bf16, device cpu"
    )
