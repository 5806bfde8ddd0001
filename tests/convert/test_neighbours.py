"""Downloads in the script's own modules: found through its imports, in the file beside it."""

from __future__ import annotations

from pathlib import Path

import pytest

from accelify.rules.checks import all_rules
from accelify.rules.checks.logger_on_every_process import LoggerOnEveryProcess
from accelify.rules.engine import lint
from accelify.transform.convert import convert
from accelify.transform.loss_scaler import trains_beside
from accelify.transform.model_runners import only_runs
from accelify.transform.neighbours import (
    distributing_functions,
    drawing_functions,
    fetching_imports,
    passes_through,
    process_query,
    uses_only,
    writing_functions,
)

DOWNLOADER = """
import urllib.request

def _get(url, dest):
    urllib.request.urlretrieve(url, dest)

def dataset(root):
    _get("https://example.org/x", root)
    return root

def mnist(root):
    return MNIST(root, download=True)

def labels(root):
    return open(root).read()
"""


def _script(tmp_path: Path) -> str:
    script = tmp_path / "train.py"
    script.write_text("")
    return str(script)


def test_functions_that_fetch_directly_or_through_another_are_found(tmp_path: Path) -> None:
    (tmp_path / "data.py").write_text(DOWNLOADER)
    imports = {"dataset": "data.dataset", "mnist": "data.mnist", "labels": "data.labels",
               "torch": "torch"}  # fmt: skip
    assert fetching_imports(_script(tmp_path), imports) == {"data.dataset", "data.mnist"}


def test_packages_and_relative_imports_resolve_beside_the_script(tmp_path: Path) -> None:
    (tmp_path / "utils").mkdir()
    (tmp_path / "utils" / "__init__.py").write_text(DOWNLOADER)
    imports = {"d": ".utils.dataset", "l": "utils.labels"}
    assert fetching_imports(_script(tmp_path), imports) == {".utils.dataset"}


def test_missing_or_broken_modules_and_unsaved_sources_tell_nothing(tmp_path: Path) -> None:
    (tmp_path / "broken.py").write_text("def dataset(:\n")
    imports = {"a": "broken.dataset", "b": "absent.dataset"}
    assert fetching_imports(_script(tmp_path), imports) == frozenset()
    (tmp_path / "data.py").write_text(DOWNLOADER)
    assert fetching_imports("<string>", {"d": "data.dataset"}) == frozenset()


MISC = """
import os
import torch.distributed as dist

def _setup(args):
    dist.init_process_group("gloo")

def init_distributed_mode(args):
    args.distributed = "RANK" in os.environ
    if args.distributed:
        _setup(args)

def get_rank():
    return dist.get_rank() if dist.is_initialized() else 0
"""

TRAIN = """
import argparse
import torch
from torch.utils.data import DataLoader, TensorDataset
import util.misc as utils

def main(args):
    utils.init_distributed_mode(args)
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(TensorDataset(torch.randn(8, 2), torch.randn(8, 1)), batch_size=2)
    for x, y in loader:
        optimizer.zero_grad()
        ((model(x) - y) ** 2).mean().backward()
        optimizer.step()

main(argparse.Namespace())
"""


def test_helpers_that_start_the_process_group_are_found_through_module_imports(
    tmp_path: Path,
) -> None:
    (tmp_path / "util").mkdir()
    (tmp_path / "util" / "misc.py").write_text(MISC)
    found = distributing_functions(
        _script(tmp_path), ["util.misc.init_distributed_mode", "util.misc.get_rank", "os.getcwd"]
    )
    assert found == {"util.misc.init_distributed_mode"}


QUERIES = """
import os
import torch.distributed as dist

def is_dist_avail_and_initialized():
    if not dist.is_available():
        return False
    if not dist.is_initialized():
        return False
    return True

def get_world_size():
    if not is_dist_avail_and_initialized():
        return 1
    return dist.get_world_size()

def get_rank():
    \"\"\"This process's rank.\"\"\"
    return dist.get_rank() if dist.is_initialized() else 0

def two_when_alone():
    if not is_dist_avail_and_initialized():
        return 2
    return dist.get_world_size()

def from_the_environment():
    return int(os.environ.get("WORLD_SIZE", 1))

def of_a_group(group):
    return dist.get_world_size(group)

def noisy():
    print("asked")
    return dist.get_rank() if dist.is_initialized() else 0

def checks_something_else():
    if os.environ.get("X"):
        return 1
    return dist.get_world_size()
"""


