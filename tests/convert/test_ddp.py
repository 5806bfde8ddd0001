"""Hand-written DDP -> Accelerate: each rewrite where its condition holds, a whole-file refusal
where it does not (the golden cases are in fixtures/convert/ddp/)."""

from __future__ import annotations

import pytest

from accelify.transform.convert import Result, convert

HEAD = """import os
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    data = TensorDataset(torch.randn(32, 4), torch.randn(32, 1))
"""
LOADER = "    loader = DataLoader(data, batch_size=4, sampler=DistributedSampler(data))\n"
MODEL = "    model = DDP(torch.nn.Linear(4, 1))\n"
TRAIN = """    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in loader:
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
"""


def _convert(*parts: str) -> Result:
    return convert(HEAD + "".join(parts))


def _refusal(result: Result) -> str:
    assert not result.changed
    return " ".join(n.message for n in result.manual)


def test_sampler_default_shuffles_like_distributed_sampler() -> None:
    code = _convert(LOADER, MODEL, TRAIN).code
    assert "DataLoader(data, batch_size=4, shuffle=True)" in code
    assert "DistributedSampler" not in code and "DDP" not in code


BATCHED = """    sampler = DistributedSampler(data, shuffle=False)
    batches = torch.utils.data.BatchSampler(sampler, 4, drop_last=True)
    loader = DataLoader(data, batch_sampler=batches)
"""
EPOCHS = """    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for x, y in loader:
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
"""


def test_sampler_feeding_a_batch_sampler_becomes_the_plain_sampler_it_stands_for() -> None:
    result = _convert(BATCHED, MODEL, EPOCHS)
    assert not result.manual, result.notes
    assert "sampler = torch.utils.data.SequentialSampler(data)" in result.code
    assert "DataLoader(data, batch_sampler=batches)" in result.code
    assert "loader.set_epoch(epoch)" in result.code and "sampler.set_epoch" not in result.code
    assert "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)" in result.code


@pytest.mark.parametrize(
    ("line", "plain"),
    [
        ("BatchSampler(DistributedSampler(data), 4, False)", "RandomSampler(data)"),
        (
            "BatchSampler(sampler=DistributedSampler(data, shuffle=False), batch_size=4, "
            "drop_last=False)",
            "SequentialSampler(data)",
        ),
    ],
)
def test_a_sampler_built_inside_its_batch_sampler(line: str, plain: str) -> None:
    loader = f"    loader = DataLoader(data, batch_sampler=torch.utils.data.{line})\n"
    result = _convert(loader, MODEL, TRAIN)
    assert not result.manual, result.notes
    assert f"torch.utils.data.{plain}" in result.code


def test_sampler_seed_goes_with_a_note() -> None:
    loader = (
        "    loader = DataLoader(data, batch_size=4, sampler=DistributedSampler(data, seed=7))\n"
    )
    result = _convert(loader, MODEL, TRAIN)
    assert "DataLoader(data, batch_size=4, shuffle=True)" in result.code
    assert any("seed=7 goes" in note.message for note in result.notes)


def test_save_under_rank_guard_gets_no_wait_that_only_rank_zero_would_reach() -> None:
    save = '    if rank == 0:\n        torch.save(model.module.state_dict(), "m.pt")\n'
    code = _convert(LOADER, MODEL, TRAIN, save).code
    assert (
        "if accelerator.is_main_process:\n"
        '        accelerator.save(accelerator.unwrap_model(model).state_dict(), "m.pt")' in code
    )
    assert "wait_for_everyone" not in code


def test_barrier_and_sum_become_accelerator_calls() -> None:
    tail = (
        "    total = torch.zeros(1)\n"
        "    dist.all_reduce(total, op=dist.ReduceOp.SUM)\n"
        "    dist.barrier()\n"
    )
    code = _convert(LOADER, MODEL, TRAIN, tail).code
    assert 'total = accelerator.reduce(total, "sum")' in code
    assert "accelerator.wait_for_everyone()" in code


def test_ddp_options_that_matter_become_a_kwargs_handler() -> None:
    model = "    model = DDP(torch.nn.Linear(4, 1), device_ids=None, static_graph=True)\n"
    code = _convert(LOADER, model, TRAIN).code
    assert "kwargs_handlers=[DistributedDataParallelKwargs(static_graph=True)]" in code


def test_environment_read_as_a_string_keeps_its_type() -> None:
    tail = '    print(os.environ["RANK"] == "0")\n'
    code = _convert(LOADER, MODEL, TRAIN, tail).code
    assert 'os.environ["RANK"] == "0"' in code


