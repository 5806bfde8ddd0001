"""Research code's ``utils.init_distributed_mode(args)`` (distributed/helpers.py): its call goes
and what it set on ``args`` comes from the accelerator, or the file stays as it is."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from accelify.transform.convert import convert

MISC = """
import os
import torch.distributed as dist

def init_distributed_mode(args):
    if "RANK" not in os.environ:
        args.distributed = False
        return
    args.rank, args.gpu = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    args.distributed = True
    args.dist_url = "env://"
    dist.init_process_group("gloo", init_method=args.dist_url)

def get_rank():
    return dist.get_rank() if dist.is_initialized() else 0
"""

MAIN = """
import argparse
import torch
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
import util.misc as utils

def main(args):
    {call}
    device = torch.device("cpu")
    torch.manual_seed(0)
    model = torch.nn.Linear(2, 1)
    if args.distributed:
        model = DDP(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = TensorDataset(torch.randn(8, 2), torch.randn(8, 1))
    if args.distributed:
        sampler = DistributedSampler(data)
    else:
        sampler = None
    loader = DataLoader(data, batch_size=2, sampler=sampler)
    for x, y in loader:
        optimizer.zero_grad()
        ((model(x) - y) ** 2).mean().backward()
        optimizer.step()
    {tail}

main(argparse.Namespace())
"""


def _convert(tmp_path: Path, call: str = "utils.init_distributed_mode(args)", tail: str = "pass"):
    (tmp_path / "util").mkdir()
    (tmp_path / "util" / "misc.py").write_text(MISC)
    source = textwrap.dedent(MAIN.format(call=call, tail=tail))
    (tmp_path / "main.py").write_text(source)  # the helper is found beside the file
    return convert(source, path=str(tmp_path / "main.py"))


def test_the_helpers_call_goes_and_its_switch_keeps_the_distributed_path(tmp_path: Path) -> None:
    result = _convert(tmp_path, tail="print(args.rank, args.gpu)")
    assert not result.manual, result.notes
    assert "init_distributed_mode" not in result.code and "args.distributed" not in result.code
    assert "DistributedSampler(" not in result.code and "DDP(" not in result.code
    assert "accelerator.print(accelerator.process_index, accelerator.local_process_index)" in (
        result.code
    )


@pytest.mark.parametrize(
    ("call", "tail", "why"),
    [
        ("utils.init_distributed_mode(args)", "print(args.dist_url)", "args.dist_url is set by"),
        ("ok = utils.init_distributed_mode(args)", "pass", "its result is used"),
        ("utils.init_distributed_mode(args, 1)", "pass", "is not passed one namespace"),
    ],
)
def test_what_the_rewrite_cannot_place_keeps_the_file(
    tmp_path: Path, call: str, tail: str, why: str
) -> None:
    result = _convert(tmp_path, call, tail)
    assert not result.changed
    assert any(why in n.message and n.refusal == "ACR301" for n in result.manual), result.notes
