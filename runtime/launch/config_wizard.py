"""``accel-run config``: write an accelerate-format config file, by defaults or by a few questions.

Only what a single-machine user has to decide is asked (CPU or GPU, how many processes, mixed
precision); several machines are a matter of flags or editing the YAML, as the file is plain.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from rich.prompt import Confirm, Prompt

from accelify.runtime.launch import config as cfg
from accelify.runtime.launch.terminal import console


def write_config(path: Path, flags: dict[str, Any], interactive: bool, force: bool) -> Path:
    """Write the config to ``path``; refuses to overwrite unless ``force``."""
    if path.exists() and not force:
        raise cfg.ConfigError(f"{path}:0: already exists; pass --force to overwrite it")
    gpus = cfg.gpu_count()
    values = {"use_cpu": gpus == 0, "num_processes": max(gpus, 1), **flags}
    if interactive:
        values.update(_ask(values))
    settings = cfg.resolve({}, values, lambda: gpus)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(cfg.to_file_dict(settings), sort_keys=False), encoding="utf-8")
    return path


def _ask(defaults: dict[str, Any]) -> dict[str, Any]:
    out = console()
    try:
        use_cpu = Confirm.ask("Run on CPU only?", default=defaults["use_cpu"], console=out)
        processes = _ask_until_valid(
            "How many processes in total?", str(defaults["num_processes"]), cfg.positive_int, out
        )
        precision = Prompt.ask(
            "Mixed precision?",
            choices=list(cfg.MIXED_PRECISIONS),
            default=defaults.get("mixed_precision", "no"),
            console=out,
        )
    except EOFError:
        print()  # end the unanswered prompt's line
        raise cfg.ConfigError(
            "no answer on standard input; use `accel-run config --default` in scripts"
        ) from None
    return {"use_cpu": use_cpu, "num_processes": processes, "mixed_precision": precision}


def _ask_until_valid(
    question: str, default: str, parse: Callable[[object], Any], out: Console
) -> Any:
    while True:
        try:
            return parse(Prompt.ask(question, default=default, console=out))
        except ValueError as err:
            print(f"  {err}")
