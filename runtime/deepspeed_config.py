"""The DeepSpeed config a run trains with, built before ``deepspeed.initialize`` sees it.

It is the user's JSON file, or one built from the launch options (``--zero-stage`` ...) when there
is none. ``"auto"`` values are filled from the launch options and the script (the prepared
loader's batch size, the Accelerator's accumulation steps and mixed precision, the model's
``config.hidden_size``), as HF Accelerate does; one nothing can fill is an error naming it. A
value given in two places with different values is an error naming both: nothing is chosen
silently. Plain Python (no deepspeed, no torch) so accel-run checks the same rules.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from .deepspeed_placeholders import DEFAULT_LR, DEFAULT_WEIGHT_DECAY

AUTO = "auto"
# Launch option -> where it lives in a DeepSpeed config.
OPTION_KEYS = {
    "zero_stage": "zero_optimization.stage",
    "offload_optimizer_device": "zero_optimization.offload_optimizer.device",
    "offload_param_device": "zero_optimization.offload_param.device",
    "gradient_clipping": "gradient_clipping",
    "gradient_accumulation_steps": "gradient_accumulation_steps",
    "zero3_save_16bit_model": "zero_optimization.stage3_gather_16bit_weights_on_model_save",
}
# Launch option -> the variable HF Accelerate's launcher passes it in.
OPTION_ENV = {
    "zero_stage": "ACCELERATE_DEEPSPEED_ZERO_STAGE",
    "offload_optimizer_device": "ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE",
    "offload_param_device": "ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_DEVICE",
    "gradient_clipping": "ACCELERATE_GRADIENT_CLIPPING",
    "gradient_accumulation_steps": "ACCELERATE_GRADIENT_ACCUMULATION_STEPS",
    "zero3_save_16bit_model": "ACCELERATE_DEEPSPEED_ZERO3_SAVE_16BIT_MODEL",
}
# What HF Accelerate's launcher puts in an "auto" value when the launch leaves the option out.
LAUNCH_DEFAULTS = {
    "zero_optimization.stage": 2,
    "zero_optimization.offload_optimizer.device": "none",
    "zero_optimization.offload_param.device": "none",
    "zero_optimization.offload_optimizer.nvme_path": "none",
    "zero_optimization.offload_param.nvme_path": "none",
    "zero_optimization.stage3_gather_16bit_weights_on_model_save": False,
}
# Config keys HF Accelerate fills from the model's hidden size h: h*h, 0.9*h*h, 10*h.
HIDDEN_SIZE_KEYS = (
    "zero_optimization.reduce_bucket_size",
    "zero_optimization.stage3_prefetch_bucket_size",
    "zero_optimization.stage3_param_persistence_threshold",
)
CONFIG_FILE_ENV = "ACCELERATE_DEEPSPEED_CONFIG_FILE"
OFFLOAD_DEVICES = ("none", "cpu", "nvme")


def parse_option(name: str, value: object) -> Any:
    """One launch option, validated (``ValueError`` says what is wrong)."""
    text = str(value).strip().lower()
    if name == "zero_stage":
        if text not in ("0", "1", "2", "3"):
            raise ValueError(f"must be 0, 1, 2 or 3, got {value!r}")
        return int(text)
    if name in ("offload_optimizer_device", "offload_param_device"):
        if text not in OFFLOAD_DEVICES:
            raise ValueError(f"must be one of {', '.join(OFFLOAD_DEVICES)}, got {value!r}")
        return text
    if name == "gradient_clipping":
        try:
            return float(text)
        except ValueError:
            raise ValueError(f"must be a number, got {value!r}") from None
    if name == "gradient_accumulation_steps":
        if not text.isdigit() or int(text) < 1:
            raise ValueError(f"must be a positive integer, got {value!r}")
        return int(text)
    if text not in ("true", "false"):
        raise ValueError(f"must be true or false, got {value!r}")
    return text == "true"


def options_from_env(environ: Mapping[str, str]) -> dict[str, Any]:
    """The launch options a launcher passed (only those it set)."""
    options = {}
    for name, variable in OPTION_ENV.items():
        raw = environ.get(variable, "").strip()
        if raw and raw != AUTO:
            try:
                options[name] = parse_option(name, raw)
            except ValueError as err:
                raise ValueError(f"environment variable {variable}: {err}") from None
    return options


def read_file(path: str | os.PathLike) -> dict[str, Any]:
    """A DeepSpeed JSON config; errors are one line pointing at ``path:line``."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as err:
        raise ValueError(f"{path}:0: cannot read the DeepSpeed config: {err.strerror}") from None
    try:
        config = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}:{err.lineno}: not valid JSON: {err.msg}") from None
    if not isinstance(config, dict) or "zero_optimization" not in config:
        raise ValueError(f"{path}:1: a DeepSpeed config needs a zero_optimization section")
    return config


def get(config: Mapping[str, Any], path: str) -> Any:
    for key in path.split("."):
        if not isinstance(config, Mapping):
            return None
        config = config.get(key)  # type: ignore[assignment]
    return config


