"""The rest of HF ``Accelerator``'s public API: state hooks, ``prepare_optimizer``/``_scheduler``,
``profile``, ``rng_types``, ``dynamo_backend``, the plugin refusals and the read-only properties,
plus a census that every public HF attribute exists here or is left out for a stated reason."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import accelerate
import pytest
import torch

from accelify.runtime import Accelerator, FP8BackendType, ProfileKwargs

from .test_multiprocess import _run

# HF's public attributes accelify leaves out, each with its reason.
LEFT_OUT = {
    # DeepSpeed-Ulysses sequence parallelism (ALST): GPU-only, needs DeepSpeed's sequence API.
    "deepspeed_ulysses_dl_adapter",
    # LOMO optimizers (the lomo_optim package, GPU-oriented) fuse the step into backward.
    "lomo_backward",
}


def _tiny() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def test_every_public_hf_attribute_is_here_or_left_out_for_a_reason() -> None:
    hf = accelerate.Accelerator(cpu=True)
    theirs = {name for name in dir(hf) if not name.startswith("_")}
    ours = {name for name in dir(Accelerator()) if not name.startswith("_")}
    assert theirs >= LEFT_OUT, "a left-out name is gone upstream: drop it from LEFT_OUT"
    assert sorted(theirs - ours - LEFT_OUT) == []
    assert not LEFT_OUT & ours, "implemented now: drop it from LEFT_OUT"


def test_read_only_properties_answer_as_hf_does_on_one_process() -> None:
    ours, hf = Accelerator(), accelerate.Accelerator(cpu=True)
    for name in (
        "multi_device",
        "is_fsdp2",
        "is_composable_parallelism_enabled",
        "parallelism_config",
        "torch_device_mesh",
        "should_save_model",
        "native_amp",
        "dispatch_batches",
        "use_seedable_sampler",
        "non_blocking",
        "use_stateful_dataloader",
        "deepspeed_plugin",
        "fp8_enabled",
        "has_fp8_handler",
        "has_lomo_optimizer",
        "ddp_handler",
        "profile_handler",
        "rng_types",
    ):
        assert getattr(ours, name) == getattr(hf, name), name
    assert ours.fp8_backend == FP8BackendType.NO == hf.fp8_backend.value
    assert Accelerator(mixed_precision="bf16").native_amp is True
    with pytest.raises(RuntimeError, match="parallelism_config"):
        _ = ours.tensor_parallel_rank
    with pytest.raises(NotImplementedError, match="Pipeline"):
        _ = ours.pipeline_parallel_rank
    with pytest.warns(UserWarning, match="no effect"), ours.maybe_context_parallel():
        pass


def test_verify_device_map_spots_a_model_split_over_devices() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(2, 2))
    assert Accelerator.verify_device_map(model) is False
    model[0].hf_device_map = {"0": "cpu", "1": "disk"}
    assert Accelerator().verify_device_map(model) is True


def test_save_and_load_hooks_get_hfs_arguments_and_can_be_removed(tmp_path: Path) -> None:
    accelerator = Accelerator()
    model, _ = accelerator.prepare(*_tiny())
    calls: list[tuple] = []

    def save_hook(models: list, weights: list, output_dir: str) -> None:
        calls.append(("save", models, [sorted(w) for w in weights], output_dir))
        torch.save(weights.pop(), Path(output_dir) / "mine.pt")  # the hook saves it itself

    def load_hook(models: list, input_dir: str) -> None:
        calls.append(("load", list(models), input_dir))
        models.pop().load_state_dict(torch.load(Path(input_dir) / "mine.pt"))

    save_handle = accelerator.register_save_state_pre_hook(save_hook)
    load_handle = accelerator.register_load_state_pre_hook(load_hook)
    saved = accelerator.save_state(tmp_path / "ckpt")
    assert calls[0][:3] == ("save", [model], [["bias", "weight"]])
    assert (Path(saved) / "mine.pt").is_file()
    assert not (Path(saved) / "model.safetensors").exists()  # the hook took it away
    expected = model.weight.detach().clone()
    with torch.no_grad():
        model.weight.zero_()
    accelerator.load_state(saved)
    assert calls[1] == ("load", [model], saved)
    assert torch.equal(model.weight, expected)

    save_handle.remove()
    load_handle.remove()
    accelerator.save_state(tmp_path / "plain")
    accelerator.load_state(tmp_path / "plain")
    assert len(calls) == 2
    assert (tmp_path / "plain" / "model.safetensors").is_file()


def test_prepare_optimizer_and_scheduler_one_at_a_time() -> None:
    accelerator = Accelerator()
    model, optimizer = _tiny()
    model = accelerator.prepare_model(model)
    prepared = accelerator.prepare_optimizer(optimizer)
    scheduler = accelerator.prepare_scheduler(torch.optim.lr_scheduler.StepLR(optimizer, 1, 0.5))
    assert prepared.optimizer is optimizer
    assert accelerator.prepare_optimizer(prepared) is prepared  # never wrapped twice
    assert accelerator.prepare_scheduler(scheduler) is scheduler
    assert accelerator._optimizers == [prepared] and accelerator._schedulers == [scheduler]
    accelerator.backward(model(torch.ones(1, 3)).sum())
    prepared.step()
    scheduler.step()
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.05)


def test_profile_records_and_writes_hfs_trace_file(tmp_path: Path) -> None:
    handler = ProfileKwargs(activities=["cpu"], output_trace_dir=str(tmp_path))
    accelerator = Accelerator(kwargs_handlers=[handler])
    assert accelerator.profile_handler is handler
    with accelerator.profile() as prof:
        torch.ones(8, 8) @ torch.ones(8, 8)
    assert any("mm" in event.key for event in prof.key_averages())
    assert json.loads((tmp_path / "profile_0.json").read_text())["traceEvents"]
    with (
        pytest.raises(ValueError, match="Invalid profiler activity"),
        accelerator.profile(ProfileKwargs(activities=["abacus"])),
    ):
        pass


def test_dynamo_backend_compiles_the_prepared_model() -> None:
    model, _ = _tiny()
    expected = model(torch.ones(2, 3))
    compiled = Accelerator(dynamo_backend="eager").prepare(model)
    assert isinstance(compiled, torch._dynamo.eval_frame.OptimizedModule)
    assert torch.allclose(compiled(torch.ones(2, 3)), expected)
    assert Accelerator().unwrap_model(compiled) is model
    assert Accelerator(dynamo_backend="no").prepare(_tiny()[0]).__class__ is torch.nn.Linear
    with pytest.raises(ValueError, match=r"not a torch\.compile backend"):
        Accelerator(dynamo_backend="nvprims_nvfuser")


@pytest.mark.parametrize(
    ("argument", "says"),
    [
        ("deepspeed_plugins", "one DeepSpeedPlugin"),
        ("torch_tp_plugin", "tensor parallelism"),
        ("megatron_lm_plugin", "Megatron"),
    ],
)
def test_plugins_accelify_does_not_take_are_refused_by_name(argument: str, says: str) -> None:
    with pytest.raises(ValueError, match=f"{argument}=.*not supported by accelify.*{says}"):
        Accelerator(**{argument: object()})


def test_unknown_rng_types_are_refused_up_front() -> None:
    with pytest.raises(ValueError, match="unknown"):
        Accelerator(rng_types=["torch", "dice"])


RNG_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import torch
    from torch.utils.data import DataLoader
    from accelify.runtime import Accelerator

    accelerator = Accelerator(rng_types=sys.argv[2].split(","))
    rank = accelerator.process_index
    generator = torch.Generator().manual_seed(rank)  # differs per process on purpose
    loader = accelerator.prepare(DataLoader(list(range(16)), batch_size=2, shuffle=True,
                                            generator=generator))
    seen, draws = [], []
    for epoch in range(2):
        torch.manual_seed(100 + rank)  # the processes' random states drift apart
        generator.manual_seed(200 + rank)
        for i, batch in enumerate(loader):
            if i == 0:
                draws.append(torch.rand(1).item())
            seen += [(epoch, int(x)) for x in batch]
    with open(f"{sys.argv[1]}/rank{rank}.json", "w") as out:
        out.write(json.dumps({"seen": seen, "draws": draws}))
    """
)


@pytest.mark.slow
def test_rng_types_synchronise_shuffling_and_torch_each_epoch_on_two_processes(
    tmp_path: Path,
) -> None:
    script = tmp_path / "rng_types.py"
    script.write_text(RNG_SCRIPT)
    _run(tmp_path, "torch,generator", processes=2, script=script)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for epoch in range(2):
        shards = [[x for e, x in rank["seen"] if e == epoch] for rank in ranks]
        assert sorted(shards[0] + shards[1]) == list(range(16)), epoch  # one permutation
    assert ranks[0]["draws"] == ranks[1]["draws"]  # torch's generator too
