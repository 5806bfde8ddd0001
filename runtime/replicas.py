"""The replica check: data-parallel processes must hold the same weights after an optimizer step.

A forward through the bare model instead of the prepared one, a module whose parameters a prepared
optimizer steps but no prepared model holds, or a step taken differently on some processes: each
leaves every process training its own copy, and nothing fails (the job ends with N different
models and exit 0). So after the first optimizer step, then every N steps
(``ACCELIFY_SYNC_CHECK=off|first|every:N``, or ``Accelerator(sync_check=...)``; default ``first``),
and at ``save_state`` and ``end_training``, the processes compare a fingerprint of the parameters
(float64 sum and sum of squares per model) in one small all-gather. Sharded backends (FSDP,
DeepSpeed) hold different shards on purpose and are not checked.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

ENV = "ACCELIFY_SYNC_CHECK"
# Replicas agree bit for bit on one kind of device; a tolerance far below what one optimizer step
# moves covers float64 sums taken in another order on other hardware.
_RELATIVE_TOLERANCE = 1e-9
_CAUSES = (
    "usual causes: a forward through the model's name from before prepare() (an unprepared "
    "alias), a module trained outside prepare(), or code around the step that depends on the "
    f"process (its rank, its own loss or data); {ENV}=off turns this check off"
)


class ReplicaMismatchError(RuntimeError):
    """The processes of a data-parallel job hold different weights."""


@dataclass(frozen=True)
class Schedule:
    """When to compare: never (``every == 0``), after the first step only (``None``), or after
    the first and every ``every``-th optimizer step."""

    every: int | None

    @property
    def off(self) -> bool:
        return self.every == 0

    def due(self, step: int) -> bool:
        return not self.off and (step == 1 or (self.every is not None and step % self.every == 0))


def schedule(value: str | None) -> Schedule:
    """Read ``off``, ``first`` or ``every:N`` (the argument, else the environment, else first)."""
    text = (value if value is not None else os.environ.get(ENV, "first")).strip().lower()
    if text in {"off", "0", "false", "no"}:
        return Schedule(0)
    if text in {"first", ""}:
        return Schedule(None)
    name, _, count = text.partition(":")
    if name == "every" and count.isdigit() and int(count) > 0:
        return Schedule(int(count))
    raise ValueError(f"{ENV}={text!r}: expected off, first or every:N (N a positive integer)")


@dataclass(frozen=True)
class Group:
    """A set of parameters every process must hold equal, and how a message names it."""

    label: str
    parameters: Sequence[torch.Tensor]
    advice: str = _CAUSES


def groups(
    models: Sequence[torch.nn.Module], optimizers: Sequence[torch.optim.Optimizer]
) -> list[Group]:
    """One group per prepared model, and one per optimizer for the parameters it steps that no
    prepared model holds (a module trained outside ``prepare``)."""
    found, held = [], set()
    for index, model in enumerate(models):
        inner = getattr(model, "module", model)
        parameters = list(model.parameters())
        held.update(id(p) for p in parameters)
        found.append(Group(f"model {index} ({type(inner).__name__})", parameters))
    for index, optimizer in enumerate(optimizers):
        loose = [
            p for group in optimizer.param_groups for p in group["params"] if id(p) not in held
        ]
        if loose:
            advice = (
                "no prepared model holds them, so their gradients are never averaged: pass the "
                f"module they belong to to prepare(); {ENV}=off turns this check off"
            )
            label = (
                f"what optimizer {index} steps outside the prepared models ({len(loose)} tensors)"
            )
            found.append(Group(label, loose, advice))
    return found


def compare(found: Sequence[Group], device: torch.device, when: str) -> None:
    """Gather every process's fingerprints and raise on the first group that differs.

    Every process must call this at the same point: it is one collective on the default group.
    """
    if not found:
        return
    mine = torch.stack([_fingerprint(group.parameters, device) for group in found])
    every = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(every, mine)
    table = torch.stack(every).cpu()  # processes x groups x (sum, sum of squares)
    for index, group in enumerate(found):
        values = table[:, index]
        scale = values.abs().amax(dim=0).clamp(min=1.0)
        apart = ((values - values[0]).abs() > _RELATIVE_TOLERANCE * scale).any(dim=1)
        if bool(apart.any()):
            rank = int(apart.nonzero()[0])
            raise ReplicaMismatchError(
                f"{group.label} is not the same on every process {when}: rank 0 and rank {rank} "
                f"hold different weights (sums {values[0, 0].item():.9g} and "
                f"{values[rank, 0].item():.9g}); {group.advice}"
            )


def _fingerprint(parameters: Sequence[torch.Tensor], device: torch.device) -> torch.Tensor:
    total = torch.zeros(2, dtype=torch.float64, device=device)
    with torch.no_grad():
        for p in parameters:
            values = p.detach().to(device=device, dtype=torch.float64)
            total[0] += values.sum()
            total[1] += values.square().sum()
    return total
