"""The built-in trackers, each a thin class over its own library, imported when it starts."""

from __future__ import annotations

import importlib
import os
import time
import warnings
from pathlib import Path
from typing import Any

import torch
import yaml

from ..config import env_flag
from .base import GeneralTracker, on_main_process


class TensorBoardTracker(GeneralTracker):
    """Event files under ``<logging_dir>/<project_name>`` through ``torch.utils.tensorboard``,
    or ``tensorboardX`` when the ``tensorboard`` package is missing."""

    name = "tensorboard"
    requires_logging_directory = True
    modules = ("tensorboard", "tensorboardX")
    pip_package = "tensorboard"

    def __init__(self, run_name: str, logging_dir: str | os.PathLike, **kwargs: Any) -> None:
        super().__init__()
        self.run_name = run_name
        self.logging_dir = os.path.join(logging_dir, run_name)
        self.init_kwargs = kwargs

    @on_main_process
    def start(self) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ModuleNotFoundError:
            from tensorboardX import SummaryWriter
        self.writer = SummaryWriter(self.logging_dir, **self.init_kwargs)

    @property
    def tracker(self) -> Any:
        return self.writer

    @on_main_process
    def store_init_configuration(self, values: dict) -> None:
        """TensorBoard's hparams, plus an ``hparams.yml`` in a fresh timestamped folder of the
        run (HF's layout), readable without TensorBoard."""
        self.writer.add_hparams(values, metric_dict={})
        self.writer.flush()
        folder = Path(self.logging_dir, str(time.time()))
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / "hparams.yml", "w") as stream:
            yaml.dump(values, stream)

    @on_main_process
    def log(self, values: dict, step: int | None = None, **kwargs: Any) -> None:
        """Numbers become scalars, strings text, dicts grouped scalars; tensors are read out."""
        for key, value in _plain(values).items():
            if isinstance(value, int | float):
                self.writer.add_scalar(key, value, global_step=step, **kwargs)
            elif isinstance(value, str):
                self.writer.add_text(key, value, global_step=step, **kwargs)
            elif isinstance(value, dict):
                self.writer.add_scalars(key, value, global_step=step, **kwargs)
        self.writer.flush()

    @on_main_process
    def finish(self) -> None:
        self.writer.close()


class _ProjectRunTracker(GeneralTracker):
    """Libraries with wandb's shape: ``init(project=...)`` returns a run with ``log`` and
    ``finish``, and the module's ``config`` holds the hyperparameters."""

    requires_logging_directory = False
    main_process_only = False

    def __init__(self, run_name: str, **kwargs: Any) -> None:
        super().__init__()
        self.run_name = run_name
        self.init_kwargs = kwargs

    @on_main_process
    def start(self) -> None:
        self.run = self._library().init(project=self.run_name, **self.init_kwargs)

    @property
    def tracker(self) -> Any:
        return self.run

    @on_main_process
    def store_init_configuration(self, values: dict) -> None:
        self._library().config.update(values, allow_val_change=True)

    @on_main_process
    def log(self, values: dict, step: int | None = None, **kwargs: Any) -> None:
        self.run.log(values, step=step, **kwargs)

    @on_main_process
    def finish(self) -> None:
        self.run.finish()

    def _library(self) -> Any:
        return importlib.import_module(self.modules[0])


class WandBTracker(_ProjectRunTracker):
    name = "wandb"
    modules = ("wandb",)
    pip_package = "wandb"


class TrackioTracker(_ProjectRunTracker):
    name = "trackio"
    modules = ("trackio",)
    pip_package = "trackio"


class SwanLabTracker(_ProjectRunTracker):
    name = "swanlab"
    modules = ("swanlab",)
    pip_package = "swanlab"


class CometMLTracker(GeneralTracker):
    """A Comet experiment (``comet_ml.start``, or ``Experiment`` on releases before it)."""

    name = "comet_ml"
    requires_logging_directory = False
    modules = ("comet_ml",)
    pip_package = "comet_ml"

    def __init__(self, run_name: str, **kwargs: Any) -> None:
        super().__init__()
        self.run_name = run_name
        self.init_kwargs = kwargs

    @on_main_process
    def start(self) -> None:
        import comet_ml

        begin = getattr(comet_ml, "start", None) or comet_ml.Experiment
        self.writer = begin(project_name=self.run_name, **self.init_kwargs)

    @property
    def tracker(self) -> Any:
        return self.writer

    @on_main_process
    def store_init_configuration(self, values: dict) -> None:
        self.writer.log_parameters(values)

    @on_main_process
    def log(self, values: dict, step: int | None = None, **kwargs: Any) -> None:
        if step is not None:
            self.writer.set_step(step)
        for key, value in values.items():
            if isinstance(value, int | float):
                self.writer.log_metric(key, value, step=step, **kwargs)
            elif isinstance(value, str):
                self.writer.log_other(key, value, **kwargs)
            elif isinstance(value, dict):
                self.writer.log_metrics(value, step=step, **kwargs)

    @on_main_process
    def finish(self) -> None:
        self.writer.end()


