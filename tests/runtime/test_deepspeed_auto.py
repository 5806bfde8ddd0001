"""HF Accelerate's ZeRO-3 template, every ``"auto"`` in it, filled as HF Accelerate fills it.

The reference is accelerate itself where it can run without a process group: its
``DeepSpeedPlugin`` reads the template and fills what the launch and mixed precision give
(``fill_match``, ``set_mixed_precision``); what ``Accelerator._prepare_deepspeed`` adds from the
loader, the model and the placeholders is its documented formula, applied with the plugin's own
``deepspeed_config_process``. One real 2-process run checks that DeepSpeed accepts the result.
"""

from __future__ import annotations

import copy
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from accelify.runtime import DummyOptim, DummyScheduler
from accelify.runtime import deepspeed_config as dsc

pytest.importorskip("deepspeed")
hf_utils = pytest.importorskip("accelerate.utils")

# accelerate's ZeRO-3 template (its tests/deepspeed/ds_config_zero3.json), with the offload
# devices and paths also left "auto" and gradient accumulation "auto" as its docs show.
TEMPLATE: dict[str, Any] = {
    "fp16": {
        "enabled": "auto",
        "loss_scale": 0,
        "loss_scale_window": 1000,
        "initial_scale_power": 16,
        "hysteresis": 2,
        "min_loss_scale": 1,
    },
    "bf16": {"enabled": "auto"},
    "optimizer": {
        "type": "AdamW",
        "params": {"lr": "auto", "weight_decay": "auto", "torch_adam": True, "adam_w_mode": True},
    },
    "scheduler": {
        "type": "WarmupLR",
        "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto", "warmup_num_steps": "auto"},
    },
    "zero_optimization": {
        "stage": 3,
        "offload_optimizer": {"device": "auto", "nvme_path": "auto", "pin_memory": True},
        "offload_param": {"device": "auto", "nvme_path": "auto", "pin_memory": True},
        "overlap_comm": True,
        "contiguous_gradients": True,
        "sub_group_size": 1e9,
        "reduce_bucket_size": "auto",
        "stage3_prefetch_bucket_size": "auto",
        "stage3_param_persistence_threshold": "auto",
        "stage3_max_live_parameters": 1e9,
        "stage3_max_reuse_distance": 1e9,
        "stage3_gather_16bit_weights_on_model_save": "auto",
    },
    "gradient_accumulation_steps": "auto",
    "gradient_clipping": "auto",
    "steps_per_print": 2000,
    "train_batch_size": "auto",
    "train_micro_batch_size_per_gpu": "auto",
    "wall_clock_breakdown": False,
}
MODEL = SimpleNamespace(config=SimpleNamespace(hidden_size=48))


def _accelify(case: dict[str, Any]) -> dict[str, Any]:
    config = dsc.merge_options(copy.deepcopy(TEMPLATE), {}, "ds.json")
    optimizer = DummyOptim([], lr=case["lr"], weight_decay=case["weight_decay"])
    scheduler = DummyScheduler(optimizer, warmup_num_steps=case["warmup"])
    processes, split = case["processes"], case["split_batches"]
    return dsc.fill_from_script(
        config,
        micro_batch_size=dsc.micro_batch_size(case["batch_sizes"], processes, split),
        accumulation_steps=case["accumulation"],
        num_processes=processes,
        mixed_precision=case["mixed_precision"],
        hidden_size=dsc.hidden_size_of(MODEL),
        declared=dsc.placeholder_fills(
            optimizer, scheduler, num_processes=processes, split_batches=split
        ),
    )


