"""``init_empty_weights`` and ``init_on_device`` place what they build as HF Accelerate's do."""

from __future__ import annotations

import accelerate
import pytest
import torch

from accelify.runtime import init_empty_weights, init_on_device


class Frozen(torch.nn.Module):
    """Parameters (one frozen, one marked by transformers), buffers and a plain tensor."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(3, 2)
        self.norm = torch.nn.BatchNorm1d(2)
        self.scale = torch.nn.Parameter(torch.ones(2), requires_grad=False)
        marked = torch.nn.Parameter(torch.ones(1))
        marked._is_hf_initialized = True  # set before registration: it must survive the move
        self.marked = marked
        self.register_parameter("absent", None)
        self.table = torch.zeros(2)


def _placed(model: torch.nn.Module) -> dict[str, tuple]:
    """Where each tensor is, with the parameters' class, gradient flag and transformers' mark."""
    found = {name: (t.device.type,) for name, t in model.named_buffers()}
    found["table"] = (model.table.device.type,)
    for name, p in model.named_parameters():
        found[name] = (p.device.type, type(p), p.requires_grad, getattr(p, "_is_hf_initialized", 0))
    return found


@pytest.mark.parametrize("include_buffers", [False, True])
def test_empty_weights_are_placed_as_hfs(include_buffers: bool) -> None:
    with init_empty_weights(include_buffers=include_buffers):
        ours = Frozen()
    with accelerate.init_empty_weights(include_buffers=include_buffers):
        theirs = Frozen()
    assert _placed(ours) == _placed(theirs)
    assert {p.device.type for p in ours.parameters()} == {"meta"}
    buffers = {b.device.type for b in ours.buffers()}
    assert buffers == ({"meta"} if include_buffers else {"cpu"})


def test_include_buffers_defaults_to_hfs_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCELERATE_INIT_INCLUDE_BUFFERS", "true")
    with init_empty_weights():
        model = Frozen()
    assert model.norm.running_mean.is_meta


def test_init_on_device_takes_a_name_and_restores_module_registration() -> None:
    register = torch.nn.Module.register_parameter
    with pytest.raises(RuntimeError, match="inside"), init_on_device("meta"):
        assert torch.nn.Linear(2, 2).weight.is_meta
        raise RuntimeError("inside")
    assert torch.nn.Module.register_parameter is register
    assert not torch.nn.Linear(2, 2).weight.is_meta
