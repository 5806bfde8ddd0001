"""Which prepared models leave parameters without a gradient in a training step.

DistributedDataParallel reduces gradients bucket by bucket and waits for every parameter it
wraps; a parameter that gets no gradient in a step (the auxiliary head of ``validity, _ = D(x)``,
InfoGAN's code head in the generator's step) stops it with "Expected to have finished reduction
in the prior iteration" at the next one, unless it was told to look for unused parameters.
"""

from __future__ import annotations

from collections.abc import Iterator

import libcst as cst

from accelify.transform.analysis import Analysis, key_of, name_nodes, unwrap_moves
from accelify.transform.setup import Setup, in_training_step, origins


def partly_used(a: Analysis, setup: Setup) -> dict[str, cst.Call]:
    """Prepared model -> the first training-step forward whose outputs are partly discarded."""
    models = set(setup.models(a))
    found: dict[str, cst.Call] = {}
    for call, scope in a.calls:
        key = key_of(call.func)
        if scope not in setup.reach or key is None or not in_training_step(a, call):
            continue
        held = origins(a, setup.scope, scope, key) & models
        if held and _discards(a, call):
            for model in held - _same_parameters(a, setup):
                found.setdefault(model, call)
    return found


def _same_parameters(a: Analysis, setup: Setup) -> set[str]:
    """Models built as torch's recurrent or attention layers: their extra outputs (the final
    state, the attention weights) come from the same parameters as the one the step reads."""
    return {
        b.key
        for b in setup.prepared
        if b.value is not None
        and isinstance(value := unwrap_moves(b.value), cst.Call)
        and a.names.last_part(value.func) in _ONE_COMPUTATION
    }


_ONE_COMPUTATION = frozenset({"LSTM", "GRU", "RNN", "MultiheadAttention"})


def _discards(a: Analysis, call: cst.Call) -> bool:
    """``v, _ = model(x)``, ``v, unused = model(x)``, or ``model(x)[0]``."""
    parent = a.parent(call)
    if isinstance(parent, cst.Subscript) and parent.value is call:
        return True
    if not isinstance(parent, cst.Assign) or parent.value is not call or len(parent.targets) != 1:
        return False
    target = parent.targets[0].target
    if not isinstance(target, cst.Tuple | cst.List):
        return False
    scope = a.scope_of[id(call)]
    return any(not _read(a, scope.node, name) for name in _names(target))


def _names(target: cst.Tuple | cst.List) -> Iterator[str]:
    for element in target.elements:
        if isinstance(element.value, cst.Name):
            yield element.value.value


def _read(a: Analysis, scope: cst.CSTNode, name: str) -> bool:
    """Whether ``name`` is anything but an unpacking target somewhere in ``scope``."""
    if name.startswith("_"):
        return False
    return len(name_nodes(scope, name)) > 1
