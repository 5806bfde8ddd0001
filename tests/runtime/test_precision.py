"""Mixed precision: autocast forward with fp32 outputs, fp16 loss scaling and skipped steps."""

from __future__ import annotations

import copy

import pytest
import torch

from accelify.runtime import Accelerator

from .conftest import CUDA


def _setup(device: str, mixed_precision: str):
    accelerator = Accelerator(cpu=device == "cpu", mixed_precision=mixed_precision)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    return accelerator, *accelerator.prepare(model, optimizer, scheduler)


@pytest.mark.parametrize("device", ["cpu", CUDA])
@pytest.mark.parametrize("mixed_precision", ["bf16", "fp16"])
def test_forward_computes_in_low_precision_and_returns_fp32(
    device: str, mixed_precision: str
) -> None:
    accelerator, model, _, _ = _setup(device, mixed_precision)
    inner = []
    model[0].register_forward_hook(lambda module, args, output: inner.append(output.dtype))
    output = model(torch.ones(3, 4, device=accelerator.device))
    assert inner == [{"bf16": torch.bfloat16, "fp16": torch.float16}[mixed_precision]]
    assert output.dtype == torch.float32
    plain = accelerator.unwrap_model(model, keep_fp32_wrapper=False)
    assert plain(torch.ones(3, 4, device=accelerator.device)).dtype == torch.float32
    assert inner[-1] == torch.float32


@pytest.mark.parametrize("device", ["cpu", CUDA])
def test_an_overflowing_fp16_step_is_skipped_and_reported(device: str) -> None:
    accelerator, model, optimizer, scheduler = _setup(device, "fp16")
    before = [p.detach().clone() for p in model.parameters()]
    scale = accelerator.scaler.get_scale()
    accelerator.backward(model(torch.full((3, 4), 1e4, device=accelerator.device)).sum())
    optimizer.step()
    scheduler.step()
    assert accelerator.optimizer_step_was_skipped
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert scheduler.get_last_lr() == [0.1]
    assert accelerator.scaler.get_scale() < scale

    optimizer.zero_grad()
    accelerator.backward(model(torch.ones(3, 4, device=accelerator.device)).sum() * 1e-3)
    optimizer.step()
    scheduler.step()
    assert not accelerator.optimizer_step_was_skipped
    assert scheduler.get_last_lr() == [0.05]


def test_clip_grad_norm_sees_unscaled_gradients_under_fp16() -> None:
    accelerator, model, _, _ = _setup("cpu", "fp16")
    accelerator.backward(model(torch.ones(3, 4)).sum() * 1e-3)
    norm = accelerator.clip_grad_norm_(model.parameters(), max_norm=1e9)
    true_norm = torch.tensor(3e-3 * 10**0.5)  # d/dW and d/db are 3e-3 for all 10 entries
    torch.testing.assert_close(norm, true_norm, rtol=1e-2, atol=0)


def test_kwargs_handlers_reach_the_scaler_and_autocast_and_hf_handlers_work_too() -> None:
    from accelerate.utils import GradScalerKwargs as HFGradScalerKwargs

    from accelify.runtime import AutocastKwargs, GradScalerKwargs

    ours = Accelerator(
        cpu=True, mixed_precision="fp16", kwargs_handlers=[GradScalerKwargs(init_scale=1024)]
    )
    assert ours.scaler.get_scale() == 1024
    hf = Accelerator(
        cpu=True, mixed_precision="fp16", kwargs_handlers=[HFGradScalerKwargs(init_scale=8)]
    )
    assert hf.scaler.get_scale() == 8
    off = Accelerator(
        cpu=True, mixed_precision="bf16", kwargs_handlers=[AutocastKwargs(enabled=False)]
    )
    model = off.prepare(torch.nn.Sequential(torch.nn.Linear(2, 2)))
    inner = []
    model[0].register_forward_hook(lambda module, args, output: inner.append(output.dtype))
    model(torch.ones(1, 2))
    assert inner == [torch.float32]
    with pytest.raises(ValueError, match="unsupported kwargs handler"):
        Accelerator(cpu=True, kwargs_handlers=[object()])


def test_a_deep_copy_of_a_prepared_model_runs_its_own_weights() -> None:
    accelerator, model, _, _ = _setup("cpu", "bf16")
    copy_ = copy.deepcopy(accelerator.unwrap_model(model))
    copy_(torch.ones(1, 4)).sum().backward()
    assert copy_[0].weight.grad is not None and model[0].weight.grad is None
