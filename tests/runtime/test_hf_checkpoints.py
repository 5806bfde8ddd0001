"""Checkpoints interoperate with HF Accelerate: each runtime resumes the other's ``save_state``.

The runtimes run ``fixtures/runtime/resume_toy.py`` in separate processes (their process-state
singletons must not meet). The saving run goes on after saving; each resume must then draw the
same random numbers and take the same next step, to the bit. The resuming runs do not train
before loading, so equal draws show that the random states were restored, not merely seeded.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from accelify.runtime import Accelerator, hf_layout
from accelify.runtime.checkpoint import load_object

SCRIPT = Path(__file__).resolve().parents[2] / "fixtures" / "runtime" / "resume_toy.py"
IMPLS = ("hf", "accelify")


def _run(impl: str, *args: str) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ACCELERATE_", "WORLD_"))}
    env["OMP_NUM_THREADS"] = "1"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--impl", impl, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("{")]
    return json.loads(line)


def _resumed_by_both(saver: str, folder: Path, *flags: str) -> dict[str, dict[str, Any]]:
    """What ``saver`` did after saving into ``folder``, and what each runtime does resuming it."""
    reports = {"saver": _run(saver, "--save", str(folder), *flags)}
    for impl in IMPLS:
        reports[impl] = _run(impl, "--load", str(folder), *flags)
    return reports


def _assert_same(reports: dict[str, dict[str, Any]]) -> None:
    expected = reports["saver"]
    for impl in IMPLS:
        assert reports[impl] == expected, f"{impl} resumed differently"


@pytest.mark.slow
def test_accelify_resumes_what_hf_saved(tmp_path: Path) -> None:
    folder = tmp_path / "hf_state"
    _assert_same(_resumed_by_both("hf", folder))
    assert not (folder / "checksums.json").exists()  # nothing to verify: loaded as it is


@pytest.mark.slow
def test_hf_resumes_what_accelify_saved(tmp_path: Path) -> None:
    folder = tmp_path / "accelify_state"
    reports = _resumed_by_both("accelify", folder)
    _assert_same(reports)
    assert {"model_1.safetensors", "optimizer_1.bin", "checksums.json"} <= {
        p.name for p in folder.iterdir()
    }


@pytest.mark.slow
# Each saver with one weight format (both runtimes load each save): the two tests above save
# each runtime's default, safetensors.
@pytest.mark.parametrize(
    ("saver", "safetensors"), [("hf", False), ("accelify", False), ("hf", True)],
    ids=["hf-torch", "accelify-torch", "hf-safetensors"],
)  # fmt: skip
def test_schedulers_registered_objects_and_both_weight_formats(
    tmp_path: Path, saver: str, safetensors: bool
) -> None:
    flags = ["--scheduler", "--custom", *([] if safetensors else ["--no-safetensors"])]
    reports = _resumed_by_both(saver, tmp_path / "state", *flags)
    _assert_same(reports)
    assert reports["hf"]["counter"] == 5 and reports["hf"]["lr"] == 0.05 * 0.5**5
    names = {p.name for p in (tmp_path / "state").iterdir()}
    weights = {"model.safetensors", "model_1.safetensors"}
    if not safetensors:
        weights = {"pytorch_model.bin", "pytorch_model_1.bin"}
    assert weights | {"scheduler.bin", "custom_checkpoint_0.pkl"} <= names


def _saved(tmp_path: Path) -> tuple[Accelerator, torch.nn.Module, Path]:
    """An accelify checkpoint of one trained step, with step counter 1."""
    accelerator = Accelerator(cpu=True)
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    with accelerator.accumulate(model):
        accelerator.backward(model(torch.ones(1, 2)).sum())
        optimizer.step()
    return accelerator, model, Path(accelerator.save_state(tmp_path / "checkpoint_7"))


def _as_hf_wrote_it(folder: Path) -> None:
    for name in ("accelify_state.json", "checksums.json"):
        (folder / name).unlink()


def test_random_states_are_saved_under_hf_keys_with_the_step(tmp_path: Path) -> None:
    _, _, folder = _saved(tmp_path)
    states = load_object(folder / "random_states_0.pkl", hf_layout.numpy_globals())
    assert {"step", "random_state", "numpy_random_seed", "torch_manual_seed"} <= set(states)
    assert states["step"] == 1 and len(states["numpy_random_seed"][1]) == 624
    assert load_object(folder / "random_states_0.pkl").keys() == states.keys()  # plain data


def test_a_folder_in_hf_layout_takes_step_and_iteration_from_hf_s_records(
    tmp_path: Path,
) -> None:
    accelerator, model, folder = _saved(tmp_path)
    _as_hf_wrote_it(folder)
    saved = [p.detach().clone() for p in model.parameters()]
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.zero_()
    accelerator.step = 0
    accelerator.load_state(folder)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), saved, strict=True))
    assert accelerator.step == 1 and accelerator.save_iteration == 8  # from checkpoint_7


def test_random_states_of_older_accelify_checkpoints_still_restore(tmp_path: Path) -> None:
    accelerator, _, folder = _saved(tmp_path)
    (folder / "checksums.json").unlink()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    older = {
        "python": random.getstate(),
        "torch": torch.get_rng_state(),
        "numpy": (kind, torch.from_numpy(keys.astype("int64")), pos, has_gauss, cached),
    }
    torch.save(older, folder / "random_states_0.pkl")
    expected = [random.random(), float(np.random.rand()), torch.rand(1).item()]
    accelerator.load_state(folder)
    assert [random.random(), float(np.random.rand()), torch.rand(1).item()] == expected


def test_loader_states_only_hf_s_loaders_have_are_named_in_a_warning(tmp_path: Path) -> None:
    accelerator, _, folder = _saved(tmp_path)
    _as_hf_wrote_it(folder)
    torch.save({"_num_yielded": 3}, folder / "dl_state_dict.bin")
    with pytest.warns(UserWarning, match=r"checkpoint_7: dl_state_dict\.bin not restored"):
        accelerator.load_state(folder)


def test_accelify_s_manifest_without_its_metadata_is_an_error(tmp_path: Path) -> None:
    accelerator, _, folder = _saved(tmp_path)
    (folder / "accelify_state.json").unlink()
    with pytest.raises(FileNotFoundError, match=r"accelify_state\.json: missing, though"):
        accelerator.load_state(folder)
