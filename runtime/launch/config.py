"""accel-run settings: accelerate's YAML config schema, defaults, flags over file, children's env.

Every setting is validated by one parser whether it comes from the YAML file or from a flag, so
both give the same message. A later backend (DeepSpeed, FSDP) registers its ``*_config`` section
parser in :data:`SECTIONS` (its :class:`Section` brings its children's env) and its name in
:data:`DISTRIBUTED_TYPES`; its ``--use-*`` flag sets ``distributed_type`` in cli.py.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Protocol

import yaml

from accelify.runtime.launch.bootstrap import TIMEOUT_ENV

DEFAULT_PORT = 29500
MIXED_PRECISIONS = ("no", "fp16", "bf16")
# The distributed types accel-run can launch (backends.py registers the sharded ones' sections).
DISTRIBUTED_TYPES = ("NO", "MULTI_CPU", "MULTI_GPU", "DEEPSPEED", "FSDP")
SHARDED_TYPES = ("DEEPSPEED", "FSDP")
# torch.compile backends HF Accelerate's launcher accepts (``accelerate.utils.DynamoBackend``).
DYNAMO_BACKENDS = (
    "NO", "EAGER", "AOT_EAGER", "INDUCTOR", "AOT_TS_NVFUSER", "NVPRIMS_NVFUSER", "CUDAGRAPHS",
    "OFI", "FX2TRT", "ONNXRT", "TENSORRT", "AOT_TORCHXLA_TRACE_ONCE", "TORCHXLA_TRACE_ONCE", "TVM",
    "HPU_BACKEND", "NEURON",
)  # fmt: skip
# Settings HF Accelerate's launcher hands to the Accelerator as ``ACCELERATE_DYNAMO_*``.
DYNAMO_KEYS = (
    "dynamo_backend",
    "dynamo_mode",
    "dynamo_use_fullgraph",
    "dynamo_use_dynamic",
    "dynamo_use_regional_compilation",
)


class ConfigError(ValueError):
    """A bad setting or config file; ``str()`` is the one-line report (exit code 2 in the CLI)."""


def default_config_path() -> Path:
    """Where accelerate keeps its default config: ``$HF_HOME/accelerate/default_config.yaml``.

    Same rule as ``accelerate.commands.config.config_args``: ``HF_HOME`` wins, else
    ``$XDG_CACHE_HOME/huggingface``, else ``~/.cache/huggingface``; so both tools share one file.
    """
    cache = os.environ.get("XDG_CACHE_HOME", "~/.cache")
    home = os.environ.get("HF_HOME", os.path.join(cache, "huggingface"))
    return Path(os.path.expanduser(home)) / "accelerate" / "default_config.yaml"


# --- value parsers: the same ones read YAML values and flag strings -------------------------------


def _integer(value: object, minimum: int, what: str) -> int:
    text = str(value).strip()
    if isinstance(value, bool) or not re.fullmatch(r"[+-]?\d+", text) or int(text) < minimum:
        raise ValueError(f"must be {what}, got {value!r}")
    return int(text)


def positive_int(value: object) -> int:
    return _integer(value, 1, "a positive integer")


def non_negative_int(value: object) -> int:
    return _integer(value, 0, "an integer >= 0")


def port(value: object) -> int:
    number = _integer(value, 0, "a port number (0 picks a free one)")
    if number > 65535:
        raise ValueError(f"must be a port number (0 picks a free one), got {value!r}")
    return number


def positive_float(value: object) -> float:
    try:
        number = float(str(value))
    except ValueError:
        number = -1.0
    if isinstance(value, bool) or not number > 0:
        raise ValueError(f"must be a positive number of seconds, got {value!r}")
    return number


def boolean(value: object) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "yes", "1"):
        return True
    if text in ("false", "no", "0"):
        return False
    raise ValueError(f"must be true or false, got {value!r}")


def dynamo_backend(value: object) -> str:
    """accelerate's spelling: upper case, and ``no`` (or YAML's ``false``) for off."""
    picked = "NO" if value is False else str(value).strip().upper()
    if picked not in DYNAMO_BACKENDS:
        raise ValueError(f"must be one of {', '.join(DYNAMO_BACKENDS)}, got {value!r}")
    return picked


def text(value: object) -> str:
    if not isinstance(value, str | int) or isinstance(value, bool) or not str(value).strip():
        raise ValueError(f"must be a non-empty string, got {value!r}")
    return str(value).strip()


def gpu_ids(value: object) -> str:
    ids = str(value).replace(" ", "")
    if ids != "all" and not re.fullmatch(r"\d+(,\d+)*", ids):
        raise ValueError(f"must be 'all' or a comma-separated list like 0,1, got {value!r}")
    return ids


def tee(value: object) -> str:
    """torchrun's ``--tee``: 0-3 (none, stdout, stderr, both) for all ranks, or ``rank:n,...``."""
    spec = str(value).replace(" ", "")
    if not re.fullmatch(r"[0-3]|\d+:[0-3](,\d+:[0-3])*", spec):
        raise ValueError(f"must be 0-3 or rank:0-3 pairs like 0:3,1:2, got {value!r}")
    return spec


