"""accel-run's command line: parse, merge the config, hand over to :mod:`.run`.

argparse rather than typer/click: accelerate's ``launch`` is argparse with the script as the first
positional and ``REMAINDER`` after it, and reusing that exact shape is what makes every
``accelerate launch`` command line mean the same here (everything after the script is the
script's, even ``--num_processes``).
"""

from __future__ import annotations

import argparse
import copy
import difflib
import shutil
import sys
from importlib.metadata import version
from pathlib import Path
from typing import Any, NoReturn

from rich.markup import escape
from rich.text import Text

from accelify.runtime import NEEDS_TORCH
from accelify.runtime.launch import backends, foreign_flags, parallelism
from accelify.runtime.launch import config as cfg
from accelify.runtime.launch.terminal import console

PROG = "accel-run"
EXAMPLES = """\
examples:
  accel-run train.py --lr 3e-4                   one process per GPU (one process on a CPU box)
  accel-run --cpu --num-processes 2 train.py     two CPU processes talking over gloo
  accel-run --num_processes 8 --mixed_precision bf16 train.py
                                                 accelerate's spellings work too
  accel-run -m my_project.train --epochs 3       run a module, like python -m
  accel-run --num-machines 2 --machine-rank 1 --main-process-ip 10.0.0.1 \\
            --main-process-port 29500 --num-processes 16 train.py
                                                 machine 1 of 2, 8 processes on each
  accel-run --nproc-per-node 2 --nnodes 1 train.py
                                                 torchrun's spellings work too
  accel-run --num-processes 4 --use-fsdp --fsdp-version 2 --use-parallelism-config \
            --parallelism-config-dp-shard-size 2 --parallelism-config-tp-size 2 train.py
                                                 FSDP2 x tensor parallel (ParallelismConfig)
  accel-run launch train.py                      `accelerate launch`'s shape
  accel-run test --config-file fsdp.yaml         a short training run on that config
  accel-run config --default                     write the default config file
  accel-run env                                  versions, devices and the resolved config

Every option of `accelerate launch` is accepted. Those for TPUs, SageMaker, Megatron-LM, FP8 and
context/sequence parallelism (--megatron-lm-*, --fp8-*, --parallelism-config-cp-comm-strategy,
--vm, --aws-*, ...) are not listed here: each one given prints why it has no effect, or stops the
launch when it would change training and accel-run cannot do it (--tpu, --use-megatron-lm,
--mpirun-hostfile).

Everything after the script (or -m module) is passed to it unchanged. Settings are merged as
defaults < config file < flags; the config file is --config-file, else accelerate's default
($HF_HOME/accelerate/default_config.yaml) when it exists.

exit codes: 0 all workers succeeded; the first failing worker's code (128+N when killed by
signal N); 2 a usage or config error.
"""
# Settings fields that have a flag taking a value: (field, metavar, help, torchrun's spelling).
_VALUE_FLAGS = (
    ("num_processes", "N", "processes in total over all machines (default: one per GPU, else 1)",
     ""),
    ("num_machines", "N", "machines taking part (default: 1)", ""),
    ("machine_rank", "R", "this machine's rank, 0 to num_machines-1 (default: 0)", "node_rank"),
    ("main_process_ip", "ADDR", "address of machine 0 (needed with several machines)",
     "master_addr"),
    ("main_process_port", "PORT", "port on machine 0; 0 or absent picks a free one",
     "master_port"),
    ("mixed_precision", "{no,fp16,bf16}", "mixed precision for the Accelerator (default: no)", ""),
    ("gradient_accumulation_steps", "N",
     "gradient accumulation steps for the Accelerator (any backend; accelerate launch passes it "
     "to DeepSpeed only)", ""),
    ("gpu_ids", "IDS", "GPUs to use, like 0,1 (sets CUDA_VISIBLE_DEVICES; default: all)", ""),
    ("num_cpu_threads_per_process", "N",
     "OMP_NUM_THREADS of each worker (default: cores / processes, unless already set)", ""),
    ("dynamo_backend", "BACKEND",
     "torch.compile backend for HF Accelerate's prepare (ACCELERATE_DYNAMO_BACKEND; default: no)",
     ""),
    ("dynamo_mode", "MODE", "default|reduce-overhead|max-autotune, with --dynamo-backend", ""),
    ("rdzv_backend", "{static,c10d}", "rendezvous backend with several machines", ""),
    ("rdzv_conf", "K=V,...", "rendezvous options, like join_timeout=600", ""),
    ("max_restarts", "N", "restart all workers up to N times after a failure (default: 0)", ""),
    ("monitor_interval", "SECONDS", "how often the agent checks the workers (default: 0.1)", ""),
    ("timeout", "SECONDS",
     "end the job when a collective of accelify.runtime waits this long, with each rank's stack "
     "(default: torch's, 30 minutes; InitProcessGroupKwargs(timeout=...) in the script wins)", ""),
    ("tee", "SPEC", "also write stdout (1), stderr (2) or both (3) to --log-dir; or rank:n,...",
     ""),
    ("log_dir", "DIR", "keep each rank's error file (and --tee output) in a folder under DIR", ""),
    ("role", "NAME", "the workers' role name for the elastic agent (default: default)", ""),
)  # fmt: skip
# Settings fields set by a flag without a value: (flag, field, help).
_SWITCHES = (
    ("cpu", "use_cpu", "run on CPU only (gloo), even where GPUs exist"),
    ("same_network", "same_network", "accepted: machines always meet at --main-process-ip"),
    ("debug", "debug", "show the elastic agent's log and set ACCELERATE_DEBUG_MODE"),
    ("enable_cpu_affinity", "enable_cpu_affinity",
     "ACCELERATE_CPU_AFFINITY=1: HF Accelerate pins each CUDA rank to its cores"),
    ("dynamo_use_fullgraph", "dynamo_use_fullgraph", "with --dynamo-backend"),
    ("dynamo_use_dynamic", "dynamo_use_dynamic", "with --dynamo-backend"),
    ("dynamo_use_regional_compilation", "dynamo_use_regional_compilation",
     "with --dynamo-backend"),
)  # fmt: skip
# torchrun's own ways to say how many and where; translated by _torchrun_values().
_TORCHRUN_FLAGS = (
    ("nproc_per_node", "N", "torchrun's count: processes on each machine"),
    ("nnodes", "N", "torchrun's --num-machines (a fixed count; MIN:MAX is not supported)"),
    ("rdzv_endpoint", "HOST:PORT", "torchrun's --main-process-ip and --main-process-port"),
)


