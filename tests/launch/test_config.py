"""The config module: accelerate's YAML schema, where the default file lives, flags over file."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from accelify.runtime.launch import config as cfg
from accelify.runtime.launch.cli import main

# What `accelerate config default` writes on a CPU-only machine (accelerate 1.x).
ACCELERATE_DEFAULT = """\
compute_environment: LOCAL_MACHINE
debug: false
distributed_type: 'NO'
downcast_bf16: 'no'
enable_cpu_affinity: false
machine_rank: 0
main_training_function: main
mixed_precision: 'no'
num_machines: 1
num_processes: 1
rdzv_backend: static
same_network: true
tpu_env: []
tpu_use_cluster: false
tpu_use_sudo: false
use_cpu: true
"""


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return path


def test_default_path_follows_accelerates_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HOME", "/h")
    assert cfg.default_config_path() == Path("/h/accelerate/default_config.yaml")
    monkeypatch.delenv("HF_HOME")
    monkeypatch.setenv("XDG_CACHE_HOME", "/x")
    assert cfg.default_config_path() == Path("/x/huggingface/accelerate/default_config.yaml")
    monkeypatch.delenv("XDG_CACHE_HOME")
    expected = Path.home() / ".cache/huggingface/accelerate/default_config.yaml"
    assert cfg.default_config_path() == expected


def test_an_accelerate_default_config_is_read(tmp_path: Path) -> None:
    values = cfg.load_file(_write(tmp_path, ACCELERATE_DEFAULT))
    assert values["use_cpu"] is True
    assert values["num_processes"] == 1
    assert values["mixed_precision"] == "no"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("use_cpu: true\nlearning_rate: 3\n", ":2: learning_rate: unknown key (accel-run reads:"),
        ("num_processes: 0\n", ":1: num_processes: must be a positive integer, got 0"),
        ("mixed_precision: fp8\n", ":1: mixed_precision: must be one of no, fp16, bf16"),
        ("distributed_type: TPU\n", ":1: distributed_type: must be one of NO, MULTI_CPU"),
        ("main_training_function: train\n", ":1: main_training_function: 'train' is not"),
        ("dynamo_config:\n  dynamo_backend: turbo\n", ":1: dynamo_config: dynamo_backend: must"),
        ("use_cpu: true\n# caf\xe9\n", ":2: not UTF-8 text (byte 0xe9); save it as UTF-8"),
        ("num_processes: [\n", ":2: not valid YAML"),
        ("- 1\n", ":1: a config file must be a mapping"),
    ],
)
def test_bad_config_files_name_the_line_and_key(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "config.yaml"
    path.write_bytes(text.encode("latin-1"))  # latin-1: the one case that is not UTF-8
    with pytest.raises(cfg.ConfigError) as err:
        cfg.load_file(path)
    assert str(err.value).startswith(f"{path}{message}")


@pytest.mark.parametrize(
    "text",
    [
        "dynamo_backend: 'NO'\n",  # accelerate's older configs: "NO" means off
        "dynamo_config: {}\n",
        "dynamo_config:\n  dynamo_backend: 'NO'\n",
        "dynamo_config:\n  backend: no\n",  # YAML's no is false: off too
    ],
)
def test_every_spelling_of_dynamo_off_is_read_as_off(tmp_path: Path, text: str) -> None:
    settings = cfg.resolve(cfg.load_file(_write(tmp_path, text)), {}, lambda: 0)
    assert settings.dynamo_backend == "NO"
    assert cfg.child_env(settings)["ACCELERATE_DYNAMO_BACKEND"] == "NO"


def test_a_dynamo_section_reaches_hf_accelerates_variables(tmp_path: Path) -> None:
    text = "dynamo_config:\n  dynamo_backend: inductor\n  dynamo_mode: max-autotune\n"
    env = cfg.child_env(cfg.resolve(cfg.load_file(_write(tmp_path, text)), {}, lambda: 0))
    assert (env["ACCELERATE_DYNAMO_BACKEND"], env["ACCELERATE_DYNAMO_MODE"]) == (
        "INDUCTOR",
        "max-autotune",
    )
    assert env["ACCELERATE_DYNAMO_USE_FULLGRAPH"] == "False"


def test_flags_override_the_file_and_the_rest_is_derived(tmp_path: Path) -> None:
    text = "distributed_type: MULTI_CPU\nnum_processes: 4\nmixed_precision: bf16\n"
    path = _write(tmp_path, text)
    settings = cfg.load_settings(str(path), {"num_processes": 2})

    assert settings.num_processes == 2
    assert settings.mixed_precision == "bf16"
    assert settings.use_cpu  # MULTI_CPU implies it
    assert settings.resolved_distributed_type == "MULTI_CPU"


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"num_processes": 3, "num_machines": 2}, r"must be a multiple of num_machines \(2\)"),
        ({"num_machines": 2, "machine_rank": 2, "num_processes": 2}, "must be below"),
        ({"num_machines": 2, "num_processes": 2}, "need --main-process-ip"),
    ],
)
def test_inconsistent_settings_are_refused(flags: dict, message: str) -> None:
    with pytest.raises(cfg.ConfigError, match=message):
        cfg.resolve({}, {"use_cpu": True, **flags}, lambda: 0)


def test_default_process_count_is_one_per_gpu_else_one() -> None:
    assert cfg.resolve({}, {}, lambda: 4).num_processes == 4
    assert cfg.resolve({}, {"gpu_ids": "0,2"}, lambda: 4).num_processes == 2
    assert cfg.resolve({}, {}, lambda: 0).num_processes == 1
    assert cfg.resolve({}, {"use_cpu": True}, lambda: 4).num_processes == 1


def test_child_env_uses_accelerates_names() -> None:
    settings = cfg.resolve(
        {}, {"mixed_precision": "fp16", "gpu_ids": "1", "gradient_accumulation_steps": 2}, lambda: 2
    )
    env = cfg.child_env(settings, environ={"OMP_NUM_THREADS": "3", "PYTHONHASHSEED": "5"})
    assert env == {
        "ACCELERATE_MIXED_PRECISION": "fp16",
        "ACCELERATE_USE_CPU": "False",
        "ACCELERATE_GRADIENT_ACCUMULATION_STEPS": "2",
        "CUDA_VISIBLE_DEVICES": "1",
        "ACCELERATE_DYNAMO_BACKEND": "NO",
        "ACCELERATE_DYNAMO_MODE": "default",
        "ACCELERATE_DYNAMO_USE_FULLGRAPH": "False",
        "ACCELERATE_DYNAMO_USE_DYNAMIC": "False",
        "ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION": "False",
    }


def test_processes_share_one_string_hash_unless_the_user_chose_one() -> None:
    settings = cfg.resolve({}, {}, lambda: 0)
    assert cfg.child_env(settings, environ={})["PYTHONHASHSEED"] == "0"
    assert "PYTHONHASHSEED" not in cfg.child_env(settings, environ={"PYTHONHASHSEED": "7"})


def test_a_sharded_backend_on_cpu_never_gets_accelerate_use_cpu() -> None:
    """HF's Accelerator with ACCELERATE_USE_CPU drops DeepSpeed/FSDP for DDP without a word."""
    flags = {"use_cpu": True, "num_processes": 2, "num_cpu_threads_per_process": 3}
    plain = cfg.child_env(cfg.resolve({}, flags, lambda: 0), environ={"OMP_NUM_THREADS": "8"})
    assert (plain["ACCELERATE_USE_CPU"], plain["OMP_NUM_THREADS"]) == ("True", "3")
    for kind in cfg.SHARDED_TYPES:
        sharded = cfg.resolve({}, {**flags, "distributed_type": kind}, lambda: 0)
        env = cfg.child_env(sharded)
        assert "ACCELERATE_USE_CPU" not in env
        assert env["CUDA_VISIBLE_DEVICES"] == ""  # use_cpu still means the CPU


