"""Downloads in the script's own modules: found through its imports, in the file beside it."""

from __future__ import annotations

from pathlib import Path

from accelify.transform.convert import convert
from accelify.transform.neighbours import distributing_functions, fetching_imports

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
