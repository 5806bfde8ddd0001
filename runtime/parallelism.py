"""HF Accelerate's ``ParallelismConfig``: data, sharded and tensor parallelism over one DeviceMesh.

The fields, defaults, variables and checks are HF's, and so is the one path both ways of asking
take: ``accel-run --use-parallelism-config`` (or a ``parallelism_config`` section) writes the
``PARALLELISM_CONFIG_*`` variables and ``ACCELERATE_USE_PARALLELISM_CONFIG``, and
``ParallelismConfig()`` reads every size it is not given from them.

torch does the distributing: ``init_device_mesh`` builds the mesh with HF's dimension names (and
the flattened ``dp``, ``dp_shard_cp`` and ``dp_cp``), FSDP2 shards over ``dp_shard`` (HSDP over
``dp_replicate`` x ``dp_shard``), DDP replicates over every process when ``dp_replicate_size``
is the only size, and tensor parallelism is the script's, done before ``prepare`` as HF expects
(transformers' ``tp_plan``, or torch's ``parallelize_module`` on ``torch_device_mesh["tp"]``).
Context and sequence parallelism are refused by name. Nothing here imports torch at load, so
accel-run checks the sizes with this class before it starts the workers.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

    from .state import ProcessState

USE_ENV = "ACCELERATE_USE_PARALLELISM_CONFIG"
ENV_PREFIX = "PARALLELISM_CONFIG_"
SIZES = ("dp_replicate", "dp_shard", "tp", "cp", "sp")  # the ``<name>_size`` fields, HF's order
# HF's canonical mesh order: tensor (and context) parallel innermost, data parallel outermost.
MESH_ORDER = ("dp_replicate", "dp_shard", "cp", "sp", "tp")
BACKENDS = {"cp_backend": ("torch",), "sp_backend": ("deepspeed",)}
_REFUSED = {
    "cp": "context parallelism (torch's context_parallel with FSDP2) is not implemented",
    "sp": "sequence parallelism (DeepSpeed-Ulysses) is not implemented",
}


@dataclass
class ParallelismConfig:
    """How the processes split the training (HF Accelerate's fields, defaults and variables).

    ``dp_replicate_size`` copies of the model, each sharded by FSDP2 over ``dp_shard_size``
    processes (HSDP when both are above 1), each layer the script parallelised split over
    ``tp_size`` processes. A field left at ``None`` is read from ``PARALLELISM_CONFIG_<FIELD>``,
    else 1 (``torch``/``deepspeed`` for the backends). ``tp_handler`` is accepted and unused, as
    its one option (async TP) is in HF; ``cp_size`` and ``sp_size`` above 1 are refused.
    """

    dp_replicate_size: int | None = None
    dp_shard_size: int | None = None
    tp_size: int | None = None
    cp_size: int | None = None
    cp_backend: str | None = None
    sp_size: int | None = None
    sp_backend: str | None = None
    tp_handler: Any = None
    cp_handler: Any = None
    sp_handler: Any = None

    device_mesh = None  # built by get_device_mesh; a class attribute, not a field, as in HF

    def __post_init__(self) -> None:
        """Fill what is left at ``None`` from HF's variables; refuse what HF refuses (with its
        messages), then what accelify cannot run."""
        for name in SIZES:
            if getattr(self, f"{name}_size") is None:
                variable = f"{ENV_PREFIX}{name.upper()}_SIZE"
                setattr(self, f"{name}_size", int(os.environ.get(variable, "1")))
        for field, allowed in BACKENDS.items():
            if getattr(self, field) is None:
                setattr(self, field, os.environ.get(f"{ENV_PREFIX}{field.upper()}", allowed[0]))
        for name in SIZES:
            size = getattr(self, f"{name}_size")
            if size < 1:
                raise ValueError(f"{name}_size must be at least 1, but got {size}")
        for field, allowed in BACKENDS.items():
            if getattr(self, field) not in allowed:
                raise ValueError(
                    f"{field} must be one of {list(allowed)}, but got {getattr(self, field)}"
                )
        if self.cp_enabled and self.sp_enabled:
            raise ValueError(
                "Context Parallelism (CP) and Sequence Parallelism (SP) are mutually exclusive. "
                f"Got cp_size={self.cp_size} and sp_size={self.sp_size}. "
                "Please set either cp_size=1 or sp_size=1."
            )
        pure_dp = self.dp_replicate_enabled and not self.dp_shard_enabled
        if (self.tp_enabled or self.cp_enabled) and pure_dp:
            raise ValueError(
                "Tensor/Context parallelism (tp/cp_size > 1) cannot be used with pure data "
                "parallelism (dp_replicate_size > 1 and dp_shard_size == 1). Please set "
                "dp_shard_size > 1 and dp_replicate_size == 1 to compose FSDP + TP/CP for 2D "
                "parallel, or set dp_replicate_size == 1 and dp_shard_size > 1 to compose HSDP + "
                "TP/CP for 3D parallel."
            )
        for name, why in _REFUSED.items():
            if getattr(self, f"{name}_size") > 1:
                raise ValueError(
                    f"ParallelismConfig({name}_size={getattr(self, f'{name}_size')}) is not "
                    f"supported by accelify: {why}; leave {name}_size at 1"
                )

    def _enabled(self, *names: str) -> list[str]:
        return [name for name in names if getattr(self, f"{name}_size") > 1]

    @property
    def dp_replicate_enabled(self) -> bool:
        return self.dp_replicate_size > 1

    @property
    def dp_shard_enabled(self) -> bool:
        return self.dp_shard_size > 1

    @property
    def tp_enabled(self) -> bool:
        return self.tp_size > 1

    @property
    def cp_enabled(self) -> bool:
        return self.cp_size > 1

    @property
    def sp_enabled(self) -> bool:
        return self.sp_size > 1

    @property
    def dp_dim_names(self) -> list[str]:
        """The dimensions whose processes read different batches."""
        return self._enabled("dp_replicate", "dp_shard")

    @property
    def non_dp_dim_names(self) -> list[str]:
        """The dimensions whose processes read the same batch."""
        return self._enabled("tp", "cp", "sp")

    @property
    def dp_shard_cp_dim_names(self) -> list[str]:
        """The dimensions flattened into the one FSDP shards the model over."""
        return self._enabled("dp_shard", "cp")

    @property
    def dp_cp_dim_names(self) -> list[str]:
        """The dimensions a loss is averaged over."""
        return self._enabled("dp_replicate", "dp_shard", "cp")

    @property
    def fsdp_dim_names(self) -> list[str]:
        """FSDP2's mesh: ``dp_shard_cp``, with ``dp_replicate`` before it for HSDP."""
        return [*self._enabled("dp_replicate"), "dp_shard_cp"]

    @property
    def active_mesh_dims(self) -> list[str]:
        return self.dp_dim_names + self.non_dp_dim_names

    @property
    def total_size(self) -> int:
        return self.data_parallel_size * self.non_data_parallel_size

    @property
    def data_parallel_size(self) -> int:
        return self.dp_replicate_size * self.dp_shard_size

    @property
    def non_data_parallel_size(self) -> int:
        return self.tp_size * self.cp_size * self.sp_size

    def build_device_mesh(self, device_type: str) -> DeviceMesh | None:
        """A new mesh of the enabled dimensions in HF's order, with HF's flattened ones; ``None``
        when every size is 1."""
        names = [name for name in MESH_ORDER if getattr(self, f"{name}_size") > 1]
        if not names:
            return None
        from torch.distributed.device_mesh import init_device_mesh

        shape = tuple(getattr(self, f"{name}_size") for name in names)
        mesh = init_device_mesh(device_type, shape, mesh_dim_names=tuple(names))
        for flat, dims in (
            ("dp", self.dp_dim_names),
            ("dp_shard_cp", self.dp_shard_cp_dim_names),
            ("dp_cp", self.dp_cp_dim_names),
        ):
            if dims:
                mesh[tuple(dims)]._flatten(flat)
        return mesh

    def get_device_mesh(self, device_type: str | None = None) -> DeviceMesh | None:
        """The mesh, built on first use for ``device_type`` (HF's method and messages)."""
        if self.device_mesh is None:
            if device_type is None:
                raise ValueError("You need to pass a device_type e.g cuda to build the device mesh")
            self.device_mesh = self.build_device_mesh(device_type)
        elif device_type is not None and self.device_mesh.device_type != device_type:
            raise ValueError(
                f"The device_mesh is already created with device type "
                f"{self.device_mesh.device_type}. However, you are trying to get a device mesh "
                f"with device_type {device_type}. Please check if you correctly initialized your "
                "device_mesh"
            )
        return self.device_mesh


