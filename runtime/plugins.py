"""HF Accelerate's ``FullyShardedDataParallelPlugin`` and ``DeepSpeedPlugin``: a backend chosen in
the script (``Accelerator(fsdp_plugin=...)``) instead of by the launch.

A plugin gives its strategy the same settings object the launch gives it, built by the same code:
the FSDP plugin writes the ``FSDP_*`` variables ``accel-run --use-fsdp`` would set and
``FsdpOptions.from_env`` reads them; the DeepSpeed plugin gives the launch options and config that
``DeepSpeedSettings.from_env`` reads from ``ACCELERATE_DEEPSPEED_*``. As in HF, a field left at
``None`` is read from the variable HF reads, and the ``Accelerator`` turns the backend's
``ACCELERATE_USE_*`` switch on, so the process state resolves as under the launcher. A field
accelify cannot honour is refused by name unless it has its default.

FSDP1 settings (``fsdp_version=1``, ``sharding_strategy``) run on FSDP2, as they do from an
accel-run config; FSDP1's own tuning (``backward_prefetch``, ``forward_prefetch``,
``use_orig_params``, ``sync_module_states``, ``limit_all_gathers``) and the loading hints
``cpu_ram_efficient_loading`` and ``zero3_init_flag`` are accepted as accel-run accepts them:
they change memory and speed, never the trained weights.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import torch

from . import deepspeed_config as dsc
from .config import env_flag
from .state import SHARDED_BACKENDS, DistributedType, ProcessState

if TYPE_CHECKING:  # the backends' modules load when a plugin is used, not with this one
    from .strategies.deepspeed import DeepSpeedSettings
    from .strategies.fsdp import FsdpOptions

# FSDP plugin field -> the variable HF's plugin reads it from (and accel-run sets).
FSDP_VARIABLES = {
    "fsdp_version": "FSDP_VERSION",
    "sharding_strategy": "FSDP_SHARDING_STRATEGY",
    "reshard_after_forward": "FSDP_RESHARD_AFTER_FORWARD",
    "auto_wrap_policy": "FSDP_AUTO_WRAP_POLICY",
    "transformer_cls_names_to_wrap": "FSDP_TRANSFORMER_CLS_TO_WRAP",
    "min_num_params": "FSDP_MIN_NUM_PARAMS",
    "cpu_offload": "FSDP_OFFLOAD_PARAMS",
    "state_dict_type": "FSDP_STATE_DICT_TYPE",
}
# FSDP plugin fields accelify has no implementation for: refused unless None or False.
FSDP_UNSUPPORTED = {
    "ignored_modules": "every parameter is sharded",
    "param_init_fn": "models are sharded as built (no meta-device initialisation)",
    "state_dict_config": "it follows state_dict_type",
    "optim_state_dict_config": "it follows state_dict_type",
    "activation_checkpointing": "activation checkpointing is not supported",
    "activation_checkpointing_offload": "activation checkpointing is not supported",
}
_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


def _refused(plugin: str, field: str, value: Any, why: str) -> ValueError:
    return ValueError(f"{plugin}({field}={value!r}) is not supported by accelify: {why}")


def _name(value: Any) -> str:
    """An enum member's name (``ShardingStrategy.FULL_SHARD``), else the value as text."""
    return str(getattr(value, "name", value)).upper()


