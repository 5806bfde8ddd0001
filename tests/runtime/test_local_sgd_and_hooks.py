"""DDP communication hooks (``DistributedDataParallelKwargs(comm_hook=...)``), ``LocalSGD`` and
``debug_launcher``, with HF Accelerate's names and semantics.

The 2-process checks share one run of fixtures/runtime/local_sgd_hooks.py (gloo on CPU).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from accelerate.utils import DDPCommunicationHookType as HFHookType
from accelerate.utils import DistributedDataParallelKwargs as HFDDPKwargs

from accelify.runtime import (
    Accelerator,
    DDPCommunicationHookType,
    DistributedDataParallelKwargs,
    LocalSGD,
)
from accelify.runtime.handlers import collect, comm_hook

from .test_multiprocess import _run

SCRIPT = Path(__file__).resolve().parents[2] / "fixtures" / "runtime" / "local_sgd_hooks.py"


class _Recorder:
    """Stands for a DDP model: records what ``register_comm_hook`` receives."""

    def register_comm_hook(self, state: object, hook: object) -> None:
        self.state, self.hook = state, hook


def test_hook_options_never_reach_ddps_constructor() -> None:
    ours = DistributedDataParallelKwargs(comm_hook="fp16", bucket_cap_mb=5)
    theirs = HFDDPKwargs(comm_hook=HFHookType.POWER_SGD, comm_state_option={"a": 1})
    assert collect([ours])["ddp"] == {"bucket_cap_mb": 5}
    assert collect([theirs])["ddp"] == {}
    assert [member.value for member in DDPCommunicationHookType] == [
        member.value for member in HFHookType
    ]


@pytest.mark.parametrize(
    ("options", "name"),
    [
        ({"comm_hook": "bf16"}, "bf16_compress_hook"),
        ({"comm_hook": HFHookType.FP16}, "fp16_compress_hook"),
        ({"comm_hook": "batched_power_sgd"}, "batched_powerSGD_hook"),
        ({"comm_hook": "power_sgd", "comm_wrapper": "bf16"}, "bf16_compress_wrapper_hook"),
    ],
)
def test_the_named_torch_hook_is_registered(options: dict, name: str) -> None:
    model = _Recorder()
    register = comm_hook(DistributedDataParallelKwargs(**options))
    assert register is not None
    register(model)
    assert model.hook.__name__ == name


def test_power_sgd_gets_a_state_of_its_own_per_model() -> None:
    handler = DistributedDataParallelKwargs(
        comm_hook="power_sgd", comm_state_option={"matrix_approximation_rank": 3}
    )
    register = comm_hook(handler)
    first, second = _Recorder(), _Recorder()
    register(first)
    register(second)
    assert first.state.matrix_approximation_rank == 3
    assert first.state is not second.state


def test_no_hook_and_wrong_names() -> None:
    assert comm_hook(None) is None
    assert comm_hook(DistributedDataParallelKwargs()) is None
    with pytest.raises(ValueError, match="fp32"):
        comm_hook(DistributedDataParallelKwargs(comm_hook="fp32"))
    with pytest.raises(ValueError, match="comm_wrapper"):
        comm_hook(DistributedDataParallelKwargs(comm_hook="fp16", comm_wrapper="power_sgd"))


def test_local_sgd_on_one_process_changes_nothing() -> None:
    model = torch.nn.Linear(2, 1)
    before = [p.detach().clone() for p in model.parameters()]
    with LocalSGD(Accelerator(), model, local_sgd_steps=1) as local_sgd:
        local_sgd.step()
    assert not local_sgd.enabled and local_sgd.num_steps == 1
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    with pytest.raises(ValueError, match="local_sgd_steps"):
        LocalSGD(Accelerator(), model, local_sgd_steps=0)


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    out = tmp_path_factory.mktemp("local_sgd")
    _run(out, processes=2, script=SCRIPT)
    return [json.loads((out / f"rank{rank}.json").read_text()) for rank in (0, 1)]


@pytest.mark.slow
@pytest.mark.parametrize("case", ["fp16", "power_sgd"])
def test_compression_hooks_train_and_keep_ranks_equal(ranks: list[dict], case: str) -> None:
    plain = ranks[0]["no"]
    hooked = [rank[case] for rank in ranks]
    assert plain["hook"] == ""  # DDP's builtin all-reduce
    assert "fp16_compress" in hooked[0]["hook"]  # power_sgd: wrapped in fp16 compression
    assert all(all(rank["equal"]) for rank in hooked)
    assert hooked[0]["weights"] == hooked[1]["weights"]
    assert hooked[0]["weights"] != plain["weights"]  # compression changed what was sent ...
    torch.testing.assert_close(  # ... but training went the same way
        torch.tensor(hooked[0]["weights"]), torch.tensor(plain["weights"]), atol=2e-2, rtol=0
    )


@pytest.mark.slow
def test_local_sgd_averages_every_k_steps_and_on_exit(ranks: list[dict]) -> None:
    for rank in ranks:
        # 7 steps with k=3: equal after steps 3 and 6, then after leaving the block
        assert rank["local_sgd"]["equal"] == [False, False, True, False, False, True, False, True]
        assert rank["local_sgd_off"]["equal"] == [True] * 8  # enabled=False: plain DDP
        assert rank["local_sgd"]["num_steps"] == rank["local_sgd_off"]["num_steps"] == 7


@pytest.mark.slow
def test_debug_launcher_runs_the_function_on_cpu_processes(tmp_path: Path) -> None:
    code = textwrap.dedent(f"""
        from pathlib import Path
        import torch
        from accelify.runtime import Accelerator, debug_launcher

        def work(folder):
            accelerator = Accelerator()
            total = accelerator.reduce(torch.ones(1) * (accelerator.process_index + 1))
            Path(folder, f"rank{{accelerator.process_index}}").write_text(
                f"{{accelerator.num_processes}} {{accelerator.device}} {{float(total)}}"
            )

        debug_launcher(work, args=({str(tmp_path)!r},), num_processes=2)
    """)
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=120
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    found = sorted(path.read_text() for path in tmp_path.glob("rank*"))
    assert found == ["2 cpu 3.0", "2 cpu 3.0"]