def test_helpers_that_answer_torch_distributeds_queries_are_read_as_the_process_count(
    tmp_path: Path,
) -> None:
    """DETR's, DeiT's and MAE's util/misc.py: rank 0 of 1 until the group starts, then dist's
    answers, which the accelerator's equal once it starts the group."""
    (tmp_path / "util").mkdir()
    (tmp_path / "util" / "misc.py").write_text(QUERIES)
    script = _script(tmp_path)
    found = {
        name: process_query(script, f"util.misc.{name}")
        for name in ("get_world_size", "get_rank", "two_when_alone", "from_the_environment",
                     "of_a_group", "noisy", "checks_something_else", "absent")
    }  # fmt: skip
    assert found == {
        "get_world_size": "get_world_size", "get_rank": "get_rank", "two_when_alone": None,
        "from_the_environment": None, "of_a_group": None, "noisy": None,
        "checks_something_else": None, "absent": None,
    }  # fmt: skip
    assert process_query(script, "misc.get_rank") is None  # not beside the script


SAMPLED = """
import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
import util.misc as utils

def main(args):
    utils.init_distributed_mode(args)
    device = torch.device(args.device)
    data = TensorDataset(torch.randn(8, 2), torch.randn(8, 1))
    num_tasks = utils.get_world_size()
    global_rank = utils.get_rank()
    sampler = DistributedSampler(data, num_replicas={replicas}, rank={rank}, shuffle=True)
    loader = DataLoader(data, sampler=sampler, batch_size=2)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 1).to(device))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for x, y in loader:
            optimizer.zero_grad()
            ((model(x) - y) ** 2).mean().backward()
            optimizer.step()
"""


@pytest.mark.parametrize(
    ("replicas", "rank", "converts"),
    [
        ("num_tasks", "global_rank", True),
        ("utils.get_world_size()", "utils.get_rank()", True),
        ("global_rank", "num_tasks", False),  # swapped: not the accelerator's shards
        ("num_tasks", "0", False),
    ],
)
def test_a_sampler_sharded_by_the_helpers_answers_becomes_the_prepared_loaders(
    tmp_path: Path, replicas: str, rank: str, converts: bool
) -> None:
    (tmp_path / "util").mkdir()
    (tmp_path / "util" / "misc.py").write_text(
        QUERIES + "\ndef init_distributed_mode(args):\n    dist.init_process_group('gloo')\n"
    )
    script = SAMPLED.format(replicas=replicas, rank=rank)
    result = convert(script, path=_script(tmp_path))
    assert ("accelerator.prepare(model, optimizer, loader)" in result.code) is converts
    if not converts:
        (note,) = result.manual
        assert note.refusal == "ACR303" and "is not one accel-convert recognises" in note.message


def test_a_launcher_whose_module_runs_no_backward_is_named_truly(tmp_path: Path) -> None:
    """DeiT's engine.train_one_epoch hands the loss to timm's loss scaler: giving the folder
    would not help, and the note says so."""
    (tmp_path / "engine.py").write_text(
        "def train_one_epoch(model, loader, optimizer, scaler):\n"
        "    for x, y in loader:\n        scaler(model(x).mean(), optimizer)\n"
    )
    script = (
        "import torch\nfrom torch.utils.data import DataLoader, TensorDataset\n"
        "from engine import train_one_epoch\n\n"
        "model = torch.nn.Linear(2, 1)\n"
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "loader = DataLoader(TensorDataset(torch.randn(8, 2), torch.randn(8, 1)))\n"
        "train_one_epoch(model, loader, optimizer, None)\n"
    )
    assert trains_beside(_script(tmp_path), "engine.train_one_epoch") == ("engine.py", False)
    (note,) = convert(script, path=_script(tmp_path)).notes
    assert "engine.py runs no .backward() either" in note.message
    for step in ("model(x).mean().backward()", "scaler(model(x).mean(), optimizer)"):
        (tmp_path / "engine.py").write_text(  # a loss scaler's step zeroes the gradients
            "def train_one_epoch(model, loader, optimizer, scaler):\n"
            f"    for x, y in loader:\n        optimizer.zero_grad()\n        {step}\n"
        )
        (note,) = convert(script, path=_script(tmp_path)).notes
        assert "give it this file with the one that trains" in note.message