class UsageError(Exception):
    """A bad command line; reported in one line with exit code 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(message + self._did_you_mean(message))

    def _did_you_mean(self, message: str) -> str:
        """For an unknown option, the closest one this command has (``--num-proceses``)."""
        prefix = "unrecognized arguments: "
        if not message.startswith(prefix):
            return ""
        unknown = message[len(prefix) :].split(maxsplit=1)[0].partition("=")[0]
        spelled = [option for option in self._option_string_actions if "_" not in option]
        close = difflib.get_close_matches(unknown, spelled, n=1)
        return f" (did you mean {close[0]}?)" if close and unknown.startswith("-") else ""


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """One spelling per option in ``--help``: ``--num-processes``, not also ``--num_processes``
    (accelerate's underscore spellings are still accepted)."""

    def _format_action_invocation(self, action: argparse.Action) -> str:
        dashed = [s for s in action.option_strings if "_" not in s]
        if not dashed or len(dashed) == len(action.option_strings):
            return super()._format_action_invocation(action)
        shown = copy.copy(action)
        shown.option_strings = dashed
        return super()._format_action_invocation(shown)


def _flag(name: str) -> list[str]:
    dashed = "--" + name.replace("_", "-")
    return [dashed, "--" + name] if "_" in name else [dashed]


def _add_switch(parser: argparse.ArgumentParser, name: str, dest: str, help_text: str) -> None:
    parser.add_argument(*_flag(name), dest=dest, action="store_true", default=None, help=help_text)


def launch_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=PROG,
        usage="%(prog)s [launch] [OPTIONS] script.py [script args...]\n"
        "       %(prog)s [launch] [OPTIONS] -m module [module args...]\n"
        "       %(prog)s {test,config,env} ...",
        description="Launch a training script on N processes and M machines, on torch's elastic\n"
        "agent, with the environment HF Accelerate's launcher gives its scripts.",
        epilog=EXAMPLES,
        formatter_class=_HelpFormatter,
        allow_abbrev=False,
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {version('accelify')}")
    parser.add_argument(*_flag("config_file"), metavar="PATH", help="accelerate-style YAML config")
    for name, metavar, help_text, torchrun in _VALUE_FLAGS:
        spellings = _flag(name) + (_flag(torchrun) if torchrun else [])
        parser.add_argument(*spellings, dest=name, metavar=metavar, help=help_text)
    parser.add_argument("-t", dest="tee", help=argparse.SUPPRESS)  # accelerate's short --tee
    for flag, name, help_text in _SWITCHES:
        _add_switch(parser, flag, name, help_text)
    torchrun = parser.add_argument_group("torchrun's spellings")
    for name, metavar, help_text in _TORCHRUN_FLAGS:
        torchrun.add_argument(*_flag(name), dest=name, metavar=metavar, help=help_text)
    _add_switch(torchrun, "standalone", "standalone", "one machine, a free port (the default)")
    parser.add_argument(
        *_flag("multi_gpu"),
        dest="distributed_type",
        action="store_const",
        const="MULTI_GPU",
        help="accepted for accelerate compatibility (several processes imply it)",
    )
    backends.add_flags(parser)
    parallelism.add_flags(parser)
    foreign_flags.add_flags(parser)
    parser.add_argument(
        "-m", "--module", action="store_true", help="the target is a module name, as in python -m"
    )
    parser.add_argument(
        *_flag("no_python"),
        action="store_true",
        help="the target is a program to run as it is, not a Python script",
    )
    parser.add_argument(
        "-q", "--quiet", action="store_true", help="no notes or warnings from accel-run itself"
    )
    parser.add_argument("script", nargs="?", help="the training script (or module with -m)")
    parser.add_argument("script_args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    return parser


def config_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=f"{PROG} config",
        description="Write a config file (accelerate's format) that accel-run reads by default.",
        epilog="examples:\n  accel-run config --default\n"
        "  accel-run config --config-file cpu2.yaml   then: accel-run --config-file cpu2.yaml ...",
        formatter_class=_HelpFormatter,
        allow_abbrev=False,
    )
    parser.add_argument(
        "--default", action="store_true", help="write the defaults for this machine, ask nothing"
    )
    parser.add_argument(*_flag("config_file"), metavar="PATH", help="where to write it")
    parser.add_argument(*_flag("mixed_precision"), metavar="{no,fp16,bf16}", help="with --default")
    parser.add_argument("--force", action="store_true", help="overwrite an existing file")
    return parser


def env_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=f"{PROG} env",
        description="Print versions, devices and the resolved config (paste it into bug reports).",
        allow_abbrev=False,
    )
    parser.add_argument(*_flag("config_file"), metavar="PATH", help="config file to resolve")
    return parser


