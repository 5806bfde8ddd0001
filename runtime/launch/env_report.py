"""``accel-run env``: the facts a bug report needs — versions, devices and the config that applies.

Plain ``- key: value`` lines, like ``accelerate env``, so it pastes into an issue unchanged.
"""

from __future__ import annotations

import os
import platform
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import yaml

from accelify.runtime.launch import config as cfg

# Variables that change what a run does: accelerate's, the FSDP plugin's, DeepSpeed's.
LAUNCH_VARIABLE_PREFIXES = ("ACCELERATE_", "FSDP_", "DS_")


def _version(package: str) -> str:
    try:
        return version(package)
    except PackageNotFoundError:
        return "not installed"


def _devices() -> list[str]:
    import torch

    count = cfg.gpu_count()
    lines = [f"torch CUDA build: {torch.version.cuda or 'none'}", f"GPUs: {count}"]
    lines += [f"  {i}: {torch.cuda.get_device_name(i)}" for i in range(count)]
    return lines


def report(config_file: str | None) -> tuple[str, bool]:
    """The report text and whether the config resolved cleanly."""
    path = Path(config_file) if config_file else cfg.default_config_path()
    exists = bool(config_file) or path.is_file()
    lines = [
        f"accelify version: {_version('accelify')}",
        f"Platform: {platform.platform()}",
        f"Python version: {sys.version.split()[0]}",
        f"torch version: {_version('torch')}",
        f"accelerate version: {_version('accelerate')}",
        f"deepspeed version: {_version('deepspeed')}",
        f"CPU cores: {os.cpu_count()}",
        *_devices(),
        f"Config file: {path if exists else f'none ({path} does not exist)'}",
    ]
    ok = True
    try:
        settings = cfg.load_settings(config_file, {})
    except cfg.ConfigError as err:
        lines.append(f"Config error: {err}")
        ok = False
    else:
        lines.append("Resolved config:")
        resolved = yaml.safe_dump(cfg.to_file_dict(settings), sort_keys=False)
        lines += [f"  {line}" for line in resolved.splitlines()]
    launch_vars = sorted(k for k in os.environ if k.startswith(LAUNCH_VARIABLE_PREFIXES))
    lines += [f"{k}={os.environ[k]}" for k in launch_vars]
    return "\n".join(line if line.startswith(" ") else f"- {line}" for line in lines), ok
