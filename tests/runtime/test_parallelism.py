"""``ParallelismConfig``: HF's N-D parallelism (replicated, sharded and tensor parallel) on a mesh.

A small transformer (fixtures/runtime/parallelism/train_nd.py) trains through accel-run on 2 CPU
gloo processes (4 for the 2-D layouts, slow) with the same global batches in every layout, and
must train as DDP does: exactly where the layout runs DDP's or FSDP2's arithmetic, within float32
rounding where tensor parallelism splits the matmuls (torch sums their pieces in another order:
about 1e-7 after 6 steps, so 1e-5 leaves room and still catches any real difference, which moves
the loss by 1e-2). The mesh, the ranks and the loaders' shares must be HF's, checked against HF's
own ``ParallelismConfig``, properties and ``prepare_data_loader`` over the same sizes; HF's
``Accelerator`` itself refuses a ``ParallelismConfig`` on CPU processes (``MULTI_CPU`` is not one
of its multi-device types), so it cannot train the layouts here.
"""

from __future__ import annotations

import json
import sys
import types
import warnings
from collections.abc import Iterator
from pathlib import Path

import accelerate
import accelerate.data_loader
import pytest
import torch
from torch.utils.data import DataLoader

from accelify.runtime import Accelerator, ParallelismConfig, prepare_data_loader
from accelify.runtime import parallelism as nd
from accelify.runtime.launch import backends, cli
from accelify.runtime.launch import config as cfg
from accelify.runtime.launch import parallelism as launch_nd
from accelify.runtime.state import DistributedType, ProcessState
from accelify.runtime.strategies.tensor_parallel import TensorParallel

from .test_multiprocess import _run

SCRIPT = (
    Path(__file__).resolve().parents[2] / "fixtures" / "runtime" / "parallelism" / "train_nd.py"
)
ACCEL_RUN = [sys.executable, "-c", "from accelify.runtime.launch.cli import main; main()", "--cpu"]
FSDP2 = ("--use-fsdp", "--fsdp-version", "2")
TOLERANCE = 1e-5  # float32 sums in another order (tensor parallel); see the module's docstring


def _argument(fields: str, *more: str) -> tuple[str, ...]:
    """The script's arguments for ``Accelerator(parallelism_config=ParallelismConfig(**fields))``,
    recording HF's answers for the same sizes."""
    return ("--parallelism", fields, "--with-hf", *more)


# Every layout, as (processes, launch flags, script arguments); the 4-process ones are slow.
LAYOUTS = {
    "ddp": (2, (), ()),
    "tp": (2, (), _argument('{"tp_size": 2}', "--save")),
    "tp_launched": (2, ("--use-parallelism-config", "--parallelism-config-tp-size", "2"), ()),
    "shard": (2, FSDP2, _argument('{"dp_shard_size": 2}', "--save")),
    "replicate": (2, (), _argument('{"dp_replicate_size": 2}')),
    "shard_tp": (4, FSDP2, _argument('{"dp_shard_size": 2, "tp_size": 2}', "--save")),
    "hsdp": (4, FSDP2, _argument('{"dp_replicate_size": 2, "dp_shard_size": 2}')),
}


def _train(out: Path, layout: str) -> list[dict]:
    """One rank record per process. ``_run`` sets ACCELERATE_GRADIENT_ACCUMULATION_STEPS=2: every
    layout's backward halves its loss alike."""
    processes, flags, args = LAYOUTS[layout]
    _run(out, *args, processes=processes, script=SCRIPT, launcher=[*ACCEL_RUN, *flags])
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(processes)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict]]:
    return {
        layout: _train(tmp_path_factory.mktemp(layout), layout)
        for layout, (processes, _, _) in LAYOUTS.items()
        if processes == 2
    }


def _max_difference(first: dict, second: dict) -> float:
    assert first.keys() == second.keys()
    return max((torch.tensor(first[k]) - torch.tensor(second[k])).abs().max().item() for k in first)


def _trains_like_ddp(records: list[dict], ddp: list[dict], exact: bool = False) -> None:
    ours, reference = records[0], ddp[0]
    if exact:
        assert (ours["losses"], ours["norms"]) == (reference["losses"], reference["norms"])
        assert ours["params"] == reference["params"]
        return
    assert ours["losses"] == pytest.approx(reference["losses"], rel=TOLERANCE)
    assert ours["norms"] == pytest.approx(reference["norms"], rel=TOLERANCE)
    assert _max_difference(ours["params"], reference["params"]) < TOLERANCE


def _same_as_hf(records: list[dict]) -> None:
    for record in records:
        assert record["facts"] == record["hf"]


