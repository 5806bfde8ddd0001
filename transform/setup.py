"""Where the accelerator lives, what it prepares, and what makes a script unsafe to convert.

A *training setup* is the scope (module, function or method) that builds a model and its
optimizer. The accelerator is created there, the objects are prepared there, and every other
function that needs the accelerator receives it from there.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from accelify.transform.analysis import TRAINING_ROLES, Analysis, Binding, Scope
from accelify.transform.patterns import CLOSURE_OPTIMIZERS, Role, callee_name, dotted_name

ACCELERATOR = "accelerator"

# Calls that mean the script already does its own distribution: converting would double it.
_HAND_DISTRIBUTED = {
    "DataParallel": "nn.DataParallel",
    "DistributedDataParallel": "DistributedDataParallel",
    "init_process_group": "hand-written torch.distributed",
    "DistributedSampler": "a DistributedSampler",
}


@dataclass(eq=False)
class Setup:
    scope: Scope
    accelerator: str  # how code in ``scope`` names it: "accelerator" or "self.accelerator"
    exists: bool  # the script already creates it
    prepared: list[Binding] = field(default_factory=list)  # what prepare() will wrap
    already_prepared: set[str] = field(default_factory=set)
    unprepared: list[Binding] = field(default_factory=list)  # built conditionally: left to a human

    @property
    def on_self(self) -> bool:
        return self.accelerator.startswith("self.")


def find_setup(a: Analysis) -> tuple[Setup | None, list[tuple[cst.CSTNode, str]]]:
    """The one setup to convert, plus (node, reason) for everything refused."""
    refusals: list[tuple[cst.CSTNode, str]] = []
    found = _refusals(a)
    refusals.extend(r for reasons in found.values() for r in reasons)
    refused = _with_nested(a, set(found))
    existing = next(iter(a.bindings_of(Role.ACCELERATOR)), None)
    candidates = [existing.scope] if existing is not None else _candidate_scopes(a)
    usable, unusable = [], []
    for scope in candidates:
        (unusable if reachable(a, scope) & refused else usable).append(scope)
    for scope in usable[1:]:
        message = f"left unchanged: a second training setup in {scope.name}(); convert it by hand"
        refusals.append((scope.node, message))
    kept = reachable(a, usable[0]) if usable else set()
    dropped = refused | {s for scope in unusable + usable[1:] for s in reachable(a, scope)}
    a.exclude(_with_nested(a, dropped) - kept)
    if not usable:
        return None, refusals
    if existing is not None:
        setup = Setup(existing.scope, existing.key, exists=True)
        setup.already_prepared = _already_prepared(a, existing.key)
        setup.prepared = _to_prepare(a, setup)
        return setup, refusals
    scope = usable[0]
    on_self = scope.cls is not None and any(b.key.startswith("self.") for b in _owned(a, scope))
    setup = Setup(scope, f"self.{ACCELERATOR}" if on_self else ACCELERATOR, exists=False)
    setup.prepared = _to_prepare(a, setup)
    return setup, refusals


def _owned(a: Analysis, scope: Scope) -> list[Binding]:
    return [b for b in a.bindings if b.scope is scope and a.role(scope, b.key) in TRAINING_ROLES]


def _candidate_scopes(a: Analysis) -> list[Scope]:
    """Scopes that build a model and an optimizer; else the module if it trains on free names."""
    found = []
    for scope in a.scopes:
        roles = {a.role(scope, b.key) for b in _owned(a, scope)}
        if Role.MODEL in roles and Role.OPTIMIZER in roles:
            found.append(scope)
    if not found and any(loop.trains and loop.scope.is_module for loop in a.loops):
        found.append(a.scopes[0])
    return found


def _refusals(a: Analysis) -> dict[Scope, list[tuple[cst.CSTNode, str]]]:
    """Patterns that make converting a scope's training unsafe, by the scope they are in."""
    out: dict[Scope, list[tuple[cst.CSTNode, str]]] = {}

    def refuse(scope: Scope, node: cst.CSTNode, reason: str) -> None:
        out.setdefault(scope, []).append((node, reason))

    for call, where in a.calls:
        name = callee_name(call)
        if name in _HAND_DISTRIBUTED:
            refuse(where, call, f"{_HAND_DISTRIBUTED[name]}: the script distributes itself")
        elif name in CLOSURE_OPTIMIZERS:
            refuse(where, call, f"{name} needs a closure, which prepare() cannot wrap")
        elif (
            name == "step"
            and call.args
            and a.role(where, dotted_name(call.func.value) or "") is Role.OPTIMIZER  # type: ignore[union-attr]
        ):
            refuse(where, call, "optimizer.step(closure): closures cannot be converted")
    for b in a.bindings:
        if b.in_loop and a.role(b.scope, b.key) is Role.OPTIMIZER:
            refuse(b.scope, b.node, f"optimizer {b.key} is created inside a loop")
    for loop in a.loops:
        stepped = _stepped_optimizers(a, loop)
        if len(stepped) > 1:
            names = ", ".join(sorted(stepped))
            refuse(loop.scope, loop.node, f"several optimizers ({names}) step in one loop")
    return out