def _put(config: dict[str, Any], path: str, value: Any) -> None:
    *parents, last = path.split(".")
    for key in parents:
        config = config.setdefault(key, {})
    config[last] = value


def merge_options(
    config: Mapping[str, Any] | None, options: Mapping[str, Any], where: str
) -> dict[str, Any]:
    """The config with the launch options in it; ``config=None`` builds one from them alone.

    An option fills a missing or ``"auto"`` value (an ``"auto"`` no option fills takes HF's
    launch default); one that differs from an explicit value in the file ``where`` is refused
    with both named.
    """
    if config is None:
        merged: dict[str, Any] = {"train_batch_size": AUTO, "train_micro_batch_size_per_gpu": AUTO}
        defaults = {"zero_stage": 2, "offload_optimizer_device": "none"}
        defaults["offload_param_device"] = "none"
        options = {**defaults, **options}
    else:
        merged = json.loads(json.dumps(config))
    conflicts = []
    for name, value in options.items():
        key = OPTION_KEYS[name]
        current = get(merged, key)
        if current in (None, AUTO):
            _put(merged, key, value)
        elif current != value:
            conflicts.append(f"{key}={current!r} in {where} but {name}={value!r} in the launch")
    if conflicts:
        raise ValueError(f"conflicting DeepSpeed settings: {'; '.join(conflicts)}")
    for key, value in LAUNCH_DEFAULTS.items():
        if get(merged, key) == AUTO:
            _put(merged, key, value)
    return merged


def micro_batch_size(
    batch_sizes: Sequence[int | None], num_processes: int, split_batches: bool
) -> int | None:
    """The per-process batch of the loaders prepared with the model, as HF Accelerate picks it.

    The smallest (HF's ``is_train_batch_min``: the training loader's, next to a larger evaluation
    one), split over the processes with ``split_batches``; ``None`` when a loader has no integer
    ``batch_size`` or none was prepared.
    """
    if not batch_sizes or None in batch_sizes:
        return None
    smallest = min(batch_sizes)  # type: ignore[type-var]
    return smallest // num_processes if split_batches else smallest


def hidden_size_of(model: Any) -> int | None:
    """``model.config.hidden_size`` (or the largest of ``hidden_sizes``), HF's source for
    :data:`HIDDEN_SIZE_KEYS`; ``None`` for a model without one."""
    config = getattr(model, "config", None)
    if hasattr(config, "hidden_size"):
        return config.hidden_size
    sizes = getattr(config, "hidden_sizes", None)
    return max(sizes) if sizes else None


class Fill(NamedTuple):
    """A value the script gives for a config key; ``default`` is used only for an ``"auto"``."""

    key: str
    value: Any
    source: str
    default: Any = None


def _settle(config: dict[str, Any], fill: Fill, conflicts: list[str]) -> None:
    """Put ``fill`` where the config has nothing or ``"auto"``; note a contradiction."""
    current = get(config, fill.key)
    if current in (None, AUTO):
        value = fill.default if fill.value is None and current == AUTO else fill.value
        if value is not None:
            _put(config, fill.key, value)
    elif fill.value is not None and current != fill.value:
        conflicts.append(f"{fill.key}={current!r} in the DeepSpeed config but {fill.source}")


def fill_from_script(
    config: Mapping[str, Any],
    *,
    micro_batch_size: int | None,
    accumulation_steps: int,
    num_processes: int,
    mixed_precision: str,
    hidden_size: int | None = None,
    declared: Sequence[Fill] = (),
) -> dict[str, Any]:
    """Fill what only the script knows; refuse explicit config values the script contradicts.

    ``hidden_size`` is the model's (:func:`hidden_size_of`). ``declared`` are the values the
    script's placeholders carry for a config-declared optimizer and scheduler
    (:func:`placeholder_fills`); they fill only keys the config has.
    """
    filled = json.loads(json.dumps(config))
    conflicts: list[str] = []
    _settle(
        filled,
        Fill(
            "gradient_accumulation_steps",
            accumulation_steps,
            f"gradient_accumulation_steps={accumulation_steps} in the Accelerator",
        ),
        conflicts,
    )
    if micro_batch_size is None and get(filled, "train_micro_batch_size_per_gpu") in (None, AUTO):
        raise ValueError(
            "DeepSpeed needs the micro-batch size: pass the training DataLoader to the same "
            "prepare() call as the model (with an integer batch_size), or set "
            "train_micro_batch_size_per_gpu in the config"
        )
    _settle(
        filled,
        Fill(
            "train_micro_batch_size_per_gpu",
            micro_batch_size,
            f"the prepared DataLoader gives {micro_batch_size} samples per process",
        ),
        conflicts,
    )
    micro = get(filled, "train_micro_batch_size_per_gpu")
    steps = get(filled, "gradient_accumulation_steps")
    total = Fill(
        "train_batch_size", micro * steps * num_processes, "micro-batch x steps x processes"
    )
    _settle(filled, total, conflicts)
    _fill_precision(filled, mixed_precision, conflicts)
    clipping = get(filled, "gradient_clipping")
    if clipping in (None, AUTO):
        # An "auto" the launch left clips at 1.0, as in HF; no value at all means no clipping
        # (DeepSpeed's default), so a script that never clips trains as under DDP.
        filled["gradient_clipping"] = 1.0 if clipping == AUTO else 0.0
    _fill_from_hidden_size(filled, hidden_size)
    for fill in declared:
        if get(filled, fill.key) is not None:
            _settle(filled, fill, conflicts)
    _warm_up_to_the_optimizer_lr(filled)
    left = sorted(_auto_paths(filled))
    if conflicts:
        raise ValueError(f"conflicting DeepSpeed settings: {'; '.join(conflicts)}")
    if left:
        raise ValueError(f"DeepSpeed config values left 'auto' that accelify cannot fill: {left}")
    return filled