def test_tensor_parallel_trains_like_ddp_and_its_ranks_read_the_same_batches(runs: dict) -> None:
    tp, ddp = runs["tp"], runs["ddp"]
    assert [r["strategy"] for r in tp] == ["TensorParallel"] * 2
    _trains_like_ddp(tp, ddp)
    assert tp[0]["batches"] == tp[1]["batches"]  # one tensor-parallel group: the same batch
    assert tp[0]["batches"] == [a + b for a, b in zip(*(r["batches"] for r in ddp), strict=True)]
    assert [r["reloaded"] for r in tp] == [True, True]  # save_state/load_state round trip


def test_dp_shard_is_fsdp2_and_trains_like_ddp(runs: dict) -> None:
    shard = runs["shard"]
    assert [(r["type"], r["strategy"]) for r in shard] == [("FSDP", "FSDP")] * 2
    _trains_like_ddp(shard, runs["ddp"])
    assert [r["batches"] for r in shard] == [r["batches"] for r in runs["ddp"]]
    assert [r["reloaded"] for r in shard] == [True, True]


def test_dp_replicate_alone_is_ddp_bit_for_bit(runs: dict) -> None:
    replicate = runs["replicate"]
    assert [(r["type"], r["strategy"]) for r in replicate] == [("MULTI_CPU", "DDP")] * 2
    _trains_like_ddp(replicate, runs["ddp"], exact=True)


def test_mesh_and_ranks_answer_as_hfs_on_every_process(runs: dict) -> None:
    for layout in ("tp", "shard", "replicate"):
        _same_as_hf(runs[layout])
    tp, shard, replicate = runs["tp"], runs["shard"], runs["replicate"]
    assert [r["facts"]["properties"]["tensor_parallel_rank"] for r in tp] == [0, 1]
    assert [r["facts"]["properties"]["data_parallel_shard_rank"] for r in shard] == [0, 1]
    assert [r["facts"]["properties"]["data_parallel_rank"] for r in replicate] == [0, 1]
    assert tp[0]["facts"]["groups"] == {"tp": [0, 1]}
    dimensions = ("dp_shard", "dp", "dp_shard_cp", "dp_cp")  # the last three flattened
    assert shard[0]["facts"]["groups"] == {name: [0, 1] for name in dimensions}
    composable = {layout: runs[layout][0]["composable"] for layout in ("tp", "shard", "replicate")}
    assert composable == {"tp": False, "shard": True, "replicate": False}  # HF's: is_fsdp2
    assert all(r["facts"]["properties"]["should_save_model"] for r in tp + shard + replicate)


def test_the_launch_options_train_as_the_argument_bit_for_bit(runs: dict) -> None:
    launched, argument = runs["tp_launched"][0], runs["tp"][0]
    assert launched["facts"] == argument["facts"]
    assert (launched["losses"], launched["norms"]) == (argument["losses"], argument["norms"])
    assert launched["params"] == argument["params"]


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["shard_tp", "hsdp"])
def test_two_dimensional_layouts_on_4_processes_train_like_ddp(
    runs: dict, tmp_path: Path, layout: str
) -> None:
    records = _train(tmp_path, layout)
    _trains_like_ddp(records, runs["ddp"])
    _same_as_hf(records)
    assert all(r.get("reloaded", True) for r in records)
    if layout == "shard_tp":  # each tensor-parallel pair reads one data-parallel share
        batches = [r["batches"] for r in records]
        assert batches[0] == batches[1] == runs["ddp"][0]["batches"]
        assert batches[2] == batches[3] == runs["ddp"][1]["batches"]


# --- in one process ----------------------------------------------------------------------------

_HFS_CHECKS = [
    {"dp_shard_size": 0},
    {"tp_size": 0},
    {"cp_backend": "jax"},
    {"sp_backend": "ulysses"},
    {"dp_replicate_size": 2, "tp_size": 2},
    {"cp_size": 2, "sp_size": 2},
]


@pytest.mark.parametrize("fields", _HFS_CHECKS)
def test_bad_sizes_are_refused_with_hfs_messages(fields: dict) -> None:
    # A handler given keeps HF's from building its default, which needs transformers.
    handler = {"tp_handler": object()} if fields.get("tp_size", 1) > 1 else {}
    with pytest.raises(ValueError) as theirs:
        accelerate.ParallelismConfig(**fields, **handler)
    with pytest.raises(ValueError) as ours:
        ParallelismConfig(**fields)
    assert str(ours.value) == str(theirs.value)


@pytest.mark.parametrize(("size", "what"), [("cp_size", "context"), ("sp_size", "sequence")])
def test_context_and_sequence_parallelism_are_refused_by_name(size: str, what: str) -> None:
    refused = rf"^ParallelismConfig\({size}=2\) is not supported by accelify: {what}"
    with pytest.raises(ValueError, match=refused):
        ParallelismConfig(**{size: 2})


