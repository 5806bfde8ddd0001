"""Whose optimizer DeepSpeed steps: the script's (swapped for a CPU one under ZeRO-Offload) or
the one its config declares, stood for in the script by ``DummyOptim``/``DummyScheduler``.

Processes run fixtures/runtime/train_sharded.py on 2 CPU processes through accel-run, like
test_deepspeed.py; the config checks below them start none.
"""

from __future__ import annotations

import json

import pytest
import torch

from accelify.runtime import Accelerator, DummyOptim, DummyScheduler
from accelify.runtime import deepspeed_config as dsc

from .conftest import max_difference, resumed_run, run_sharded

pytest.importorskip("deepspeed")

ADAM = ("--optimizer", "adam")
DECLARED = ("--optimizer", "declared")
# The config HF Accelerate's DeepSpeed guide shows for a config-declared optimizer and schedule;
# torch_adam keeps DeepSpeed from JIT-building its fused Adam, which a CPU-only host lacks.
DECLARED_CONFIG = {
    "zero_optimization": {"stage": 2},
    "optimizer": {
        "type": "AdamW",
        "params": {"lr": "auto", "weight_decay": "auto", "torch_adam": True},
    },
    "scheduler": {
        "type": "WarmupDecayLR",
        "params": {
            "warmup_min_lr": "auto",
            "warmup_max_lr": "auto",
            "warmup_num_steps": "auto",
            "total_num_steps": "auto",
        },
    },
    "train_micro_batch_size_per_gpu": "auto",
    "gradient_accumulation_steps": "auto",
}


# ZeRO-3 offloading both takes the same CPU Adam as ZeRO-2 offloading the optimizer only (whose
# launch settings tests/launch/test_env_contract.py checks), and offloads parameters too.
OFFLOADS = {
    "zero3-optimizer-and-params": (
        *("--zero-stage", "3", "--offload-optimizer-device", "cpu"),
        *("--offload-param-device", "cpu"),
    ),
}


@pytest.fixture(scope="module")
def offload_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    runs = {
        name: run_sharded(tmp_path_factory.mktemp(name), "--use-deepspeed", *flags, script=ADAM)
        for name, flags in OFFLOADS.items()
    }
    return {**runs, "ddp": run_sharded(tmp_path_factory.mktemp("ddp_adam"), script=ADAM)}


@pytest.fixture(scope="module")
def declared_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    config = tmp_path_factory.mktemp("config") / "ds.json"
    config.write_text(json.dumps(DECLARED_CONFIG))
    flags = ("--use-deepspeed", "--deepspeed-config-file", str(config))
    straight = tmp_path_factory.mktemp("declared")
    return {
        "straight": run_sharded(straight, *flags, script=DECLARED),
        "resumed": resumed_run(
            straight, tmp_path_factory.mktemp("declared_resumed"), *flags, script=DECLARED
        ),
    }


@pytest.mark.slow
@pytest.mark.parametrize("offload", OFFLOADS)
def test_offload_steps_the_scripts_adam_on_the_cpu_like_ddp(
    offload_runs: dict, offload: str
) -> None:
    """DeepSpeed refuses a torch Adam under ZeRO-Offload; its CPU Adam takes over, same maths.

    The vectorised CPU Adam rounds differently from torch's: 1e-5 over 24 steps (measured 2e-7).
    """
    run, ddp = offload_runs[offload], offload_runs["ddp"]
    assert run["type"] == "DEEPSPEED"
    assert max_difference(run["params"], ddp["params"]) < 1e-5
    assert run["losses"] == pytest.approx(ddp["losses"], abs=1e-5)
    assert run["lr"] == pytest.approx(ddp["lr"])  # the script's StepLR still drives it


@pytest.mark.slow
def test_a_config_declared_optimizer_and_schedule_train_and_resume(declared_runs: dict) -> None:
    straight, resumed = declared_runs["straight"], declared_runs["resumed"]
    losses = straight["losses"]
    assert sum(losses[-8:]) < 0.8 * sum(losses[:8])
    # The script counts 3 epochs x 16 batches / 2 accumulated = 24 optimizer steps over the
    # unprepared loader; each of 2 processes takes 12. WarmupDecayLR (warm-up 4, peak at the
    # DummyOptim's lr 0.01) at its 12th step, iteration 11, gives 0.01 * (12 - 11) / (12 - 4).
    assert straight["lr"] == pytest.approx(0.01 * 1 / 8)
    assert resumed["losses"] == losses[8:]  # the engine restored optimizer and schedule
    assert resumed["params"] == straight["params"]
    assert resumed["lr"] == straight["lr"]


# --- filling a declared optimizer and schedule from the placeholders (no processes) -----------


def _fill(config: dict, optimizer: object, scheduler: object = None) -> dict:
    fills = dsc.placeholder_fills(optimizer, scheduler, num_processes=2, split_batches=False)
    return dsc.fill_from_script(
        {"zero_optimization": {"stage": 2}, **config},
        micro_batch_size=4,
        accumulation_steps=1,
        num_processes=2,
        mixed_precision="no",
        declared=fills,
    )