def flag_values(args: argparse.Namespace) -> dict[str, Any]:
    """The settings given on the command line, validated; flags left out are not in the dict."""
    values = {}
    for name in cfg.PARSERS:
        raw = getattr(args, name, None)
        if raw is None:
            continue
        try:
            values[name] = cfg.parse_value(name, raw)
        except ValueError as err:
            raise UsageError(f"{_flag(name)[0]}: {err}") from None
    for name, value in _torchrun_values(args).items():
        if values.setdefault(name, value) != value:
            raise UsageError(
                f"{_flag(name)[0]} is {values[name]} but torchrun's spelling says {value}"
            )
    return values


def _torchrun_values(args: argparse.Namespace) -> dict[str, Any]:
    """``--nnodes``, ``--rdzv-endpoint`` and ``--standalone`` as accelerate's settings."""
    values: dict[str, Any] = {}
    nnodes = getattr(args, "nnodes", None)
    if nnodes is not None:
        low, _, high = str(nnodes).partition(":")
        if high and high != low:
            raise UsageError(
                f"--nnodes {nnodes}: accel-run runs a fixed number of machines; give one number"
            )
        values["num_machines"] = _parsed("nnodes", "num_machines", low)
    endpoint = getattr(args, "rdzv_endpoint", None)
    if endpoint is not None:
        host, _, port = str(endpoint).rpartition(":")
        if not host:
            raise UsageError(f"--rdzv-endpoint: must be HOST:PORT, got {endpoint!r}")
        values["main_process_ip"] = _parsed("rdzv_endpoint", "main_process_ip", host)
        values["main_process_port"] = _parsed("rdzv_endpoint", "main_process_port", port)
    if getattr(args, "standalone", None):
        values |= {"num_machines": 1, "main_process_port": 0}
    return values


