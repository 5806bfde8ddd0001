"""Which name prepare() wraps when the optimizer holds one name and the training calls another
(research code's ``model_without_ddp``): setup.py's ``_trained_in_place_of_its_bare_name``."""

from __future__ import annotations

import textwrap

from accelify.transform.convert import convert

TEMPLATE = """
import torch
from torch.utils.data import DataLoader, TensorDataset

model = torch.nn.Linear(2, 1)
{bare}
optimizer = torch.optim.SGD({params}, lr=0.1)
loader = DataLoader(TensorDataset(torch.randn(8, 2), torch.randn(8, 1)), batch_size=2)
for x, y in loader:
    optimizer.zero_grad()
    print(list(x.shape))
    ((model(x) - y) ** 2).mean().backward()
    optimizer.step()
torch.save(bare.state_dict() if {saves} else model.state_dict(), "model.pt")
"""


def _convert(bare: str, params: str, saves: bool = True) -> tuple[str, list[str]]:
    source = textwrap.dedent(TEMPLATE.format(bare=bare, params=params, saves=saves))
    result = convert(source)
    return result.code, [n.message for n in result.manual]


def test_the_model_that_trains_is_prepared_and_the_bare_name_kept() -> None:
    code, manual = _convert("bare = model", "bare.parameters()")
    assert manual == []
    assert "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)" in code
    assert "bare = model\n" in code  # the bare name still names the module


def test_a_builtin_the_training_calls_is_not_taken_for_a_model() -> None:
    code, manual = _convert("bare = model", "list(bare.parameters())")
    assert manual == [] and "accelerator.prepare(model, optimizer, loader)" in code


def test_a_name_made_from_the_trained_model_otherwise_is_refused() -> None:
    code, manual = _convert("bare = torch.nn.Sequential(model)", "bare.parameters()")
    (message,) = manual
    assert "bare is bound from model, and the script runs both" in message
    assert "accelerator" not in code