@dataclass
class FullyShardedDataParallelPlugin:
    """FSDP settings in the script (HF Accelerate's fields and defaults); accelify runs FSDP2."""

    fsdp_version: int | None = None
    sharding_strategy: Any = None
    reshard_after_forward: Any = None
    backward_prefetch: Any = None
    mixed_precision_policy: Any = None
    auto_wrap_policy: Any = None
    cpu_offload: Any = None
    ignored_modules: Any = None
    state_dict_type: Any = None
    state_dict_config: Any = None
    optim_state_dict_config: Any = None
    limit_all_gathers: bool = True
    use_orig_params: bool | None = None
    param_init_fn: Any = None
    sync_module_states: bool | None = None
    forward_prefetch: bool | None = None
    activation_checkpointing: bool | None = None
    activation_checkpointing_offload: bool | None = None
    cpu_ram_efficient_loading: bool | None = None
    transformer_cls_names_to_wrap: list[str] | str | None = None
    min_num_params: int | None = None

    def __post_init__(self) -> None:
        """Fill what is left at ``None`` from HF's variables and defaults; refuse what accelify
        cannot run, here rather than in ``prepare``."""
        env = os.environ
        if self.fsdp_version is None:
            self.fsdp_version = int(env.get("FSDP_VERSION", "1"))
        if self.fsdp_version not in (1, 2):
            raise ValueError(f"fsdp_version must be 1 or 2, got {self.fsdp_version!r}")
        reshard = self.reshard_after_forward
        if self.fsdp_version == 1 and self.sharding_strategy is None:
            # FSDP1 says it with a strategy, for which reshard_after_forward is another name.
            if isinstance(reshard, bool):
                raise ValueError("reshard_after_forward with fsdp_version=1 is a sharding strategy")
            self.sharding_strategy = reshard or env.get("FSDP_SHARDING_STRATEGY", "FULL_SHARD")
        if self.fsdp_version == 2 and reshard is None:
            self.reshard_after_forward = env_flag("FSDP_RESHARD_AFTER_FORWARD", True)
        elif self.fsdp_version == 2 and str(reshard).lower() in ("true", "false"):
            self.reshard_after_forward = str(reshard).lower() == "true"
        if self.cpu_offload is None:
            self.cpu_offload = env_flag("FSDP_OFFLOAD_PARAMS")
        if self.state_dict_type is None:
            default = "FULL_STATE_DICT" if self.fsdp_version == 1 else "SHARDED_STATE_DICT"
            self.state_dict_type = env.get("FSDP_STATE_DICT_TYPE", default)
        if self.transformer_cls_names_to_wrap is None:
            self.transformer_cls_names_to_wrap = env.get("FSDP_TRANSFORMER_CLS_TO_WRAP")
        if self.auto_wrap_policy is None:
            # HF's NO_WRAP would ignore the layer classes; accel-run wraps them, and so here.
            named = "TRANSFORMER_BASED_WRAP" if self.transformer_cls_names_to_wrap else "NO_WRAP"
            self.auto_wrap_policy = env.get("FSDP_AUTO_WRAP_POLICY", named)
        if self.min_num_params is None and _name(self.auto_wrap_policy) == "SIZE_BASED_WRAP":
            self.min_num_params = int(env.get("FSDP_MIN_NUM_PARAMS", "0") or 0)
        for field in ("activation_checkpointing", "activation_checkpointing_offload"):
            if getattr(self, field) is None:
                setattr(self, field, env_flag(f"FSDP_{field.upper()}"))
        if self.ignored_modules is None:
            self.ignored_modules = env.get("FSDP_IGNORED_MODULES")
        self.settings()

    def launch_variables(self) -> dict[str, str]:
        """The ``FSDP_*`` variables accel-run would set for these settings."""
        name = "FullyShardedDataParallelPlugin"
        for field, why in FSDP_UNSUPPORTED.items():
            if getattr(self, field) not in (None, False):
                raise _refused(name, field, getattr(self, field), why)
        if callable(self.auto_wrap_policy):
            raise _refused(
                name,
                "auto_wrap_policy",
                self.auto_wrap_policy,
                "give 'transformer_based_wrap' (with transformer_cls_names_to_wrap) or "
                "'size_based_wrap' (with min_num_params)",
            )
        classes = self.transformer_cls_names_to_wrap or ()
        classes = classes if isinstance(classes, str) else ",".join(classes)
        values = {
            "fsdp_version": self.fsdp_version,
            "auto_wrap_policy": _name(self.auto_wrap_policy),
            "transformer_cls_names_to_wrap": classes,
            "min_num_params": self.min_num_params or 0,
            "cpu_offload": str(self._offloads()).lower(),
            "state_dict_type": _name(self.state_dict_type),
        }
        if self.sharding_strategy is not None:
            values["sharding_strategy"] = _name(self.sharding_strategy)
        if self.fsdp_version == 2:
            if not isinstance(self.reshard_after_forward, bool):
                raise ValueError(
                    f"reshard_after_forward must be a bool with fsdp_version=2, got "
                    f"{self.reshard_after_forward!r}"
                )
            values["reshard_after_forward"] = str(self.reshard_after_forward).lower()
        return {FSDP_VARIABLES[field]: str(value) for field, value in values.items()}

    def settings(self) -> FsdpOptions:
        """The ``FsdpOptions`` the FSDP strategy runs with (from the launcher's parser)."""
        from .strategies.fsdp import FsdpOptions

        variables = self.launch_variables()
        try:
            options = FsdpOptions.from_env(variables)
        except ValueError as err:
            field = next((f for f, v in FSDP_VARIABLES.items() if v in str(err)), None)
            named = f"({field}=...)" if field else ""
            raise ValueError(f"FullyShardedDataParallelPlugin{named}: {err}") from None
        return replace(options, mp_policy=self._mp_policy())

    def _offloads(self) -> bool:
        from torch.distributed.fsdp import CPUOffload, CPUOffloadPolicy, OffloadPolicy

        offload = self.cpu_offload
        if isinstance(offload, CPUOffloadPolicy):
            if not offload.pin_memory:
                why = "parameters offload to pinned memory"
                raise _refused("FullyShardedDataParallelPlugin", "cpu_offload", offload, why)
            return True
        if isinstance(offload, OffloadPolicy):  # the base class: no offloading
            return False
        if isinstance(offload, CPUOffload):  # FSDP1's
            return offload.offload_params
        if isinstance(offload, bool):
            return offload
        raise ValueError(f"cpu_offload must be a bool or an offload policy, got {offload!r}")

    def _mp_policy(self) -> Any:
        """HF's FSDP2 policy for ``mixed_precision_policy``: a dtype (or its name) for parameters,
        reductions and outputs, a dict of ``MixedPrecisionPolicy``'s fields, or the policy."""
        from torch.distributed.fsdp import MixedPrecisionPolicy

        policy = self.mixed_precision_policy
        if policy is None or isinstance(policy, MixedPrecisionPolicy):
            return policy
        if isinstance(policy, Mapping):
            try:
                return MixedPrecisionPolicy(**policy)
            except TypeError:
                raise ValueError(
                    f"mixed_precision_policy={dict(policy)!r}: the keys must be "
                    "MixedPrecisionPolicy's (param_dtype, reduce_dtype, output_dtype, "
                    "cast_forward_inputs); FSDP2 does not cast buffers"
                ) from None
        dtype = _DTYPES.get(policy, policy)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(
                f"mixed_precision_policy={policy!r}: give a MixedPrecisionPolicy, a dict of its "
                f"fields, a torch dtype or one of {list(_DTYPES)}"
            )
        return MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=dtype, output_dtype=dtype)


