"""``FullyShardedDataParallelPlugin`` and ``DeepSpeedPlugin``: a backend chosen in the script.

A plugin must train exactly as the launch options that say the same (2 CPU processes through
accel-run, fixtures/runtime/train_sharded.py), read the launcher's variables for what it leaves
at ``None`` as HF's plugin does, and refuse by name what accelify cannot honour.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import accelerate.utils
import pytest
import torch
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, ShardingStrategy

from accelify.runtime import (
    Accelerator,
    DeepSpeedPlugin,
    DistributedType,
    FullyShardedDataParallelPlugin,
)
from accelify.runtime.strategies.deepspeed import DeepSpeedSettings
from accelify.runtime.strategies.fsdp import FsdpOptions

from .conftest import max_difference, run_sharded
from .test_fsdp import fsdp_process  # noqa: F401 (a fixture: one process under a launcher)

BLOCKS = ("--fsdp-transformer-layer-cls-to-wrap", "Block")
DS_CONFIG = {
    "zero_optimization": {"stage": 2},
    "train_micro_batch_size_per_gpu": "auto",
    "gradient_clipping": "auto",
}


def _same_training(first: dict, second: dict) -> None:
    assert first["losses"] == second["losses"]
    assert max_difference(first["params"], second["params"]) == 0


@pytest.mark.slow
def test_an_fsdp_plugin_trains_as_the_launch_options_that_say_the_same(tmp_path: Path) -> None:
    # fsdp_version=2 defaults to sharded checkpoints (HF's plugin), which the launch must name.
    flags = ("--use-fsdp", "--fsdp-version", "2", *BLOCKS)
    launched = run_sharded(
        tmp_path / "launch", *flags, "--fsdp-state-dict-type", "SHARDED_STATE_DICT"
    )
    fields = {"fsdp_version": 2, "auto_wrap_policy": "transformer_based_wrap"}
    fields["transformer_cls_names_to_wrap"] = ["Block"]
    planned = run_sharded(tmp_path / "plugin", script=("--fsdp-plugin", json.dumps(fields)))

    assert planned["type"] == launched["type"] == "FSDP"
    _same_training(planned, launched)
    distributed = sorted(p.name for p in (tmp_path / "plugin/state/pytorch_model_fsdp_0").iterdir())
    assert distributed == [".metadata", "__0_0.distcp", "__1_0.distcp"]


@pytest.mark.slow
def test_a_deepspeed_plugin_trains_as_the_same_config_given_to_the_launch(tmp_path: Path) -> None:
    pytest.importorskip("deepspeed")
    file = tmp_path / "ds.json"
    file.write_text(json.dumps(DS_CONFIG))
    launched = run_sharded(
        tmp_path / "launch", "--use-deepspeed", "--deepspeed-config-file", str(file)
    )
    fields = json.dumps({"hf_ds_config": DS_CONFIG})
    planned = run_sharded(tmp_path / "plugin", script=("--deepspeed-plugin", fields))

    assert planned["type"] == launched["type"] == "DEEPSPEED"
    _same_training(planned, launched)
    assert (tmp_path / "plugin/state/pytorch_model").is_dir()  # the engine's checkpoint


# --- in one process ----------------------------------------------------------------------------


@pytest.fixture
def launched(fsdp_process, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    """A one-process launch that selects no backend: only a plugin can (the switch it turns on
    is undone afterwards)."""
    monkeypatch.delenv("ACCELERATE_USE_FSDP")
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "false")


def test_a_plugin_selects_its_backend_with_its_settings(launched) -> None:
    plugin = FullyShardedDataParallelPlugin(
        fsdp_version=2, reshard_after_forward=False, state_dict_type="FULL_STATE_DICT"
    )
    accelerator = Accelerator(fsdp_plugin=plugin)
    assert accelerator.distributed_type == DistributedType.FSDP
    # The launcher's FSDP_AUTO_WRAP_POLICY=SIZE_BASED_WRAP, FSDP_MIN_NUM_PARAMS=20 fill the rest.
    assert accelerator.strategy.options == FsdpOptions(
        reshard_after_forward=False, auto_wrap_policy="SIZE_BASED_WRAP", min_num_params=20
    )


def test_a_plugin_left_at_its_defaults_reads_the_launchers_variables(fsdp_process) -> None:  # noqa: F811
    from_launch = Accelerator().strategy.options
    assert Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin()).strategy.options == from_launch


def test_the_mixed_precision_policy_reaches_fully_shard(launched) -> None:
    plugin = FullyShardedDataParallelPlugin(fsdp_version=2, mixed_precision_policy="bf16")
    accelerator = Accelerator(fsdp_plugin=plugin)
    model = accelerator.prepare(torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 1)))
    seen = []
    model[0].register_forward_pre_hook(lambda module, args: seen.append(module.weight.dtype))
    assert model(torch.randn(2, 4)).dtype == torch.bfloat16
    assert seen == [torch.bfloat16]
    bf16 = MixedPrecisionPolicy(torch.bfloat16, torch.bfloat16, torch.bfloat16)
    assert accelerator.strategy.options.mp_policy == bf16


def test_deepspeed_plugin_accumulation_steps_are_the_accelerators(launched) -> None:
    pytest.importorskip("deepspeed")
    accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin(gradient_accumulation_steps=4))
    assert accelerator.distributed_type == DistributedType.DEEPSPEED
    assert accelerator.gradient_accumulation_steps == 4
    assert accelerator.strategy.settings.options == {"gradient_accumulation_steps": 4}


def test_a_plugin_after_the_state_chose_another_backend_is_refused(launched) -> None:
    Accelerator()
    with pytest.raises(ValueError, match=r"fsdp_plugin=...\) needs FSDP, but this process already"):
        Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin())


# --- HF's fields, defaults and variables -------------------------------------------------------


@pytest.mark.parametrize(
    ("ours", "theirs"),
    [
        (FullyShardedDataParallelPlugin, accelerate.utils.FullyShardedDataParallelPlugin),
        (DeepSpeedPlugin, accelerate.utils.DeepSpeedPlugin),
    ],
)
def test_the_plugins_have_hfs_fields_and_defaults(ours: type, theirs: type) -> None:
    def defaults(cls: type) -> dict:
        return {f.name: f.default for f in dataclasses.fields(cls)}

    assert defaults(ours) == defaults(theirs)


def _named(value: object) -> object:
    """HF's plugin keeps enums (``StateDictType.SHARDED_STATE_DICT``) where accelify keeps names."""
    return getattr(value, "name", value)


