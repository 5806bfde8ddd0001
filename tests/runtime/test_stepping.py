"""Gradient accumulation, prepared optimizers and schedulers on one process."""

from __future__ import annotations

import copy

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from accelify.runtime import Accelerator
from accelify.runtime.optim import PreparedOptimizer, PreparedScheduler
from accelify.runtime.precision import Precision
from accelify.runtime.state import StepState


def _data(batches: int) -> TensorDataset:
    generator = torch.Generator().manual_seed(0)
    return TensorDataset(
        torch.randn(batches * 2, 3, generator=generator), torch.randn(batches * 2, 1)
    )


def test_accumulation_syncs_every_n_steps_and_at_the_end_of_the_loader() -> None:
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=3)
    model, loader = accelerator.prepare(torch.nn.Linear(3, 1), DataLoader(_data(7), batch_size=2))
    pattern = []
    for _ in range(2):
        for _ in loader:
            with accelerator.accumulate(model):
                pattern.append(accelerator.sync_gradients)
    epoch = [False, False, True, False, False, True, True]
    assert pattern == epoch + epoch


def test_accumulated_training_equals_a_plain_loop_over_the_mean_loss() -> None:
    torch.manual_seed(0)
    plain = torch.nn.Linear(3, 1)
    model = copy.deepcopy(plain)
    data = _data(6)
    plain_opt = torch.optim.SGD(plain.parameters(), lr=0.1)
    for start in (0, 6):  # two windows of three batches of two samples
        x, y = data[start : start + 6]
        loss = sum(
            torch.nn.functional.mse_loss(plain(x[i : i + 2]), y[i : i + 2]) for i in (0, 2, 4)
        )
        (loss / 3).backward()
        plain_opt.step()
        plain_opt.zero_grad()

    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=3)
    model, optimizer, loader = accelerator.prepare(
        model, torch.optim.SGD(model.parameters(), lr=0.1), DataLoader(data, batch_size=2)
    )
    for x, y in loader:
        with accelerator.accumulate(model):
            accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
            optimizer.step()
            optimizer.zero_grad()
    for ours, theirs in zip(model.parameters(), plain.parameters(), strict=True):
        torch.testing.assert_close(ours, theirs)


def _prepared(num_processes: int, split_batches: bool = False):
    shared = StepState()
    parameter = torch.nn.Parameter(torch.zeros(1))
    optimizer = PreparedOptimizer(
        torch.optim.SGD([parameter], lr=1.0), shared, Precision(torch.device("cpu"))
    )
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer.optimizer, step_size=1, gamma=0.5)
    prepared = PreparedScheduler(
        scheduler, [optimizer], shared, num_processes=num_processes, split_batches=split_batches
    )
    return shared, optimizer, prepared


@pytest.mark.parametrize(
    ("num_processes", "split_batches", "steps"), [(1, False, 3), (2, False, 6), (2, True, 3)]
)
def test_schedulers_step_once_per_process_per_optimizer_step(
    num_processes: int, split_batches: bool, steps: int
) -> None:
    shared, optimizer, scheduler = _prepared(num_processes, split_batches)
    for sync in (True, False, True, True):
        shared.sync_gradients = sync
        optimizer.step()
        scheduler.step()
    assert scheduler.last_epoch == steps


def test_non_sync_steps_leave_parameters_gradients_and_schedule_alone() -> None:
    shared, optimizer, scheduler = _prepared(1)
    parameter = optimizer.param_groups[0]["params"][0]
    parameter.grad = torch.ones(1)
    shared.sync_gradients = False
    optimizer.step()
    optimizer.zero_grad()
    scheduler.step()
    assert parameter.item() == 0.0 and parameter.grad is not None
    assert scheduler.last_epoch == 0
    shared.sync_gradients = True
    optimizer.step()
    optimizer.zero_grad()
    assert parameter.item() == -1.0 and parameter.grad is None


def test_a_scheduler_built_on_the_prepared_optimizer_is_found_and_wrapped() -> None:
    accelerator = Accelerator(cpu=True)
    model = torch.nn.Linear(1, 1)
    optimizer = accelerator.prepare(torch.optim.SGD(model.parameters(), lr=1.0))
    scheduler = accelerator.prepare(torch.optim.lr_scheduler.StepLR(optimizer, 1))
    assert isinstance(scheduler, PreparedScheduler)
    assert scheduler.optimizers == [optimizer]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_optimizer_state_loaded_before_prepare_follows_the_model_to_the_device() -> None:
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.ones(1, 2)).sum().backward()
    optimizer.step()
    accelerator = Accelerator()
    model, optimizer = accelerator.prepare(model, optimizer)
    assert all(s["exp_avg"].is_cuda for s in optimizer.state.values())


def _one_cycle_lrs(accelerator_class) -> list[float]:
    """Learning rates of a OneCycleLR sized for the optimizer steps of 2 epochs of 3 windows."""
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.1, total_steps=6)
    accelerator = accelerator_class(cpu=True, gradient_accumulation_steps=2)
    model, optimizer, loader, scheduler = accelerator.prepare(
        model, optimizer, DataLoader(_data(6), batch_size=2), scheduler
    )
    lrs = []
    for _ in range(2):
        for x, y in loader:
            with accelerator.accumulate(model):
                accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
            lrs.append(scheduler.get_last_lr()[0])
    return lrs


def test_a_one_cycle_schedule_runs_to_its_end_under_accumulation_like_hf() -> None:
    """Steps between accumulation windows must not count towards OneCycleLR's total_steps."""
    hf = pytest.importorskip("accelerate")
    assert _one_cycle_lrs(Accelerator) == _one_cycle_lrs(hf.Accelerator)