def placeholder_fills(
    optimizer: Any, scheduler: Any, *, num_processes: int, split_batches: bool
) -> list[Fill]:
    """What a script's ``DummyOptim``/``DummyScheduler`` say about the config's declared ones.

    The schedule length the script computes counts every process's batches; each process
    steps ``1/num_processes`` of them unless batches are split (HF Accelerate's rule).
    """
    fills = []
    if hasattr(optimizer, "defaults"):  # the script's own torch optimizer
        lr = optimizer.defaults.get("lr")
        fills.append(Fill("scheduler.params.warmup_max_lr", None, "", default=lr))
    elif optimizer is not None:
        fills += [
            Fill("optimizer.params.lr", optimizer.lr, f"DummyOptim(lr={optimizer.lr})", DEFAULT_LR),
            Fill(
                "optimizer.params.weight_decay",
                optimizer.weight_decay,
                f"DummyOptim(weight_decay={optimizer.weight_decay})",
                DEFAULT_WEIGHT_DECAY,
            ),
        ]
    if scheduler is not None:
        total = scheduler.total_num_steps
        if total is not None and not split_batches:
            total = math.ceil(total / num_processes)
        warmup = scheduler.warmup_num_steps
        warmup = None if warmup is None else max(1, warmup)
        fills += [
            # DeepSpeed refuses 0 warm-up steps; 1 is the shortest warm-up there is.
            Fill(
                "scheduler.params.warmup_num_steps",
                warmup,
                f"DummyScheduler(warmup_num_steps={warmup})",
                1,
            ),
            Fill(
                "scheduler.params.total_num_steps",
                total,
                f"DummyScheduler(total_num_steps={scheduler.total_num_steps}) on "
                f"{num_processes} processes",
            ),
        ]
    return fills


def _warm_up_to_the_optimizer_lr(config: dict[str, Any]) -> None:
    """A declared schedule left ``"auto"`` warms up from 0 to the declared optimizer's lr."""
    if get(config, "scheduler.params.warmup_min_lr") == AUTO:
        _put(config, "scheduler.params.warmup_min_lr", 0.0)
    lr = get(config, "optimizer.params.lr")
    if get(config, "scheduler.params.warmup_max_lr") == AUTO and lr not in (None, AUTO):
        _put(config, "scheduler.params.warmup_max_lr", lr)


def _fill_from_hidden_size(config: dict[str, Any], hidden_size: int | None) -> None:
    """HF's ZeRO bucket sizes for :data:`HIDDEN_SIZE_KEYS` left ``"auto"``; without a hidden
    size they cannot be filled, and a guess would silently change memory use and speed."""
    wanted = [key for key in HIDDEN_SIZE_KEYS if get(config, key) == AUTO]
    if not wanted:
        return
    if hidden_size is None:
        raise ValueError(
            f"DeepSpeed config values {wanted} are 'auto', which is filled from the model's "
            "config.hidden_size (or config.hidden_sizes), and the model has none: replace "
            "'auto' with an integer for these keys"
        )
    values = (hidden_size * hidden_size, int(0.9 * hidden_size * hidden_size), 10 * hidden_size)
    for key, value in zip(HIDDEN_SIZE_KEYS, values, strict=True):
        if key in wanted:
            _put(config, key, value)


def _fill_precision(config: dict[str, Any], mixed_precision: str, conflicts: list[str]) -> None:
    """``fp16.enabled``/``bf16.enabled`` from the Accelerator's mixed precision."""
    for kind in ("fp16", "bf16"):
        wanted = mixed_precision == kind
        current = get(config, f"{kind}.enabled")
        if current in (None, AUTO):
            if wanted or current == AUTO:
                _put(config, f"{kind}.enabled", wanted)
        elif current != wanted and mixed_precision != "no":
            conflicts.append(
                f"{kind}.enabled={current!r} in the DeepSpeed config but "
                f"mixed_precision={mixed_precision!r}"
            )


def _auto_paths(config: Mapping[str, Any], prefix: str = "") -> list[str]:
    found = []
    for key, value in config.items():
        if isinstance(value, Mapping):
            found += _auto_paths(value, f"{prefix}{key}.")
        elif value == AUTO:
            found.append(f"{prefix}{key}")
    return found
