"""accel-run's sharded backends: ``deepspeed_config``/``fsdp_config`` sections and their flags.

Keys, flags and the variables handed to the workers are accelerate's (``commands/launch.py``,
``utils/launch.py``), so an accelerate config or command line means the same here. Flags override
the YAML section key by key; a flag of one backend without that backend selected, both backends at
once, or a DeepSpeed JSON file contradicting a launch option are refused before anything starts.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

from accelify.runtime import deepspeed_config as dsc
from accelify.runtime.launch import config as cfg


def _fsdp_sharding(value: object) -> str:
    text = str(value).strip().upper()
    if text not in _SHARDING:
        raise ValueError(f"must be one of {', '.join(_SHARDING)} (or 1-5), got {value!r}")
    return text


def _never(value: object) -> bool:
    if cfg.boolean(value):
        raise ValueError("true is not supported by accel-run (FSDP2 without it)")
    return False


_SHARDING = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "HYBRID_SHARD_ZERO2")
_SHARDING += tuple(str(i) for i in range(1, 6))

# accelerate's ways of starting a multi-machine DeepSpeed run. accel-run is "standard": one
# elastic agent per machine, each started there; the others start every machine from one (ssh, MPI).
STANDARD_LAUNCHER = "standard"
MULTINODE_LAUNCHERS = (STANDARD_LAUNCHER, "pdsh", "openmpi", "mvapich", "mpich", "nossh", "slurm")


class Key(NamedTuple):
    """One key of a backend section, which is also an accel-run flag."""

    parse: Callable[[object], Any]
    variable: str | None  # what accelerate's launcher sets for the workers; None: launcher only
    help: str
    default: str | None = None  # what accelerate's launcher sets when the key is not given


_FSDP1_ONLY = "FSDP1 tuning that FSDP2 does by itself: accepted so existing configs load"
_SSH_ONLY = "read by accelerate's ssh/MPI launchers only: accepted so their configs load"
_HF_ONLY = "passed to HF Accelerate's runtime; accelify.runtime does not read it"
# The launch options the runtime also reads (``deepspeed_config.OPTION_ENV``), with their help.
_DS_OPTION_HELP = {
    "zero_stage": "0-3: shard optimizer states (1), + gradients (2), + parameters (3)",
    "offload_optimizer_device": (
        "none|cpu|nvme: where optimizer states live and are stepped (cpu: DeepSpeed's CPU Adam)"
    ),
    "offload_param_device": "none|cpu|nvme: where ZeRO-3 keeps the parameters between uses",
    "gradient_clipping": "max gradient norm the engine clips to (unset: no clipping)",
    "gradient_accumulation_steps": "micro-batches per optimizer step",
    "zero3_save_16bit_model": "true|false: save_model gathers ZeRO-3's 16-bit weights",
}


def _ds_option(name: str) -> Callable[[object], Any]:
    return lambda value: dsc.parse_option(name, value)


DEEPSPEED_KEYS: dict[str, Key] = {
    **{
        name: Key(_ds_option(name), dsc.OPTION_ENV[name], help)
        for name, help in _DS_OPTION_HELP.items()
    },
    "deepspeed_config_file": Key(
        cfg.text,
        dsc.CONFIG_FILE_ENV,
        'a DeepSpeed JSON config; its "auto" values are filled from the script and these flags',
    ),
    "zero3_init_flag": Key(
        cfg.boolean,
        "ACCELERATE_DEEPSPEED_ZERO3_INIT",
        "true|false: transformers builds ZeRO-3 models already partitioned",
    ),
    "deepspeed_multinode_launcher": Key(
        cfg.choice(*MULTINODE_LAUNCHERS, lower=True),
        None,
        "standard: one agent per machine, as accel-run runs; the others are refused on 2+ machines",
    ),
    "offload_optimizer_nvme_path": Key(
        cfg.text,
        "ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_NVME_PATH",
        f"NVMe offload folder; {_HF_ONLY}",
    ),
    "offload_param_nvme_path": Key(
        cfg.text, "ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_NVME_PATH", f"NVMe offload folder; {_HF_ONLY}"
    ),
    "deepspeed_moe_layer_cls_names": Key(
        cfg.text,
        "ACCELERATE_DEEPSPEED_MOE_LAYER_CLS_NAMES",
        f"MoE layer classes ZeRO-3 keeps whole, comma-separated; {_HF_ONLY}",
    ),
    "deepspeed_hostfile": Key(cfg.text, None, _SSH_ONLY),
    "deepspeed_inclusion_filter": Key(cfg.text, None, _SSH_ONLY),
    "deepspeed_exclusion_filter": Key(cfg.text, None, _SSH_ONLY),
}
FSDP_KEYS: dict[str, Key] = {
    "fsdp_version": Key(
        cfg.choice("1", "2"), "FSDP_VERSION", "1|2: accelify.runtime runs both on FSDP2", "1"
    ),
    "fsdp_sharding_strategy": Key(
        _fsdp_sharding,
        "FSDP_SHARDING_STRATEGY",
        "FULL_SHARD|SHARD_GRAD_OP|NO_SHARD|HYBRID_SHARD|HYBRID_SHARD_ZERO2 (or 1-5)",
        "FULL_SHARD",
    ),
    "fsdp_reshard_after_forward": Key(
        cfg.boolean,
        "FSDP_RESHARD_AFTER_FORWARD",
        "true|false: free gathered parameters after the forward (FSDP2's way to say FULL_SHARD)",
        "true",
    ),
    "fsdp_auto_wrap_policy": Key(
        cfg.choice("TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP", "NO_WRAP"),
        "FSDP_AUTO_WRAP_POLICY",
        "TRANSFORMER_BASED_WRAP|SIZE_BASED_WRAP|NO_WRAP: which submodules are sharded apart",
    ),
    "fsdp_transformer_layer_cls_to_wrap": Key(
        cfg.text, "FSDP_TRANSFORMER_CLS_TO_WRAP", "layer class names, comma-separated (GPT2Block)"
    ),
    "fsdp_min_num_params": Key(
        cfg.non_negative_int,
        "FSDP_MIN_NUM_PARAMS",
        "SIZE_BASED_WRAP: shard apart submodules with at least this many parameters",
        "100000000",
    ),
    "fsdp_offload_params": Key(
        cfg.boolean,
        "FSDP_OFFLOAD_PARAMS",
        "true|false: keep parameters on the CPU (CUDA runs)",
        "false",
    ),
    "fsdp_state_dict_type": Key(
        cfg.choice("FULL_STATE_DICT", "SHARDED_STATE_DICT"),
        "FSDP_STATE_DICT_TYPE",
        "FULL_STATE_DICT|SHARDED_STATE_DICT: one file, or a distributed checkpoint per process",
    ),
    "fsdp_backward_prefetch": Key(cfg.text, "FSDP_BACKWARD_PREFETCH", _FSDP1_ONLY),
    # An old spelling accelerate's launcher reads no more (it sets no variable for it).
    "fsdp_backward_prefetch_policy": Key(cfg.text, None, _FSDP1_ONLY),
    "fsdp_forward_prefetch": Key(cfg.boolean, "FSDP_FORWARD_PREFETCH", _FSDP1_ONLY, "false"),
    "fsdp_use_orig_params": Key(cfg.boolean, "FSDP_USE_ORIG_PARAMS", _FSDP1_ONLY, "true"),
    "fsdp_sync_module_states": Key(cfg.boolean, "FSDP_SYNC_MODULE_STATES", _FSDP1_ONLY, "true"),
    "fsdp_cpu_ram_efficient_loading": Key(
        cfg.boolean, "FSDP_CPU_RAM_EFFICIENT_LOADING", _FSDP1_ONLY, "true"
    ),
    "fsdp_activation_checkpointing": Key(
        _never, "FSDP_ACTIVATION_CHECKPOINTING", "only false: not supported by accel-run", "false"
    ),
    "fsdp_activation_checkpointing_offload": Key(
        _never,
        "FSDP_ACTIVATION_CHECKPOINTING_OFFLOAD",
        "only false: not supported by accel-run",
        "false",
    ),
}


@dataclass(frozen=True)
class Backend:
    """A parsed ``deepspeed_config`` or ``fsdp_config`` section: what the workers get."""

    kind: str  # DEEPSPEED or FSDP
    values: Mapping[str, Any] = field(default_factory=dict)
    use_cpu: bool = False
    # Settings the config file gave (section keys, mixed_precision): HF's DeepSpeed plugin
    # refuses them beside a deepspeed_config_file (ACCELERATE_CONFIG_DS_FIELDS).
    from_file: tuple[str, ...] = ()

    def env(self) -> dict[str, str]:
        keys = DEEPSPEED_KEYS if self.kind == "DEEPSPEED" else FSDP_KEYS
        env = {key.variable: key.default for key in keys.values() if key.default is not None}
        for key, value in self.values.items():
            variable = keys[key].variable
            if variable is not None:
                env[variable] = str(value).lower() if isinstance(value, bool) else str(value)
        if self.kind == "FSDP":
            return {"ACCELERATE_USE_FSDP": "true", **env}
        env["ACCELERATE_USE_DEEPSPEED"] = "true"
        env["ACCELERATE_CONFIG_DS_FIELDS"] = ",".join(self.from_file)
        if self.use_cpu:
            env["DS_ACCELERATOR"] = "cpu"  # else deepspeed looks for an accelerator it may find
        return env


def parse_keys(keys: Mapping[str, Key], values: object, flags: bool = False) -> dict[str, Any]:
    """Validate a section (or the flags for one); errors name the key (or the flag)."""
    if not isinstance(values, Mapping):
        raise ValueError("must be a mapping of key: value")
    parsed = {}
    for key, value in values.items():
        where = f"--{key.replace('_', '-')}" if flags else key
        if key not in keys:
            raise ValueError(f"{key}: {cfg.unknown_key(key, keys)}")
        if value is None:
            continue
        try:
            parsed[key] = keys[key].parse(value)
        except ValueError as err:
            raise ValueError(f"{where}: {err}") from None
    return parsed


def _parse(kind: str, keys: Mapping[str, Key], values: object, flags: bool = False) -> Backend:
    return Backend(kind, parse_keys(keys, values, flags))


SECTION_OF = {"DEEPSPEED": "deepspeed_config", "FSDP": "fsdp_config"}
# Section keys whose flag is accel-run's own, for every backend (checked against the section).
SHARED_FLAGS = frozenset({"gradient_accumulation_steps"})
cfg.SECTIONS["deepspeed_config"] = lambda values: _parse("DEEPSPEED", DEEPSPEED_KEYS, values)
cfg.SECTIONS["fsdp_config"] = lambda values: _parse("FSDP", FSDP_KEYS, values)


def add_flags(parser: argparse.ArgumentParser) -> None:
    """``--use-deepspeed``, ``--use-fsdp`` and one flag per section key (accelerate's names)."""
    group = parser.add_argument_group("sharded backends (keys of deepspeed_config/fsdp_config)")
    for kind in SECTION_OF:
        name = f"use_{kind.lower()}"
        group.add_argument(
            f"--{name.replace('_', '-')}", f"--{name}", dest=name, action="store_true",
            help=f"train with {'DeepSpeed' if kind == 'DEEPSPEED' else 'FSDP2'}",
        )  # fmt: skip
    for key, spec in [*DEEPSPEED_KEYS.items(), *FSDP_KEYS.items()]:
        if key in SHARED_FLAGS:
            continue
        flag = f"--{key.replace('_', '-')}"
        group.add_argument(flag, f"--{key}", dest=key, metavar="VALUE", help=spec.help)


def apply(settings: cfg.Settings, args: argparse.Namespace) -> cfg.Settings:
    """Merge the backend flags into ``settings`` and check the combination."""
    chosen = [kind for kind in SECTION_OF if getattr(args, f"use_{kind.lower()}", False)]
    if len(chosen) > 1:
        raise cfg.ConfigError("--use-deepspeed and --use-fsdp exclude each other; pick one")
    kind = chosen[0] if chosen else settings.distributed_type
    active = SECTION_OF.get(kind or "")
    flags = {}
    for section, keys in (("deepspeed_config", DEEPSPEED_KEYS), ("fsdp_config", FSDP_KEYS)):
        given = {k: getattr(args, k) for k in keys if k not in SHARED_FLAGS}
        given = {k: v for k, v in given.items() if v is not None}
        if given and section != active:
            flag = f"--{next(iter(given)).replace('_', '-')}"
            backend = "--use-deepspeed" if section == "deepspeed_config" else "--use-fsdp"
            raise cfg.ConfigError(f"{flag} needs {backend} (or its distributed_type)")
        if given:
            try:
                flags = parse_keys(keys, given, flags=True)
            except ValueError as err:
                raise cfg.ConfigError(str(err)) from None
    others = {k: v for k, v in settings.sections.items() if k not in SECTION_OF.values()}
    if active is None:
        return replace(settings, sections=others)
    base = settings.sections.get(active) or Backend(kind)
    from_file = tuple(base.values)
    if "mixed_precision" in settings.from_file:
        from_file += ("mixed_precision",)
    merged = Backend(kind, {**base.values, **flags}, settings.use_cpu, from_file)
    backend = _checked(settings, merged)
    return replace(settings, distributed_type=kind, sections={**others, active: backend})


def _checked(settings: cfg.Settings, backend: Backend) -> Backend:
    """Refuse what would fail in every worker: conflicting values, files that do not exist."""
    values = backend.values
    steps = values.get("gradient_accumulation_steps")
    flag_steps = settings.gradient_accumulation_steps
    if steps is not None and flag_steps is not None and steps != flag_steps:
        raise cfg.ConfigError(
            f"gradient_accumulation_steps is {steps} in deepspeed_config but "
            f"--gradient-accumulation-steps is {flag_steps}"
        )
    launcher = values.get("deepspeed_multinode_launcher", STANDARD_LAUNCHER)
    if settings.num_machines > 1 and launcher != STANDARD_LAUNCHER:
        raise cfg.ConfigError(
            f"deepspeed_multinode_launcher is {launcher}, which starts every machine from this "
            "one; accel-run starts one agent per machine: run it on each machine with its "
            f"--machine-rank, and set deepspeed_multinode_launcher: {STANDARD_LAUNCHER}"
        )
    path = values.get("deepspeed_config_file")
    if backend.kind != "DEEPSPEED" or path is None:
        return backend
    options = {k: v for k, v in values.items() if k in dsc.OPTION_KEYS}
    if flag_steps is not None:
        options["gradient_accumulation_steps"] = flag_steps
    try:
        dsc.merge_options(dsc.read_file(path), options, path)
    except ValueError as err:
        raise cfg.ConfigError(str(err)) from None
    # Workers may start elsewhere (cwd of a module run): give them the absolute path.
    return replace(backend, values={**values, "deepspeed_config_file": os.path.abspath(path)})
