"""Downloads in the script's own modules: found through its imports, in the file beside it."""

from __future__ import annotations

from pathlib import Path

import pytest

from accelify.rules.checks.logger_on_every_process import LoggerOnEveryProcess
from accelify.rules.engine import lint
from accelify.transform.convert import convert
from accelify.transform.loss_scaler import trains_beside
from accelify.transform.neighbours import (
    distributing_functions,
    fetching_imports,
    passes_through,
    process_query,
    uses_only,
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