def test_an_agent_whose_method_trains_beside_the_script_is_named(tmp_path: Path) -> None:
    """cleanrl-like entry points build an agent from a module beside them and call its update
    (SAC's update_parameters, a GAN's train()): the note names the method that runs the
    backward, not the first method called (select_action), and says nothing for a class whose
    methods run none."""
    (tmp_path / "sac.py").write_text(
        "import torch\n\n\nclass SAC:\n"
        "    def __init__(self):\n        self.policy = torch.nn.Linear(2, 1)\n"
        "        self.optim = torch.optim.Adam(self.policy.parameters())\n\n"
        "    def select_action(self, state):\n        return self.policy(state)\n\n"
        "    def update_parameters(self, memory):\n"
        "        loss = self.policy(memory).mean()\n        self.optim.zero_grad()\n"
        "        loss.backward()\n        self.optim.step()\n"
    )
    script = (
        "import torch\nfrom sac import SAC\n\nagent = SAC()\n"
        "for step in range(10):\n    action = agent.select_action(torch.randn(1, 2))\n"
        "    agent.update_parameters(torch.randn(4, 2))\n"
    )
    (note,) = convert(script, path=_script(tmp_path)).notes
    assert note.line == 7 and note.info
    assert "agent.update_parameters(...) (SAC.update_parameters in sac.py)" in note.message
    (tmp_path / "sac.py").write_text(
        "class SAC:\n    def select_action(self, state):\n        return state\n\n"
        "    def update_parameters(self, memory):\n        return memory\n"
    )
    assert convert(script, path=_script(tmp_path)).notes == ()


def test_a_trainer_re_exported_by_its_package_and_training_in_a_method_is_named(
    tmp_path: Path,
) -> None:
    """pytorch-template's layout: ``from trainer import Trainer`` reads a package whose
    ``__init__`` re-exports the class from ``trainer/trainer.py``, and ``trainer.train()`` is
    inherited from a base class, while the class's own ``_train_epoch`` runs the backward. The
    note names that method and says ``train`` is inherited; with no backward in the class, no
    note."""
    (tmp_path / "trainer").mkdir()
    (tmp_path / "trainer" / "__init__.py").write_text("from .trainer import *\n")
    trainer = (
        "from base import BaseTrainer\n\n\nclass Trainer(BaseTrainer):\n"
        "    def _train_epoch(self, epoch):\n"
        "        loss = self.model(self.data).mean()\n        loss.backward()\n"
        "        self.optimizer.step()\n"
    )
    (tmp_path / "trainer" / "trainer.py").write_text(trainer)
    script = (
        "import torch\nfrom trainer import Trainer\n\nmodel = torch.nn.Linear(2, 1)\n"
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "trainer = Trainer(model, optimizer)\ntrainer.train()\n"
    )
    (note,) = convert(script, path=_script(tmp_path)).notes
    assert note.line == 7 and note.info and note.refusal == "ACR106"
    assert (
        "trainer.train(...) (Trainer.train, inherited; Trainer._train_epoch in "
        "trainer/trainer.py runs the backward)" in note.message
    )
    (tmp_path / "trainer" / "trainer.py").write_text(trainer.replace("loss.backward()", "pass"))
    assert convert(script, path=_script(tmp_path)).notes == ()


def test_an_update_of_an_object_the_project_builds_is_named_as_a_possible_step(
    tmp_path: Path,
) -> None:
    """DomainBed's scripts/train.py runs no backward: its loop calls algorithm.update(...) on an
    instance of the class algorithms.get_algorithm_class(name) returns, from the project's own
    package above the script. The note says the step may be in there; an installed library's
    object updated in a loop (a progress bar) gets none."""
    package = tmp_path / "domain"
    (package / "scripts").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "algorithms.py").write_text("def get_algorithm_class(name):\n    return None\n")
    script = package / "scripts" / "train.py"
    code = (
        "from domain import algorithms\n\n"
        "algorithm_class = algorithms.get_algorithm_class('ERM')\n"
        "algorithm = algorithm_class(4, 2)\n"
        "for step in range(10):\n    algorithm.update([step])\n"
    )
    script.write_text(code)
    (note,) = convert(code, path=str(script)).notes
    assert note.line == 6 and note.info and note.refusal == "ACR106"
    assert (
        "algorithm.update(...) calls into an object built by what "
        "domain.algorithms.get_algorithm_class(...) returns" in note.message
    )
    bar = (
        "from tqdm import tqdm\n\npbar = tqdm(total=10)\n"
        "for step in range(10):\n    pbar.update(1)\n"
    )
    script.write_text(bar)
    assert convert(bar, path=str(script)).notes == ()