def requested(given: Any) -> ParallelismConfig | None:
    """The ``parallelism_config`` argument, else one read from the variables when the launcher
    turned them on (HF's rule), else ``None``."""
    if given is None:
        on = os.environ.get(USE_ENV, "false").lower() == "true"
        return ParallelismConfig() if on else None
    if not isinstance(given, ParallelismConfig):
        theirs = f"{type(given).__module__}.{type(given).__name__}"
        raise TypeError(
            f"Accelerator(parallelism_config=...) takes accelify's ParallelismConfig, got "
            f"{theirs}: use accelify.runtime.ParallelismConfig (HF's arguments)"
        )
    return given


def check_processes(config: ParallelismConfig, num_processes: int, distributed_type: str) -> None:
    """Check the sizes against the launch (HF's checks and messages, then what accelify cannot
    run). With every size 1 on several processes, ``dp_replicate_size`` becomes their number, as
    in HF. ``distributed_type`` is a ``DistributedType`` or its value."""
    if config.total_size == 1:
        if num_processes == 1:
            return  # one process: nothing to split, whatever the backend
        config.dp_replicate_size = num_processes
    if config.total_size != num_processes:
        raise ValueError(
            f"ParallelismConfig total_size ({config.total_size}) does not match num_processes "
            f"({num_processes}). Please adjust dp_replicate_size/ dp_shard_size/tp_size/cp_size/"
            "sp_size."
        )
    fsdp = distributed_type == "FSDP"
    if fsdp and not config.dp_shard_enabled and not config.cp_enabled:
        raise ValueError(
            "FSDP is enabled but the parallelism config has no dimension for FSDP to shard across "
            "(both `dp_shard_size` and `cp_size` are 1). This usually means a model that is "
            "already parallelized another way -- e.g. loaded with `DistributedConfig(tp_size=N)` "
            "or `enable_expert_parallel=True`, which makes the whole world size tensor/expert "
            "parallel -- was launched under an FSDP config. Either launch it without the FSDP "
            "config, or leave ranks for FSDP to use by lowering `tp_size`."
        )
    if distributed_type == "DEEPSPEED" and config.total_size > 1:
        raise ValueError(
            "ParallelismConfig under DeepSpeed is not supported by accelify (HF uses it for "
            "DeepSpeed's sequence parallelism); shard with FSDP2 instead"
        )
    if config.dp_shard_enabled and not fsdp:
        raise ValueError(
            f"ParallelismConfig(dp_shard_size={config.dp_shard_size}) shards the model with FSDP2: "
            "launch with accel-run --use-fsdp --fsdp-version 2 (distributed_type: FSDP), or pass "
            "Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2))"
        )


