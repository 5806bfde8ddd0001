"""Weights files, full training states, automatic naming, rotation, crashes and resuming."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from accelify.runtime import Accelerator, ProjectConfiguration, load_checkpoint_in_model, state
from accelify.runtime.checkpoint import parse_size


class Tied(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(16, 8)
        self.hidden = torch.nn.Linear(8, 8)
        self.out = torch.nn.Linear(8, 16, bias=False)
        self.out.weight = self.embed.weight


def _same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    return all(
        torch.equal(x, y)
        for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True)
    )


def test_sizes_use_hf_units() -> None:
    assert parse_size("10GB") == 10 * 10**9
    assert parse_size("2MiB") == 2 * 2**20
    assert parse_size(123) == 123
    with pytest.raises(ValueError, match="not a size"):
        parse_size("big")


def test_save_model_shards_above_the_limit_and_a_later_save_removes_stale_shards(
    tmp_path: Path,
) -> None:
    accelerator = Accelerator(cpu=True)
    model = Tied()
    accelerator.save_model(model, tmp_path, max_shard_size="600B")
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    shards = sorted(p.name for p in tmp_path.glob("model-*.safetensors"))
    assert len(shards) > 1 and set(index["weight_map"].values()) == set(shards)
    assert "out.weight" not in index["weight_map"]  # tied to embed.weight, stored once
    fresh = Tied()
    load_checkpoint_in_model(fresh, tmp_path, strict=True)
    assert _same_weights(fresh, model) and fresh.out.weight is fresh.embed.weight

    accelerator.save_model(model, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.safetensors"]


def test_save_model_without_safetensors_writes_torch_files_loaded_weights_only(
    tmp_path: Path,
) -> None:
    model = torch.nn.Linear(3, 3)
    Accelerator(cpu=True).save_model(model, tmp_path, safe_serialization=False)
    fresh = torch.nn.Linear(3, 3)
    load_checkpoint_in_model(fresh, tmp_path / "pytorch_model.bin", strict=True)
    assert _same_weights(fresh, model)


def test_mismatched_weights_are_an_error_when_strict(tmp_path: Path) -> None:
    Accelerator(cpu=True).save_model(torch.nn.Linear(3, 3), tmp_path)
    with pytest.raises(ValueError, match=r"missing: \['0.bias', '0.weight'\]"):
        load_checkpoint_in_model(torch.nn.Sequential(torch.nn.Linear(3, 3)), tmp_path, strict=True)
    with pytest.raises(ValueError, match="size mismatch for weight"):
        load_checkpoint_in_model(torch.nn.Linear(3, 4), tmp_path)


class Counter:
    def __init__(self) -> None:
        self.count = 0

    def state_dict(self) -> dict:
        return {"count": self.count}

    def load_state_dict(self, values: dict) -> None:
        self.count = values["count"]


def _training(project: Path, mixed_precision: str = "no", **config):
    """A seeded, shuffled loop; returns (accelerator, model, run_one_epoch)."""
    accelerator = Accelerator(
        cpu=True,
        mixed_precision=mixed_precision,
        project_config=ProjectConfiguration(project, automatic_checkpoint_naming=True, **config),
    )
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    data = TensorDataset(torch.randn(10, 3), torch.randn(10, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2)
    loader = DataLoader(data, batch_size=3, shuffle=True)
    counter = Counter()
    accelerator.register_for_checkpointing(counter)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)

    def epoch() -> None:
        for x, y in loader:
            noisy = x + torch.randn_like(x)  # global RNG: must be restored on resume
            accelerator.backward(torch.nn.functional.mse_loss(model(noisy), y))
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            counter.count += 1

    return accelerator, model, epoch, counter


def test_resuming_after_one_epoch_equals_training_two(tmp_path: Path) -> None:
    accelerator, straight, epoch, _ = _training(tmp_path / "a", "fp16")
    epoch()
    epoch()
    state.reset()

    accelerator, _, epoch, _ = _training(tmp_path / "b", "fp16")
    epoch()
    accelerator.save_state()
    state.reset()
    torch.manual_seed(999)  # whatever the new process's RNG holds, load_state restores it

    accelerator, resumed, epoch, counter = _training(tmp_path / "b", "fp16")
    accelerator.load_state()
    assert counter.count == 4 and accelerator.save_iteration == 1
    epoch()
    assert _same_weights(resumed, straight)


def test_checkpoint_layout_rotation_and_restored_counter(tmp_path: Path) -> None:
    accelerator, *_ = _training(tmp_path, "fp16", total_limit=2)
    for _ in range(4):
        accelerator.save_state()
    root = tmp_path / "checkpoints"
    assert sorted(p.name for p in root.iterdir()) == ["checkpoint_2", "checkpoint_3"]
    assert sorted(p.name for p in (root / "checkpoint_3").iterdir()) == [
        "accelify_state.json",
        "checksums.json",
        "custom_checkpoint_0.pkl",
        "dataloader.bin",
        "model.safetensors",
        "optimizer.bin",
        "random_states_0.pkl",
        "scaler.pt",
        "scheduler.bin",
    ]
    state.reset()
    accelerator, *_ = _training(tmp_path, "fp16", total_limit=2)
    accelerator.load_state()
    assert accelerator.save_iteration == 4
    assert accelerator.save_state().endswith("checkpoint_4")


def test_a_crash_while_saving_leaves_the_previous_checkpoint_loadable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    accelerator, model, epoch, _ = _training(tmp_path)
    accelerator.save_state()
    saved = [p.detach().clone() for p in model.parameters()]
    epoch()

    def crash() -> None:
        raise OSError("disk full")

    monkeypatch.setattr("accelify.runtime.rng.capture", crash)
    with pytest.raises(OSError, match="disk full"):
        accelerator.save_state()
    with pytest.raises(OSError, match="disk full"):
        accelerator.save_state(tmp_path / "checkpoints" / "checkpoint_0")
    monkeypatch.undo()

    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["checkpoint_0"]
    accelerator.load_state()
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), saved, strict=True))


def test_a_full_disk_names_the_file_and_leaves_no_half_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    accelerator, *_ = _training(tmp_path)

    def full(obj: object, f: object) -> None:  # what torch.save says when the disk fills up
        raise RuntimeError("[enforce fail at inline_container.cc:859] . PytorchStreamWriter "
                           "failed writing file data/0: file write failed")  # fmt: skip

    monkeypatch.setattr(torch, "save", full)
    with pytest.raises(
        OSError, match=r"/\.checkpoint_0\.partial/optimizer\.bin: not saved: .*write failed"
    ):
        accelerator.save_state(safe_serialization=True)
    assert list((tmp_path / "checkpoints").iterdir()) == []


def test_restore_errors_are_raised(tmp_path: Path) -> None:
    accelerator, *_ = _training(tmp_path)
    folder = Path(accelerator.save_state())
    (folder / "checksums.json").unlink()  # else the changed file is refused before it is read
    torch.save({"python": "not a state", "torch": torch.zeros(1)}, folder / "random_states_0.pkl")
    with pytest.raises(ValueError, match=r"Random\.setstate"):
        accelerator.load_state(folder)
    (folder / "random_states_0.pkl").unlink()
    with pytest.raises(FileNotFoundError, match=r"random_states_0\.pkl: missing"):
        accelerator.load_state(folder)


def test_checkpoints_only_load_plain_data(tmp_path: Path) -> None:
    accelerator, *_ = _training(tmp_path)
    pickled = Counter()
    pickled.count = Counter()  # an arbitrary object: loading it would need full unpickling
    accelerator.register_for_checkpointing(pickled)
    folder = accelerator.save_state()
    with pytest.raises(Exception, match="weights_only"):
        accelerator.load_state(folder)


def test_resume_and_automatic_naming_errors_are_one_line(tmp_path: Path) -> None:
    accelerator = Accelerator(cpu=True)
    with pytest.raises(ValueError, match="needs input_dir"):
        accelerator.load_state()
    with pytest.raises(ValueError, match="needs output_dir"):
        accelerator.save_state()
    with pytest.raises(ValueError, match="cannot checkpoint"):
        accelerator.register_for_checkpointing(object())
    auto = _training(tmp_path)[0]
    with pytest.raises(FileNotFoundError, match="no checkpoint to resume"):
        auto.load_state()


def test_torch_format_states_load(tmp_path: Path) -> None:
    accelerator, model, epoch, _ = _training(tmp_path)
    folder = Path(accelerator.save_state(safe_serialization=False))
    assert (folder / "pytorch_model.bin").is_file() and not (folder / "model.safetensors").exists()
    saved = [p.detach().clone() for p in model.parameters()]
    epoch()
    accelerator.load_state(folder)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), saved, strict=True))


@pytest.mark.parametrize("left", ["new", "old"])
def test_a_save_interrupted_between_its_renames_still_loads(tmp_path: Path, left: str) -> None:
    """save_state renames the old folder away, then the new one into place: a crash between
    the two leaves only hidden folders, and load_state reads the new one if it is complete."""
    accelerator, model, epoch, _ = _training(tmp_path)
    target = Path(accelerator.save_state())
    first = [p.detach().clone() for p in model.parameters()]
    epoch()
    second = [p.detach().clone() for p in model.parameters()]
    new = Path(accelerator.save_state())
    target.rename(target.parent / f".{target.name}.old")  # the crash: the old one moved away...
    if left == "new":  # ...and the new one finished but not yet renamed
        new.rename(target.parent / f".{target.name}.partial")
    epoch()
    with pytest.warns(UserWarning, match="missing, as a save_state was interrupted; loading"):
        accelerator.load_state(target)
    expected = second if left == "new" else first
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), expected, strict=True))


def test_a_flipped_byte_is_an_error_naming_the_file(tmp_path: Path) -> None:
    accelerator, *_ = _training(tmp_path)
    folder = Path(accelerator.save_state())
    weights = folder / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-3] ^= 0x10  # inside the last tensor's values: safetensors reads it without complaint
    weights.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"/model\.safetensors: damaged: its bytes differ"):
        accelerator.load_state(folder)


DAMAGE = {
    "truncated": lambda data: data[: len(data) // 2],
    "empty": lambda data: b"",
    "garbage": lambda data: b"x" * len(data),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_file_that_cannot_be_read_is_an_error_naming_it(tmp_path: Path, damage: str) -> None:
    """Without checksums (HF's checkpoints have none), torch's own errors name no file."""
    accelerator, *_ = _training(tmp_path)
    folder = Path(accelerator.save_state())
    (folder / "checksums.json").unlink()
    optimizer = folder / "optimizer.bin"
    optimizer.write_bytes(DAMAGE[damage](optimizer.read_bytes()))
    with pytest.raises(ValueError, match=r"/optimizer\.bin: cannot be read [^\n]*$"):
        accelerator.load_state(folder)


def test_free_memory_forgets_what_was_prepared(tmp_path: Path) -> None:
    accelerator = Accelerator(cpu=True)
    model = accelerator.prepare(torch.nn.Linear(2, 2))
    assert accelerator.free_memory(model) == [None]
    folder = Path(accelerator.save_state(tmp_path / "state"))
    assert not (folder / "model.safetensors").exists()


def test_saved_files_get_the_usual_permissions(tmp_path: Path) -> None:
    """Atomic writes go through a temporary file; it must not leave the result private (0600)."""
    previous = os.umask(0o022)
    try:
        Accelerator(cpu=True).save({"x": torch.ones(1)}, tmp_path / "w.pt")
    finally:
        os.umask(previous)
    assert stat.S_IMODE((tmp_path / "w.pt").stat().st_mode) == 0o644
    assert [p.name for p in tmp_path.iterdir()] == ["w.pt"]


def test_a_loader_prepared_after_the_save_starts_from_its_beginning(tmp_path: Path) -> None:
    """As under HF (which loads no plain loader's state), a loader the checkpoint knows nothing of
    does not stop load_state; the ones it saved get their position back, and a saved one that
    went missing is still an error."""
    accelerator = Accelerator(cpu=True)
    train = accelerator.prepare(DataLoader(range(8), batch_size=2))
    next(iter(train))  # an epoch started, then saved mid-way
    accelerator.save_state(tmp_path / "ckpt")
    evaluation = accelerator.prepare(DataLoader(range(4), batch_size=2))
    with pytest.warns(UserWarning, match="no position saved for prepared data loader 1"):
        accelerator.load_state(tmp_path / "ckpt")
    assert [b.tolist() for b in evaluation] == [[0, 1], [2, 3]]
    (tmp_path / "ckpt" / "dataloader.bin").unlink()
    with pytest.raises(FileNotFoundError, match=r"dataloader\.bin: missing from the checkpoint"):
        accelerator.load_state(tmp_path / "ckpt")
