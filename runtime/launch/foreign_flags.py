"""``accelerate launch`` options that accel-run accepts but does not act on, and why.

accel-run takes any ``accelerate launch`` command line. Most options have a setting here (cli.py,
backends.py, parallelism.py); the rest only matter to launch paths accel-run does not have (TPU
pods, SageMaker, Megatron-LM, FP8, context/sequence parallelism, mpirun). Those are accepted so the
command line parses, and each one given gets one line: a note when accelerate itself would ignore
it on every path accel-run runs, an error (exit 2) when it would change training and accel-run
cannot do it.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class Foreign:
    """accelerate options (by dest name) sharing one reason."""

    names: tuple[str, ...]
    action: str  # "store" (takes a value), "store_true" or "append"
    why: str
    refused: bool = False  # True: it would change training, so the launch stops


def _names(prefix: str, words: str) -> tuple[str, ...]:
    return tuple(f"{prefix}{word}" for word in words.split())


_NOT_HERE = "accel-run does not support it; use `accelerate launch`"
_TPU = "read by accelerate's TPU launchers only, and accel-run does not launch on TPUs"
FOREIGN = (
    Foreign(("tpu",), "store_true", f"TPU training (torch_xla): {_NOT_HERE}", refused=True),
    Foreign(("use_megatron_lm",), "store_true", f"Megatron-LM: {_NOT_HERE}", refused=True),
    Foreign(
        ("mpirun_hostfile",),
        "store",
        "accel-run does not start machines through mpirun: run accel-run on each machine with "
        "its --machine-rank and --main-process-ip",
        refused=True,
    ),
    Foreign(("tpu_cluster", "no_tpu_cluster", "tpu_use_sudo", "downcast_bf16"), "store_true", _TPU),
    Foreign(("main_training_function",), "store", _TPU),
    Foreign(("vm", "env"), "append", _TPU),
    Foreign(
        ("aws_access_key_id", "aws_secret_access_key"),
        "store",
        "read by accelerate's SageMaker launcher only",
    ),
    Foreign(
        _names(
            "megatron_lm_",
            "tp_degree use_custom_fsdp no_load_optim eod_mask_loss overlap_cpu_optimizer_d2h_h2d "
            "no_save_optim optimizer_cpu_offload use_precision_aware_optimizer "
            "decoder_last_pipeline_num_layers pp_degree num_micro_batches sequence_parallelism "
            "recompute_activations use_distributed_optimizer gradient_clipping "
            "recompute_granularity recompute_method recompute_num_layers attention_backend "
            "expert_model_parallel_size context_parallel_size attention_dropout hidden_dropout "
            "attention_softmax_in_fp32 expert_tensor_parallel_size calculate_per_token_loss "
            "use_rotary_position_embeddings",
        ),
        "store",
        "accelerate reads it only with --use-megatron-lm, which accel-run does not support",
    ),
    Foreign(
        _names(
            "fp8_",
            "backend margin interval format amax_history_len amax_compute_algo "
            "override_linear_precision opt_level enable_fsdp_float8_all_gather pad_inner_dim",
        ),
        "store",
        "accelerate reads it only with --mixed-precision fp8, which accel-run does not support",
    ),
    Foreign(
        ("fp8_use_autocast_during_eval",),
        "store_true",
        "accelerate reads it only with --mixed-precision fp8, which accel-run does not support",
    ),
    Foreign(
        _names(
            "parallelism_config_",
            "cp_comm_strategy sp_seq_length sp_seq_length_is_variable sp_attn_implementation",
        ),
        "store",
        "accelerate reads it only with --parallelism-config-cp-size or -sp-size above 1 "
        "(context or sequence parallelism), which accel-run does not support",
    ),
)
BY_NAME = {name: foreign for foreign in FOREIGN for name in foreign.names}


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def add_flags(parser: argparse.ArgumentParser) -> None:
    """Accept every foreign option in accelerate's two spellings, out of ``--help``'s way."""
    for name, foreign in BY_NAME.items():
        spellings = dict.fromkeys([flag(name), f"--{name}"])
        parser.add_argument(
            *spellings, dest=f"foreign_{name}", action=foreign.action, help=argparse.SUPPRESS
        )


def given(args: argparse.Namespace) -> Iterator[tuple[str, Foreign]]:
    """The foreign options on this command line, with their reason."""
    for name, foreign in BY_NAME.items():
        if getattr(args, f"foreign_{name}", None) not in (None, False):
            yield flag(name), foreign


def review(args: argparse.Namespace) -> list[str]:
    """One note per foreign option given; the first refused one raises ``ValueError``."""
    notes = []
    for spelled, foreign in given(args):
        if foreign.refused:
            raise ValueError(f"{spelled}: {foreign.why}")
        notes.append(f"{spelled} has no effect: {foreign.why}")
    return notes
