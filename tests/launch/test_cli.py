"""accel-run's command line: what reaches the script, and one-line errors with exit code 2."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from accelify.runtime.launch import backends, cli, foreign_flags, parallelism
from accelify.runtime.launch import config as cfg

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
        (["--num-proceses", "2", SCRIPT], "--num-proceses (did you mean --num-processes?)"),
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


def test_help_shows_one_spelling_per_option_and_each_command_its_own(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """accelerate's underscore spellings are accepted, not listed a second time; ``accel-run
    test --help`` is about the self-test, not the launch of a script."""
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    out = capsys.readouterr().out
    assert "--num-processes N" in out and "--num_processes" not in out.split("examples:")[0]
    with pytest.raises(SystemExit) as done:
        cli.main(["test", "--help"])
    out = capsys.readouterr().out
    assert done.value.code == 0
    assert out.startswith("usage: accel-run test [launch options]")
    assert "the training script" not in out


def test_version_comes_from_the_installed_package(capsys: pytest.CaptureFixture[str]) -> None:
    from importlib.metadata import version

    with pytest.raises(SystemExit):
        cli.main(["--version"])
    assert capsys.readouterr().out.strip() == f"accel-run {version('accelify')}"


def test_missing_script_from_a_real_process_has_no_traceback(accel_run) -> None:
    done = accel_run("--cpu", "missing.py")
    assert done.returncode == 2
    assert done.stderr == "accel-run: error: missing.py:0: no such script\n"


def _accelerate_options() -> list[argparse.Action]:
    """Every option of the installed `accelerate launch`, read from its own parser."""
    launch = pytest.importorskip("accelerate.commands.launch")
    parser = launch.launch_command_parser()
    return [a for a in parser._actions if a.option_strings and a.dest != "help"]


def _accelerate_command_lines() -> list[list[str]]:
    """One command line per spelling of each option, with a value where it takes one."""
    lines = []
    for action in _accelerate_options():
        value = [] if action.nargs == 0 else ["1"]
        lines += [[spelling, *value] for spelling in action.option_strings]
    return lines


# Namespace fields a command line may set that are the launcher's own, not a setting.
_LAUNCHER_FIELDS = {"config_file", "module", "no_python", "quiet", "use_deepspeed", "use_fsdp"}
_LAUNCHER_FIELDS |= {"use_parallelism_config"}


def _fields_set(argv: list[str]) -> set[str]:
    parse = cli.launch_parser().parse_args
    given, bare = vars(parse([*argv, SCRIPT])), vars(parse([SCRIPT]))
    assert given["script"] == SCRIPT, argv  # a switch never swallows the script, nor a value
    return {name for name, value in given.items() if value != bare[name]}


def test_every_accelerate_launch_option_is_accepted_and_means_something() -> None:
    """A new upstream option fails here until accel-run implements it or says why it cannot."""
    settings = set(cfg.PARSERS) | set(backends.DEEPSPEED_KEYS) | set(backends.FSDP_KEYS)
    settings |= set(parallelism.KEYS)
    lines = _accelerate_command_lines()
    assert len(lines) > 200  # both spellings of the 123 options of accelerate 1.15
    for argv in lines:
        fields = _fields_set(argv)
        assert len(fields) == 1, (argv, fields)
        (field,) = fields
        foreign = field.removeprefix("foreign_")
        known = field in settings | _LAUNCHER_FIELDS or field == "distributed_type"
        assert known or foreign in foreign_flags.BY_NAME, (argv, field)


@pytest.mark.parametrize("foreign", foreign_flags.FOREIGN, ids=lambda f: f.names[0])
def test_options_accel_run_cannot_honour_say_why_in_one_line(foreign) -> None:
    for name in foreign.names:
        value = [] if foreign.action == "store_true" else ["x"]
        args = cli.launch_parser().parse_args([f"--{name}", *value, SCRIPT])
        if foreign.refused:
            with pytest.raises(ValueError, match=f"^{foreign_flags.flag(name)}: "):
                foreign_flags.review(args)
        else:
            assert foreign_flags.review(args) == [
                f"{foreign_flags.flag(name)} has no effect: {foreign.why}"
            ]


def test_notes_print_before_the_launch_and_quiet_silences_them(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("accelify.runtime.launch.run.run_elastic", lambda *args: None)
    for quiet in ([], ["-q"]):
        with pytest.raises(SystemExit) as done:
            cli.main(["launch", "--cpu", "--vm", "tpu-1", *quiet, SCRIPT])
        assert done.value.code == 0
        err = capsys.readouterr().err
        assert err == (
            ""
            if quiet
            else f"accel-run: note: --vm has no effect: {foreign_flags.BY_NAME['vm'].why}\n"
        )


def test_a_launch_at_a_terminal_says_in_one_line_what_it_starts(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], hf_home: Path
) -> None:
    monkeypatch.setattr("accelify.runtime.launch.run.run_elastic", lambda *args: None)
    monkeypatch.setattr(cli, "_on_terminal", lambda: True)
    for quiet in ([], ["-q"]):
        with pytest.raises(SystemExit):
            cli.main(["--cpu", "--num-processes", "2", "--mixed-precision", "bf16", *quiet, SCRIPT])
        assert capsys.readouterr().err == (
            ""
            if quiet
            else f"accel-run: starting {SCRIPT}: 2 processes on 1 machine, MULTI_CPU, mixed "
            "precision bf16, config file none\n"
        )


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--nproc-per-node", "2"], {"nproc_per_node": 2}),
        (["--nproc_per_node", "2", "--nnodes", "2:2", "--node-rank", "1",
          "--master-addr", "10.0.0.1", "--master_port", "29501"],
         {"nproc_per_node": 2, "num_machines": 2, "machine_rank": 1,
          "main_process_ip": "10.0.0.1", "main_process_port": 29501}),
        (["--rdzv-endpoint", "10.0.0.1:29400", "--rdzv-backend", "c10d"],
         {"main_process_ip": "10.0.0.1", "main_process_port": 29400, "rdzv_backend": "c10d"}),
        (["--standalone"], {"num_machines": 1, "main_process_port": 0}),
    ],
    ids=["nproc", "two-nodes", "endpoint", "standalone"],
)  # fmt: skip
def test_torchrun_spellings_are_accelerates_settings(argv: list[str], expected: dict) -> None:
    assert cli.flag_values(cli.launch_parser().parse_args([*argv, SCRIPT])) == expected


def test_nproc_per_node_counts_per_machine() -> None:
    flags = {"nproc_per_node": 4, "num_machines": 2, "main_process_ip": "10.0.0.1"}
    assert cfg.resolve({}, flags, lambda: 0).num_processes == 8


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--nnodes", "1:4", SCRIPT], "--nnodes 1:4: accel-run runs a fixed number of machines"),
        (["--nproc-per-node", "2", "--num-processes", "3", SCRIPT],
         "--nproc-per-node 2 on 1 machine(s) is 2 processes, but --num-processes is 3"),
        (["--num-machines", "2", "--nnodes", "3", SCRIPT],
         "--num-machines is 2 but torchrun's spelling says 3"),
        (["--rdzv-endpoint", "29400", SCRIPT], "--rdzv-endpoint: must be HOST:PORT"),
        (["--tpu", SCRIPT], "--tpu: TPU training (torch_xla): accel-run does not support it"),
        (["--mpirun-hostfile", "hosts", SCRIPT], "--mpirun-hostfile: accel-run does not start"),
        (["--tee", "4", SCRIPT], "--tee: must be 0-3 or rank:0-3 pairs"),
        (["--rdzv-conf", "timeout", SCRIPT], "--rdzv-conf: must be key=value pairs"),
        (["--dynamo-backend", "turbo", SCRIPT], "--dynamo-backend: must be one of NO, EAGER"),
        (["-m", "--no-python", "x"], "--module and --no-python exclude each other"),
        (["--no-python", "no-such-program-here"], "no-such-program-here:0: no such program"),
        (["test", SCRIPT], "accel-run test takes launch options only, not a script"),
        (["launch", "missing.py"], "missing.py:0: no such script"),
    ],
)  # fmt: skip
def test_bad_launch_lines_are_one_line_errors(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as done:
        cli.main(argv)
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("accel-run: error: ")
    assert message in err


def test_the_agents_own_options_reach_its_config(tmp_path: Path) -> None:
    from torch.distributed.elastic.multiprocessing import Std

    from accelify.runtime.launch import run

    argv = ["--cpu", "--num-processes", "2", "-t", "0:3,1:2", "--role", "trainer",
            "--rdzv-conf", "join_timeout=5, last_call_timeout=1",
            "--log-dir", str(tmp_path)]  # fmt: skip
    settings = cfg.resolve({}, cli.flag_values(cli.launch_parser().parse_args(argv)), lambda: 0)
    with run._log_dir(settings) as first, run._log_dir(settings) as second:
        config = run.launch_config(settings, "spawn", first)
    assert config.role == "trainer"
    assert config.rdzv_configs.items() >= {"join_timeout": "5", "last_call_timeout": "1"}.items()
    assert config.logs_specs._tee == {0: Std.ALL, 1: Std.ERR}
    # Each run keeps its own folder under --log-dir: an old run's error files never mix in.
    assert Path(first).parent == Path(second).parent == tmp_path and first != second
    assert Path(first).is_dir() and Path(second).is_dir()
