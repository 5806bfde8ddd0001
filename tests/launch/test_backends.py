"""accel-run's DeepSpeed and FSDP settings: accelerate's YAML sections, flags and worker env.

The YAML inputs are the Trainer guide's examples (FSDP, DeepSpeed with a config file, DeepSpeed
with accelerate's plugin keys); the env they give is read back by the runtime's own parsers, so
launcher and runtime are checked against each other.
"""

from __future__ import annotations

from importlib.metadata import version
from pathlib import Path

import pytest

from accelify.runtime import deepspeed_config as dsc
from accelify.runtime.launch import backends
from accelify.runtime.launch import config as cfg
from accelify.runtime.launch.cli import flag_values, launch_parser, main

COMMON = """\
compute_environment: LOCAL_MACHINE
downcast_bf16: 'no'
machine_rank: 0
main_training_function: main
num_machines: 1
rdzv_backend: static
same_network: true
tpu_env: []
tpu_use_cluster: false
tpu_use_sudo: false
use_cpu: false
"""
GUIDE_FSDP = """\
distributed_type: FSDP
fsdp_config:
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
  fsdp_backward_prefetch_policy: BACKWARD_PRE
  fsdp_forward_prefetch: true
  fsdp_offload_params: false
  fsdp_sharding_strategy: 1
  fsdp_state_dict_type: FULL_STATE_DICT
  fsdp_sync_module_states: true
  fsdp_transformer_layer_cls_to_wrap: BertLayer
  fsdp_use_orig_params: true
mixed_precision: bf16
num_processes: 2
"""
GUIDE_DEEPSPEED_FILE = """\
deepspeed_config:
  deepspeed_config_file: {path}
  zero3_init_flag: true
distributed_type: DEEPSPEED
num_processes: 4
"""
GUIDE_DEEPSPEED_PLUGIN = """\
deepspeed_config:
  gradient_accumulation_steps: 1
  gradient_clipping: 0.7
  offload_optimizer_device: cpu
  offload_param_device: cpu
  zero3_init_flag: true
  zero_stage: 2
distributed_type: DEEPSPEED
mixed_precision: bf16
num_processes: 4
"""


def _settings(tmp_path: Path, text: str, *flags: str) -> cfg.Settings:
    path = tmp_path / "config.yaml"
    path.write_text(COMMON + text)
    args = launch_parser().parse_args([*flags, "train.py"])
    return backends.apply(cfg.load_settings(str(path), flag_values(args)), args)


def test_the_guides_fsdp_config_reaches_the_runtime(tmp_path: Path) -> None:
    from accelify.runtime.strategies.fsdp import FsdpOptions  # imports torch: only here

    settings = _settings(tmp_path, GUIDE_FSDP)
    env = cfg.child_env(settings)

    assert settings.resolved_distributed_type == "FSDP"
    assert env["ACCELERATE_USE_FSDP"] == "true"
    assert env["ACCELERATE_MIXED_PRECISION"] == "bf16"
    assert env["FSDP_TRANSFORMER_CLS_TO_WRAP"] == "BertLayer"
    assert (env["FSDP_SYNC_MODULE_STATES"], env["FSDP_OFFLOAD_PARAMS"]) == ("true", "false")
    assert "FSDP_BACKWARD_PREFETCH" not in env  # the old _policy key: accelerate sets nothing
    # Keys the file leaves out get accelerate's launcher defaults, as under `accelerate launch`.
    assert (env["FSDP_VERSION"], env["FSDP_CPU_RAM_EFFICIENT_LOADING"]) == ("1", "true")
    assert FsdpOptions.from_env(env) == FsdpOptions(
        auto_wrap_policy="TRANSFORMER_BASED_WRAP",
        layer_classes=("BertLayer",),
        min_num_params=100_000_000,
    )


def test_the_guides_deepspeed_plugin_keys_reach_the_runtime(tmp_path: Path) -> None:
    settings = _settings(tmp_path, GUIDE_DEEPSPEED_PLUGIN, "--zero-stage", "3")
    env = cfg.child_env(settings)

    assert env["ACCELERATE_USE_DEEPSPEED"] == "true"
    assert env["ACCELERATE_DEEPSPEED_ZERO3_INIT"] == "true"
    assert "DS_ACCELERATOR" not in env  # only with --cpu
    assert dsc.options_from_env(env) == {
        "zero_stage": 3,  # the flag over the file's 2
        "offload_optimizer_device": "cpu",
        "offload_param_device": "cpu",
        "gradient_clipping": 0.7,
        "gradient_accumulation_steps": 1,
    }


def test_the_guides_deepspeed_config_file_is_checked_before_launch(tmp_path: Path) -> None:
    ds_json = tmp_path / "ds_zero3_config.json"
    ds_json.write_text('{"zero_optimization": {"stage": 3}, "gradient_clipping": "auto"}')
    text = GUIDE_DEEPSPEED_FILE.format(path=ds_json)

    env = cfg.child_env(_settings(tmp_path, text, "--cpu", "--gradient-clipping", "1.5"))
    assert env[dsc.CONFIG_FILE_ENV] == str(ds_json)
    assert (env["ACCELERATE_GRADIENT_CLIPPING"], env["DS_ACCELERATOR"]) == ("1.5", "cpu")

    with pytest.raises(cfg.ConfigError) as err:
        _settings(tmp_path, text, "--zero-stage", "2")
    assert str(err.value) == (
        f"conflicting DeepSpeed settings: zero_optimization.stage=3 in {ds_json} but "
        "zero_stage=2 in the launch"
    )
    missing = GUIDE_DEEPSPEED_FILE.format(path="/home/user/configs/ds_zero3_config.json")
    with pytest.raises(cfg.ConfigError, match=r"ds_zero3_config.json:0: cannot read"):
        _settings(tmp_path, missing)


