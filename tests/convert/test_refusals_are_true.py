"""Every refusal of the soundness steps is true: the conversion they hold back goes wrong.

For each refused case under fixtures/convert/sound, the conversion is made again without the
step that refused it (what accel-convert wrote before that step existed), and run on two CPU
processes forked by the oracle's zygote with the variables accel-run --cpu gives its workers (a
launch per run would import torch three times over). What the refusal said must happen: the
replicas drift apart (the step trained a bare module; the runtime's replica check stops such a
run), or the run fails in the gradient all-reduce (a process left it, or DDP waited for a
gradient that never came). The cases the steps let through run on two processes with equal
replicas.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import accelify.transform.convert as convert_module
from accelify.transform.convert import convert
from accelify.transform.steps import prepare as prepare_step

from .conftest import CASES_DIR

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "oracle"))
from runner import Zygote, zygote_fixture  # noqa: F401  (tests/oracle is scripts, not a package)

pytest.importorskip("torch")

SOUND = CASES_DIR / "sound"
# Seconds a two-process run may take before it counts as hung (each run takes a few seconds).
HANG = 90
BIN = Path(sys.executable).parent
# Put before every script: each process draws its own numbers, as an unseeded one does, but the
# same ones on every run, so whether the processes part is decided by the code and not by luck.
SEED_BY_RANK = """\
import os as _os, random as _random
import torch as _torch
_random.seed(int(_os.environ.get("RANK", "0")))
_torch.manual_seed(int(_os.environ.get("RANK", "0")))
"""
# Written by every rank at the end: the sum of its model's weights, in full precision.
PROBE = """
import os as _os
_w = sum(p.detach().double().sum().item() for p in accelerator.unwrap_model({model}).parameters())
with open(f"weights-{{_os.environ.get('RANK', '0')}}.txt", "w") as _f:
    _f.write(repr(_w))
"""


def _without(step_name: str, source: str) -> str:
    """The conversion as it was before ``step_name`` refused anything."""
    steps = [s for s in convert_module.STEPS if s.__name__ != step_name]
    original = convert_module.STEPS[:]
    convert_module.STEPS[:] = steps
    try:
        return convert(source).code
    finally:
        convert_module.STEPS[:] = original


def _run_two(
    zygote: Zygote, code: str, model: str, tmp_path: Path
) -> subprocess.CompletedProcess[str]:
    for old in tmp_path.glob("weights-*.txt"):
        old.unlink()
    script = tmp_path / "train.py"
    probe = PROBE.format(model=model)
    end = re.search(r"^( *)accelerator\.end_training\(\)$", code, re.MULTILINE)
    if end is not None:  # inside the function that trains, where its names are
        indented = "".join(end.group(1) + line + "\n" for line in probe.strip().splitlines())
        code = code[: end.start()] + indented + code[end.start() :]
    else:
        code += probe
    script.write_text(SEED_BY_RANK + code)
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    run = zygote.run(script, tmp_path, out, HANG, ranks=2)
    hung = "\n(hung)" if run.timed_out else ""  # a process waits for another in the all-reduce
    return subprocess.CompletedProcess([str(script)], run.code, run.stdout, run.stderr + hung)


def _weights(result: subprocess.CompletedProcess[str]) -> dict[str, float]:
    folder = Path(result.args[-1]).parent
    return {f.stem[-1]: float(f.read_text()) for f in folder.glob("weights-*.txt")}


# case -> (the step that refuses it, the model to probe)
DRIFTS = {
    "alias_trained": ("uses", "model"),
    "model_in_a_dict": ("uses", "model"),
    "models_in_a_list": ("uses", "head"),
    "plateau_on_own_loss": ("lockstep", "model"),
    "target_network_copied_before_prepare": ("uses", "actor_target"),  # each its own copy
}
FAILS_IN_ALL_REDUCE = {
    "stop_on_own_loss": ("lockstep", "model"),
    "episode_of_random_length": ("lockstep", "policy"),
    "early_stop_on_unseeded_data": ("lockstep", "model"),
    "replay_buffer_threshold": ("lockstep", "q"),
    "dataset_of_random_size": ("lockstep", "model"),
    "curriculum_from_own_loss": ("lockstep", "model"),
    "resumed_epoch_after_a_checkpoint_in_the_loop": ("lockstep", "net"),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(DRIFTS))
def test_refused_use_would_let_replicas_drift(case: str, tmp_path: Path, zygote: Zygote) -> None:
    source = (SOUND / f"{case}.in.py").read_text()
    assert not convert(source).changed  # refused today
    step, model = DRIFTS[case]
    result = _run_two(zygote, _without(step, source), model, tmp_path)
    _assert_drifted(result)  # the bare module trained apart on each process


@pytest.mark.slow
def test_a_parameter_replaced_while_training_would_let_replicas_drift(
    tmp_path: Path, zygote: Zygote, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The EMA quantizer's forward puts a new codebook Parameter in place of the one
    DistributedDataParallel was given: converted anyway, each process moves its own."""
    source = (SOUND / "parameter_replaced_in_forward.in.py").read_text()
    assert not convert(source).changed  # refused today
    monkeypatch.setattr(sys.modules[prepare_step.__module__], "replaced_parameters", lambda *_: {})
    code = convert(source).code
    assert "accelerator.prepare(" in code
    _assert_drifted(_run_two(zygote, code, "model", tmp_path))