def _with_nested(a: Analysis, scopes: set[Scope]) -> set[Scope]:
    """``scopes`` and every function defined inside one of them."""
    out = set(scopes)
    for scope in a.scopes:
        parent = scope.parent
        while parent is not None and parent not in scopes:
            parent = parent.parent
        if parent is not None:
            out.add(scope)
    return out


def _stepped_optimizers(a: Analysis, loop) -> set[str]:
    names = set()
    for call, where in a.calls:
        if (
            where is loop.scope
            and isinstance(call.func, cst.Attribute)
            and call.func.attr.value == "step"
            and a.enclosing(call, cst.For) is loop.node
        ):
            key = dotted_name(call.func.value) or ""
            if a.role(where, key) is Role.OPTIMIZER:
                names.add(key)
    return names


def reachable(a: Analysis, scope: Scope) -> set[Scope]:
    """``scope``, the same-file functions it calls, transitively, and its class's methods."""
    seen = {scope} | {s for s in a.scopes if scope.cls is not None and s.cls is scope.cls}
    todo = list(seen)
    while todo:
        current = todo.pop()
        for call, where in a.calls:
            name = dotted_name(call.func)
            callee = a.functions.get(name.removeprefix("self.")) if name else None
            if where is current and callee is not None and callee not in seen:
                seen.add(callee)
                todo.append(callee)
    return seen


def _to_prepare(a: Analysis, setup: Setup) -> list[Binding]:
    """The unconditional builds of training objects in the setup scope, in prepare() order."""
    latest: dict[str, Binding] = {}
    for b in _owned(a, setup.scope):
        if not b.nested and b.key not in setup.already_prepared:
            latest[b.key] = b
    setup.unprepared = [
        b
        for b in _owned(a, setup.scope)
        if b.nested
        and not b.in_loop
        and b.key not in latest
        and b.key not in setup.already_prepared
    ]
    if setup.scope.is_module and not latest:
        return _free_names(a, setup)
    order = {role: i for i, role in enumerate(TRAINING_ROLES)}
    chosen = sorted(
        latest.values(),
        key=lambda b: (order[a.role(setup.scope, b.key)], a.line(b.statement)),  # type: ignore[index]
    )
    return chosen


def _free_names(a: Analysis, setup: Setup) -> list[Binding]:
    """Training objects a module-level snippet uses without building them (the guide's example)."""
    module = setup.scope
    seen: dict[str, Role] = {
        key: role
        for (owner, key), role in a.roles.items()
        if owner == id(module.node) and role in TRAINING_ROLES and key not in setup.already_prepared
    }
    order = {role: i for i, role in enumerate(TRAINING_ROLES)}
    keys = sorted(seen, key=lambda k: order[seen[k]])
    return [Binding(k, module, module.body[0], module.node, None, False, False) for k in keys]


def _already_prepared(a: Analysis, accelerator: str) -> set[str]:
    done = set()
    for b in a.bindings:
        value = b.value
        if isinstance(b.node, cst.Assign):
            value = b.node.value
        if isinstance(value, cst.Call) and dotted_name(value.func) == f"{accelerator}.prepare":
            done.add(b.key)
    return done