@pytest.mark.parametrize(
    ("parts", "why"),
    [
        (
            (LOADER, "    model = DDP(torch.nn.Linear(4, 1), process_group=None)\n", TRAIN),
            "process_group",
        ),
        (
            (
                LOADER,
                MODEL,
                TRAIN,
                "    t = torch.ones(1)\n    dist.all_reduce(t, op=dist.ReduceOp.MAX)\n",
            ),
            "all_reduce",
        ),
        ((LOADER, MODEL, TRAIN, "    print(other.module)\n"), ".module"),
        (
            (LOADER, "    sampler = DistributedSampler(data, drop_last=True)\n", MODEL, TRAIN),
            "drop_last",
        ),
        (
            (BATCHED.replace("shuffle=False", "shuffle=flag"), MODEL, TRAIN),
            "which plain sampler it stands for is not known",
        ),
        (
            (
                BATCHED.replace("DataLoader(data, batch_sampler=batches)", "Wrapped(batches)"),
                LOADER,
                MODEL,
                TRAIN,
            ),
            "not handed straight to a DataLoader's batch_sampler=",
        ),
        (
            (
                BATCHED,
                "    other = DataLoader(data, batch_size=4, sampler=sampler)\n",
                MODEL,
                TRAIN,
            ),
            "feeds both a DataLoader and a BatchSampler",
        ),
        (
            (
                LOADER,
                MODEL,
                "    bare = torch.nn.Linear(4, 1)\n    with bare.no_sync():\n        pass\n",
                TRAIN,
            ),
            "of a model it did not wrap",
        ),
        (
            (LOADER, MODEL, TRAIN, "    sync = model.no_sync\n"),
            "other than as `with model.no_sync():`",
        ),
        (
            (LOADER, MODEL, TRAIN, "    print(model.require_backward_grad_sync)\n"),
            "reads require_backward_grad_sync",
        ),
    ],
    ids=[
        "ddp-process-group",
        "all-reduce-max",
        "untraced-module",
        "sampler-drop-last",
        "batched-sampler-shuffle-unknown",
        "batch-sampler-elsewhere",
        "sampler-fed-twice",
        "no-sync-of-another-model",
        "no-sync-not-entered",
        "sync-switch-read",
    ],
)
def test_what_cannot_be_mapped_leaves_the_file_unchanged(parts: tuple[str, ...], why: str) -> None:
    assert why in _refusal(_convert(*parts))


def test_sharded_loader_that_would_not_be_prepared_is_refused() -> None:
    evaluation = (
        "    sharded = DistributedSampler(data, shuffle=False)\n"
        "    test = DataLoader(data, batch_size=4, sampler=sharded)\n"
        "    with torch.no_grad():\n"
        "        correct = sum(float(model(x).sum()) for x, _ in test)\n"
    )
    assert "would not prepare" in _refusal(_convert(LOADER, MODEL, TRAIN, evaluation))


EVALUATION = """    sharded = DistributedSampler(data, shuffle=False)
    test = DataLoader(data, batch_size=4, sampler=sharded)
    with torch.no_grad():
        for x, _ in test:
            print(model(x).sum())
"""


def test_a_sharded_loader_only_evaluated_keeps_its_sampler_told_the_accelerators_numbers() -> None:
    """Each process evaluates the shard it did under torchrun; one process reads every sample
    in order, as the script's non-distributed path did."""
    result = _convert(LOADER, MODEL, TRAIN, EVALUATION)
    assert (
        "test = DataLoader(data, batch_size=4, sampler=torch.utils.data.DistributedSampler(data, "
        "num_replicas=accelerator.num_processes, rank=accelerator.process_index, shuffle=False))"
    ) in result.code
    assert "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)" in result.code
    assert any("test is only evaluated, so it is not prepared" in n.message for n in result.notes)
    assert not result.manual


@pytest.mark.parametrize(
    "change",
    [
        ("DistributedSampler(data, shuffle=False)", "DistributedSampler(data)"),  # shuffles
        ("DistributedSampler(data, shuffle=False)", "DistributedSampler(held, shuffle=False)"),
    ],
    ids=["shuffled", "another dataset"],
)
def test_an_evaluated_sampler_that_cannot_come_back_as_it_was_is_refused(
    change: tuple[str, str],
) -> None:
    held = "    held = TensorDataset(torch.randn(8, 4), torch.randn(8, 1))\n"
    evaluation = EVALUATION.replace(*change)
    assert "would not prepare" in _refusal(_convert(LOADER, MODEL, TRAIN, held, evaluation))


def test_processes_that_train_apart_are_not_turned_into_ddp() -> None:
    """init_process_group without DDP: every process trains its own model; prepare() would
    synchronise them, a different program."""
    result = _convert(LOADER, "    model = torch.nn.Linear(4, 1)\n", TRAIN)
    assert "hand-written distribution" in _refusal(result)


def test_sync_the_script_schedules_keeps_its_schedule() -> None:
    """``no_sync()`` -> ``accelerator.no_sync(model)``; the switch stays on the prepared model
    (not its unwrapped module, where DDP would never read it)."""
    step = (
        "    for i, (x, y) in enumerate(loader):\n"
        "        model.require_backward_grad_sync = i % 2 == 1\n"
        "        with model.no_sync():\n"
        "            torch.nn.functional.mse_loss(model(x), y).backward()\n"
        "        optimizer.step()\n"
    )
    optimizer = "    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
    code = _convert(LOADER, MODEL, optimizer, step).code
    assert "with accelerator.no_sync(model):\n" in code
    assert "        model.require_backward_grad_sync = i % 2 == 1\n" in code


