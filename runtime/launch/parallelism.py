"""accel-run's ``parallelism_config`` section, ``--use-parallelism-config`` and its size flags.

Keys, flags and variables are accelerate's (``commands/launch.py``, ``utils/launch.py``): the
workers get ``ACCELERATE_USE_PARALLELISM_CONFIG=true`` and every ``PARALLELISM_CONFIG_*`` size,
which ``ParallelismConfig()`` reads in HF's runtime and in accelify's alike. Flags override the
section key by key, and a non-empty section turns it on as ``--use-parallelism-config`` does.
Before anything starts the sizes are checked by the runtime's own ``ParallelismConfig`` and
against the process count and backend, so a bad combination stops the launch with the message
each worker would give.

accelerate launch takes the option only with ``--use-fsdp --fsdp-version 2``; accel-run also
launches tensor and data parallelism without FSDP, which HF's runtime runs when a script passes
the same config, and refuses FSDP1 with it as accelerate does.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from accelify.runtime.launch import backends
from accelify.runtime.launch import config as cfg
from accelify.runtime.launch.backends import Key
from accelify.runtime.parallelism import (
    ENV_PREFIX,
    USE_ENV,
    ParallelismConfig,
    check_processes,
)

SECTION = "parallelism_config"
_PREFIX = "parallelism_config_"
_FIELDS = (  # ParallelismConfig's field, its parser, accelerate launch's default, the help
    (
        "dp_replicate_size",
        cfg.positive_int,
        "1",
        "copies of the model, each on its own batches (DDP; HSDP with dp-shard-size)",
    ),
    (
        "dp_shard_size",
        cfg.positive_int,
        "1",
        "processes FSDP2 shards each copy over (with --use-fsdp --fsdp-version 2)",
    ),
    ("tp_size", cfg.positive_int, "1", "processes each tensor-parallelised layer is split over"),
    ("cp_size", cfg.positive_int, "1", "context parallelism: only 1 (not supported)"),
    ("cp_backend", cfg.choice("torch", lower=True), "torch", "torch"),
    ("sp_size", cfg.positive_int, "1", "sequence parallelism: only 1 (not supported)"),
    ("sp_backend", cfg.choice("deepspeed", lower=True), "deepspeed", "deepspeed"),
)
KEYS: dict[str, Key] = {
    f"{_PREFIX}{name}": Key(parse, f"{ENV_PREFIX}{name.upper()}", help_text, default)
    for name, parse, default, help_text in _FIELDS
}


@dataclass(frozen=True)
class Parallelism:
    """A parsed ``parallelism_config`` section (or its flags): what the workers get."""

    values: Mapping[str, Any] = field(default_factory=dict)

    def fields(self) -> dict[str, Any]:
        """``ParallelismConfig``'s arguments, every one given (defaults filled in)."""
        return {
            key.removeprefix(_PREFIX): self.values.get(key, spec.parse(spec.default))
            for key, spec in KEYS.items()
        }

    def env(self) -> dict[str, str]:
        env = {USE_ENV: "true"}
        for key, value in self.fields().items():
            env[KEYS[_PREFIX + key].variable] = str(value)
        return env


cfg.SECTIONS[SECTION] = lambda values: Parallelism(backends.parse_keys(KEYS, values))


def _flag(key: str) -> str:
    return f"--{key.replace('_', '-')}"


def add_flags(parser: argparse.ArgumentParser) -> None:
    """``--use-parallelism-config`` and one flag per section key, in accelerate's two spellings."""
    group = parser.add_argument_group("N-D parallelism (keys of parallelism_config)")
    group.add_argument(
        "--use-parallelism-config",
        "--use_parallelism_config",
        dest="use_parallelism_config",
        action="store_true",
        help="split the processes by the sizes below (ParallelismConfig's variables)",
    )
    for key, spec in KEYS.items():
        group.add_argument(_flag(key), f"--{key}", dest=key, metavar="VALUE", help=spec.help)


def apply(settings: cfg.Settings, args: argparse.Namespace) -> cfg.Settings:
    """Merge the flags into the section, turn it on or drop it, and check the sizes."""
    section = settings.sections.get(SECTION)
    given = {key: getattr(args, key) for key in KEYS if getattr(args, key, None) is not None}
    if not (getattr(args, "use_parallelism_config", False) or (section and section.values)):
        if given:
            raise cfg.ConfigError(
                f"{_flag(next(iter(given)))} needs --use-parallelism-config (or a {SECTION} "
                "section)"
            )
        others = {k: v for k, v in settings.sections.items() if k != SECTION}
        return replace(settings, sections=others)
    try:
        flags = backends.parse_keys(KEYS, given, flags=True)
    except ValueError as err:
        raise cfg.ConfigError(str(err)) from None
    merged = Parallelism({**(section.values if section else {}), **flags})
    _check(settings, merged)
    return replace(settings, sections={**settings.sections, SECTION: merged})


def _check(settings: cfg.Settings, chosen: Parallelism) -> None:
    kind = settings.resolved_distributed_type
    fsdp = settings.sections.get(backends.SECTION_OF["FSDP"])
    default = backends.FSDP_KEYS["fsdp_version"].default
    if kind == "FSDP" and fsdp is not None and fsdp.values.get("fsdp_version", default) != "2":
        raise cfg.ConfigError(
            "--use-parallelism-config with FSDP needs --fsdp-version 2 (fsdp_version: 2), as "
            "accelerate launch does"
        )
    try:
        config = ParallelismConfig(**chosen.fields())
        check_processes(config, settings.num_processes or 1, kind)
    except ValueError as err:
        raise cfg.ConfigError(f"{SECTION}: {err}") from None