@dataclass
class DeepSpeedPlugin:
    """DeepSpeed settings in the script (HF Accelerate's fields and defaults).

    The fields that are launch options (``zero_stage``, ``gradient_clipping``, ...) fill the
    ``"auto"`` values of ``hf_ds_config`` and must not contradict its explicit ones; without a
    config they build one. After construction ``deepspeed_config`` is the config before the
    script fills its ``"auto"`` values (batch sizes, precision), as HF's is.
    """

    hf_ds_config: Any = None
    gradient_accumulation_steps: int | None = None
    gradient_clipping: float | None = None
    zero_stage: int | None = None
    is_train_batch_min: bool = True
    offload_optimizer_device: str | None = None
    offload_param_device: str | None = None
    offload_optimizer_nvme_path: str | None = None
    offload_param_nvme_path: str | None = None
    zero3_init_flag: bool | None = None
    zero3_save_16bit_model: bool | None = None
    transformer_moe_cls_names: str | None = None
    enable_msamp: bool | None = None
    msamp_opt_level: str | None = None

    def __post_init__(self) -> None:
        """Fill what is left at ``None`` from HF's variables, check every field, build the
        config (reading ``hf_ds_config`` when it is a file)."""
        env = os.environ
        from_env = dsc.options_from_env(env)
        for name in dsc.OPTION_ENV:
            value = getattr(self, name)
            if value is None or value == dsc.AUTO:
                setattr(self, name, from_env.get(name))
            else:
                try:
                    setattr(self, name, dsc.parse_option(name, value))
                except ValueError as err:
                    raise ValueError(f"DeepSpeedPlugin({name}={value!r}): {err}") from None
        if self.hf_ds_config is None:
            self.hf_ds_config = env.get(dsc.CONFIG_FILE_ENV, "none")
        for name in ("offload_optimizer_nvme_path", "offload_param_nvme_path"):
            if getattr(self, name) is None:
                setattr(self, name, env.get(f"ACCELERATE_DEEPSPEED_{name.upper()}", "none"))
        if self.enable_msamp is None:
            self.enable_msamp = env.get("ACCELERATE_FP8_BACKEND") == "MSAMP"
        if self.msamp_opt_level is None:
            self.msamp_opt_level = env.get("ACCELERATE_FP8_OPT_LEVEL", "O1")
        self._refuse_unsupported()
        self.deepspeed_config = self.settings().merged()
        zero3 = dsc.get(self.deepspeed_config, "zero_optimization.stage") == 3
        if self.zero3_init_flag is None:
            self.zero3_init_flag = env_flag("ACCELERATE_DEEPSPEED_ZERO3_INIT", zero3)
        if self.zero3_init_flag and not zero3:
            warnings.warn(
                "zero3_init_flag applies to ZeRO stage 3 only; it is set to False",
                stacklevel=3,
            )
            self.zero3_init_flag = False

    def _refuse_unsupported(self) -> None:
        name = "DeepSpeedPlugin"
        unsupported = {
            "is_train_batch_min": (
                self.is_train_batch_min is False,
                "the micro-batch is the smallest prepared loader's (HF's default)",
            ),
            "transformer_moe_cls_names": (
                self.transformer_moe_cls_names is not None,
                "ZeRO-3 MoE leaf modules are not supported",
            ),
            "enable_msamp": (self.enable_msamp, "FP8 (MS-AMP) training is not supported"),
            "offload_optimizer_nvme_path": (
                self.offload_optimizer_nvme_path != "none",
                "give zero_optimization.offload_optimizer.nvme_path in hf_ds_config",
            ),
            "offload_param_nvme_path": (
                self.offload_param_nvme_path != "none",
                "give zero_optimization.offload_param.nvme_path in hf_ds_config",
            ),
        }
        for field, (used, why) in unsupported.items():
            if used:
                raise _refused(name, field, getattr(self, field), why)
        config = self.hf_ds_config
        if isinstance(config, Mapping) and "zero_optimization" not in config:
            raise ValueError("DeepSpeedPlugin(hf_ds_config=...) needs a zero_optimization section")
        if not isinstance(config, str | Mapping):
            raise ValueError(
                f"DeepSpeedPlugin(hf_ds_config={config!r}): give a DeepSpeed JSON file's path "
                "or a dict"
            )

    def settings(self) -> DeepSpeedSettings:
        """The ``DeepSpeedSettings`` the DeepSpeed strategy runs with."""
        from .strategies.deepspeed import DeepSpeedSettings

        options = {name: getattr(self, name) for name in dsc.OPTION_ENV}
        options = {name: value for name, value in options.items() if value is not None}
        config = self.hf_ds_config
        if isinstance(config, Mapping):
            return DeepSpeedSettings(options, config, "DeepSpeedPlugin(hf_ds_config=...)")
        if config == "none":
            return DeepSpeedSettings(options, None, "the DeepSpeedPlugin")
        return DeepSpeedSettings(options, config, config)