def key_values(value: object) -> dict[str, str]:
    """torchrun's ``--rdzv-conf``: ``key=value,key=value``."""
    pairs = [part for part in str(value).split(",") if part.strip()]
    if not all(re.fullmatch(r"\s*\w+\s*=[^=]*", part) for part in pairs):
        raise ValueError(
            f"must be key=value pairs like join_timeout=600,timeout=900, got {value!r}"
        )
    return {key.strip(): text.strip() for key, text in (part.split("=") for part in pairs)}


def choice(*allowed: str, lower: bool = False) -> Callable[[object], str]:
    def parse(value: object) -> str:
        picked = str(value).strip()
        picked = picked.lower() if lower else picked.upper()
        if picked not in allowed:
            raise ValueError(f"must be one of {', '.join(allowed)}, got {value!r}")
        return picked

    return parse


@dataclass(frozen=True)
class Settings:
    """Everything a launch needs, after defaults, file and flags are merged."""

    compute_environment: str = "LOCAL_MACHINE"
    distributed_type: str | None = None  # None: derived from the process count and use_cpu
    mixed_precision: str = "no"
    use_cpu: bool = False
    num_processes: int | None = None  # total over all machines, as in accelerate
    num_machines: int = 1
    machine_rank: int = 0
    main_process_ip: str | None = None
    main_process_port: int | None = None  # None or 0: a free port (single machine only)
    gpu_ids: str | None = None
    rdzv_backend: str = "static"
    # Accepted for compatibility: accelerate's two multi-machine paths give the agent the same
    # static endpoint, so accel-run needs no switch for it.
    same_network: bool = False
    debug: bool = False
    enable_cpu_affinity: bool = False  # ACCELERATE_CPU_AFFINITY: HF Accelerate pins CUDA ranks
    dynamo_backend: str = "NO"  # ACCELERATE_DYNAMO_*: torch.compile in HF Accelerate's prepare
    dynamo_mode: str = "default"
    dynamo_use_fullgraph: bool = False
    dynamo_use_dynamic: bool = False
    dynamo_use_regional_compilation: bool = False
    # Flag-only settings (accelerate's config file has no place for them).
    gradient_accumulation_steps: int | None = None
    num_cpu_threads_per_process: int | None = None  # OMP_NUM_THREADS of each worker
    nproc_per_node: int | None = None  # torchrun's count, per machine: sets num_processes
    max_restarts: int = 0
    monitor_interval: float = 0.1
    timeout: float | None = None  # ACCELIFY_TIMEOUT: the runtime's process-group timeout, seconds
    # The elastic agent's own options, as torchrun (and accelerate launch) spell them.
    tee: str = "0"
    log_dir: str | None = None  # None: a temporary folder, removed after the run
    role: str = "default"
    rdzv_conf: Mapping[str, str] = field(default_factory=dict)
    # Backend sections (``deepspeed_config``, ``fsdp_config``), parsed by backends.py.
    sections: Mapping[str, Section] = field(default_factory=dict)
    # The settings whose value came from the config file (HF's DeepSpeed checks ask).
    from_file: frozenset[str] = frozenset()

    @property
    def processes_per_machine(self) -> int:
        return (self.num_processes or 1) // self.num_machines

    @property
    def resolved_distributed_type(self) -> str:
        """NO/MULTI_CPU/MULTI_GPU follow the process count, as the flags may override the file."""
        if self.distributed_type not in (None, "NO", "MULTI_CPU", "MULTI_GPU"):
            return self.distributed_type
        if (self.num_processes or 1) == 1:
            return "NO"
        return "MULTI_CPU" if self.use_cpu else "MULTI_GPU"


