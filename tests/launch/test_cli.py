"""accel-run's command line: what reaches the script, and one-line errors with exit code 2."""

from __future__ import annotations

from pathlib import Path

import pytest

from accelify.runtime.launch import cli

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "launch"
SCRIPT = str(FIXTURES / "allreduce.py")


def test_everything_after_the_script_belongs_to_the_script() -> None:
    args = cli.launch_parser().parse_args(
        ["--num_processes", "2", SCRIPT, "--lr", "3", "--num_processes", "5"]
    )
    assert args.num_processes == "2"
    assert args.script == SCRIPT
    assert args.script_args == ["--lr", "3", "--num_processes", "5"]


def test_accelerate_command_line_spellings_are_the_same_settings() -> None:
    dashed = ["--num-processes", "4", "--mixed-precision", "BF16", "--main-process-port", "0"]
    underscored = ["--num_processes", "4", "--mixed_precision", "bf16", "--main_process_port", "0"]
    parse = cli.launch_parser().parse_args
    expected = {"num_processes": 4, "mixed_precision": "bf16", "main_process_port": 0}
    assert cli.flag_values(parse([*dashed, SCRIPT])) == expected
    assert cli.flag_values(parse([*underscored, "--multi_gpu", SCRIPT])) == {
        **expected,
        "distributed_type": "MULTI_GPU",
    }


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--num-processes", "0", SCRIPT], "--num-processes: must be a positive integer, got '0'"),
        (["--mixed-precision", "fp8", SCRIPT], "--mixed-precision: must be one of no, fp16, bf16"),
        (["--main-process-port", "70000", SCRIPT], "--main-process-port: must be a port number"),
        (["--gpu-ids", "0;1", SCRIPT], "--gpu-ids: must be 'all' or a comma-separated list"),
        (["missing.py"], "missing.py:0: no such script"),
        (["--cpu"], "no script to run; see accel-run --help"),
        (["--nproc", "2", SCRIPT], "unrecognized arguments: --nproc"),
        (["--num-processes"], "argument --num-processes/--num_processes: expected one argument"),
        (["--config-file", "nope.yaml", SCRIPT], "nope.yaml:0: no such config file"),
        (["--num-machines", "2", "--num-processes", "2", SCRIPT], "need --main-process-ip"),
        (["config", "--mixed-precision", "fp4"], "--mixed-precision: must be one of"),
        (["env", "--config-file", "nope.yaml"], None),
    ],
)
def test_usage_errors_are_one_line_and_exit_2(
    argv: list[str], message: str | None, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as done:
        cli.main(argv)
    assert done.value.code == 2
    err = capsys.readouterr().err
    if message is None:  # `env` still prints its report, with the config error in it
        return
    assert err.count("\n") == 1
    assert err.startswith("accel-run: error: ")
    assert message in err


def test_a_user_config_at_the_default_location_is_read(
    hf_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    default = hf_home / "accelerate" / "default_config.yaml"
    default.parent.mkdir(parents=True)
    default.write_text("use_cpu: true\nbogus: 1\n")
    with pytest.raises(SystemExit) as done:
        cli.main([SCRIPT])
    assert done.value.code == 2
    assert f"{default}:2: bogus: unknown key" in capsys.readouterr().err


def test_help_teaches_with_examples(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        cli.main(["--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert "accel-run --cpu --num-processes 2 train.py" in out
    assert "exit codes:" in out


def test_version_comes_from_the_installed_package(capsys: pytest.CaptureFixture[str]) -> None:
    from importlib.metadata import version

    with pytest.raises(SystemExit):
        cli.main(["--version"])
    assert capsys.readouterr().out.strip() == f"accel-run {version('accelify')}"


def test_missing_script_from_a_real_process_has_no_traceback(accel_run) -> None:
    done = accel_run("--cpu", "missing.py")
    assert done.returncode == 2
    assert done.stderr == "accel-run: error: missing.py:0: no such script\n"