def _assert_drifted(result: subprocess.CompletedProcess[str]) -> None:
    """The replicas parted: the runtime's replica check stopped the run, or (parting after the
    steps it checks) both processes finished with different weights."""
    if result.returncode != 0:
        assert "ReplicaMismatchError: model 0" in result.stderr, result.stderr[-2000:]
        return
    weights = _weights(result)
    assert set(weights) == {"0", "1"}, result.stdout
    assert weights["0"] != weights["1"]


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(FAILS_IN_ALL_REDUCE))
def test_refused_control_flow_would_break_the_all_reduce(
    case: str, tmp_path: Path, zygote: Zygote
) -> None:
    source = (SOUND / f"{case}.in.py").read_text()
    assert not convert(source).changed
    step, model = FAILS_IN_ALL_REDUCE[case]
    result = _run_two(zygote, _without(step, source), model, tmp_path)
    weights = _weights(result)
    # One process left the training loop first: the run fails in the all-reduce, or it hangs
    # with one rank done and the other still in it, or (had it finished) the replicas differ.
    # Both ranks finishing with equal weights would make the refusal a lie, and so would a run
    # that failed for any other reason (the probe after a main() whose accelerator is local
    # fails on every rank that gets there, which proves nothing by itself).
    hung = result.stderr.endswith("(hung)")
    if hung:
        assert len(weights) == 1, "hung before either process finished: too slow to tell"
    elif result.returncode != 0:
        assert any(gone in result.stderr for gone in PEER_LEFT), result.stderr[-2000:]
    else:
        assert weights.get("0") != weights.get("1"), result.stdout


# What gloo raises in a collective whose peer has left it.
PEER_LEFT = ("Connection closed by peer", "Connection reset by peer")


@pytest.mark.slow
@pytest.mark.parametrize(
    "case",
    [
        "discarded_output",
        "head_attached_from_outside",
        "layers_of_random_depth",
        "feature_cut_off_the_graph",
    ],
)
def test_parameters_without_gradients_need_unused_parameters(
    case: str, tmp_path: Path, zygote: Zygote
) -> None:
    source = (SOUND / f"{case}.in.py").read_text()
    code = convert(source).code
    assert "find_unused_parameters=True" in code
    kept = _run_two(zygote, code, "model", tmp_path)
    assert kept.returncode == 0, kept.stderr[-2000:]
    weights = _weights(kept)
    assert weights["0"] == weights["1"]
    without = code.replace(
        "kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=True)],", ""
    )
    failed = _run_two(zygote, without, "model", tmp_path)
    assert failed.returncode != 0
    assert "Expected to have finished reduction" in failed.stderr