PARSERS: dict[str, Callable[[object], Any]] = {
    "compute_environment": choice("LOCAL_MACHINE"),
    "distributed_type": choice(*DISTRIBUTED_TYPES),
    "mixed_precision": choice(*MIXED_PRECISIONS, lower=True),
    "use_cpu": boolean,
    "num_processes": positive_int,
    "num_machines": positive_int,
    "machine_rank": non_negative_int,
    "main_process_ip": text,
    "main_process_port": port,
    "gpu_ids": gpu_ids,
    "rdzv_backend": choice("static", "c10d", lower=True),
    "same_network": boolean,
    "debug": boolean,
    "enable_cpu_affinity": boolean,
    "dynamo_backend": dynamo_backend,
    "dynamo_mode": choice("default", "reduce-overhead", "max-autotune", lower=True),
    "dynamo_use_fullgraph": boolean,
    "dynamo_use_dynamic": boolean,
    "dynamo_use_regional_compilation": boolean,
    "gradient_accumulation_steps": positive_int,
    "num_cpu_threads_per_process": positive_int,
    "nproc_per_node": positive_int,
    "max_restarts": non_negative_int,
    "monitor_interval": positive_float,
    "timeout": positive_float,
    "tee": tee,
    "log_dir": text,
    "role": text,
    "rdzv_conf": key_values,
}
FLAG_ONLY_KEYS = frozenset(
    {
        "gradient_accumulation_steps", "num_cpu_threads_per_process", "nproc_per_node",
        "max_restarts", "monitor_interval", "timeout", "tee", "log_dir", "role", "rdzv_conf",
    }
)  # fmt: skip
# dynamo_backend is also a top-level key: accelerate's older configs wrote it there.
FILE_KEYS = frozenset(PARSERS) - FLAG_ONLY_KEYS - set(DYNAMO_KEYS[1:])


class Section(Protocol):
    """A backend's parsed ``*_config`` section (``deepspeed_config``, ``fsdp_config``, ...)."""

    values: Mapping[str, Any]  # the section's keys, as written in the file

    def env(self) -> dict[str, str]:
        """What accelerate's launcher sets for this backend (``ACCELERATE_USE_FSDP``, ...)."""
        ...


# ``*_config`` sections: name -> parser of the nested mapping; backends.py registers its two.
SECTIONS: dict[str, Callable[[Mapping[str, Any]], Section]] = {}
# Keys accelerate writes into every config that only matter to features accel-run does not have;
# accepted while they hold these values so an existing accelerate config keeps working.
INERT_KEYS: dict[str, tuple[object, ...]] = {
    "downcast_bf16": ("no", False),
    "main_training_function": ("main",),
    "tpu_env": ([], None),
    "tpu_use_cluster": (False,),
    "tpu_use_sudo": (False,),
}


def parse_value(key: str, value: object) -> Any:
    """Validate one setting; ``ValueError`` says what is wrong without naming where."""
    return PARSERS[key](value)