def test_a_model_moved_by_a_helper_beside_the_script_is_refused(tmp_path: Path) -> None:
    """Beta-VAE's ``from utils import cuda``: the helper returns what it is given moved to the
    GPU when a flag asks for it, for the model and the batches alike. Converted, the model would
    go where the accelerator puts it (the CPU, as nothing in the file moves) while the batches
    followed the flag: refused at the call that moves the model. A helper that only returns what
    it is given does not hold the conversion back."""
    (tmp_path / "utils.py").write_text(
        "def cuda(tensor, uses_cuda):\n    return tensor.cuda() if uses_cuda else tensor\n"
    )
    script = (
        "import torch\nfrom utils import cuda\n\nuse_cuda = torch.cuda.is_available()\n"
        "loader = torch.utils.data.DataLoader(torch.randn(8, 2), batch_size=4)\n"
        "net = cuda(torch.nn.Linear(2, 1), use_cuda)\n"
        "optimizer = torch.optim.SGD(net.parameters(), lr=0.1)\n"
        "for x in loader:\n    net(cuda(x, use_cuda)).mean().backward()\n    optimizer.step()\n"
    )
    result = convert(script, path=_script(tmp_path))
    assert not result.changed
    (note,) = result.manual
    assert note.line == 6 and note.refusal == "ACR209"
    assert "the model goes through cuda(), which returns what it is given moved" in note.message
    (tmp_path / "utils.py").write_text("def cuda(tensor, uses_cuda):\n    return tensor\n")
    assert convert(script, path=_script(tmp_path)).changed


def test_a_script_whose_helper_starts_the_process_group_stays_unchanged(tmp_path: Path) -> None:
    """The helper would start a second set-up under prepare(), and the switches it sets would
    keep choosing the hand-written path: refused at the call, with the file it is in."""
    (tmp_path / "util").mkdir()
    (tmp_path / "util" / "misc.py").write_text(MISC)
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    result = convert(TRAIN, path=str(script))
    assert not result.changed
    (note,) = result.manual
    assert note.line == 8 and note.refusal == "ACR301"
    assert "utils.init_distributed_mode() starts the process group in util/misc.py" in note.message
    (tmp_path / "util" / "misc.py").write_text(MISC.replace("init_process_group", "barrier"))
    assert convert(TRAIN, path=str(script)).changed  # the baseline: without it, it converts


LOGGER = """
import time

class MetricLogger(object):
    def log_every(self, iterable, print_freq, header=None):
        i = 0
        for obj in iterable:
            start = time.time()
            yield obj
            if i % print_freq == 0 or i == len(iterable) - 1:
                print(header, i, len(iterable), time.time() - start)
            i += 1
"""


def _loop(*lines: str) -> str:
    """Lines of ``log_every``'s loop body."""
    return "".join(" " * 12 + line + "\n" for line in lines)


YIELD = _loop("yield obj")
# Each breaks one fact the loop's batches being the loader's own rests on.
NOT_THROUGH = {
    "a yield under a condition": (YIELD, _loop("if i % 2:", "    yield obj")),
    "two yields": (YIELD, _loop("yield obj", "yield obj")),
    "an early exit": (_loop("i += 1"), _loop("i += 1", "if i > 3:", "    break")),
    "another item": (YIELD, _loop("yield obj[0]")),
    "the item rebound": (YIELD, _loop("obj = obj * 2", "yield obj")),
    "the iterable read": ("        i = 0\n", "        i = 0\n        next(iter(iterable))\n"),
    "a base class": ("class MetricLogger(object):", "class MetricLogger(Base):"),
    "a collective": (YIELD, _loop("yield obj", "dist.barrier()")),
    "errors swallowed": (YIELD, _loop("try:", "    yield obj", "except ValueError:", "    pass")),
}

LOGGED = """
import torch
from torch.utils.data import DataLoader, TensorDataset
import util.misc as utils

def train_one_epoch(model, loader, optimizer):
    metric_logger = utils.MetricLogger()
    for x, y in metric_logger.log_every(loader, 10, "train"):
        optimizer.zero_grad()
        ((model(x) - y) ** 2).mean().backward()
        optimizer.step()

model = torch.nn.Linear(2, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loader = DataLoader(TensorDataset(torch.randn(8, 2), torch.randn(8, 1)), batch_size=2)
train_one_epoch(model, loader, optimizer)
"""