PLUGINS = {
    "deepspeed_plugin": (DeepSpeedPlugin, DistributedType.DEEPSPEED),
    "fsdp_plugin": (FullyShardedDataParallelPlugin, DistributedType.FSDP),
}


@dataclass(frozen=True)
class Requested:
    """The backend a plugin asks for and the settings its strategy takes."""

    argument: str
    kind: DistributedType
    settings: FsdpOptions | DeepSpeedSettings
    accumulation_steps: int | None = None

    def strategy_kwargs(self, state: ProcessState) -> dict[str, Any]:
        """``settings=`` for ``strategies.select``, once the state runs the plugin's backend."""
        if state.distributed_type != self.kind:
            raise ValueError(
                f"Accelerator({self.argument}=...) needs {self.kind.value}, but this process "
                f"already runs {state.distributed_type.value} (an Accelerator or PartialState was "
                "created before without the plugin): pass it to the first one"
            )
        return {"settings": self.settings}


def requested(deepspeed_plugin: Any, fsdp_plugin: Any) -> Requested | None:
    """Check the plugins given to ``Accelerator`` and turn their backend's launcher switch on,
    as HF does, so that the process state resolves to it as under ``accel-run``."""
    given = {"deepspeed_plugin": deepspeed_plugin, "fsdp_plugin": fsdp_plugin}
    given = {argument: plugin for argument, plugin in given.items() if plugin is not None}
    if not given:
        return None
    if len(given) > 1:
        raise ValueError("Accelerator takes deepspeed_plugin or fsdp_plugin, not both; pick one")
    ((argument, plugin),) = given.items()
    expected, kind = PLUGINS[argument]
    if isinstance(plugin, Mapping):
        raise ValueError(
            f"Accelerator({argument}={{...}}): several DeepSpeed plugins are not supported by "
            "accelify; pass one DeepSpeedPlugin"
        )
    if not isinstance(plugin, expected):
        theirs = f"{type(plugin).__module__}.{type(plugin).__name__}"
        raise TypeError(
            f"Accelerator({argument}=...) takes accelify's plugin, got {theirs}: use "
            f"accelify.runtime.{expected.__name__} (HF's arguments)"
        )
    switch = next(name for name, backend in SHARDED_BACKENDS.items() if backend == kind)
    os.environ[switch] = "true"
    steps = getattr(plugin, "gradient_accumulation_steps", None)
    return Requested(argument, kind, plugin.settings(), steps)