NAMED = "    sampler = DistributedSampler(data)\n"
NAMED_LOADER = "    loader = DataLoader(data, batch_size=4, sampler=sampler)\n"


@pytest.mark.parametrize(
    "line",
    [
        'print("Sampler_train = %s" % str(sampler))',
        'print(f"sampler: {sampler}")',
        "print(repr(sampler))",
        'print("sampler", sampler)',
    ],
)
def test_a_print_of_a_sampler_that_goes_goes_with_it(line: str) -> None:
    """A DistributedSampler has no repr of its own: such a print shows its address only."""
    result = _convert(NAMED, f"    {line}\n", NAMED_LOADER, MODEL, TRAIN)
    assert result.changed
    assert "sampler" not in result.code.split("def main():")[1].split("optimizer")[0]
    assert any("removed the print of the DistributedSampler" in n.message for n in result.notes)


@pytest.mark.parametrize(
    "line",
    [
        "print(len(sampler))",  # the shard's size: a number the script computed
        "print(sampler, file=log)",  # written into a file
        'print(f"{sampler!r:>40}")',  # formatted
        "print(sampler.num_replicas)",  # read
    ],
)
def test_any_other_read_of_a_sampler_is_refused(line: str) -> None:
    result = _convert(NAMED, "    log = None\n", f"    {line}\n", NAMED_LOADER, MODEL, TRAIN)
    assert "used other than by its DataLoader" in _refusal(result)


LOOKUP = """    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    backend = dist.get_default_backend_for_device(device)
"""


@pytest.mark.parametrize(
    "start",
    [
        LOOKUP + "    dist.init_process_group(backend=backend)\n",
        "    dist.init_process_group(dist.get_default_backend_for_device(torch.device('cpu')))\n",
    ],
    ids=["named", "inline"],
)
def test_a_backend_looked_up_to_start_the_group_goes_with_it(start: str) -> None:
    """pytorch/examples' DDP scripts ask torch for their device's backend: accel-run does."""
    result = convert(
        HEAD.replace('    dist.init_process_group("gloo")\n', start) + LOADER + MODEL + TRAIN
    )
    assert result.changed and not result.manual
    assert "get_default_backend_for_device" not in result.code
    assert "device = torch.device" not in result.code  # computed only for the lookup


def test_a_backend_used_otherwise_is_refused() -> None:
    start = LOOKUP + "    dist.init_process_group(backend=backend)\n    print(backend)\n"
    result = convert(
        HEAD.replace('    dist.init_process_group("gloo")\n', start) + LOADER + MODEL + TRAIN
    )
    assert "used other than to start the process group" in _refusal(result)


FACTORY = """import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def loaders():
    data = TensorDataset(torch.randn(32, 4), torch.randn(32, 1))
    train = DataLoader(data, batch_size=4, sampler=DistributedSampler(data))
    test = DataLoader(data, batch_size=4)
    return train, test


def main():
    dist.init_process_group("gloo")
    train_loader, test_loader = loaders()
    model = DDP(torch.nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in {walked}:
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
"""


def test_a_sharded_loader_a_factory_returns_for_training_is_prepared() -> None:
    """LLMs-from-scratch's prepare_dataset() builds the sharded loader and returns it with the
    test loader: the name the caller trains on is prepared, so it shards the data itself."""
    result = convert(FACTORY.format(walked="train_loader"))
    assert result.changed and not result.manual
    assert "DataLoader(data, batch_size=4, shuffle=True)" in result.code
    assert "accelerator.prepare(model, optimizer, train_loader)" in result.code


def test_a_sharded_loader_a_factory_returns_unprepared_is_refused() -> None:
    result = convert(FACTORY.format(walked="test_loader"))
    assert "would not prepare it" in _refusal(result)


def test_a_line_a_message_names_is_the_line_of_the_file_as_written() -> None:
    """Removing a two-line DataParallel shifts the single-process form up; the refusal still
    names the optimizer's own line (17), not the shifted one."""
    source = """import torch
import torch.nn as nn
from torch import optim


class Exp:
    def __init__(self, args):
        model = build()
        if args.multi:
            model = nn.DataParallel(model, device_ids=args.ids)
        self.model = model

    def _get_data(self):
        return 1

    def _select_optimizer(self):
        model_optim = optim.Adam(self.model.parameters(), lr=0.1)
        return model_optim

    def train(self, loader):
        model_optim = self._select_optimizer()
        for x, y in loader:
            loss = self.model(x)
            loss.backward()
            model_optim.step()
"""
    result = convert(source)
    assert result.code == source
    (note,) = [n for n in result.notes if n.manual]
    assert "_select_optimizer() (line 17)" in note.message
    assert note.line == 24
