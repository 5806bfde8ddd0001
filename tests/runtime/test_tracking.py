"""Experiment tracking (``log_with``, ``init_trackers``, ``log``, ``get_tracker``, ``end_training``)
with HF Accelerate's semantics: TensorBoard event files read back, custom trackers, the errors,
and a tracking script in HF's style on 1 process (against HF Accelerate) and on 2 processes."""

from __future__ import annotations

import importlib.machinery
import json
import os
import sys
import types
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from accelify.runtime import (
    Accelerator,
    GeneralTracker,
    LoggerType,
    ProjectConfiguration,
    state,
    tracking,
)

from .conftest import run_past_teardown, torchrun

event_accumulator = pytest.importorskip(
    "tensorboard.backend.event_processing.event_accumulator",
    reason="pip install tensorboard (in the test extra)",
)

SCRIPT = Path(__file__).resolve().parents[2] / "fixtures" / "runtime" / "track_toy.py"


class Recorder(GeneralTracker):
    name = "recorder"
    requires_logging_directory = False

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple] = []

    @property
    def tracker(self) -> list[tuple]:
        return self.calls

    def start(self) -> None:
        self.calls.append(("start",))

    def store_init_configuration(self, values: dict) -> None:
        self.calls.append(("config", values))

    def log(self, values: dict, step: int | None = None, **kwargs: Any) -> None:
        self.calls.append(("log", values, step, kwargs))

    def finish(self) -> None:
        self.calls.append(("finish",))


def _scalars(folder: Path) -> dict[str, list[tuple[int, float]]]:
    """The scalars of the event files directly in ``folder``, by tag: (step, value) pairs."""
    events = event_accumulator.EventAccumulator(str(folder))
    events.Reload()
    return {
        tag: [(event.step, event.value) for event in events.Scalars(tag)]
        for tag in events.Tags()["scalars"]
    }


def _hparams(folder: Path) -> list[dict]:
    return [yaml.safe_load(path.read_text()) for path in sorted(folder.glob("*/hparams.yml"))]


def test_tensorboard_writes_the_logged_scalars_and_the_config(tmp_path: Path) -> None:
    accelerator = Accelerator(log_with="tensorboard", project_dir=str(tmp_path))
    config = {"lr": 0.01, "batch_size": 8, "optimizer": "sgd"}
    accelerator.init_trackers("demo", config=config)
    accelerator.log({"loss": 0.5, "note": "first"}, step=1)
    accelerator.log({"loss": torch.tensor(0.25), "acc": {"train": 0.75, "eval": 0.5}}, step=2)
    writer = accelerator.get_tracker("tensorboard", unwrap=True)
    assert writer.log_dir == str(tmp_path / "demo")
    accelerator.end_training()

    scalars = _scalars(tmp_path / "demo")
    assert scalars["loss"] == [(1, 0.5), (2, 0.25)]
    assert "note" not in scalars  # a string is text, not a scalar
    assert _hparams(tmp_path / "demo") == [config]
    grouped = {p.name: _scalars(p) for p in (tmp_path / "demo").glob("acc_*")}
    assert grouped == {"acc_train": {"acc": [(2, 0.75)]}, "acc_eval": {"acc": [(2, 0.5)]}}


def test_logging_dir_of_the_project_configuration_wins_over_project_dir(tmp_path: Path) -> None:
    project = ProjectConfiguration(project_dir=str(tmp_path / "p"), logging_dir=str(tmp_path / "l"))
    accelerator = Accelerator(log_with=LoggerType.TENSORBOARD, project_config=project)
    accelerator.init_trackers("run")
    accelerator.log({"x": 3.0}, step=7)
    accelerator.end_training()
    assert _scalars(tmp_path / "l" / "run") == {"x": [(7, 3.0)]}
    assert not (tmp_path / "p").exists()