FSDP_ENVIRONMENTS = [
    {},
    {"FSDP_VERSION": "2"},
    {"FSDP_VERSION": "2", "FSDP_RESHARD_AFTER_FORWARD": "false",
     "FSDP_STATE_DICT_TYPE": "FULL_STATE_DICT"},
    {"FSDP_SHARDING_STRATEGY": "SHARD_GRAD_OP", "FSDP_AUTO_WRAP_POLICY": "SIZE_BASED_WRAP",
     "FSDP_MIN_NUM_PARAMS": "7"},
    {"FSDP_AUTO_WRAP_POLICY": "TRANSFORMER_BASED_WRAP",
     "FSDP_TRANSFORMER_CLS_TO_WRAP": "Block,Layer"},
]  # fmt: skip


@pytest.mark.parametrize("environment", FSDP_ENVIRONMENTS)
def test_fsdp_fields_left_at_none_are_read_as_hf_reads_them(environment, monkeypatch) -> None:
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    ours, theirs = (
        FullyShardedDataParallelPlugin(),
        accelerate.utils.FullyShardedDataParallelPlugin(),
    )
    for field in ("fsdp_version", "reshard_after_forward", "state_dict_type", "min_num_params"):
        assert _named(getattr(ours, field)) == _named(getattr(theirs, field)), field
    assert _named(ours.sharding_strategy) == _named(theirs.sharding_strategy)
    if ours.auto_wrap_policy == "TRANSFORMER_BASED_WRAP":
        assert ours.transformer_cls_names_to_wrap == ",".join(theirs.transformer_cls_names_to_wrap)


DS_ENVIRONMENTS = [
    {},
    {"ACCELERATE_DEEPSPEED_ZERO_STAGE": "3", "ACCELERATE_GRADIENT_CLIPPING": "0.5"},
    {"ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE": "cpu",
     "ACCELERATE_GRADIENT_ACCUMULATION_STEPS": "3"},
]  # fmt: skip


@pytest.mark.parametrize("environment", DS_ENVIRONMENTS)
def test_deepspeed_fields_left_at_none_are_read_as_hf_reads_them(environment, monkeypatch) -> None:
    pytest.importorskip("deepspeed")
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    ours, theirs = DeepSpeedPlugin(), accelerate.utils.DeepSpeedPlugin()
    # Options left unset stay None here (accelify's defaults apply when the config is built),
    # where HF writes its defaults in: compare what the environment gave, and the ZeRO stage.
    for name, value in DeepSpeedSettings.from_env(os.environ).options.items():
        assert getattr(ours, name) == getattr(theirs, name) == value, name
    assert ours.zero3_init_flag == theirs.zero3_init_flag
    stage = theirs.deepspeed_config["zero_optimization"]["stage"]
    assert ours.deepspeed_config["zero_optimization"]["stage"] == stage


