"""What is never turned into an Accelerator: the whole file stays as it is, with the line.

Sharded models (FSDP, ``fully_shard``), device meshes, tensor and pipeline parallelism and RPC
are not data parallelism: the accelerator would train a different program. (Hogwild training,
worker processes sharing one model, is the file verdict's to refuse: it has no DDP.)
"""

from __future__ import annotations

from accelify.transform.distributed.context import Rewrite
from accelify.transform.refusals import OTHER_PARALLELISM

# Packages whose import alone means a kind of parallelism other than data parallelism.
_PACKAGES = {
    "torch.distributed.fsdp": "shards the model with FSDP",
    "torch.distributed._composable": "shards the model with FSDP",
    "torch.distributed.device_mesh": "builds a DeviceMesh",
    "torch.distributed.tensor": "parallelises tensors",
    "torch.distributed.pipelining": "runs a pipeline-parallel schedule",
    "torch.distributed.rpc": "trains over RPC",
    "torch.distributed.autograd": "trains over RPC (distributed autograd)",
    "torch.distributed.optim": "uses a distributed optimizer",
    "torch.distributed.checkpoint": "saves a sharded checkpoint",
}
# Last parts of names (from torch) that mean the same.
_CALLS = {
    "FullyShardedDataParallel": "shards the model with FSDP",
    "fully_shard": "shards the model with FSDP",
    "init_device_mesh": "builds a DeviceMesh",
    "DeviceMesh": "builds a DeviceMesh",
    "parallelize_module": "parallelises tensors",
    "ZeroRedundancyOptimizer": "shards the optimizer (ZeroRedundancyOptimizer)",
    "new_group": "trains over its own process groups",
}


def refuse_other_parallelism(r: Rewrite) -> None:
    """Raise :class:`Refused` at the first construct that is not plain data parallelism."""
    names = r.analysis.names
    for local, qualified in names.imports.items():
        for package, why in _PACKAGES.items():
            if qualified == package or qualified.startswith(f"{package}."):
                raise r.refuse(names.statements[local], OTHER_PARALLELISM, _why(why))
    for call, _scope in r.analysis.calls:
        last = names.last_part(call.func)
        if last in _CALLS and names.refers_to(call.func, ("torch",), last):
            raise r.refuse(call, OTHER_PARALLELISM, _why(_CALLS[last]))  # type: ignore[index]


def _why(what: str) -> str:
    return (
        f"the script {what}; accel-convert turns only DistributedDataParallel into an Accelerator"
    )