def _hf(case: dict[str, Any]) -> dict[str, Any]:
    """accelerate's plugin, then ``_prepare_deepspeed``'s values (accelerate 1.15)."""
    plugin = hf_utils.DeepSpeedPlugin(hf_ds_config=copy.deepcopy(TEMPLATE))
    plugin.set_mixed_precision(case["mixed_precision"])
    plugin.fill_match(
        "gradient_accumulation_steps",
        must_match=False,
        gradient_accumulation_steps=case["accumulation"],
    )
    sizes = case["batch_sizes"]
    if case["split_batches"]:
        sizes = [size // case["processes"] for size in sizes]
    micro = min(sizes)  # is_train_batch_min defaults to True
    hidden = MODEL.config.hidden_size
    optimizer = hf_utils.DummyOptim([], lr=case["lr"], weight_decay=case["weight_decay"])
    scheduler = hf_utils.DummyScheduler(optimizer, warmup_num_steps=case["warmup"])
    plugin.deepspeed_config_process(
        must_match=False,
        **{
            "gradient_clipping": 1.0,
            "zero_optimization.stage3_gather_16bit_weights_on_model_save": False,
            "train_micro_batch_size_per_gpu": micro,
            "train_batch_size": micro * case["accumulation"] * case["processes"],
            "zero_optimization.reduce_bucket_size": hidden * hidden,
            "zero_optimization.stage3_prefetch_bucket_size": int(0.9 * hidden * hidden),
            "zero_optimization.stage3_param_persistence_threshold": 10 * hidden,
            "optimizer.params.lr": optimizer.lr,
            "optimizer.params.weight_decay": optimizer.weight_decay,
            "scheduler.params.warmup_min_lr": 0,
            "scheduler.params.warmup_max_lr": optimizer.lr,
            "scheduler.params.warmup_num_steps": max(1, scheduler.warmup_num_steps),
        },
    )
    return plugin.deepspeed_config


CASES = {
    "bf16-train-and-eval-loaders": {
        "mixed_precision": "bf16",
        "accumulation": 4,
        "processes": 2,
        "split_batches": False,
        "batch_sizes": [8, 32],
        "lr": 3e-4,
        "weight_decay": 0.01,
        "warmup": 10,
    },
    "fp16-split-batches-no-warmup": {
        "mixed_precision": "fp16",
        "accumulation": 1,
        "processes": 4,
        "split_batches": True,
        "batch_sizes": [16],
        "lr": 1e-3,
        "weight_decay": 0.0,
        "warmup": 0,
    },
    "fp32": {
        "mixed_precision": "no",
        "accumulation": 2,
        "processes": 1,
        "split_batches": False,
        "batch_sizes": [5],
        "lr": 0.02,
        "weight_decay": 0.1,
        "warmup": 3,
    },
}


@pytest.mark.parametrize("name", CASES)
def test_the_template_is_filled_exactly_as_hf_fills_it(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for variable in [v for v in os.environ if v.startswith("ACCELERATE_")]:
        monkeypatch.delenv(variable)  # the plugin reads the launcher's variables
    ours, theirs = _accelify(CASES[name]), _hf(CASES[name])
    assert theirs.pop("steps_per_print") == math.inf  # HF silences DeepSpeed's own logging
    assert ours.pop("steps_per_print") == 2000
    assert ours == theirs
    assert dsc._auto_paths(ours) == []


def test_hidden_size_values_follow_hfs_formula() -> None:
    keys = {"reduce_bucket_size", "stage3_prefetch_bucket_size"}
    keys.add("stage3_param_persistence_threshold")
    config = {"zero_optimization": dict.fromkeys(keys, "auto")}
    many = SimpleNamespace(config=SimpleNamespace(hidden_sizes=[32, 1024, 64]))
    filled = dsc.fill_from_script(
        config,
        micro_batch_size=2,
        accumulation_steps=1,
        num_processes=1,
        mixed_precision="no",
        hidden_size=dsc.hidden_size_of(many),  # the largest, as HF
    )
    assert filled["zero_optimization"] == {
        "reduce_bucket_size": 1024 * 1024,
        "stage3_prefetch_bucket_size": int(0.9 * 1024 * 1024),
        "stage3_param_persistence_threshold": 10 * 1024,
    }


@pytest.mark.parametrize(
    "model", [torch.nn.Linear(2, 2), SimpleNamespace(config=SimpleNamespace(vocab_size=9))]
)
def test_a_hidden_size_auto_without_a_hidden_size_is_one_error_naming_the_keys(
    model: Any,
) -> None:
    config = {"zero_optimization": {"stage": 3, "reduce_bucket_size": "auto"}}
    config["zero_optimization"]["stage3_param_persistence_threshold"] = "auto"
    with pytest.raises(ValueError) as err:
        dsc.fill_from_script(
            config,
            micro_batch_size=2,
            accumulation_steps=1,
            num_processes=1,
            mixed_precision="no",
            hidden_size=dsc.hidden_size_of(model),
        )
    assert str(err.value) == (
        "DeepSpeed config values ['zero_optimization.reduce_bucket_size', "
        "'zero_optimization.stage3_param_persistence_threshold'] are 'auto', which is filled "
        "from the model's config.hidden_size (or config.hidden_sizes), and the model has none: "
        "replace 'auto' with an integer for these keys"
    )


def test_explicit_values_and_launch_options_beat_the_launch_defaults() -> None:
    config = dsc.merge_options(copy.deepcopy(TEMPLATE), {"zero3_save_16bit_model": True}, "ds")
    zero = config["zero_optimization"]
    assert zero["stage3_gather_16bit_weights_on_model_save"] is True
    assert zero["offload_param"]["device"] == "none"
    assert dsc.merge_options({"zero_optimization": {"stage": "auto"}}, {}, "ds") == {
        "zero_optimization": {"stage": 2}
    }


def test_a_loader_without_an_integer_batch_size_cannot_fill_the_micro_batch() -> None:
    assert dsc.micro_batch_size([8, None], 2, split_batches=False) is None
    with pytest.raises(ValueError, match=r"with an integer batch_size\), or set train_micro"):
        dsc.fill_from_script(
            {"zero_optimization": {"stage": 2}, "train_micro_batch_size_per_gpu": "auto"},
            micro_batch_size=None,
            accumulation_steps=1,
            num_processes=1,
            mixed_precision="no",
        )


# --- the template through deepspeed.initialize on 2 gloo processes ------------------------------

SCRIPT = """
import json, sys
from types import SimpleNamespace
import torch
from torch.utils.data import DataLoader, TensorDataset
from accelify.runtime import Accelerator, DummyOptim, DummyScheduler

accelerator = Accelerator(gradient_accumulation_steps=2)
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 1))
model.config = SimpleNamespace(hidden_size=8)
optimizer = DummyOptim(model.parameters(), lr=0.01, weight_decay=0.0)
scheduler = DummyScheduler(optimizer, warmup_num_steps=2)
loader = DataLoader(TensorDataset(torch.randn(16, 4), torch.randn(16, 1)), batch_size=2)
model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
for x, y in loader:
    with accelerator.accumulate(model):
        accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
if accelerator.is_main_process:
    with open(sys.argv[1], "w") as handle:
        json.dump(model.config, handle)
accelerator.end_training()
"""


@pytest.mark.slow
def test_deepspeed_trains_with_the_filled_template(tmp_path: Path) -> None:
    config, script, out = tmp_path / "ds.json", tmp_path / "train.py", tmp_path / "config.json"
    config.write_text(json.dumps(TEMPLATE))
    script.write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ACCELERATE_", "DS_"))}
    env["OMP_NUM_THREADS"] = "1"
    command = [sys.executable, "-c", "from accelify.runtime.launch.cli import main; main()"]
    command += ["--num-processes", "2", "--cpu", "--use-deepspeed"]
    command += ["--deepspeed-config-file", str(config), str(script), str(out)]
    done = subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    used = json.loads(out.read_text())
    assert used["train_batch_size"] == 2 * 2 * 2
    assert used["zero_optimization"]["reduce_bucket_size"] == 64
    assert used["zero_optimization"]["stage3_param_persistence_threshold"] == 80
    assert used["gradient_clipping"] == 1.0
    assert used["scheduler"]["params"]["warmup_max_lr"] == 0.01