def _parsed(flag: str, name: str, raw: str) -> Any:
    try:
        return cfg.parse_value(name, raw)
    except ValueError as err:
        raise UsageError(f"{_flag(flag)[0]}: {err}") from None


def _warn(message: str, quiet: bool) -> None:
    if not quiet:
        console(stderr=True).print(Text(f"{PROG}: {message}"))


def _on_terminal() -> bool:
    return sys.stderr.isatty()


def _start_line(args: argparse.Namespace, settings: cfg.Settings, command: list[str]) -> str:
    """What a launch starts, in one line for a person at a terminal (accelerate launch says
    nothing until the script prints)."""
    processes = settings.num_processes or 1
    machines = f"{settings.num_machines} machines" if settings.num_machines > 1 else "1 machine"
    default = cfg.default_config_path()
    config_file = args.config_file or (str(default) if default.is_file() else "none")
    target = args.script if not args.module else f"-m {args.script}"
    return (
        f"starting {target}: {processes} process{'es' * (processes > 1)} on {machines}, "
        f"{settings.resolved_distributed_type}, mixed precision {settings.mixed_precision}, "
        f"config file {config_file}"
    )


def _command(args: argparse.Namespace) -> tuple[str, list[str]]:
    """The worker's entry point (a program, or Python running bootstrap.py) and its arguments."""
    from accelify.runtime.launch.run import BOOTSTRAP

    if args.script is None:
        raise UsageError("no script to run; see accel-run --help")
    if args.module and args.no_python:
        raise UsageError("--module and --no-python exclude each other; pick one")
    if args.no_python:
        if shutil.which(args.script) is None:
            raise UsageError(f"{args.script}:0: no such program")
        return args.script, list(args.script_args)
    if not args.module and not Path(args.script).is_file():
        raise UsageError(f"{args.script}:0: no such script")
    target = ["-m", args.script] if args.module else [args.script]
    return sys.executable, [BOOTSTRAP, *target, *args.script_args]


def _warn_if_trains_alone(args: argparse.Namespace, settings: cfg.Settings) -> None:
    from accelify.runtime.launch.script_check import is_distributed

    processes = settings.num_processes or 1
    if processes < 2 or args.module or args.no_python or is_distributed(Path(args.script)):
        return
    _warn(
        f"warning: {args.script} uses no Accelerator and no torch.distributed: each of the "
        f"{processes} processes will train the whole model on all the data by itself "
        "(convert it with accel-convert, or launch it on 1 process)",
        args.quiet,
    )


def _warn_if_hf_runs_alone(args: argparse.Namespace, settings: cfg.Settings) -> None:
    """HF Accelerate, started on N processes on a host without GPUs and without ``--cpu``, sets
    up no process group: each process sees ``num_processes == 1`` and trains alone (exit 0).
    ``accelerate launch`` starts one process there; accelify.runtime uses gloo."""
    from accelify.runtime.launch.script_check import uses_hf_state

    if (settings.num_processes or 1) < 2 or settings.resolved_distributed_type != "MULTI_GPU":
        return
    if args.module or args.no_python or not uses_hf_state(Path(args.script)):
        return
    if cfg.gpu_count() == 0:
        _warn(
            f"warning: no GPU here and no --cpu: HF Accelerate in {args.script} will see "
            f"num_processes == 1 in each of the {settings.num_processes} processes, each training "
            "alone; pass --cpu to train on CPU processes over gloo",
            args.quiet,
        )


