"""Process state and options from arguments and the ACCELERATE_* launcher variables."""

from __future__ import annotations

import pytest
import torch

from accelify.runtime import Accelerator, DistributedType, state


def test_without_world_size_one_process_trains_on_the_best_device() -> None:
    assert not state.is_initialized()
    accelerator = Accelerator()
    assert state.is_initialized()
    assert accelerator.distributed_type == DistributedType.NO == "NO"
    assert (accelerator.num_processes, accelerator.process_index) == (1, 0)
    assert accelerator.is_main_process and accelerator.is_local_main_process
    expected = (
        "cuda"
        if torch.cuda.is_available()
        else "mps"
        if torch.backends.mps.is_available()
        else "cpu"
    )
    assert accelerator.device.type == expected
    accelerator.end_training()
    assert not state.is_initialized()


def test_launcher_variables_fill_in_arguments_that_were_not_given(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")
    monkeypatch.setenv("ACCELERATE_GRADIENT_ACCUMULATION_STEPS", "4")
    monkeypatch.setenv("ACCELERATE_USE_CPU", "true")
    accelerator = Accelerator()
    assert accelerator.mixed_precision == "bf16"
    assert accelerator.gradient_accumulation_steps == 4
    assert accelerator.device.type == "cpu"
    explicit = Accelerator(cpu=True, mixed_precision="no", gradient_accumulation_steps=2)
    assert (explicit.mixed_precision, explicit.gradient_accumulation_steps) == ("no", 2)


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("ACCELERATE_MIXED_PRECISION", "fp8", "mixed_precision must be one of"),
        ("ACCELERATE_GRADIENT_ACCUMULATION_STEPS", "zero", "positive integer"),
        ("ACCELERATE_USE_CPU", "maybe", "is not a boolean"),
        ("WORLD_SIZE", "two", "is not an integer"),
    ],
)
def test_bad_launcher_variables_are_one_line_errors(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str, message: str
) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=message) as error:
        Accelerator()
    assert "\n" not in str(error.value)


def test_several_processes_never_fall_back_to_training_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    with pytest.raises(ValueError, match="MASTER_ADDR"):
        Accelerator(cpu=True)
    assert not state.is_initialized()


def test_accelerators_in_one_process_share_the_state_and_must_agree_on_cpu() -> None:
    first = Accelerator(cpu=True)
    assert Accelerator(cpu=True).state is first.state
    with pytest.raises(ValueError, match="already exists"):
        Accelerator(cpu=False)