def test_a_section_of_the_backend_not_launched_is_left_out(tmp_path: Path) -> None:
    settings = _settings(tmp_path, GUIDE_FSDP.replace("FSDP\n", "MULTI_GPU\n", 1), "--cpu")
    assert settings.sections == {}
    assert "ACCELERATE_USE_FSDP" not in cfg.child_env(settings)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--zero-stage", "3"], "--zero-stage needs --use-deepspeed (or its distributed_type)"),
        (["--use-fsdp", "--use-deepspeed"], "--use-deepspeed and --use-fsdp exclude each other"),
        (["--use-deepspeed", "--zero-stage", "4"], "--zero-stage: must be 0, 1, 2 or 3, got '4'"),
        (["--use-fsdp", "--fsdp-state-dict-type", "LOCAL_STATE_DICT"], "--fsdp-state-dict-type:"),
        (["--use-fsdp", "--fsdp-activation-checkpointing", "true"], "true is not supported"),
        (["--use-deepspeed", "--offload-param-device", "disk"], "must be one of none, cpu, nvme"),
    ],
)
def test_bad_backend_flags_are_one_line_usage_errors(
    args: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = tmp_path / "train.py"
    script.write_text("")
    with pytest.raises(SystemExit) as done:
        main(["--cpu", *args, str(script)])
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert message in err


def test_section_errors_name_the_line_and_key(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("distributed_type: FSDP\nfsdp_config:\n  fsdp_wrap_everything: true\n")
    with pytest.raises(cfg.ConfigError, match=r":2: fsdp_config: fsdp_wrap_everything: unknown"):
        cfg.load_file(path)


def test_accumulation_in_the_section_and_on_the_command_line_must_agree(tmp_path: Path) -> None:
    with pytest.raises(cfg.ConfigError, match="is 1 in deepspeed_config but --gradient-acc"):
        _settings(tmp_path, GUIDE_DEEPSPEED_PLUGIN, "--gradient-accumulation-steps", "4")


MULTI_MACHINE_DEEPSPEED = """\
deepspeed_config:
  deepspeed_hostfile: /etc/hostfile
  deepspeed_multinode_launcher: {launcher}
  zero_stage: 2
distributed_type: DEEPSPEED
main_process_ip: 10.0.0.1
main_process_port: 29500
num_processes: 4
"""


def test_a_multi_machine_deepspeed_config_runs_with_one_agent_per_machine(tmp_path: Path) -> None:
    standard = MULTI_MACHINE_DEEPSPEED.format(launcher="standard")
    env = cfg.child_env(_settings(tmp_path, standard, "--num-machines", "2"))
    assert env["ACCELERATE_DEEPSPEED_ZERO_STAGE"] == "2"
    assert not any("/etc/hostfile" in value for value in env.values())  # the ssh launchers' key

    pdsh = MULTI_MACHINE_DEEPSPEED.format(launcher="pdsh")
    with pytest.raises(cfg.ConfigError, match="deepspeed_multinode_launcher is pdsh, which"):
        _settings(tmp_path, pdsh, "--num-machines", "2")
    assert _settings(tmp_path, pdsh).num_machines == 1  # one machine: nothing to start elsewhere


def test_env_reports_the_backend_its_version_and_its_variables(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(COMMON + GUIDE_DEEPSPEED_PLUGIN)
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    monkeypatch.setenv("FSDP_VERSION", "2")
    with pytest.raises(SystemExit) as done:
        main(["env", "--config-file", str(path)])
    report = capsys.readouterr().out
    assert done.value.code == 0
    assert f"- deepspeed version: {version('deepspeed')}\n" in report
    assert "  deepspeed_config:\n" in report
    assert "    offload_optimizer_device: cpu\n" in report
    assert "- DS_ACCELERATOR=cpu\n- FSDP_VERSION=2" in report


def test_hf_is_told_which_deepspeed_settings_came_from_the_config_file(tmp_path: Path) -> None:
    """HF's plugin refuses config-file settings beside a DeepSpeed JSON; flags it accepts."""
    keys = "gradient_accumulation_steps,gradient_clipping,offload_optimizer_device,"
    keys += "offload_param_device,zero3_init_flag,zero_stage"
    from_file = cfg.child_env(_settings(tmp_path, GUIDE_DEEPSPEED_PLUGIN, "--zero-stage", "3"))
    assert from_file["ACCELERATE_CONFIG_DS_FIELDS"] == keys + ",mixed_precision"
    flagged = cfg.child_env(_settings(tmp_path, GUIDE_DEEPSPEED_PLUGIN, "--mixed-precision", "no"))
    assert flagged["ACCELERATE_CONFIG_DS_FIELDS"] == keys
    assert "ACCELERATE_USE_CPU" not in flagged