def _hf_check(config: ParallelismConfig, processes: int, fsdp: bool) -> str:
    """HF's check of the sizes against an accelerator (GPU processes, or FSDP2 ones)."""
    theirs = accelerate.ParallelismConfig(
        dp_replicate_size=config.dp_replicate_size,
        dp_shard_size=config.dp_shard_size,
        tp_size=config.tp_size,
        tp_handler=object() if config.tp_enabled else None,
    )
    accelerator = types.SimpleNamespace(
        multi_device=not fsdp,
        is_fsdp2=fsdp,
        num_processes=processes,
        distributed_type="FSDP" if fsdp else "MULTI_GPU",
        is_main_process=True,
    )
    with pytest.raises(ValueError) as raised:
        theirs._validate_accelerator(accelerator)
    return str(raised.value)


@pytest.mark.parametrize(
    ("fields", "processes", "fsdp"),
    [({"tp_size": 4}, 2, False), ({"dp_shard_size": 2}, 4, True), ({"tp_size": 2}, 2, True)],
)
def test_sizes_that_do_not_fit_the_launch_are_refused_with_hfs_messages(
    fields: dict, processes: int, fsdp: bool
) -> None:
    config = ParallelismConfig(**fields)
    kind = DistributedType.FSDP if fsdp else DistributedType.MULTI_CPU
    with pytest.raises(ValueError) as ours:
        nd.check_processes(config, processes, kind)
    assert str(ours.value) == _hf_check(config, processes, fsdp)


def test_what_accelify_cannot_run_with_the_launch_is_refused_with_the_fix() -> None:
    with pytest.raises(ValueError, match=r"dp_shard_size=2\) shards the model with FSDP2: .*-fsdp"):
        nd.check_processes(ParallelismConfig(dp_shard_size=2), 2, DistributedType.MULTI_CPU)
    with pytest.raises(ValueError, match="under DeepSpeed is not supported by accelify"):
        nd.check_processes(ParallelismConfig(), 2, DistributedType.DEEPSPEED)
    with pytest.raises(ValueError, match="total_size \\(2\\) does not match num_processes \\(1\\)"):
        Accelerator(parallelism_config=ParallelismConfig(tp_size=2))
    with pytest.raises(TypeError, match="takes accelify's ParallelismConfig, got accelerate"):
        Accelerator(parallelism_config=accelerate.ParallelismConfig())


@pytest.fixture
def hf_state_reset() -> Iterator[None]:
    """HF's state is one per process: start and leave it blank for the other tests."""
    accelerate.state.AcceleratorState._reset_state(reset_partial_state=True)
    yield
    accelerate.state.AcceleratorState._reset_state(reset_partial_state=True)


def test_the_launchers_variables_build_the_config_as_hfs_do(
    monkeypatch: pytest.MonkeyPatch, hf_state_reset: None
) -> None:
    launched = launch_nd.Parallelism({"parallelism_config_dp_shard_size": 1})
    for name, value in launched.env().items():
        monkeypatch.setenv(name, value)
    ours, theirs = Accelerator(), accelerate.Accelerator(cpu=True)
    assert ours.parallelism_config == ParallelismConfig(1, 1, 1, 1, "torch", 1, "deepspeed")
    for name in ("dp_replicate_size", "dp_shard_size", "tp_size", "cp_size", "sp_size"):
        assert getattr(ours.parallelism_config, name) == getattr(theirs.parallelism_config, name)
    for name in (
        "torch_device_mesh",
        "should_save_model",
        "is_composable_parallelism_enabled",
        "tensor_parallel_rank",
        "data_parallel_rank",
        "data_parallel_shard_rank",
    ):
        assert getattr(ours, name) == getattr(theirs, name), name
    monkeypatch.setenv("PARALLELISM_CONFIG_CP_SIZE", "2")
    with pytest.raises(ValueError, match=r"cp_size=2\) is not supported by accelify"):
        Accelerator()


class _Mesh:
    """What HF's and accelify's loaders read of a (dp_shard=2, tp=2) DeviceMesh."""

    mesh_dim_names = ("dp_shard", "tp")

    def __getitem__(self, name: str) -> types.SimpleNamespace:
        return types.SimpleNamespace(size=lambda: 2)


def test_loaders_shard_by_the_data_parallel_dimensions_only_as_hfs_do(hf_state_reset: None) -> None:
    shares = []
    for rank in range(4):
        loader = DataLoader(list(range(16)), batch_size=2)
        options = {"num_processes": 4, "process_index": rank, "torch_device_mesh": _Mesh()}
        theirs = accelerate.data_loader.prepare_data_loader(loader, **options)
        ours = [batch.tolist() for batch in prepare_data_loader(loader, **options)]
        assert ours == [batch.tolist() for batch in theirs]
        shares.append(ours)
    assert shares[0] == shares[1] != shares[2] == shares[3]


