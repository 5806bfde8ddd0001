"""HF Accelerate's read-only ``Accelerator`` properties about its settings and its process layout.

They answer with HF's values for the setups accelify runs (DDP/FSDP2/DeepSpeed, a
``ParallelismConfig`` of data, sharded and tensor parallelism, no FP8), so scripts that read them
run unchanged; asking for something only the missing setups have (a context-parallel rank, the
DeepSpeed plugin object) raises as HF does or says what accelify offers instead.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from enum import Enum
from typing import TYPE_CHECKING, Any

import torch

from . import config
from .state import DistributedType, ProcessState

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

    from .parallelism import ParallelismConfig


class FP8BackendType(str, Enum):
    """HF Accelerate's ``accelerate.utils.FP8BackendType`` (accelify trains no FP8: ``NO``)."""

    NO = "NO"
    TE = "TE"
    MSAMP = "MSAMP"
    AO = "AO"


class SettingsFacts:
    """Mixin for ``Accelerator``: properties that read only ``state``, the loader and project
    configurations and ``mixed_precision``."""

    state: ProcessState
    dataloader_config: config.DataLoaderConfiguration
    project_configuration: config.ProjectConfiguration
    mixed_precision: str
    _parallelism: ParallelismConfig | None

    # -- process facts ---------------------------------------------------------------------------

    @property
    def device(self) -> torch.device:
        return self.state.device

    @property
    def distributed_type(self) -> DistributedType:
        return self.state.distributed_type

    @property
    def num_processes(self) -> int:
        return self.state.num_processes

    @property
    def process_index(self) -> int:
        return self.state.process_index

    @property
    def local_process_index(self) -> int:
        return self.state.local_process_index

    @property
    def is_main_process(self) -> bool:
        return self.state.is_main_process

    @property
    def is_local_main_process(self) -> bool:
        return self.state.is_local_main_process

    @property
    def is_last_process(self) -> bool:
        return self.state.is_last_process

    @property
    def use_distributed(self) -> bool:
        return self.state.use_distributed

    @property
    def project_dir(self) -> str | None:
        return self.project_configuration.project_dir

    @property
    def logging_dir(self) -> str | None:
        return self.project_configuration.logging_dir

    @property
    def save_iteration(self) -> int:
        return self.project_configuration.iteration

    # FP8 (GPU-only in HF) is not offered: its handlers are never set.
    fp8_recipe_handler = ao_recipe_handler = te_recipe_handler = msamp_recipe_handler = None
    fp8_enabled = has_fp8_handler = delayed_fp8_autocast = False
    has_lomo_optimizer = False  # LOMO optimizers (lomo_optim) are not supported

    @property
    def fp8_backend(self) -> FP8BackendType:
        return FP8BackendType.NO

    @property
    def native_amp(self) -> bool:
        """Whether torch autocast runs the mixed precision (HF: fp16 off the CPU, bf16; never
        under DeepSpeed, whose engine does it)."""
        kind, device = self.state.distributed_type, self.state.device.type
        if kind == DistributedType.DEEPSPEED or self.mixed_precision == "no":
            return False
        return self.mixed_precision == "bf16" or device != "cpu"

    @property
    def multi_device(self) -> bool:
        kind = self.state.distributed_type
        return self.state.use_distributed and kind == DistributedType.MULTI_GPU

    @property
    def is_fsdp2(self) -> bool:
        """accelify's FSDP is FSDP2 (``fully_shard``)."""
        return self.state.distributed_type == DistributedType.FSDP

    @property
    def is_composable_parallelism_enabled(self) -> bool:
        return self.is_fsdp2

    @property
    def deepspeed_plugin(self) -> None:
        """``None`` off DeepSpeed, as in HF; under DeepSpeed accelify has no plugin object."""
        if self.state.distributed_type == DistributedType.DEEPSPEED:
            raise NotImplementedError(
                "accelerator.deepspeed_plugin: accelify keeps no plugin object under DeepSpeed; "
                "the config the engine trains with is accelerator.strategy.config"
            )

    # -- the loader configuration, read through (HF's names) ---------------------------------

    @property
    def dispatch_batches(self) -> bool | None:
        return self.dataloader_config.dispatch_batches

    @property
    def use_seedable_sampler(self) -> bool:
        return self.dataloader_config.use_seedable_sampler

    @property
    def non_blocking(self) -> bool:
        return self.dataloader_config.non_blocking

    @property
    def use_stateful_dataloader(self) -> bool:
        return getattr(self.dataloader_config, "use_stateful_dataloader", False)

    # -- composable parallelism (HF's ParallelismConfig, parallelism.py) -----------------------

    @property
    def parallelism_config(self) -> ParallelismConfig | None:
        return self._parallelism

    @property
    def torch_device_mesh(self) -> DeviceMesh | None:
        """The mesh with HF's dimension names (``None`` without a config, or all sizes 1)."""
        return None if self._parallelism is None else self._parallelism.device_mesh

    @property
    def should_save_model(self) -> bool:
        """HF's answer: every process takes part in saving under a ``parallelism_config``."""
        return self._parallelism is not None or self.state.is_local_main_process

    @property
    def tensor_parallel_rank(self) -> int:
        return self._mesh_rank("tp", "Tensor parallelism")

    @property
    def data_parallel_rank(self) -> int:
        """This process's rank in ``dp_replicate`` (0 when that size is 1)."""
        return self._mesh_rank("dp_replicate", "Data parallelism")

    @property
    def data_parallel_shard_rank(self) -> int:
        return self._mesh_rank("dp_shard", "Shard-based data parallelism")

    def _mesh_rank(self, dimension: str, what: str) -> int:
        chosen = self._parallelism
        if chosen is None:
            raise RuntimeError(f"{what} is not configured. Set `parallelism_config` first.")
        if getattr(chosen, f"{dimension}_size") == 1:
            return 0
        return chosen.device_mesh.get_local_rank(dimension)

    @property
    def pipeline_parallel_rank(self) -> int:
        raise NotImplementedError("Pipeline parallelism is currently not supported in Accelerate.")

    @property
    def context_parallel_rank(self) -> int:
        raise NotImplementedError("Context parallelism is currently not supported in Accelerate.")

    @contextlib.contextmanager
    def maybe_context_parallel(
        self,
        buffers: list[torch.Tensor] | None = None,
        buffer_seq_dims: list[int] | None = None,
        no_restore_buffers: set[torch.Tensor] | None = None,
    ) -> Iterator[None]:
        """A no-op with HF's warning: context parallelism is never enabled here."""
        warnings.warn(
            "Context parallel training is not enabled. This context manager will have no effect.",
            stacklevel=3,
        )
        yield

    @staticmethod
    def verify_device_map(model: torch.nn.Module) -> bool:
        """Whether ``model`` was loaded with a multi-device ``device_map`` (big model inference),
        which cannot be trained data-parallel."""
        return any(len(getattr(m, "hf_device_map", ())) > 1 for m in model.modules())


def unsupported_plugins(**plugins: Any) -> None:
    """Refuse HF's plugin arguments accelify has no implementation for, naming what to use."""
    instead = {
        "deepspeed_plugins": "one DeepSpeedPlugin as deepspeed_plugin (several are not)",
        "torch_tp_plugin": (
            "parallelism_config=ParallelismConfig(tp_size=N), HF's replacement for it, for "
            "tensor parallelism"
        ),
        "megatron_lm_plugin": "nothing: Megatron-LM is not supported",
    }
    given = [name for name, value in plugins.items() if value is not None]
    if given:
        raise ValueError(
            f"Accelerator({given[0]}=...) is not supported by accelify; use {instead[given[0]]}"
        )