def _logger(tmp_path: Path, code: str) -> str:
    (tmp_path / "util").mkdir(exist_ok=True)
    (tmp_path / "util" / "misc.py").write_text(code)
    return _script(tmp_path)


def test_a_metric_loggers_log_every_is_read_as_handing_on_the_loaders_batches(
    tmp_path: Path,
) -> None:
    script = _logger(tmp_path, LOGGER)
    assert passes_through(script, "util.misc.MetricLogger", "log_every")
    assert not passes_through(script, "util.misc.MetricLogger", "update")
    assert not passes_through(script, "util.misc.Absent", "log_every")


@pytest.mark.parametrize("change", NOT_THROUGH.values(), ids=NOT_THROUGH)
def test_a_method_that_may_not_hand_on_each_item_once_is_not_read_through(
    tmp_path: Path, change: tuple[str, str]
) -> None:
    old, new = change
    assert old in LOGGER
    script = _logger(tmp_path, LOGGER.replace(old, new))
    assert not passes_through(script, "util.misc.MetricLogger", "log_every")


def test_training_through_log_every_prepares_the_loader_it_walks(tmp_path: Path) -> None:
    script = _logger(tmp_path, LOGGER)
    result = convert(LOGGED, path=script)
    assert "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)" in result.code
    assert not result.manual
    # The same logger in the script itself is read the same way.
    inline = LOGGED.replace("import util.misc as utils\n", LOGGER).replace("utils.", "")
    assert "accelerator.prepare(model, optimizer, loader)" in convert(inline, path=script).code


def test_a_logger_not_shown_to_hand_on_the_batches_leaves_the_loader_unprepared(
    tmp_path: Path,
) -> None:
    """As for any loop over an unknown iterable: the data is not known to be the loader's, so
    the loader is not sharded and the report says every process trains on all of it."""
    old, new = NOT_THROUGH["a yield under a condition"]
    script = _logger(tmp_path, LOGGER.replace(old, new))
    result = convert(LOGGED, path=script)
    assert "accelerator.prepare(model, optimizer)" in result.code
    (note,) = result.manual
    assert "no DataLoader feeds this training step" in note.message
    # A second binding of the logger in the function: which class runs is not one fact.
    twice = LOGGED.replace(
        "    for x, y", "    if optimizer:\n        metric_logger = Other()\n    for x, y"
    )
    assert (
        "accelerator.prepare(model, optimizer)"
        in convert(twice, path=_logger(tmp_path, LOGGER)).code
    )


TRACKING_LOGGER = """
import numpy as np
import tensorflow as tf
import visdom
from torch.utils.tensorboard import SummaryWriter as Board

class Logger(object):
    def __init__(self, log_dir):
        self.writer = {writer}

    def scalar_summary(self, tag, value, step):
        self.writer.add_summary(tf.Summary(), step)

class Meter:
    def __init__(self):
        self.values = np.zeros(3)
"""

LOGGING = """
import torch
from torch.utils.data import DataLoader, TensorDataset
from logger import Logger, Meter

model = torch.nn.Linear(2, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loader = DataLoader(TensorDataset(torch.randn(8, 2), torch.randn(8, 1)), batch_size=2)
logger = Logger("./logs")
meter = Meter()
for step, (x, y) in enumerate(loader):
    optimizer.zero_grad()
    loss = ((model(x) - y) ** 2).mean()
    loss.backward()
    optimizer.step()
    logger.scalar_summary("loss", loss.item(), step)
"""