class AimTracker(GeneralTracker):
    """An Aim run in the repository at the logging directory."""

    name = "aim"
    requires_logging_directory = True
    modules = ("aim",)
    pip_package = "aim"

    def __init__(self, run_name: str, logging_dir: str | os.PathLike = ".", **kwargs: Any) -> None:
        super().__init__()
        self.run_name = run_name
        self.aim_repo_path = logging_dir
        self.init_kwargs = kwargs

    @on_main_process
    def start(self) -> None:
        from aim import Run

        self.writer = Run(repo=self.aim_repo_path, **self.init_kwargs)
        self.writer.name = self.run_name

    @property
    def tracker(self) -> Any:
        return self.writer

    @on_main_process
    def store_init_configuration(self, values: dict) -> None:
        self.writer["hparams"] = values

    @on_main_process
    def log(self, values: dict, step: int | None = None, **kwargs: Any) -> None:
        for key, value in values.items():
            self.writer.track(value, name=key, step=step, **kwargs)

    @on_main_process
    def finish(self) -> None:
        self.writer.close()


class MLflowTracker(GeneralTracker):
    """An MLflow run in the experiment named after the project; ``MLFLOW_EXPERIMENT_NAME``,
    ``MLFLOW_RUN_ID``, ``MLFLOW_TAGS`` (JSON) and ``MLFLOW_NESTED_RUN`` win over the arguments,
    as in HF Accelerate."""

    name = "mlflow"
    requires_logging_directory = False
    modules = ("mlflow",)
    pip_package = "mlflow"

    def __init__(  # noqa: PLR0917 (HF Accelerate's signature)
        self,
        experiment_name: str | None = None,
        logging_dir: str | os.PathLike | None = None,
        run_id: str | None = None,
        tags: dict[str, Any] | str | None = None,
        nested_run: bool = False,
        run_name: str | None = None,
        description: str | None = None,
    ) -> None:
        super().__init__()
        self.experiment_name = os.environ.get("MLFLOW_EXPERIMENT_NAME", experiment_name)
        self.logging_dir = logging_dir
        self.run_id = os.environ.get("MLFLOW_RUN_ID", run_id)
        tags = os.environ.get("MLFLOW_TAGS", tags)
        self.tags = yaml.safe_load(tags) if isinstance(tags, str) else tags  # JSON is YAML
        nested = os.environ.get("MLFLOW_NESTED_RUN")
        self.nested_run = nested_run if nested is None else env_flag("MLFLOW_NESTED_RUN")
        self.run_name = run_name
        self.description = description

    @on_main_process
    def start(self) -> None:
        import mlflow

        found = mlflow.search_experiments(filter_string=f"name = '{self.experiment_name}'")
        experiment_id = (
            found[0].experiment_id
            if found
            else mlflow.create_experiment(
                name=self.experiment_name, artifact_location=self.logging_dir, tags=self.tags
            )
        )
        self.active_run = mlflow.start_run(
            run_id=self.run_id,
            experiment_id=experiment_id,
            run_name=self.run_name,
            nested=self.nested_run,
            tags=self.tags,
            description=self.description,
        )

    @property
    def tracker(self) -> Any:
        return self.active_run

    @on_main_process
    def store_init_configuration(self, values: dict) -> None:
        """MLflow refuses over-long values and more than a batch of params per call: the first
        are dropped with a warning, the rest sent in batches."""
        import mlflow
        from mlflow.utils import validation

        kept = {}
        for key, value in values.items():
            if len(str(value)) > validation.MAX_PARAM_VAL_LENGTH:
                warnings.warn(
                    f"mlflow: {key!r} is too long to be a parameter; dropped", stacklevel=3
                )
            else:
                kept[key] = value
        items = list(kept.items())
        batch = validation.MAX_PARAMS_TAGS_PER_BATCH
        for start in range(0, len(items), batch):
            mlflow.log_params(dict(items[start : start + batch]))

    @on_main_process
    def log(self, values: dict, step: int | None = None, **kwargs: Any) -> None:
        """Numbers only: MLflow metrics are floats, so anything else is dropped with a warning."""
        import mlflow

        mlflow.log_metrics(_numbers_only(values, "mlflow"), step=step, **kwargs)

    @on_main_process
    def finish(self) -> None:
        import mlflow

        mlflow.end_run()