def test_placeholders_fill_the_declared_autos() -> None:
    optimizer = DummyOptim([], lr=0.02)
    scheduler = DummyScheduler(optimizer, total_num_steps=101, warmup_num_steps=10)
    filled = _fill(DECLARED_CONFIG, optimizer, scheduler)
    assert filled["optimizer"]["params"] == {"lr": 0.02, "weight_decay": 0.0, "torch_adam": True}
    assert filled["scheduler"]["params"] == {
        "warmup_min_lr": 0.0,
        "warmup_max_lr": 0.02,
        "warmup_num_steps": 10,
        "total_num_steps": 51,  # each of 2 processes steps half of 101, rounded up
    }


def test_an_explicit_config_value_wins_over_a_default_but_not_over_the_script() -> None:
    config = {
        "optimizer": {"type": "AdamW", "params": {"lr": 3e-4}},
        "scheduler": {"type": "WarmupLR", "params": {"warmup_max_lr": "auto"}},
    }
    filled = _fill(config, DummyOptim([]), DummyScheduler(DummyOptim([])))
    assert filled["optimizer"]["params"] == {"lr": 3e-4}  # no weight_decay key invented
    assert filled["scheduler"]["params"] == {"warmup_max_lr": 3e-4}  # WarmupLR has no length
    with pytest.raises(
        ValueError, match=r"optimizer.params.lr=0.0003 in the DeepSpeed config but "
    ):
        _fill(config, DummyOptim([], lr=0.1))


def test_a_declared_schedule_warms_up_to_the_scripts_own_optimizer() -> None:
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.3)
    config = {"scheduler": {"type": "WarmupLR", "params": {"warmup_max_lr": "auto"}}}
    filled = _fill(config, optimizer, DummyScheduler(optimizer, warmup_num_steps=2))
    assert filled["scheduler"]["params"] == {"warmup_max_lr": 0.3}


@pytest.mark.parametrize(
    ("config", "objects", "message"),
    [
        (
            {"optimizer": {}},
            "sgd",
            r"ds.json declares the optimizer, and the script prepares its own \(SGD\); create ",
        ),
        ({}, "dummy", r"prepares a DummyOptim, which stands for the optimizer .* declares none"),
    ],
)
def test_optimizer_comes_from_script_or_config_never_both(
    config: dict, objects: str, message: str
) -> None:
    from accelify.runtime.strategies.deepspeed import _check_declared

    params = [torch.nn.Parameter(torch.zeros(1))]
    optimizer = torch.optim.SGD(params, lr=0.1) if objects == "sgd" else DummyOptim(params)
    with pytest.raises(ValueError, match=message):
        _check_declared({"zero_optimization": {}, **config}, "ds.json", optimizer, None)


def test_placeholders_outside_deepspeed_are_refused() -> None:
    accelerator = Accelerator(cpu=True)
    with pytest.raises(ValueError, match="DummyOptim stands for what a DeepSpeed config declares"):
        accelerator.prepare(DummyOptim([torch.nn.Parameter(torch.zeros(1))]))


def test_a_declared_schedule_needs_its_optimizer_in_the_same_prepare() -> None:
    from accelify.runtime.strategies.deepspeed import DeepSpeed

    strategy = object.__new__(DeepSpeed)  # refused before any engine or config is built
    strategy.engine = None
    model = torch.nn.Linear(1, 1)
    schedule = DummyScheduler(DummyOptim(model.parameters()), total_num_steps=10)
    with pytest.raises(ValueError, match="prepare it in one call with the model and its optimizer"):
        strategy.setup([model, schedule], training=None)


@pytest.mark.parametrize(
    ("build", "swapped"),
    [
        (lambda p: torch.optim.AdamW(p, lr=0.1, betas=(0.8, 0.9), weight_decay=0.2), True),
        (lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9), False),
        (lambda p: torch.optim.Adagrad(p, lr=0.1, lr_decay=0.01), False),  # CPU Adagrad has none
    ],
    ids=["adamw", "sgd", "adagrad-with-lr-decay"],
)
def test_offload_swaps_an_optimizer_only_for_the_same_algorithm(build, swapped: bool) -> None:
    from accelify.runtime.strategies.deepspeed import DeepSpeed

    strategy = object.__new__(DeepSpeed)  # only the config matters here
    strategy.config = {"zero_optimization": {"offload_optimizer": {"device": "cpu"}}}
    original = build([torch.nn.Parameter(torch.zeros(2))])
    if swapped:
        offloaded = strategy._for_offload(original)
        assert type(offloaded).__name__ == "DeepSpeedCPUAdam"
        assert offloaded.adam_w_mode
        assert offloaded.param_groups[0] is original.param_groups[0]  # schedulers still reach it
        assert (offloaded.defaults["betas"], offloaded.defaults["weight_decay"]) == (
            (0.8, 0.9),
            0.2,
        )
    else:
        with pytest.warns(UserWarning, match="steps .* with torch on the CPU"):
            assert strategy._for_offload(original) is original
        assert strategy.config["zero_force_ds_cpu_optimizer"] is False