def test_a_custom_tracker_gets_every_call_with_its_step_and_options(tmp_path: Path) -> None:
    recorder = Recorder()
    accelerator = Accelerator(log_with=[recorder, "tensorboard"], project_dir=str(tmp_path))
    accelerator.init_trackers("run", config={"a": 1}, init_kwargs={"tensorboard": {"comment": ""}})
    accelerator.log({"x": 1.0}, step=3, log_kwargs={"recorder": {"extra": True}})
    accelerator.log({"x": 2.0})
    assert accelerator.trackers[0] is recorder
    assert recorder.calls == [
        ("start",),
        ("config", {"a": 1}),
        ("log", {"x": 1.0}, 3, {"extra": True}),
        ("log", {"x": 2.0}, None, {}),
    ]
    accelerator.end_training()
    assert recorder.calls[-1] == ("finish",)


def test_get_tracker_wrapped_unwrapped_and_unknown(tmp_path: Path) -> None:
    recorder = Recorder()
    accelerator = Accelerator(log_with=[recorder])
    assert isinstance(accelerator.get_tracker("recorder"), GeneralTracker)  # blank before init
    accelerator.init_trackers("run")
    assert accelerator.get_tracker("recorder") is recorder
    assert accelerator.get_tracker("recorder", unwrap=True) is recorder.calls
    with pytest.raises(ValueError, match="wandb is not an available tracker"):
        accelerator.get_tracker("wandb")