def test_config_default_writes_what_accel_run_then_reads(
    hf_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as done:
        main(["config", "--default", "--mixed-precision", "bf16"])
    assert done.value.code == 0
    written = hf_home / "accelerate" / "default_config.yaml"
    assert f"wrote {written}" in capsys.readouterr().out

    assert cfg.load_settings(None, {}).mixed_precision == "bf16"
    with pytest.raises(SystemExit) as done:
        main(["env"])
    report = capsys.readouterr().out
    assert done.value.code == 0
    assert f"- Config file: {written}" in report
    assert "  mixed_precision: bf16" in report
    assert "- torch version: " in report

    with pytest.raises(SystemExit) as again:
        main(["config", "--default"])
    assert again.value.code == 2
    assert "already exists; pass --force" in capsys.readouterr().err


def test_accelerates_spelling_config_default_works_too(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``accelerate config default --config_file F --mixed_precision fp16``, renamed only."""
    target = tmp_path / "default.yaml"
    argv = ["config", "default", "--config_file", str(target), "--mixed_precision", "fp16"]
    with pytest.raises(SystemExit) as done:
        main(argv)
    assert done.value.code == 0
    assert f"wrote {target}" in capsys.readouterr().out
    assert cfg.load_settings(str(target), {}).mixed_precision == "fp16"


def test_config_asks_and_re_asks_on_bad_answers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO("y\n0\n2\nfp16\n"))
    target = tmp_path / "asked.yaml"
    with pytest.raises(SystemExit) as done:
        main(["config", "--config-file", str(target)])
    assert done.value.code == 0
    assert "must be a positive integer, got '0'" in capsys.readouterr().out
    settings = cfg.load_settings(str(target), {})
    assert (settings.use_cpu, settings.num_processes, settings.mixed_precision) == (True, 2, "fp16")
    assert "distributed_type: MULTI_CPU" in target.read_text()


def test_a_backend_section_plugs_in_without_other_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    class StandIn:
        def __init__(self, values: dict) -> None:
            self.values = values

        def env(self) -> dict[str, str]:
            return {"ACCELERATE_USE_FSDP": "true", "FSDP_MIN_NUM_PARAMS": str(self.values["n"])}

    path = _write(tmp_path, "megatron_lm_config:\n  n: 7\n")
    with pytest.raises(cfg.ConfigError, match="megatron_lm_config: unknown key"):
        cfg.load_file(path)

    monkeypatch.setitem(cfg.SECTIONS, "megatron_lm_config", StandIn)
    settings = cfg.load_settings(str(path), {"use_cpu": True})
    env = cfg.child_env(settings)
    assert (env["ACCELERATE_USE_FSDP"], env["FSDP_MIN_NUM_PARAMS"]) == ("true", "7")
