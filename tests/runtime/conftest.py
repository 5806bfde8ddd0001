"""Each runtime test starts without an Accelerator and without launcher variables."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from accelify.runtime import state

_LAUNCH_VARIABLES = (
    "WORLD_SIZE",
    "RANK",
    "LOCAL_RANK",
    "ACCELERATE_MIXED_PRECISION",
    "ACCELERATE_GRADIENT_ACCUMULATION_STEPS",
    "ACCELERATE_USE_CPU",
)

CUDA = pytest.param(
    "cuda",
    marks=[
        pytest.mark.gpu,
        pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
    ],
)


@pytest.fixture(autouse=True)
def fresh_process(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in _LAUNCH_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    state.reset()
    rng = torch.get_rng_state()
    yield
    state.reset()
    torch.set_rng_state(rng)