def load_file(path: Path) -> dict[str, Any]:
    """Read an accelerate YAML config; errors point at ``path:line``."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"{path}:0: no such config file") from None
    except OSError as err:
        raise ConfigError(f"{path}:0: {err.strerror or err}") from None
    try:
        source = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise ConfigError(
            f"{path}:{line}: not UTF-8 text (byte 0x{data[err.start]:02x}); save it as UTF-8"
        ) from None
    try:
        root = yaml.compose(source)
    except yaml.YAMLError as err:
        line = err.problem_mark.line + 1 if getattr(err, "problem_mark", None) else 1
        raise ConfigError(
            f"{path}:{line}: not valid YAML: {getattr(err, 'problem', err)}"
        ) from None
    if root is None:
        return {}
    if not isinstance(root, yaml.MappingNode):
        raise ConfigError(f"{path}:1: a config file must be a mapping of key: value")
    values: dict[str, Any] = {}
    for key_node, value_node in root.value:
        key, line = key_node.value, key_node.start_mark.line + 1
        value = yaml.safe_load(yaml.serialize(value_node))
        try:
            _take(values, key, value)
        except ValueError as err:
            raise ConfigError(f"{path}:{line}: {key}: {err}") from None
    return values


def _take(values: dict[str, Any], key: str, value: object) -> None:
    if key in FILE_KEYS:
        if value is not None:
            values[key] = parse_value(key, value)
    elif key == "dynamo_config":
        values.update(_dynamo_section(value or {}))
    elif key in SECTIONS:
        values.setdefault("sections", {})[key] = SECTIONS[key](value or {})
    elif key in INERT_KEYS:
        if value not in INERT_KEYS[key]:
            raise ValueError(f"{value!r} is not supported by accel-run")
    elif key.endswith("_config") and not value:
        return  # an empty section of a backend we do not launch (accelerate writes `{}` ones)
    else:
        raise ValueError(unknown_key(key, FILE_KEYS | set(SECTIONS) | {"dynamo_config"}))


def unknown_key(key: str, known: Iterable[str]) -> str:
    """A key accel-run does not read, with the one it most likely meant (``num_procesess``), as
    Ruff and cargo answer a misspelt setting; else every key it reads."""
    close = difflib.get_close_matches(str(key), list(known), n=1)
    if close:
        return f"unknown key (did you mean {close[0]}?)"
    return f"unknown key (accel-run reads: {', '.join(sorted(known))})"


def _dynamo_section(section: object) -> dict[str, Any]:
    """accelerate's ``dynamo_config`` mapping; its keys may leave out the ``dynamo_`` prefix."""
    if not isinstance(section, Mapping):
        raise ValueError("must be a mapping of key: value")
    values = {}
    for key, value in section.items():
        name = key if str(key).startswith("dynamo_") else f"dynamo_{key}"
        if name not in DYNAMO_KEYS:
            raise ValueError(f"{key}: {unknown_key(name, DYNAMO_KEYS)}")
        try:
            values[name] = parse_value(name, value)
        except ValueError as err:
            raise ValueError(f"{key}: {err}") from None
    return values


def gpu_count() -> int:
    """CUDA devices visible here (torch is imported only when a default needs it)."""
    import torch

    return torch.cuda.device_count()


def load_settings(config_file: str | None, flags: Mapping[str, Any]) -> Settings:
    """Defaults < config file (given, else accelerate's default one if present) < flags."""
    path = Path(config_file) if config_file else default_config_path()
    file_values = load_file(path) if config_file or path.is_file() else {}
    return resolve(file_values, flags, gpu_count)


def resolve(
    file_values: Mapping[str, Any],
    flag_values: Mapping[str, Any],
    gpu_count: Callable[[], int],
) -> Settings:
    """Merge defaults < file < flags and check the combination; ``gpu_count`` is asked lazily."""
    from_file = frozenset(file_values) - frozenset(flag_values)
    settings = Settings(**{**file_values, **flag_values}, from_file=from_file)
    if settings.distributed_type == "MULTI_CPU":
        settings = replace(settings, use_cpu=True)
    if settings.nproc_per_node is not None:
        total = settings.nproc_per_node * settings.num_machines
        if flag_values.get("num_processes", total) != total:
            raise ConfigError(
                f"--nproc-per-node {settings.nproc_per_node} on {settings.num_machines} "
                f"machine(s) is {total} processes, but --num-processes is "
                f"{flag_values['num_processes']} (accelerate's count is the total over machines)"
            )
        settings = replace(settings, num_processes=total)
    if settings.num_processes is None:
        settings = replace(settings, num_processes=_default_processes(settings, gpu_count))
    _check(settings)
    return settings


def _default_processes(settings: Settings, gpu_count: Callable[[], int]) -> int:
    if settings.use_cpu:
        return settings.num_machines
    if settings.gpu_ids not in (None, "all"):
        return len(settings.gpu_ids.split(",")) * settings.num_machines
    return max(gpu_count(), 1) * settings.num_machines