def test_a_model_without_dtensors_under_tensor_parallelism_is_warned_about() -> None:
    state = ProcessState(2, 0, 0, torch.device("cpu"), DistributedType.MULTI_CPU, True)
    with pytest.warns(UserWarning, match="no DTensor parameters, so tensor parallelism splits"):
        TensorParallel(state).wrap_model(torch.nn.Linear(2, 2))


# --- accel-run ---------------------------------------------------------------------------------


def _launch_env(*argv: str, config_file: Path | None = None) -> dict[str, str]:
    """The variables accel-run would give its workers for this command line."""
    args = cli.launch_parser().parse_args([*argv, "train.py"])
    settings = cfg.load_settings(str(config_file) if config_file else None, cli.flag_values(args))
    settings = launch_nd.apply(backends.apply(settings, args), args)
    return cfg.child_env(settings, {})


def test_flags_in_both_spellings_and_the_config_section_give_the_same_variables(
    tmp_path: Path,
) -> None:
    file = tmp_path / "nd.yaml"
    file.write_text(
        "distributed_type: FSDP\nuse_cpu: true\nnum_processes: 4\nfsdp_config:\n  fsdp_version: 2\n"
        "parallelism_config:\n  parallelism_config_dp_shard_size: 2\n"
        "  parallelism_config_tp_size: 2\n"
    )
    words = (
        "use_parallelism_config",
        "parallelism_config_dp_shard_size",
        "parallelism_config_tp_size",
    )
    underscored = (f"--{words[0]}", f"--{words[1]}", "2", f"--{words[2]}", "2")
    dashed = tuple(arg.replace("_", "-") for arg in underscored)
    launch = ("--cpu", "--num-processes", "4", *FSDP2)
    from_file = _launch_env(config_file=file)
    assert _launch_env(*launch, *dashed) == _launch_env(*launch, *underscored) == from_file
    parallel = {k: v for k, v in from_file.items() if "PARALLELISM_CONFIG" in k}
    assert parallel == {
        "ACCELERATE_USE_PARALLELISM_CONFIG": "true",
        "PARALLELISM_CONFIG_DP_REPLICATE_SIZE": "1",
        "PARALLELISM_CONFIG_DP_SHARD_SIZE": "2",
        "PARALLELISM_CONFIG_TP_SIZE": "2",
        "PARALLELISM_CONFIG_CP_SIZE": "1",
        "PARALLELISM_CONFIG_CP_BACKEND": "torch",
        "PARALLELISM_CONFIG_SP_SIZE": "1",
        "PARALLELISM_CONFIG_SP_BACKEND": "deepspeed",
    }  # accelerate launch's, for the same command line
    empty = tmp_path / "empty.yaml"
    empty.write_text("parallelism_config: {}\n")  # accelerate's config writes it: not turned on
    assert "ACCELERATE_USE_PARALLELISM_CONFIG" not in _launch_env(config_file=empty)


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (("--parallelism-config-cp-size", "2"), r"cp_size=2\) is not supported by accelify"),
        (
            ("--parallelism-config-tp-size", "4"),
            r"total_size \(4\) does not match num_processes \(2\)",
        ),
        (("--parallelism-config-dp-shard-size", "2"), "shards the model with FSDP2"),
        (("--use-fsdp", "--parallelism-config-dp-shard-size", "2"), "needs --fsdp-version 2"),
        ((*FSDP2, "--parallelism-config-tp-size", "2"), "no dimension for FSDP to shard across"),
    ],
)
def test_accel_run_refuses_before_starting_what_the_workers_would(
    argv: tuple[str, ...], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as done:
        cli.main(["--cpu", "--num-processes", "2", "--use-parallelism-config", *argv, str(SCRIPT)])
    assert done.value.code == 2
    assert capsys.readouterr().err.startswith("accel-run: error: ")
    with pytest.raises(cfg.ConfigError, match=says):
        _launch_env("--cpu", "--num-processes", "2", "--use-parallelism-config", *argv)


def test_a_size_flag_without_the_switch_is_refused() -> None:
    needs = "--parallelism-config-tp-size needs --use-parallelism-config"
    with pytest.raises(cfg.ConfigError, match=needs):
        _launch_env("--cpu", "--num-processes", "2", "--parallelism-config-tp-size", "2")


def test_no_handler_warning_unless_a_handler_is_set_for_a_size_of_1() -> None:
    state = ProcessState(1, 0, 0, torch.device("cpu"), DistributedType.NO, True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        nd.configure(ParallelismConfig(), state)
    with pytest.warns(UserWarning, match="tp_handler is set, but tp_size is set to 1"):
        nd.configure(ParallelismConfig(tp_handler=object()), state)