def configure(config: ParallelismConfig, state: ProcessState) -> None:
    """Check ``config`` against this process's launch and build its mesh."""
    check_processes(config, state.num_processes, state.distributed_type)
    unused = [
        f"ParallelismConfig.{name}_handler is set, but {name}_size is set to 1. This handler "
        "will be ignored."
        for name in ("tp", "cp", "sp")
        if getattr(config, f"{name}_size") == 1 and getattr(config, f"{name}_handler") is not None
    ]
    if unused and state.is_main_process:
        warnings.warn(
            "ParallelismConfig has the following warnings:\n" + "\n".join(unused), stacklevel=3
        )
    config.get_device_mesh(state.device.type)


def strategy_kwargs(config: ParallelismConfig | None, distributed_type: str) -> dict[str, Any]:
    """What ``strategies.select`` takes for ``config``: FSDP2's (sub)mesh, or the strategy for a
    model only the script parallelised (tensor parallel over every process)."""
    mesh = None if config is None else config.device_mesh
    if mesh is None:
        return {}
    if distributed_type == "FSDP":
        # HF's fsdp_dim_names, by the dimensions they flatten: with cp refused, dp_shard_cp is
        # dp_shard, and torch deprecates slicing a flattened dimension from the root mesh.
        return {"mesh": mesh[tuple(config.dp_dim_names)]}
    return {"tensor_parallel": True} if config.tp_enabled else {}


def data_parallel_share(
    mesh: DeviceMesh | None, num_processes: int, process_index: int
) -> tuple[int, int]:
    """The (processes, index) a data loader shards over: the processes of one tensor (or
    context) parallel group read the same batches. HF's rule, which relies on those dimensions
    being the mesh's innermost."""
    if mesh is None:
        return num_processes, process_index
    names = mesh.mesh_dim_names or ()

    def size(name: str) -> int:
        return mesh[name].size() if name in names else 1

    return size("dp_replicate") * size("dp_shard"), process_index // (size("tp") * size("cp"))