@pytest.mark.parametrize(
    ("writer", "opened", "inside"),
    [
        (
            "tf.summary.FileWriter(log_dir)",
            "Logger (a tensorflow.summary.FileWriter)",
            "FileWriter",
        ),
        ("Board(log_dir)", "Logger (a torch.utils.tensorboard.SummaryWriter)", "SummaryWriter"),
        ("visdom.Visdom(env=log_dir)", "Logger (a visdom.Visdom)", "visdom connection"),
        ("open(log_dir)", None, None),
    ],
)
def test_a_project_logger_that_opens_a_tracking_writer_is_reported_on_every_process(
    tmp_path: Path, writer: str, opened: str | None, inside: str | None
) -> None:
    """Research code's own MetricLogger opens nothing; a Logger that builds TensorBoard's writer
    opens one event file per process, as the writer itself would."""
    (tmp_path / "logger.py").write_text(TRACKING_LOGGER.format(writer=writer))
    result = convert(LOGGING, path=_script(tmp_path))
    assert "accelerator.prepare(model, optimizer, loader)" in result.code
    found = [(n.line, n.message) for n in result.manual if "opens its own" in n.message]
    told = "here: open it, and log, on the main process only (if accelerator.is_main_process:)"
    assert found == ([(9, f"every process opens its own {opened} {told}")] if opened else [])
    # accel-lint, given the converted file's path, flags the line the note is about (ACL105).
    flagged = lint(result.code, [LoggerOnEveryProcess], path=_script(tmp_path))
    assert [f.source.strip() for f in flagged] == (['logger = Logger("./logs")'] if opened else [])
    assert lint(result.code, [LoggerOnEveryProcess]) == []  # no file: nothing beside it to read
    # The same class in the script itself: its __init__ runs from the training, where the
    # writer it builds is reported.
    inline = LOGGING.replace("from logger import Logger, Meter\n", "").replace(
        "import torch\n", TRACKING_LOGGER.format(writer=writer) + "import torch\n", 1
    )
    inner = [(n.line, n.message) for n in convert(inline).manual if "opens its own" in n.message]
    assert inner == ([(10, f"every process opens its own {inside} {told}")] if inside else [])


SCHEDULES = """
import math


def adjust_learning_rate(optimizer, epoch, args):
    lr = args.lr * 0.5 * (1.0 + math.cos(math.pi * epoch / args.epochs))
    for param_group in optimizer.param_groups:
        if "lr_scale" in param_group:
            param_group["lr"] = lr * param_group["lr_scale"]
        else:
            param_group["lr"] = lr
    return lr


def steps(optimizer):
    optimizer.step()


def keeps(optimizer):
    global kept
    kept = optimizer.param_groups


def hands_on(optimizer, log):
    log(optimizer)
    return optimizer.param_groups
"""


@pytest.mark.parametrize(
    ("function", "arg", "reads"),
    [
        ("adjust_learning_rate", 0, True),
        ("adjust_learning_rate", "optimizer", True),
        ("adjust_learning_rate", 1, False),  # epoch is not used as .param_groups
        ("adjust_learning_rate", "missing", False),
        ("steps", 0, False),
        ("keeps", 0, False),  # a global: the reading stops at what it cannot see whole
        ("hands_on", 0, False),
        ("undefined", 0, False),
    ],
)
def test_a_learning_rate_schedule_beside_the_script_reads_only_param_groups(
    tmp_path: Path, function: str, arg: int | str, reads: bool
) -> None:
    (tmp_path / "lr_sched.py").write_text(SCHEDULES)
    script = str(tmp_path / "train.py")
    assert uses_only(script, f"lr_sched.{function}", arg, frozenset({"param_groups"})) is reads


def test_a_prepared_optimizer_handed_to_such_a_schedule_converts(tmp_path: Path) -> None:
    (tmp_path / "lr_sched.py").write_text(SCHEDULES)
    source = (
        "import torch\n"
        "from torch.utils.data import DataLoader, TensorDataset\n"
        "import lr_sched\n\n"
        "model = torch.nn.Linear(4, 1)\n"
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "loader = DataLoader(TensorDataset(torch.randn(8, 4), torch.randn(8, 1)), batch_size=4)\n"
        "for epoch in range(2):\n"
        "    lr_sched.{}(optimizer, epoch, None)\n"
        "    for x, y in loader:\n"
        "        optimizer.zero_grad()\n"
        "        (model(x) - y).pow(2).mean().backward()\n"
        "        optimizer.step()\n"
    )
    path = str(tmp_path / "train.py")
    assert convert(source.format("adjust_learning_rate"), path=path).changed
    refused = convert(source.format("hands_on"), path=path)
    assert not refused.changed and "hands_on" in refused.manual[0].message


RUNNERS = """
import torch

def validate(net, loader, classes):
    net.eval()
    for i, (x, y) in enumerate(loader):
        out = net(x)
    for _ in range(len(classes)):
        pass
    return out

def count(net):
    print(net)
    return sum(p.numel() for p in net.parameters())

def hidden(net):
    return net(net.init_hidden())

def until_end(net, x):
    while x.sum() > 0:
        x = net(x)

def when_big(net, x):
    if x.sum() > 0:
        net(x)

def zeroes(net):
    for p in net.parameters():
        p.data.zero_()

def trains(net, x, optimizer):
    net(x).sum().backward()
    optimizer.step()

def over_data(net, x):
    for row in x.tolist():
        net(row)

def hands_on(net):
    return net

def picked(net, xs):
    return [net(x) for x in xs if x.sum() > 0]

def listed(net, xs):
    return [net(x) for x in xs]
"""