def _check(settings: Settings) -> None:
    processes, machines = settings.num_processes or 1, settings.num_machines
    if processes % machines:
        raise ConfigError(
            f"num_processes ({processes}) is the total over all machines and must be a multiple "
            f"of num_machines ({machines})"
        )
    if settings.machine_rank >= machines:
        raise ConfigError(
            f"machine_rank ({settings.machine_rank}) must be below num_machines ({machines})"
        )
    if machines > 1 and not settings.main_process_ip:
        raise ConfigError("several machines need --main-process-ip (the address of machine 0)")
    if machines > 1 and settings.main_process_port == 0:
        raise ConfigError("several machines need a fixed --main-process-port, not 0")


def child_env(settings: Settings, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The ``ACCELERATE_*`` (and device) variables HF Accelerate's launcher gives its children.

    Names, spellings and which backend gets which follow ``accelerate.utils.launch`` (its
    ``prepare_*_env`` functions), so HF's Accelerator (Trainer's too) builds the same state under
    accel-run as under ``accelerate launch``; ``accelify.runtime`` reads the same variables.
    """
    environ = os.environ if environ is None else environ
    sharded = settings.resolved_distributed_type in SHARDED_TYPES
    env = {"ACCELERATE_MIXED_PRECISION": settings.mixed_precision}
    if not sharded:
        env["ACCELERATE_USE_CPU"] = str(settings.use_cpu)
    elif settings.use_cpu:
        # HF's Accelerator with ACCELERATE_USE_CPU drops DeepSpeed/FSDP for plain DDP, so
        # accelerate's launcher never sets it for them; it then trains on the GPUs it sees.
        # Hiding them keeps use_cpu's meaning for both runtimes (a no-op on a CPU-only host).
        env["CUDA_VISIBLE_DEVICES"] = ""
    # str(): Python's spelling (True, False), as accelerate's launcher writes these.
    env |= {f"ACCELERATE_{key.upper()}": str(getattr(settings, key)) for key in DYNAMO_KEYS}
    if settings.debug:
        env["ACCELERATE_DEBUG_MODE"] = "true"
    if settings.enable_cpu_affinity:
        env["ACCELERATE_CPU_AFFINITY"] = "1"
    if settings.gradient_accumulation_steps is not None:
        env["ACCELERATE_GRADIENT_ACCUMULATION_STEPS"] = str(settings.gradient_accumulation_steps)
    if settings.timeout is not None:
        env[TIMEOUT_ENV] = str(settings.timeout)
    if settings.gpu_ids not in (None, "all") and "CUDA_VISIBLE_DEVICES" not in env:
        env["CUDA_VISIBLE_DEVICES"] = settings.gpu_ids
    for section in settings.sections.values():
        env.update(section.env())
    if settings.resolved_distributed_type == "DEEPSPEED":
        # accelerate's DeepSpeed launch appends the working folder to the module path.
        paths = [*environ.get("PYTHONPATH", "").split(os.pathsep), os.getcwd()]
        env["PYTHONPATH"] = os.pathsep.join(path for path in paths if path)
    if "PYTHONHASHSEED" not in environ:
        # One string hash on every process and machine: a vocabulary numbered from a set of
        # words (``enumerate(set(words))``) gives each word the same id everywhere.
        env["PYTHONHASHSEED"] = "0"
    if settings.num_cpu_threads_per_process is not None:
        env["OMP_NUM_THREADS"] = str(settings.num_cpu_threads_per_process)
    elif "OMP_NUM_THREADS" not in environ:
        # Like torchrun, do not let N processes each start one thread per core.
        env["OMP_NUM_THREADS"] = str(
            max(1, (os.cpu_count() or 1) // settings.processes_per_machine)
        )
    return env


def to_file_dict(settings: Settings) -> dict[str, Any]:
    """The settings as accelerate's YAML keys (what ``accel-run config`` writes)."""
    values = asdict(settings)
    values["distributed_type"] = settings.resolved_distributed_type
    keep = [f.name for f in fields(Settings) if f.name in FILE_KEYS]
    found = {key: values[key] for key in keep if values[key] is not None}
    return found | {name: dict(section.values) for name, section in settings.sections.items()}
