"""Loss scalers read beside a script (transform/loss_scaler.py): MAE's and ConvNeXt's
``NativeScalerWithGradNormCount`` runs the backward and the step for the training step, so its
call is kept; any class that does more, or that the reading cannot see whole, is not one."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from accelify.transform.convert import convert
from accelify.transform.loss_scaler import is_loss_scaler
from accelify.transform.plan import Options
from accelify.transform.project import programs

# MAE's util/misc.py as the project fixture writes it: its loss scaler and the helpers beside.
MISC = Path(__file__).parents[2] / "fixtures" / "project" / "ddp_loss_scaler" / "in" / "util"
SCALER = (MISC / "misc.py").read_text()
NAME = "NativeScalerWithGradNormCount"

# Each variant changes one thing the reading must refuse, with why it matters.
NOT_SCALERS = {
    # the step of another optimizer than the one handed in
    "steps_another": ("self._scaler.step(optimizer)", "self._scaler.step(self.other)"),
    # a collective of its own, which every process would have to join
    "reduces": (
        "self._scaler.update()",
        "self._scaler.update()\n            dist.all_reduce(norm)",
    ),
    # keeps the loss (and its graph) on the instance
    "stores": ("norm = None", "self.last = loss"),
    # the backward is not the first thing it does
    "backward_later": (
        "        self._scaler.scale(loss).backward(create_graph=create_graph)\n",
        "        norm = None\n"
        "        self._scaler.scale(loss).backward(create_graph=create_graph)\n",
    ),
    # a backward of something else than the loss handed in
    "other_loss": ("scale(loss)", "scale(loss * self.weight)"),
    # the norm function changes the gradients in place
    "norm_changes_grads": (
        "return torch.norm(",
        "[p.grad.mul_(0.5) for p in parameters]\n    return torch.norm(",
    ),
    # an inherited __call__ or __init__ is not the one read
    "inherits": (f"class {NAME}:", f"class {NAME}(Base):"),
    # zeroes the gradients itself
    "zero_grad": (
        "self._scaler.update()",
        "self._scaler.update()\n            optimizer.zero_grad()",
    ),
    # another method steps
    "other_method_steps": (
        "return self._scaler.state_dict()",
        "self._scaler.step(self.opt)\n        return self._scaler.state_dict()",
    ),
    # no GradScaler built in __init__
    "no_grad_scaler": ('torch.amp.GradScaler("cuda", enabled=torch.cuda.is_available())', "make()"),
}


def _reads(source: str) -> bool:
    return is_loss_scaler(ast.parse(source), NAME)


def test_maes_loss_scaler_is_one() -> None:
    assert _reads(SCALER)


@pytest.mark.parametrize("variant", sorted(NOT_SCALERS))
def test_a_class_that_does_more_is_not_one(variant: str) -> None:
    old, new = NOT_SCALERS[variant]
    assert old in SCALER
    assert not _reads(SCALER.replace(old, new, 1))


TRAIN = """
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from util.misc import NativeScalerWithGradNormCount as Scaler

model = nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loader = DataLoader(TensorDataset(torch.randn(16, 4), torch.randn(16, 1)), batch_size=4)
loss_scaler = Scaler()
for x, y in loader:
    loss = nn.functional.mse_loss(model(x), y)
    loss_scaler(loss, optimizer, parameters=model.parameters())
    optimizer.zero_grad()
"""


def _script(tmp_path: Path, scaler: str) -> str:
    (tmp_path / "util").mkdir()
    (tmp_path / "util" / "__init__.py").write_text("")
    (tmp_path / "util" / "misc.py").write_text(scaler)
    return str(tmp_path / "train.py")


def test_the_call_of_a_loss_scaler_is_kept_and_said_so(tmp_path: Path) -> None:
    result = convert(TRAIN, path=_script(tmp_path, SCALER))
    assert "accelerator.prepare(" in result.code
    assert "    loss_scaler(loss, optimizer, parameters=model.parameters())\n" in result.code
    kept = [n for n in result.notes if n.message.startswith("kept loss_scaler(...)")]
    assert kept and "DeepSpeed" in kept[0].message


def test_a_class_that_is_not_one_leaves_the_script_unchanged(tmp_path: Path) -> None:
    old, new = NOT_SCALERS["reduces"]
    result = convert(TRAIN, path=_script(tmp_path, SCALER.replace(old, new)))
    assert result.code == TRAIN
    assert [n.refusal for n in result.notes] == ["ACR106"]  # the step runs in code not shown


@pytest.mark.parametrize(
    ("options", "refusal"),
    [
        (Options(mixed_precision="fp16"), "ACR215"),
        (Options(gradient_accumulation_steps=2), "ACR213"),
    ],
)
def test_the_accelerator_cannot_take_a_loss_scalers_work_over(
    tmp_path: Path, options: Options, refusal: str
) -> None:
    result = convert(TRAIN, options, path=_script(tmp_path, SCALER))
    assert result.code == TRAIN
    assert [n.refusal for n in result.notes if n.manual] == [refusal]


def test_a_module_whose_backward_is_a_loss_scalers_is_a_helper(tmp_path: Path) -> None:
    """util/misc.py, imported by the script and by engine.py, is not joined (its edits would
    serve one of them); engine.py, whose step calls the scaler, is."""
    script = _script(tmp_path, SCALER)
    (tmp_path / "engine.py").write_text(
        "def train_one_epoch(model, loader, optimizer, loss_scaler):\n"
        "    for x, y in loader:\n"
        "        loss_scaler((model(x) - y).pow(2).mean(), optimizer)\n"
        "        optimizer.zero_grad()\n"
    )
    Path(script).write_text(
        "import util.misc as misc\n"
        "from engine import train_one_epoch\n"
        f"from util.misc import {NAME} as Scaler\n"
    )
    files = [script, str(tmp_path / "engine.py"), str(tmp_path / "util" / "misc.py")]
    found = programs(files)
    assert [
        (Path(p.script).name, [Path(m).name for m in p.modules], p.conflict) for p in found
    ] == [("train.py", ["engine.py"], None)]