@pytest.mark.parametrize(
    ("function", "runs"),
    [("validate", True), ("count", True), ("hidden", False), ("until_end", False),
     ("when_big", False), ("zeroes", False), ("trains", False), ("over_data", False),
     ("hands_on", False), ("picked", False), ("listed", True)],
)  # fmt: skip
def test_a_helper_only_runs_the_model_when_the_wrapper_answers_every_use_in_lockstep(
    tmp_path: Path, function: str, runs: bool
) -> None:
    """Forwards (as many on every process), eval/train, printing and counting parameters are
    what a DDP wrapper answers as its module; a method of the module, a forward that data
    decides, a step, or the model handed back are not."""
    (tmp_path / "helpers.py").write_text(RUNNERS)
    assert only_runs(_script(tmp_path), f"helpers.{function}", 0) is runs


WRITERS = """
import os
import shutil
import torch
import matplotlib.pyplot as plt

def save_checkpoint(state, is_best, filename="checkpoint.pth"):
    torch.save(state, filename)
    if is_best:
        shutil.copyfile(filename, "best.pth")

def plot(history, path):
    plt.plot(history)
    plt.savefig(path)

def log(line, path):
    with open(path, "a") as f:
        f.write(line)

def through(state):
    save_checkpoint(state, False)

def remembers(history, value, path):
    history.append(value)
    torch.save(history, path)

def counts(path):
    global written
    written += 1
    torch.save(written, path)

def reads(path):
    return open(path).read()

def copies(table):
    return table.copy()
"""


def test_helpers_that_write_and_keep_to_themselves_are_found(tmp_path: Path) -> None:
    """On the main process alone such a helper does all it did on each; one that also changes
    what it is handed, or a global, does more than write."""
    (tmp_path / "utils.py").write_text(WRITERS)
    names = [f"utils.{n}" for n in
             ("save_checkpoint", "plot", "log", "through", "remembers", "counts", "reads",
              "copies")]  # fmt: skip
    assert writing_functions(_script(tmp_path), names) == {
        "utils.save_checkpoint", "utils.plot", "utils.log", "utils.through"
    }  # fmt: skip


# A script that trains one step per batch and imports ``utils`` from beside it; tests add what
# each step does with it.
TRAINS_WITH_UTILS = (
    "import torch\nimport utils\n"
    "model = torch.nn.Linear(2, 2)\n"
    "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
    "loader = torch.utils.data.DataLoader(torch.randn(8, 2), batch_size=2)\n"
    "for x in loader:\n"
    "    optimizer.zero_grad()\n"
    "    model(x).sum().backward()\n"
    "    optimizer.step()\n"
)


def test_a_write_of_a_helper_beside_goes_to_the_main_process(tmp_path: Path) -> None:
    (tmp_path / "utils.py").write_text(WRITERS)
    script = tmp_path / "train.py"
    script.write_text(
        TRAINS_WITH_UTILS + "    utils.save_checkpoint(model.state_dict(), False)\n"
        "    utils.remembers([], 1, 'h.pt')\n"
    )
    code = convert(script.read_text(), path=str(script)).code
    assert "    if accelerator.is_main_process:\n        utils.save_checkpoint(" in code
    assert "\n    utils.remembers([], 1, 'h.pt')\n" in code


SPLITTER = """
import numpy as np

def split(n):
    order = np.arange(n)
    np.random.shuffle(order)
    return order[: n // 2], order[n // 2 :]

def seeded_split(n):
    rng = np.random.default_rng(0)
    return rng.permutation(n)

def dataset(items):
    def transform(x):
        return x * np.random.random()  # per item, as it is read: augmentation
    return [(x, transform) for x in items]
"""
SPLIT_SCRIPT = """import torch
{seed}from graph.utils import split, seeded_split

train_idx, test_idx = split(8)
order = seeded_split(8)
model = torch.nn.Linear(2, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loader = torch.utils.data.DataLoader(torch.randn(8, 2)[train_idx], batch_size=2)
for x in loader:
    optimizer.zero_grad()
    model(x).sum().backward()
    optimizer.step()
"""


