"""DeepSpeed ZeRO-2 and ZeRO-3 on 2 CPU processes through accel-run, against plain DDP.

One module-wide set of runs serves every assertion: each stage trains straight through (saving
after epoch 0), and again resuming from that checkpoint in new processes; ZeRO-3 also in bf16.
Final fp32 weights must equal DDP's within 1e-6 (only the order of the gradient reduction
differs).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from accelify.runtime import deepspeed_config as dsc
from accelify.runtime.checkpoint import load_weights

from .conftest import fresh_model_from, max_difference, resumed_run, run_sharded

pytest.importorskip("deepspeed")
TOLERANCE = 1e-6
STAGES = ("2", "3")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    found = {}
    for stage in STAGES:
        flags = ("--use-deepspeed", "--zero-stage", stage)
        straight = tmp_path_factory.mktemp(f"zero{stage}")
        found[stage] = {**run_sharded(straight, *flags), "dir": straight}
        found[f"{stage}-resumed"] = resumed_run(
            straight, tmp_path_factory.mktemp(f"zero{stage}_resumed"), *flags
        )
    bf16 = tmp_path_factory.mktemp("zero3_bf16")
    flags = ("--use-deepspeed", "--zero-stage", "3", "--mixed-precision", "bf16")
    found["3-bf16"] = {**run_sharded(bf16, *flags), "dir": bf16}
    return found


@pytest.mark.slow
@pytest.mark.parametrize("stage", STAGES)
def test_zero_trains_like_ddp(runs: dict, ddp_run: dict, stage: str) -> None:
    run = runs[stage]
    assert run["type"] == "DEEPSPEED"
    losses = run["losses"]
    assert sum(losses[-8:]) < 0.8 * sum(losses[:8])  # last epoch vs first
    assert losses == pytest.approx(ddp_run["losses"], abs=TOLERANCE)
    assert max_difference(run["params"], ddp_run["params"]) < TOLERANCE
    assert run["lr"] == pytest.approx(ddp_run["lr"])


@pytest.mark.slow
@pytest.mark.parametrize("stage", STAGES)
def test_zero_resumes_from_its_engine_checkpoint_identically(runs: dict, stage: str) -> None:
    straight, resumed = runs[stage], runs[f"{stage}-resumed"]
    assert (straight["dir"] / "state" / "pytorch_model").is_dir()  # the engine's own format
    assert resumed["losses"] == straight["losses"][8:]  # epochs 1 and 2, bit for bit
    assert resumed["params"] == straight["params"]


@pytest.mark.slow
@pytest.mark.parametrize("stage", STAGES)
def test_save_model_gives_full_weights_for_a_fresh_model(runs: dict, stage: str) -> None:
    model = fresh_model_from(runs[stage]["dir"] / "model")
    saved = {name: value.tolist() for name, value in model.state_dict().items()}
    assert max_difference(saved, runs[stage]["params"]) == 0


@pytest.mark.slow
def test_bf16_from_the_launch_trains_and_saves_16_bit_weights(runs: dict) -> None:
    run = runs["3-bf16"]
    assert sum(run["losses"][-8:]) < 0.8 * sum(run["losses"][:8])
    weights = load_weights(run["dir"] / "model")
    assert {tensor.dtype for tensor in weights.values()} == {torch.bfloat16}
    fresh_model_from(run["dir"] / "model")  # loads (strictly) into an fp32 model


# --- the config: "auto" filling and conflicts (no processes) -----------------------------------


def test_auto_values_are_filled_from_the_script() -> None:
    config = dsc.merge_options(None, {"zero_stage": 3}, "the launch options")
    filled = dsc.fill_from_script(
        config, micro_batch_size=8, accumulation_steps=4, num_processes=2, mixed_precision="bf16"
    )
    assert filled["zero_optimization"]["stage"] == 3
    assert filled["train_micro_batch_size_per_gpu"] == 8
    assert filled["gradient_accumulation_steps"] == 4
    assert filled["train_batch_size"] == 64
    assert filled["bf16"] == {"enabled": True}
    assert filled["gradient_clipping"] == 0.0  # none asked for: no clipping (HF would clip at 1.0)


def test_a_file_value_and_a_launch_option_that_differ_are_both_named() -> None:
    file = {"zero_optimization": {"stage": 2}, "gradient_clipping": "auto"}
    merged = dsc.merge_options(file, {"gradient_clipping": 0.5}, "ds.json")
    assert merged["gradient_clipping"] == 0.5
    with pytest.raises(ValueError) as err:
        dsc.merge_options(file, {"zero_stage": 3}, "ds.json")
    assert str(err.value) == (
        "conflicting DeepSpeed settings: zero_optimization.stage=2 in ds.json but zero_stage=3 "
        "in the launch"
    )


@pytest.mark.parametrize(
    ("config", "kwargs", "message"),
    [
        ({"gradient_accumulation_steps": 8}, {}, "=8 in the DeepSpeed config but grad"),
        ({"train_micro_batch_size_per_gpu": 2}, {}, "DataLoader gives 4 samples per process"),
        ({"fp16": {"enabled": True}}, {"mixed_precision": "bf16"}, "fp16.enabled=True in the"),
        ({"optimizer": {"params": {"lr": "auto"}}}, {}, "left 'auto' .*optimizer.params.lr"),
        ({}, {"micro_batch_size": None}, "pass the training DataLoader to the same prepare"),
    ],
)
def test_what_the_script_contradicts_is_refused(config: dict, kwargs: dict, message: str) -> None:
    options = {"micro_batch_size": 4, "accumulation_steps": 2, "num_processes": 2}
    options.update({"mixed_precision": "no", **kwargs})
    with pytest.raises(ValueError, match=message):
        dsc.fill_from_script({"zero_optimization": {"stage": 2}, **config}, **options)


def test_config_files_are_checked_with_their_line(tmp_path: Path) -> None:
    bad = tmp_path / "ds.json"
    bad.write_text('{\n  "zero_optimization": {"stage": 2},\n}\n')
    with pytest.raises(ValueError, match=rf"^{bad}:3: not valid JSON"):
        dsc.read_file(bad)
    bad.write_text('{"train_batch_size": 8}')
    with pytest.raises(ValueError, match="needs a zero_optimization section"):
        dsc.read_file(bad)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize(
    "flags",
    [
        ("--zero-stage", "3", "--mixed-precision", "bf16"),
        ("--zero-stage", "2", "--mixed-precision", "fp16", "--offload-optimizer-device", "cpu"),
        ("--zero-stage", "3", "--offload-param-device", "cpu", "--offload-optimizer-device", "cpu"),
    ],
    ids=["zero3-bf16", "zero2-fp16-offload", "zero3-offload"],
)
def test_cuda_paths_train(tmp_path: Path, flags: tuple[str, ...]) -> None:
    run = run_sharded(tmp_path, "--use-deepspeed", *flags, cpu=False)
    assert run["type"] == "DEEPSPEED"
    assert sum(run["losses"][-8:]) < sum(run["losses"][:8])


def test_deepspeed_and_fsdp_load_only_when_a_launch_selects_them() -> None:
    code = (
        "import sys; from accelify.runtime import Accelerator; Accelerator(cpu=True); "
        "print([m for m in ('deepspeed', 'torch.distributed.fsdp') if m in sys.modules])"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCELERATE_")}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "[]"