def _launch(argv: list[str]) -> int:
    return _run(launch_parser().parse_args(argv))


def _run(args: argparse.Namespace) -> int:
    from accelify.runtime.launch.run import run_elastic

    entrypoint, command = _command(args)
    try:
        notes = foreign_flags.review(args)
    except ValueError as err:
        raise UsageError(str(err)) from None
    settings = cfg.load_settings(args.config_file, flag_values(args))
    settings = backends.apply(settings, args)
    settings = parallelism.apply(settings, args)
    for note in notes:
        _warn(f"note: {note}", args.quiet)
    _warn_if_trains_alone(args, settings)
    _warn_if_hf_runs_alone(args, settings)
    if not args.quiet and _on_terminal():
        _warn(_start_line(args, settings, command), quiet=False)
    report = run_elastic(settings, entrypoint, command, "spawn", PROG)
    if report is None:
        return 0
    console(stderr=True).print(Text(report.text))
    return report.exit_code


def _test(argv: list[str]) -> int:
    """``accel-run test [launch options]``: the bundled self-test on the resolved config."""
    from accelify.runtime.launch.run import SELFTEST

    parser = launch_parser()
    parser.usage = f"{PROG} test [launch options]"
    parser.description = (
        "Train the bundled self-test for a few steps on the launch the options (and the config\n"
        "file) resolve to, and report whether every process agreed: a check of the machine\n"
        "before a real job."
    )
    parser.epilog = None
    for action in parser._actions:  # the self-test is the script
        if action.dest == "script":
            action.help = argparse.SUPPRESS
    args = parser.parse_args([*argv, SELFTEST])
    if args.script != SELFTEST or args.module or args.no_python:
        raise UsageError("accel-run test takes launch options only, not a script")
    return _run(args)


def _config(argv: list[str]) -> int:
    from accelify.runtime.launch.config_wizard import write_config

    if argv[:1] == ["default"]:  # accelerate's spelling of --default
        argv = ["--default", *argv[1:]]
    args = config_parser().parse_args(argv)
    path = Path(args.config_file) if args.config_file else cfg.default_config_path()
    flags = flag_values(args)
    written = write_config(path, flags, interactive=not args.default, force=args.force)
    print(f"accel-run: wrote {written}")
    return 0


def _env(argv: list[str]) -> int:
    from accelify.runtime.launch.env_report import report

    args = env_parser().parse_args(argv)
    text, ok = report(args.config_file)
    print(text)
    return 0 if ok else 2


# ``launch`` too: `accelerate launch ...` command lines work with only the program name changed.
_COMMANDS = {"launch": _launch, "test": _test, "config": _config, "env": _env}


def main(argv: list[str] | None = None) -> NoReturn:
    """Entry point of ``accel-run``; always leaves through ``sys.exit`` with the exit code."""
    argv = sys.argv[1:] if argv is None else argv
    command = _COMMANDS.get(argv[0]) if argv else None
    rest = argv[1:] if command else argv
    command = command or _launch
    try:
        code = command(rest)
    except (UsageError, cfg.ConfigError) as err:
        console(stderr=True).print(f"[bold red]{PROG}: error:[/] {escape(str(err))}")
        code = 2
    except KeyboardInterrupt:
        console(stderr=True).print(Text(f"{PROG}: interrupted"))
        code = 130
    except ModuleNotFoundError as err:  # a launch from the light install (no runtime extra)
        if err.name != "torch":
            raise
        console(stderr=True).print(f"[bold red]{PROG}: error:[/] {escape(NEEDS_TORCH)}")
        code = 2
    sys.exit(code)
