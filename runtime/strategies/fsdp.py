"""FSDP2 (``torch.distributed.fsdp.fully_shard``): parameters sharded over a device mesh.

Options come from the launcher's ``FSDP_*`` variables (HF Accelerate's contract, see
:class:`FsdpOptions`). FSDP1-style configs (``fsdp_version: 1``, numeric sharding strategies)
are read too and run on FSDP2. Sharding replaces the model's parameters, so an optimizer built
before ``prepare`` is pointed at the new ones, as HF Accelerate does; one that already holds
state cannot be, and is refused with the fix.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import state_dict as dcp_state
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from ..config import env_flag
from ..state import ProcessState
from .base import Strategy, Training

# FSDP1's numeric and named strategies -> (reshard after forward, mesh kind).
SHARDING = {
    "FULL_SHARD": (True, "shard"),
    "SHARD_GRAD_OP": (False, "shard"),
    "NO_SHARD": (True, "replicate"),
    "HYBRID_SHARD": (True, "hybrid"),
    "HYBRID_SHARD_ZERO2": (False, "hybrid"),
}
SHARDING.update({str(i): value for i, value in enumerate(SHARDING.values(), start=1)})
WRAP_POLICIES = ("TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP", "NO_WRAP")
STATE_DICT_TYPES = ("FULL_STATE_DICT", "SHARDED_STATE_DICT")
SHARDED_FOLDER = "pytorch_model_fsdp_0"  # HF's name for the distributed checkpoint


@dataclass(frozen=True)
class FsdpOptions:
    """What the ``FSDP_*`` variables ask for."""

    reshard_after_forward: bool = True
    mesh: str = "shard"
    auto_wrap_policy: str = "NO_WRAP"
    layer_classes: tuple[str, ...] = ()
    min_num_params: int = 0
    offload_params: bool = False
    state_dict_type: str = "FULL_STATE_DICT"
    # FullyShardedDataParallelPlugin(mixed_precision_policy=...); None: from mixed_precision
    mp_policy: MixedPrecisionPolicy | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> FsdpOptions:
        strategy = environ.get("FSDP_SHARDING_STRATEGY", "FULL_SHARD").strip().upper()
        if strategy not in SHARDING:
            raise ValueError(f"FSDP_SHARDING_STRATEGY={strategy!r} is not one of {list(SHARDING)}")
        reshard, mesh = SHARDING[strategy]
        if environ.get("FSDP_RESHARD_AFTER_FORWARD", "").strip().lower() == "false":
            reshard = False
        classes = environ.get("FSDP_TRANSFORMER_CLS_TO_WRAP", "")
        policy = environ.get("FSDP_AUTO_WRAP_POLICY", "").strip().upper()
        policy = policy or ("TRANSFORMER_BASED_WRAP" if classes else "NO_WRAP")
        state_dict_type = environ.get("FSDP_STATE_DICT_TYPE", "FULL_STATE_DICT").strip().upper()
        for name, value, allowed in (
            ("FSDP_AUTO_WRAP_POLICY", policy, WRAP_POLICIES),
            ("FSDP_STATE_DICT_TYPE", state_dict_type, STATE_DICT_TYPES),
        ):
            if value not in allowed:
                raise ValueError(f"{name}={value!r} is not supported; use one of {allowed}")
        return cls(
            reshard_after_forward=reshard,
            mesh=mesh,
            auto_wrap_policy=policy,
            layer_classes=tuple(c.strip() for c in classes.split(",") if c.strip()),
            min_num_params=int(environ.get("FSDP_MIN_NUM_PARAMS", "0") or 0),
            offload_params=env_flag("FSDP_OFFLOAD_PARAMS"),
            state_dict_type=state_dict_type,
        )


class FSDP(Strategy):
    """Every wrapped block and the root module are ``fully_shard``-ed over one mesh."""

    places_models = True

    def __init__(
        self,
        state: ProcessState,
        settings: FsdpOptions | None = None,
        mesh: DeviceMesh | None = None,
        **kwargs: Any,
    ) -> None:
        """``settings`` from a ``FullyShardedDataParallelPlugin``, else the launcher's variables;
        ``mesh`` from a ``ParallelismConfig`` (its ``dp_shard`` dimension, HSDP with
        ``dp_replicate`` before it), else one built from the sharding strategy."""
        super().__init__(state)
        self.options = FsdpOptions.from_env(os.environ) if settings is None else settings
        if self.options.offload_params and state.device.type != "cuda":
            raise ValueError("fsdp_offload_params moves parameters off a GPU; it needs CUDA")
        if mesh is not None and self.options.mesh != "shard":
            raise ValueError(
                f"an FSDP sharding strategy with a {self.options.mesh} mesh beside a "
                "ParallelismConfig: its dp_replicate_size and dp_shard_size make the mesh; leave "
                "the strategy at FULL_SHARD or SHARD_GRAD_OP"
            )
        self._given_mesh = mesh
        self.mixed_precision = "no"
        self._models: list[torch.nn.Module] = []
        self._optimizers: list[torch.optim.Optimizer] = []
        self._replaced: dict[int, torch.nn.Parameter] = {}  # id(old parameter) -> sharded one

    def setup(self, objects: list[Any], training: Training) -> list[Any]:
        self.mixed_precision = training.mixed_precision
        for obj in objects:
            if isinstance(obj, torch.nn.Module):
                self.wrap_model(obj)
            elif isinstance(obj, torch.optim.Optimizer):
                raw = getattr(obj, "optimizer", obj)  # prepared in an earlier call
                if all(raw is not seen for seen in self._optimizers):
                    self._optimizers.append(raw)
        for optimizer in self._optimizers:
            self._repoint(optimizer)
        return objects

    def _repoint(self, optimizer: torch.optim.Optimizer) -> None:
        """Make an optimizer built on the unsharded parameters use the sharded ones."""
        stale = [p for g in optimizer.param_groups for p in g["params"] if id(p) in self._replaced]
        if not stale:
            return
        if optimizer.state:
            raise ValueError(
                "FSDP replaced the parameters of a model whose optimizer already stepped; "
                "prepare the model before the first step (with its optimizer, or create the "
                "optimizer after prepare(model))"
            )
        for group in optimizer.param_groups:
            group["params"] = [self._replaced.get(id(p), p) for p in group["params"]]

    def wrap_model(self, model: torch.nn.Module) -> torch.nn.Module:
        if isinstance(model, FSDPModule):
            return model
        before = dict(model.named_parameters())
        settings = {
            "mesh": self._mesh(),
            "reshard_after_forward": self.options.reshard_after_forward,
            "mp_policy": self._mp_policy(),
        }
        if self.options.offload_params:
            from torch.distributed.fsdp import CPUOffloadPolicy

            settings["offload_policy"] = CPUOffloadPolicy()
        for block in self._blocks(model):
            fully_shard(block, **settings)
        fully_shard(model, **settings)
        after = dict(model.named_parameters())
        self._replaced.update({id(p): after[name] for name, p in before.items() if name in after})
        self._models.append(model)
        for optimizer in self._optimizers:
            self._repoint(optimizer)
        return model

    def _mesh(self) -> DeviceMesh:
        from torch.distributed.device_mesh import init_device_mesh

        if self._given_mesh is not None:
            return self._given_mesh
        world, device = self.state.num_processes, self.state.device.type
        if self.options.mesh == "replicate":
            return init_device_mesh(device, (world, 1), mesh_dim_names=("replicate", "shard"))
        if self.options.mesh == "hybrid":
            local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
            shape = (world // local, local)
            return init_device_mesh(device, shape, mesh_dim_names=("replicate", "shard"))
        return init_device_mesh(device, (world,))

    def _mp_policy(self) -> MixedPrecisionPolicy:
        if self.options.mp_policy is not None:
            return self.options.mp_policy
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(self.mixed_precision)
        if dtype is None:
            return MixedPrecisionPolicy()
        return MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)

    def _blocks(self, model: torch.nn.Module) -> list[torch.nn.Module]:
        """The submodules the auto-wrap policy picks, innermost first."""
        policy = self.options.auto_wrap_policy
        if policy == "TRANSFORMER_BASED_WRAP":
            wanted = set(self.options.layer_classes)
            found = {type(m).__name__ for m in model.modules()}
            if not wanted or not wanted <= found:
                raise ValueError(
                    f"fsdp_transformer_layer_cls_to_wrap: {sorted(wanted - found) or '(none)'} "
                    f"not found in the model (its classes: {sorted(found)})"
                )
            modules = list(model.modules())[1:]
            return [m for m in reversed(modules) if type(m).__name__ in wanted]
        if policy == "SIZE_BASED_WRAP":
            picked: list[torch.nn.Module] = []
            covered: set[int] = set()
            for module in reversed(list(model.modules())[1:]):
                own = [p for p in module.parameters() if id(p) not in covered]
                if sum(p.numel() for p in own) >= max(self.options.min_num_params, 1):
                    picked.append(module)
                    covered.update(id(p) for p in own)
            return picked
        return []

    @contextlib.contextmanager
    def _gradient_sync_off(self, model: FSDPModule) -> Iterator[None]:
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)

    def no_sync(self, model: torch.nn.Module) -> contextlib.AbstractContextManager:
        if isinstance(model, FSDPModule):
            return self._gradient_sync_off(model)
        return contextlib.nullcontext()

    def clip_grad_norm_(
        self, parameters: Iterable[torch.Tensor], max_norm: float, norm_type: float
    ) -> torch.Tensor:
        """torch's clipping, over the gradients of each device mesh together: a model the script
        tensor-parallelised holds its parallelised layers' gradients on the (shard, tp) mesh and
        the rest on the shard mesh (or none), which one torch call cannot stack."""
        parameters = list(parameters)
        meshes: dict[DeviceMesh | None, list[torch.Tensor]] = {}
        for p in parameters:
            if p.grad is not None:
                mesh = p.grad.device_mesh if isinstance(p.grad, DTensor) else None
                meshes.setdefault(mesh, []).append(p)
        if len(meshes) <= 1:
            norm = torch.nn.utils.clip_grad_norm_(parameters, max_norm, norm_type=norm_type)
            return _full(norm)
        norms = [
            _full(torch.nn.utils.get_total_norm([p.grad for p in group], norm_type))
            for group in meshes.values()
        ]
        total = torch.linalg.vector_norm(torch.stack(norms), norm_type)
        for mesh, group in meshes.items():
            on_mesh = total if mesh is None else DTensor.from_local(total, mesh)
            torch.nn.utils.clip_grads_with_norm_(group, max_norm, on_mesh)
        return total

    def model_state_dict(self, model: torch.nn.Module) -> dict[str, torch.Tensor]:
        """Every process gathers; the main process gets the full weights on CPU."""
        options = dcp_state.StateDictOptions(full_state_dict=True, cpu_offload=True)
        return dcp_state.get_model_state_dict(model, options=options)

    def _pairs(self, models: list[Any], optimizers: list[Any]) -> list[tuple[Any, list[Any]]]:
        """Each model with the prepared optimizers over its parameters."""
        pairs = []
        for model in models:
            own = {id(p) for p in model.parameters()}
            held = [{id(p) for g in o.param_groups for p in g["params"]} for o in optimizers]
            pairs.append((model, [o for o, ids in zip(optimizers, held, strict=True) if ids & own]))
        return pairs

    def save_checkpoint(self, folder: Path, models: list[Any], optimizers: list[Any]) -> bool:
        from .. import checkpoint

        sharded = self.options.state_dict_type == "SHARDED_STATE_DICT"
        options = dcp_state.StateDictOptions(full_state_dict=not sharded, cpu_offload=not sharded)
        for i, (model, owned) in enumerate(self._pairs(models, optimizers)):
            weights = dcp_state.get_model_state_dict(model, options=options)
            states = [
                dcp_state.get_optimizer_state_dict(model, o.optimizer, options=options)
                for o in owned
            ]
            if sharded:
                import torch.distributed.checkpoint as dcp

                target = folder / f"{SHARDED_FOLDER}{'' if i == 0 else f'_{i}'}"
                dcp.save({"model": weights, "optimizers": states}, checkpoint_id=str(target))
            elif self.state.is_main_process:
                checkpoint.save(weights, folder / checkpoint.model_files(i)[0], True)
                checkpoint.save(states, folder / f"optimizers_of_model_{i}.bin")
        return True

    def load_checkpoint(self, folder: Path, models: list[Any], optimizers: list[Any]) -> bool:
        from .. import checkpoint

        sharded = self.options.state_dict_type == "SHARDED_STATE_DICT"
        options = dcp_state.StateDictOptions(full_state_dict=not sharded)
        for i, (model, owned) in enumerate(self._pairs(models, optimizers)):
            if sharded:
                import torch.distributed.checkpoint as dcp

                loaded = {
                    "model": dcp_state.get_model_state_dict(model),
                    "optimizers": [
                        dcp_state.get_optimizer_state_dict(model, o.optimizer) for o in owned
                    ],
                }
                source = folder / f"{SHARDED_FOLDER}{'' if i == 0 else f'_{i}'}"
                dcp.load(loaded, checkpoint_id=str(source))
                weights, states = loaded["model"], loaded["optimizers"]
            else:
                weights = checkpoint.load_weights(folder / checkpoint.model_files(i)[0])
                states = checkpoint.load_object(folder / f"optimizers_of_model_{i}.bin")
            dcp_state.set_model_state_dict(model, weights, options=options)
            for optimizer, state in zip(owned, states, strict=True):
                dcp_state.set_optimizer_state_dict(
                    model, optimizer.optimizer, state, options=options
                )
        return True

    def barrier(self) -> None:
        torch.distributed.barrier()


def _full(norm: torch.Tensor) -> torch.Tensor:
    """A norm as a plain tensor (a DTensor's is reduced over its mesh first)."""
    return norm.full_tensor() if isinstance(norm, DTensor) else norm