@pytest.mark.parametrize("seed", ["", "torch.manual_seed(0)\nimport numpy\nnumpy.random.seed(0)\n"])
def test_an_unseeded_draw_in_the_packages_own_module_is_said_where_it_is_called(
    tmp_path: Path, seed: str
) -> None:
    """gae's ``from gae.utils import mask_test_edges`` in ``gae/train.py``: the module is read
    from the folder above, and a split drawn from each process's own stream is told."""
    package = tmp_path / "graph"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "utils.py").write_text(SPLITTER)
    script = package / "train.py"
    script.write_text(SPLIT_SCRIPT.format(seed=seed))
    result = convert(script.read_text(), path=str(script))
    draws = [n for n in result.notes if "own random stream" in n.message]
    if seed:
        assert draws == []
    else:
        (note,) = draws
        assert note.manual and note.line == 4 and "split(...)" in note.message
        assert "graph/utils.py" in note.message


def test_lint_flags_the_same_draw_in_a_script_that_creates_an_accelerator(tmp_path: Path) -> None:
    """ACL216 reads the module beside as the converter does, and says the same."""
    package = tmp_path / "graph"
    package.mkdir()
    (package / "utils.py").write_text(SPLITTER)
    script = package / "train.py"
    text = "from accelerate import Accelerator\nfrom graph.utils import split\n\n"
    text += "accelerator = Accelerator()\ntrain_idx, test_idx = split(8)\n"
    script.write_text(text)
    rule = [r for r in all_rules() if r.code == "ACL216"]
    (finding,) = lint(text, rule, path=str(script))
    assert finding.line == 5 and "split(...) draws from each process's own" in finding.message
    seeded = text.replace("Accelerator()\n", "Accelerator()\nset_seed(0)\n")
    assert lint(seeded, rule, path=str(script)) == []


def test_a_draw_in_a_function_only_defined_inside_is_not_the_helpers_own(tmp_path: Path) -> None:
    """A dataset's per-item transform draws when an item is read (augmentation, meant to differ
    per process); the split draws as it runs."""
    (tmp_path / "graph.py").write_text(SPLITTER)
    names = ["graph.split", "graph.seeded_split", "graph.dataset"]
    assert drawing_functions(_script(tmp_path), names) == {"graph.split"}


def test_a_trainer_called_itself_moved_and_re_exported_absolutely_is_named(tmp_path: Path) -> None:
    """disentangling-vae's ``trainer(train_loader)``: ``Trainer.__call__`` runs the backward
    through ``self._train_epoch`` and ``self._train_iteration``, and the package's ``__init__``
    re-exports it with its own absolute import; simple-faster-rcnn's ``Trainer(net).cuda()``
    is the trainer too. The note names the method with the backward and says to give both
    files to project mode."""
    (tmp_path / "vae").mkdir()
    (tmp_path / "vae" / "__init__.py").write_text("from vae.training import Trainer\n")
    (tmp_path / "vae" / "training.py").write_text(
        "class Trainer:\n"
        "    def __call__(self, loader):\n        for x in loader:\n"
        "            self._train_epoch(x)\n\n"
        "    def _train_epoch(self, x):\n        self._train_iteration(x)\n\n"
        "    def _train_iteration(self, x):\n        self.model(x).mean().backward()\n"
        "        self.optimizer.step()\n"
    )
    script = "import torch\nfrom vae import Trainer\n\ntrainer = Trainer().cuda()\ntrainer([1])\n"
    (note,) = convert(script, path=_script(tmp_path)).notes
    assert note.line == 5 and note.info
    assert (
        "trainer(...) (Trainer.__call__, which runs Trainer._train_iteration in vae/training.py, "
        "where the backward is)" in note.message
    )
    assert "give this file with vae/training.py" in note.message


def test_a_writing_helper_handed_the_prepared_model_stays_on_every_process(tmp_path: Path) -> None:
    """It writes, but it also runs the model: each forward of the wrapper may be a collective,
    so it cannot go to the main process alone; it is reported instead."""
    (tmp_path / "utils.py").write_text(
        "import torch\n\n\ndef sample_and_save(net, path):\n"
        "    torch.save(net(torch.zeros(1, 2)), path)\n"
    )
    script = tmp_path / "train.py"
    script.write_text(TRAINS_WITH_UTILS + "    utils.sample_and_save(model, 'sample.pt')\n")
    result = convert(script.read_text(), path=str(script))
    assert "\n    utils.sample_and_save(model, 'sample.pt')\n" in result.code
    (note,) = [n for n in result.notes if n.manual]
    assert note.line == 10 and "it also runs the prepared model" in note.message