def test_a_tracker_whose_library_is_missing_is_left_out_with_a_warning_naming_its_package(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """As in HF (a script written where wandb is installed still runs elsewhere), but said."""
    monkeypatch.setattr(tracking.WandBTracker, "modules", ("accelify_no_such_module",))
    with pytest.warns(UserWarning, match=r"'wandb' is left out: .*\(pip install wandb\)"):
        accelerator = Accelerator(log_with=["wandb", "tensorboard"], project_dir=str(tmp_path))
    assert accelerator.log_with == ["tensorboard"]
    with pytest.raises(ValueError, match="Unsupported logging capability: nope"):
        Accelerator(log_with=["tensorboard", "nope"], project_dir=".")
    with pytest.raises(ValueError, match="`tensorboard` requires a `logging_dir`"):
        Accelerator(log_with="tensorboard")


def test_all_is_every_installed_tracker_plus_custom_ones(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(tracking.WandBTracker, "modules", ("accelify_no_such_module",))
    recorder = Recorder()
    chosen = Accelerator(log_with=[recorder, "all"], project_dir=str(tmp_path)).log_with
    assert chosen[0] is recorder
    assert "tensorboard" in chosen
    assert "wandb" not in chosen
    assert chosen[1:] == [c.name for c in tracking._BUILT_IN if tracking.installed(c)]


def test_a_registered_tracker_class_is_built_by_name(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    class Folder(Recorder):
        name = "folder"
        requires_logging_directory = True

        def __init__(self, run_name: str, logging_dir: str, **kwargs: Any) -> None:
            super().__init__()
            self.calls.append(("built", run_name, logging_dir, kwargs))

    monkeypatch.setattr(tracking, "_REGISTRY", dict(tracking._REGISTRY))
    tracking.register_tracker_class(Folder)
    with pytest.raises(ValueError, match="`folder` requires a `logging_dir`"):
        Accelerator(log_with="folder")
    accelerator = Accelerator(log_with="folder", project_dir=str(tmp_path))
    accelerator.init_trackers("run", init_kwargs={"folder": {"flag": 1}})
    calls = accelerator.get_tracker("folder", unwrap=True)
    assert calls == [("built", "run", str(tmp_path), {"flag": 1}), ("start",)]


def test_an_incomplete_tracker_class_is_refused() -> None:
    class NoTracker(GeneralTracker):
        name = "incomplete"

    with pytest.raises(NotImplementedError, match="`requires_logging_directory`, `tracker`"):
        NoTracker()


def test_a_wandb_style_library_is_driven_through_its_own_api(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """WandB, Trackio and SwanLab share one shape; a stand-in module checks the calls made."""
    calls: list[tuple] = []

    class Run:
        def log(self, values: dict, step: int | None = None, **kwargs: Any) -> None:
            calls.append(("log", values, step, kwargs))

        def finish(self) -> None:
            calls.append(("finish",))

    library = types.ModuleType("wandb")
    library.__spec__ = importlib.machinery.ModuleSpec("wandb", None, origin="stand-in")
    library.init = lambda **kwargs: calls.append(("init", kwargs)) or Run()
    library.config = types.SimpleNamespace(
        update=lambda values, **kwargs: calls.append(("config", values, kwargs))
    )
    monkeypatch.setitem(sys.modules, "wandb", library)

    accelerator = Accelerator(log_with="wandb")
    accelerator.init_trackers("proj", config={"lr": 1}, init_kwargs={"wandb": {"tags": ["a"]}})
    accelerator.log({"loss": 1.5}, step=4, log_kwargs={"wandb": {"commit": False}})
    assert isinstance(accelerator.get_tracker("wandb", unwrap=True), Run)
    accelerator.end_training()
    assert calls == [
        ("init", {"project": "proj", "tags": ["a"]}),
        ("config", {"lr": 1}, {"allow_val_change": True}),
        ("log", {"loss": 1.5}, 4, {"commit": False}),
        ("finish",),
    ]


def test_tracker_methods_skip_other_processes_when_main_process_only(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A built-in tracker used directly (not through the Accelerator) is guarded itself."""
    not_main = types.SimpleNamespace(is_main_process=False)
    monkeypatch.setattr(state, "PartialState", lambda: not_main)
    writer = tracking.TensorBoardTracker("run", tmp_path)
    writer.start()
    writer.log({"x": 1.0}, step=0)
    writer.finish()
    assert not hasattr(writer, "writer")
    assert not (tmp_path / "run").exists()
    recorder = Recorder()  # main_process_only=True, but a user's own methods are not wrapped
    recorder.start()
    assert recorder.calls == [("start",)]


def _run_script(project_dir: Path, *args: str, processes: int = 1) -> list[dict]:
    variables = {k: v for k, v in os.environ.items() if not k.startswith(("ACCELERATE_", "WORLD_"))}
    variables["OMP_NUM_THREADS"] = "1"
    command = [*torchrun(processes), str(SCRIPT), str(project_dir), "--log_with", "tensorboard"]
    # A retried run starts from an empty folder: the aborted one's event file would count twice.
    result = run_past_teardown([*command, *args], variables, processes > 1, clear=project_dir)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    reports = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    return sorted(reports, key=lambda report: report["rank"])


@pytest.mark.slow
def test_an_hf_style_tracking_script_logs_what_it_logs_under_hf_accelerate(tmp_path: Path) -> None:
    (ours,) = _run_script(tmp_path / "accelify")
    (theirs,) = _run_script(tmp_path / "hf", "--impl", "hf")
    assert ours["calls"] == theirs["calls"]
    assert ours["calls"][0] == ["config", {"lr": 0.1, "num_epochs": 2, "seed": 42, "batch_size": 4}]
    assert [call[2] for call in ours["calls"][1:3]] == [0, 1]  # log(..., step=epoch)
    assert ours["calls"][-1] == ["finish"]
    mine, hf = (
        _scalars(tmp_path / "accelify" / "track_toy"),
        _scalars(tmp_path / "hf" / "track_toy"),
    )
    assert set(mine) == {"accuracy", "train_loss", "epoch"}
    assert mine["epoch"] == [(0, 0.0), (1, 1.0)]
    assert set(hf) == set(mine)
    for tag, points in hf.items():
        assert [step for step, _ in mine[tag]] == [step for step, _ in points]
        assert [value for _, value in mine[tag]] == pytest.approx([value for _, value in points])
    assert _hparams(tmp_path / "accelify" / "track_toy") == _hparams(tmp_path / "hf" / "track_toy")


@pytest.mark.slow
def test_on_two_processes_only_the_main_process_tracks(tmp_path: Path) -> None:
    main, other = _run_script(tmp_path, processes=2)
    assert [call[0] for call in main["calls"]] == ["config", "log", "log", "finish"]
    assert main["get_tracker"] == "Recorder"
    assert other["calls"] == []  # init_trackers and log ran on the main process only
    assert other["get_tracker"] == "GeneralTracker"  # the blank stand-in
    run = tmp_path / "track_toy"
    assert len(list(run.glob("events.out.tfevents.*"))) == 1  # one writer, the main process's
    assert len(list(run.glob("*/hparams.yml"))) == 1
    assert [step for step, _ in _scalars(run)["accuracy"]] == [0, 1]
