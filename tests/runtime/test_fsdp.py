"""FSDP2 (``fully_shard``) on 2 CPU processes (gloo) through accel-run, against plain DDP.

The same script trains with full and with sharded state dicts, each straight through (saving after
epoch 0) and again resuming from that checkpoint in new processes. Final weights must equal DDP's
within 1e-6 (fp32). The in-process tests run FSDP on a one-process gloo group.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import torch
from torch.distributed.tensor import DTensor

from accelify.runtime import Accelerator
from accelify.runtime.strategies.fsdp import FsdpOptions

from .conftest import fresh_model_from, max_difference, resumed_run, run_sharded

TOLERANCE = 1e-6
STATE_DICTS = ("FULL_STATE_DICT", "SHARDED_STATE_DICT")
TRANSFORMER = "TRANSFORMER_BASED_WRAP"


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    found = {}
    for kind in STATE_DICTS:
        flags = ("--use-fsdp", "--fsdp-transformer-layer-cls-to-wrap", "Block")
        flags += ("--fsdp-state-dict-type", kind)
        straight = tmp_path_factory.mktemp(kind.lower())
        found[kind] = {**run_sharded(straight, *flags), "dir": straight}
        found[f"{kind}-resumed"] = resumed_run(straight, tmp_path_factory.mktemp("resumed"), *flags)
    return found


@pytest.mark.slow
@pytest.mark.parametrize("kind", STATE_DICTS)
def test_fsdp_trains_like_ddp(runs: dict, ddp_run: dict, kind: str) -> None:
    run = runs[kind]
    assert run["type"] == "FSDP"
    assert sum(run["losses"][-8:]) < 0.8 * sum(run["losses"][:8])  # last epoch vs first
    assert run["losses"] == pytest.approx(ddp_run["losses"], abs=TOLERANCE)
    assert max_difference(run["params"], ddp_run["params"]) < TOLERANCE


@pytest.mark.slow
@pytest.mark.parametrize("kind", STATE_DICTS)
def test_fsdp_resumes_identically(runs: dict, kind: str) -> None:
    straight, resumed = runs[kind], runs[f"{kind}-resumed"]
    state = straight["dir"] / "state"
    if kind == "SHARDED_STATE_DICT":  # a distributed checkpoint: one file per process
        assert sorted(p.name for p in (state / "pytorch_model_fsdp_0").glob("*.distcp")) == [
            "__0_0.distcp",
            "__1_0.distcp",
        ]
    else:
        assert (state / "model.safetensors").is_file()
    assert resumed["losses"] == straight["losses"][8:]
    assert resumed["params"] == straight["params"]


@pytest.mark.slow
def test_save_model_gathers_full_weights_for_a_fresh_model(runs: dict) -> None:
    for kind in STATE_DICTS:
        model = fresh_model_from(runs[kind]["dir"] / "model")
        saved = {name: value.tolist() for name, value in model.state_dict().items()}
        assert max_difference(saved, runs[kind]["params"]) == 0


# --- in one process ----------------------------------------------------------------------------


@pytest.fixture
def fsdp_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """Launcher variables for a one-process FSDP run (gloo, a free port)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    variables = {"WORLD_SIZE": "1", "RANK": "0", "LOCAL_RANK": "0", "MASTER_PORT": str(port)}
    variables.update(MASTER_ADDR="127.0.0.1", ACCELERATE_USE_FSDP="true", ACCELERATE_USE_CPU="1")
    variables.update(FSDP_AUTO_WRAP_POLICY="SIZE_BASED_WRAP", FSDP_MIN_NUM_PARAMS="20")
    for name, value in variables.items():
        monkeypatch.setenv(name, value)


def _model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))


def test_an_optimizer_built_before_prepare_follows_the_sharded_parameters(fsdp_process) -> None:
    accelerator = Accelerator()
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)

    held = [p for group in optimizer.param_groups for p in group["params"]]
    assert all(isinstance(p, DTensor) for p in held)
    assert [id(p) for p in held] == [id(p) for p in model.parameters()]
    # Size-based wrapping at 20 parameters: the first Linear (20) is a block, the last (5) is not.
    assert [type(m).__name__ for m in model.modules() if hasattr(m, "unshard")] == [
        "FSDPSequential",
        "FSDPLinear",
    ]
    before = model[0].weight.full_tensor().clone()
    accelerator.backward(model(torch.randn(3, 4)).sum())
    optimizer.step()
    assert not torch.equal(model[0].weight.full_tensor(), before)


def test_an_optimizer_that_already_stepped_is_refused_with_the_fix(fsdp_process) -> None:
    accelerator = Accelerator()
    model = _model()
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(2, 4)).sum().backward()
    optimizer.step()
    with pytest.raises(ValueError, match="prepare the model before the first step"):
        accelerator.prepare(model, optimizer)


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, FsdpOptions()),
        (  # an FSDP1-style config from accelerate (the Trainer guide's example)
            {"FSDP_SHARDING_STRATEGY": "1", "FSDP_TRANSFORMER_CLS_TO_WRAP": "BertLayer,Block"},
            FsdpOptions(auto_wrap_policy=TRANSFORMER, layer_classes=("BertLayer", "Block")),
        ),
        ({"FSDP_SHARDING_STRATEGY": "SHARD_GRAD_OP"}, FsdpOptions(reshard_after_forward=False)),
        ({"FSDP_SHARDING_STRATEGY": "NO_SHARD"}, FsdpOptions(mesh="replicate")),
        ({"FSDP_RESHARD_AFTER_FORWARD": "false"}, FsdpOptions(reshard_after_forward=False)),
        ({"FSDP_STATE_DICT_TYPE": STATE_DICTS[1]}, FsdpOptions(state_dict_type=STATE_DICTS[1])),
    ],
)  # fmt: skip
def test_options_follow_accelerates_environment_contract(env: dict, expected: FsdpOptions) -> None:
    assert FsdpOptions.from_env(env) == expected


def test_unsupported_options_are_refused() -> None:
    with pytest.raises(
        ValueError, match="FSDP_STATE_DICT_TYPE='LOCAL_STATE_DICT' is not supported"
    ):
        FsdpOptions.from_env({"FSDP_STATE_DICT_TYPE": "LOCAL_STATE_DICT"})


def test_layer_classes_missing_from_the_model_are_named(fsdp_process, monkeypatch) -> None:
    monkeypatch.setenv("FSDP_AUTO_WRAP_POLICY", "TRANSFORMER_BASED_WRAP")
    monkeypatch.setenv("FSDP_TRANSFORMER_CLS_TO_WRAP", "BertLayer")
    accelerator = Accelerator()
    with pytest.raises(ValueError, match=r"\['BertLayer'\] not found in the model"):
        accelerator.prepare(_model())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize(
    "flags",
    [("--mixed-precision", "bf16"), ("--fsdp-offload-params", "true")],
    ids=["bf16", "offload"],
)
def test_cuda_paths_train(tmp_path: Path, flags: tuple[str, ...]) -> None:
    run = run_sharded(tmp_path, "--use-fsdp", "--fsdp-transformer-layer-cls-to-wrap", "Block",
                      *flags, cpu=False)  # fmt: skip
    assert run["type"] == "FSDP"
    assert sum(run["losses"][-8:]) < sum(run["losses"][:8])