# --- refusals ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"activation_checkpointing": True}, r"\(activation_checkpointing=True\) is not supported"),
        ({"ignored_modules": "lm_head"}, r"\(ignored_modules='lm_head'\) is not supported"),
        ({"param_init_fn": len}, r"\(param_init_fn=<built-in function len>\) is not supported"),
        ({"auto_wrap_policy": len}, r"\(auto_wrap_policy=.*give 'transformer_based_wrap'"),
        ({"state_dict_type": "LOCAL_STATE_DICT"}, r"\(state_dict_type=...\): .*LOCAL_STATE_DICT"),
        ({"cpu_offload": CPUOffloadPolicy(pin_memory=False)}, r"\(cpu_offload=.*pinned memory"),
        ({"fsdp_version": 3}, "fsdp_version must be 1 or 2"),
        ({"fsdp_version": 2, "reshard_after_forward": "FULL_SHARD"}, "must be a bool"),
        ({"mixed_precision_policy": {"buffer_dtype": torch.float16}}, "does not cast buffers"),
    ],
)
def test_fsdp_fields_accelify_cannot_honour_are_refused_by_name(fields: dict, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        FullyShardedDataParallelPlugin(**fields)


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"zero_stage": 5}, r"DeepSpeedPlugin\(zero_stage=5\): must be 0, 1, 2 or 3"),
        ({"is_train_batch_min": False}, r"\(is_train_batch_min=False\) is not supported"),
        ({"transformer_moe_cls_names": "MoE"}, r"\(transformer_moe_cls_names='MoE'\) is not"),
        ({"enable_msamp": True}, r"\(enable_msamp=True\) is not supported"),
        ({"offload_param_nvme_path": "/nvme"}, r"offload_param_nvme_path='/nvme'\) is not"),
        ({"hf_ds_config": {"fp16": {}}}, "needs a zero_optimization section"),
        ({"hf_ds_config": 3}, "a DeepSpeed JSON file's path or a dict"),
        (
            {"hf_ds_config": {"zero_optimization": {"stage": 3}}, "zero_stage": 2},
            r"zero_optimization.stage=3 in DeepSpeedPlugin\(hf_ds_config=...\) but zero_stage=2",
        ),
    ],
)
def test_deepspeed_fields_accelify_cannot_honour_are_refused_by_name(fields, says) -> None:
    with pytest.raises(ValueError, match=says):
        DeepSpeedPlugin(**fields)


def test_fsdp1_settings_run_on_fsdp2_as_accel_run_maps_them() -> None:
    plugin = FullyShardedDataParallelPlugin(sharding_strategy=ShardingStrategy.SHARD_GRAD_OP)
    assert plugin.settings() == FsdpOptions.from_env({"FSDP_SHARDING_STRATEGY": "SHARD_GRAD_OP"})
    by_number = FullyShardedDataParallelPlugin(fsdp_version=1, reshard_after_forward="3")
    assert by_number.settings().mesh == "replicate"  # NO_SHARD


def test_hfs_plugin_objects_are_refused_naming_accelifys(monkeypatch) -> None:
    hf_plugin = accelerate.utils.FullyShardedDataParallelPlugin(fsdp_version=2)
    with pytest.raises(TypeError, match=r"use accelify.runtime.FullyShardedDataParallelPlugin"):
        Accelerator(fsdp_plugin=hf_plugin)
    with pytest.raises(
        TypeError, match=r"got builtins.object: use accelify.runtime.DeepSpeedPlugin"
    ):
        Accelerator(deepspeed_plugin=object())
    assert "ACCELERATE_USE_FSDP" not in os.environ


def test_two_plugins_or_several_deepspeed_ones_are_refused() -> None:
    with pytest.raises(ValueError, match="deepspeed_plugin or fsdp_plugin, not both"):
        Accelerator(
            deepspeed_plugin=DeepSpeedPlugin(), fsdp_plugin=FullyShardedDataParallelPlugin()
        )
    with pytest.raises(ValueError, match="several DeepSpeed plugins are not supported"):
        Accelerator(deepspeed_plugin={"a": DeepSpeedPlugin()})