class ClearMLTracker(GeneralTracker):
    """A ClearML task: the one already running, else a new one (``CLEARML_PROJECT`` and
    ``CLEARML_TASK`` win over the project name). A key's ``eval_``/``test_``/``train_`` prefix
    picks the series, as in HF Accelerate."""

    name = "clearml"
    requires_logging_directory = False
    modules = ("clearml",)
    pip_package = "clearml"

    def __init__(self, run_name: str | None = None, **kwargs: Any) -> None:
        super().__init__()
        self.user_provided_run_name = run_name
        self.init_kwargs = kwargs
        self._initialized_externally = False

    @on_main_process
    def start(self) -> None:
        from clearml import Task

        running = Task.current_task()
        self._initialized_externally = running is not None
        if running is not None:
            self.task = running
            return
        options = dict(self.init_kwargs)
        name = self.user_provided_run_name
        options.setdefault("project_name", os.environ.get("CLEARML_PROJECT", name))
        options.setdefault("task_name", os.environ.get("CLEARML_TASK", name))
        self.task = Task.init(**options)

    @property
    def tracker(self) -> Any:
        return self.task

    @on_main_process
    def store_init_configuration(self, values: dict) -> Any:
        return self.task.connect_configuration(values)

    @on_main_process
    def log(self, values: dict, step: int | None = None, **kwargs: Any) -> None:
        """Without a step each value is a single value; with one, a scalar at that iteration."""
        report = self.task.get_logger()
        for key, value in _numbers_only(values, "clearml").items():
            if step is None:
                report.report_single_value(name=key, value=value, **kwargs)
                continue
            title, series = _title_and_series(key)
            report.report_scalar(title=title, series=series, value=value, iteration=step, **kwargs)

    @on_main_process
    def finish(self) -> None:
        if not self._initialized_externally:
            self.task.close()


class DVCLiveTracker(GeneralTracker):
    """A ``dvclive.Live`` (given as ``live``, else built from the init kwargs; the project name
    is not used, as in HF Accelerate)."""

    name = "dvclive"
    requires_logging_directory = False
    modules = ("dvclive",)
    pip_package = "dvclive"

    def __init__(self, run_name: str | None = None, live: Any = None, **kwargs: Any) -> None:
        super().__init__()
        self.live = live
        self.init_kwargs = kwargs

    @on_main_process
    def start(self) -> None:
        from dvclive import Live

        if self.live is None:
            self.live = Live(**self.init_kwargs)

    @property
    def tracker(self) -> Any:
        return self.live

    @on_main_process
    def store_init_configuration(self, values: dict) -> None:
        self.live.log_params(values)

    @on_main_process
    def log(self, values: dict, step: int | None = None, **kwargs: Any) -> None:
        """Log what dvclive can plot, then advance its step."""
        from dvclive.plots import Metric

        if step is not None:
            self.live.step = step
        for key, value in values.items():
            if Metric.could_log(value):
                self.live.log_metric(key, value, **kwargs)
            else:
                warnings.warn(f"dvclive cannot log {key}={value!r}; dropped", stacklevel=3)
        self.live.next_step()

    @on_main_process
    def finish(self) -> None:
        self.live.end()


def _plain(values: dict) -> dict:
    """Tensors read out as Python numbers (one element) or lists, so any writer takes them."""
    return {
        key: (value.detach().cpu().tolist() if isinstance(value, torch.Tensor) else value)
        for key, value in values.items()
    }


def _numbers_only(values: dict, library: str) -> dict:
    numbers = {k: v for k, v in values.items() if isinstance(v, int | float)}
    for key in values.keys() - numbers.keys():
        warnings.warn(f"{library} logs numbers only; {key}={values[key]!r} dropped", stacklevel=4)
    return numbers


def _title_and_series(key: str) -> tuple[str, str]:
    for prefix in ("eval", "test", "train"):
        if key.startswith(f"{prefix}_"):
            return key[len(prefix) + 1 :], prefix
    return key, "train"
