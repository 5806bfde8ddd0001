"""accel-run's command line: parse, merge the config, hand over to :mod:`.run`.

argparse rather than typer/click: accelerate's ``launch`` is argparse with the script as the first
positional and ``REMAINDER`` after it, and reusing that exact shape is what makes every
``accelerate launch`` command line mean the same here (everything after the script is the
script's, even ``--num_processes``).
"""

from __future__ import annotations

import argparse
import sys
from importlib.metadata import version
from pathlib import Path
from typing import Any, NoReturn

from rich.console import Console
from rich.markup import escape
from rich.text import Text

from accelify.runtime.launch import backends
from accelify.runtime.launch import config as cfg

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
  accel-run config --default                     write the default config file
  accel-run env                                  versions, devices and the resolved config

Everything after the script (or -m module) is passed to it unchanged. Settings are merged as
defaults < config file < flags; the config file is --config-file, else accelerate's default
($HF_HOME/accelerate/default_config.yaml) when it exists.

exit codes: 0 all workers succeeded; the first failing worker's code (128+N when killed by
signal N); 2 a usage or config error.
"""
# Settings fields that have a flag taking a value: (field, metavar, help).
_VALUE_FLAGS = (
    ("num_processes", "N", "processes in total over all machines (default: one per GPU, else 1)"),
    ("num_machines", "N", "machines taking part (default: 1)"),
    ("machine_rank", "R", "this machine's rank, 0 to num_machines-1 (default: 0)"),
    ("main_process_ip", "ADDR", "address of machine 0 (needed with several machines)"),
    ("main_process_port", "PORT", "port on machine 0; 0 or absent picks a free one"),
    ("mixed_precision", "{no,fp16,bf16}", "mixed precision for the Accelerator (default: no)"),
    ("gradient_accumulation_steps", "N", "gradient accumulation steps for the Accelerator"),
    ("gpu_ids", "IDS", "GPUs to use, like 0,1 (sets CUDA_VISIBLE_DEVICES; default: all)"),
    ("rdzv_backend", "{static,c10d}", "rendezvous backend with several machines"),
    ("max_restarts", "N", "restart all workers up to N times after a failure (default: 0)"),
    ("monitor_interval", "SECONDS", "how often the agent checks the workers (default: 0.1)"),
)
# Settings fields set by a flag without a value: (flag, field, help).
_SWITCHES = (
    ("cpu", "use_cpu", "run on CPU only (gloo), even where GPUs exist"),
    ("same_network", "same_network", "accepted for accelerate compatibility (no effect)"),
    ("debug", "debug", "show the elastic agent's log and set ACCELERATE_DEBUG_MODE"),
)


class UsageError(Exception):
    """A bad command line; reported in one line with exit code 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def _console() -> Console:
    """Styled on a terminal, plain text in a pipe (rich decides); never re-wrapped."""
    return Console(stderr=True, highlight=False, soft_wrap=True)


def _flag(name: str) -> list[str]:
    dashed = "--" + name.replace("_", "-")
    return [dashed, "--" + name] if "_" in name else [dashed]


def launch_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=PROG,
        usage="%(prog)s [OPTIONS] script.py [script args...]\n"
        "       %(prog)s [OPTIONS] -m module [module args...]\n"
        "       %(prog)s {config,env} ...",
        description="Launch a training script on N processes and M machines, on torch's elastic\n"
        "agent, with the environment HF Accelerate's launcher gives its scripts.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {version('accelify')}")
    parser.add_argument(*_flag("config_file"), metavar="PATH", help="accelerate-style YAML config")
    for name, metavar, help_text in _VALUE_FLAGS:
        parser.add_argument(*_flag(name), dest=name, metavar=metavar, help=help_text)
    for flag, name, help_text in _SWITCHES:
        parser.add_argument(
            *_flag(flag), dest=name, action="store_true", default=None, help=help_text
        )
    parser.add_argument(
        *_flag("multi_gpu"),
        dest="distributed_type",
        action="store_const",
        const="MULTI_GPU",
        help="accepted for accelerate compatibility (several processes imply it)",
    )
    backends.add_flags(parser)
    parser.add_argument(
        "-m", "--module", action="store_true", help="the target is a module name, as in python -m"
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
        formatter_class=argparse.RawDescriptionHelpFormatter,
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
    return values


def _launch(argv: list[str]) -> int:
    from accelify.runtime.launch.run import BOOTSTRAP, run_elastic

    args = launch_parser().parse_args(argv)
    if args.script is None:
        raise UsageError("no script to run; see accel-run --help")
    if args.module:
        command = ["-m", args.script, *args.script_args]
    elif Path(args.script).is_file():
        command = [args.script, *args.script_args]
    else:
        raise UsageError(f"{args.script}:0: no such script")
    settings = cfg.load_settings(args.config_file, flag_values(args))
    settings = backends.apply(settings, args)
    report = run_elastic(settings, sys.executable, [BOOTSTRAP, *command], "spawn", PROG)
    if report is None:
        return 0
    _console().print(Text(report.text))
    return report.exit_code


def _config(argv: list[str]) -> int:
    from accelify.runtime.launch.config_wizard import write_config

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


_COMMANDS = {"config": _config, "env": _env}


def main(argv: list[str] | None = None) -> NoReturn:
    """Entry point of ``accel-run``; always leaves through ``sys.exit`` with the exit code."""
    argv = sys.argv[1:] if argv is None else argv
    command = _COMMANDS.get(argv[0], _launch) if argv else _launch
    rest = argv[1:] if command is not _launch else argv
    try:
        code = command(rest)
    except (UsageError, cfg.ConfigError) as err:
        _console().print(f"[bold red]{PROG}: error:[/] {escape(str(err))}")
        code = 2
    except KeyboardInterrupt:
        _console().print(Text(f"{PROG}: interrupted"))
        code = 130
    sys.exit(code)