@pytest.mark.slow
@pytest.mark.parametrize(
    ("case", "model"),
    [
        ("sound/alias_for_saving", "model"),
        ("sound/early_stop_on_validation", "model"),
        ("sound/plateau_on_validation", "model"),  # the learning rate falls alike everywhere
        ("sound/resumed_epoch_before_a_later_checkpoint", "net"),  # read before the loop
        ("ddp/param_groups_from_a_loop", "net"),  # prepared though no model is named in opt
        ("report/split_written_then_read", "model"),  # reads train.csv once rank 0 wrote it
        ("sound/target_network_copied_after_one_seed", "actor_target"),  # one seed, one copy
        ("sound/break_of_an_inner_loop", "model"),  # the break leaves the inner loop only
    ],
)
def test_accepted_cases_keep_replicas_equal(
    case: str, model: str, tmp_path: Path, zygote: Zygote
) -> None:
    code = convert((CASES_DIR / f"{case}.in.py").read_text()).code
    assert "accelerator.prepare(" in code
    result = _run_two(zygote, code, model, tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    weights = _weights(result)
    assert set(weights) == {"0", "1"} and weights["0"] == weights["1"]


@pytest.mark.slow
def test_target_accelerate_reads_the_rank_with_the_accelerators_cpu_choice(tmp_path: Path) -> None:
    """A rank read before ``Accelerator(cpu=True)`` exists goes through HF's ``PartialState``;
    made without the same ``cpu=`` it settles on one process, and each of the two trains alone."""
    pytest.importorskip("accelerate")
    from accelify.transform.convert import Options

    source = (CASES_DIR / "ddp" / "torchrun.in.py").read_text()
    code = convert(source, Options(target="accelerate")).code
    assert "PartialState(cpu=True).process_index" in code
    probe = "\n".join(
        [
            "import os as _os",
            "from accelerate import PartialState as _State",
            "with open(f\"world-{_os.environ['RANK']}.txt\", 'w') as _f:",
            "    _f.write(str(_State().num_processes))",
            # Past what is asked, skip the interpreter's teardown: gloo's can abort a rank there
            # (SIGABRT, "terminate called without an active exception"; 1 run in 3 here).
            "_os._exit(0)",
        ]
    )
    script = tmp_path / "train.py"
    script.write_text(code.replace('if __name__ == "__main__":\n    main()', "main()\n" + probe))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ACCELERATE_", "RANK"))}
    result = subprocess.run(
        [str(BIN / "torchrun"), "--nproc-per-node", "2", str(script)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert sorted(f.read_text() for f in tmp_path.glob("world-*.txt")) == ["2", "2"]


@pytest.mark.slow
def test_refused_second_backward_would_let_replicas_drift(
    tmp_path: Path, monkeypatch, zygote: Zygote
) -> None:
    """Two backwards through one forward: without the refusal, the second pass's gradients are
    not averaged and the replicas part."""
    import accelify.transform.setup as setup_module

    source = (SOUND / "second_backward_same_forward.in.py").read_text()
    source = source.replace("torch.randn(8, 2)", "torch.randn(64, 2)")  # a few steps per rank
    assert not convert(source).changed
    monkeypatch.setattr(setup_module, "_refuse_second_backward", lambda a, setup: None)
    _assert_drifted(_run_two(zygote, convert(source).code, "model", tmp_path))


SPLIT_PROBE = """
with open(f"split-{_os.environ.get('RANK', '0')}.txt", "w") as _f:
    _f.write(repr(sorted(train.indices)))
"""


@pytest.mark.slow
@pytest.mark.parametrize(("case", "apart"), [("split_unseeded", True), ("split_seeded", False)])
def test_an_unseeded_split_is_drawn_apart_on_each_process(
    case: str, apart: bool, tmp_path: Path, zygote: Zygote
) -> None:
    """The refusal of split_unseeded holds: converted anyway, its two processes split the data
    differently (each from its own random stream), while the seeded split is the same on both."""
    source = (SOUND / f"{case}.in.py").read_text()
    assert convert(source).changed is not apart  # refused today exactly when drawn apart
    result = _run_two(zygote, _without("lockstep", source) + SPLIT_PROBE, "model", tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    splits = {f.stem[-1]: f.read_text() for f in tmp_path.glob("split-*.txt")}
    assert set(splits) == {"0", "1"}
    assert (splits["0"] != splits["1"]) is apart


LR_PROBE = """
with open("lr.txt", "w") as _f:
    _f.write(repr(optimizer.param_groups[0]["lr"]))
"""


@pytest.mark.slow
def test_a_scheduler_attribute_set_after_prepare_stays_on_the_wrapper(tmp_path: Path) -> None:
    """The refusal of scheduler_epoch_set_after_prepare holds: converted anyway, the resumed
    ``last_epoch`` lands on the prepared scheduler's wrapper, and the schedule differs from the
    original's even on one process."""
    source = (SOUND / "scheduler_epoch_set_after_prepare.in.py").read_text()
    assert not convert(source).changed
    rates = []
    for code in (source, _without("uses", source)):
        (tmp_path / "train.py").write_text(code + LR_PROBE)
        result = subprocess.run(
            [sys.executable, "train.py"], cwd=tmp_path, capture_output=True, text=True,
            timeout=240, check=False,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr[-2000:]
        rates.append(float((tmp_path / "lr.txt").read_text()))
    original, converted = rates
    assert original != converted
