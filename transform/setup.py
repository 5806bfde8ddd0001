"""The training setup: the scope that builds the optimizer, what ``prepare()`` wraps, and where.

A *training setup* is a scope (module, function or method) that builds an optimizer for a model
it has, and from which a training step (a ``.backward()``) runs. The accelerator is created
there, the objects are prepared there, and every other function that needs the accelerator
receives it from there. Everything this module cannot show right raises :class:`Refused`: the
setup is then left unchanged as a whole, with the reason and its line.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import libcst as cst

from accelify.transform.analysis import (
    TRAINING_ROLES,
    Analysis,
    Binding,
    Loop,
    Scope,
    arguments,
    attribute_links,
    call_links,
    handed_back,
    key_of,
    loop_iterable,
    names_in,
    optimized_models,
    returned_values,
    returns,
    switched_itself,
    unwrap_moves,
)
from accelify.transform.draws import seeded
from accelify.transform.flow import Point, Timeline
from accelify.transform.patterns import (
    CLOSURE_OPTIMIZERS,
    Role,
    callee_name,
    constructor_role,
    dotted_name,
    keyword_arg,
    method_call,
    placeholder_of,
    target_names,
)
from accelify.transform.refusals import (
    BARE_MODULE,
    BUILD_ORDER,
    BUILT_IN_LOOP,
    CLOSURE,
    HAND_PICKED_DEVICE,
    LOCKSTEP,
    OBJECTS_NOT_FOLLOWED,
    SECOND_SETUP,
    STEP_ORDER,
    STEP_OUTSIDE_SETUP,
    UNSYNCED_GRADIENTS,
    Refusal,
)
from accelify.transform.walk import children, nodes

ACCELERATOR = "accelerator"
_NO_GRAD = frozenset({"no_grad", "inference_mode"})


class Refused(Exception):
    """The setup cannot be converted correctly; ``reason`` says why, ``node`` where, and
    ``family`` which code and docs page the report gives it (required, so no refusal goes
    without one; a string in its place is refused too)."""

    def __init__(self, node: cst.CSTNode, family: Refusal, reason: str) -> None:
        if not isinstance(family, Refusal):
            raise TypeError(f"Refused needs a Refusal family from refusals.py, not {family!r}")
        super().__init__(reason)
        self.node, self.family, self.reason = node, family, reason


@dataclass(eq=False)
class Setup:
    scope: Scope
    accelerator: str  # how code in ``scope`` names it: "accelerator" or "self.accelerator"
    timeline: Timeline
    reach: set[Scope]  # the scope and every function or method its training runs through
    prepared: list[Binding] = field(default_factory=list)  # what prepare() wraps, in its order
    prepare_at: Point | None = None  # None: a snippet that builds nothing (found at emission)
    create_at: Point | None = None  # final once the accelerator's arguments are known
    loaders: set[str] = field(default_factory=set)  # prepared loaders (keys of ``scope``)
    kept_loaders: dict[str, Binding] = field(default_factory=dict)  # evaluation only
    # training loops no prepared loader feeds: (loop, why, what to do)
    unsharded: list[tuple[cst.CSTNode, str, str]] = field(default_factory=list)
    partly_trained: set[str] = field(default_factory=set)  # models the optimizer holds part of
    factory_loaders: dict[str, cst.CSTNode] = field(default_factory=dict)  # built where unseen
    factory_calls: dict[str, str] = field(default_factory=dict)  # ... and by what
    rebuilds: dict[str, list[Binding]] = field(default_factory=dict)  # built again after training

    @property
    def on_self(self) -> bool:
        return self.accelerator.startswith("self.")

    @property
    def keys(self) -> list[str]:
        return [b.key for b in self.prepared]

    def models(self, a: Analysis) -> list[str]:
        """The prepared models, in prepare()'s order."""
        return [k for k in self.keys if a.role(self.scope, k) is Role.MODEL]

    def current(self, a: Analysis, key: str, node: cst.CSTNode) -> bool:
        """Whether ``key`` at ``node`` is still the object prepare() wraps, not a later rebuild
        (a model loaded again for inference after training)."""
        later = self.rebuilds.get(key)
        if not later:
            return True
        anchors = self.timeline.anchors(node)
        if not anchors:
            return False
        first = min(a.line(b.node) for b in later)
        return all(a.line(n) < first for n in anchors)


def find_setup(a: Analysis) -> tuple[Setup | None, list[tuple[cst.CSTNode, str]]]:
    """The one setup to convert, plus (node, reason) for every setup left alone (what accel-lint
    reports them with)."""
    chosen, refused = setups(a)
    return chosen, [(r.node, f"left unchanged: {r.reason}") for r in refused]


def setups(a: Analysis) -> tuple[Setup | None, list[Refused]]:
    """The one setup to convert, plus why every other setup is left alone."""
    refusals: list[Refused] = []
    planned: list[Setup] = []
    candidates = _candidate_scopes(a)
    for scope in candidates:
        try:
            planned.append(_plan(a, scope))
        except Refused as refused:
            refusals.append(refused)
    for extra in planned[1:]:
        why = f"a second training setup in {extra.scope.name}(); convert it by hand"
        refusals.append(Refused(extra.scope.node, SECOND_SETUP, why))
    chosen = planned[0] if planned else None
    if chosen is not None and (shared := _shared_training(a, chosen, candidates)) is not None:
        refusals.append(shared)
        chosen = None
    if chosen is None and not candidates:
        chosen = _snippet(a)
    kept = chosen.reach if chosen is not None else set()
    dropped = {s for scope in candidates for s in reachable(a, scope)} - kept
    a.exclude(_with_nested(a, dropped) - kept)
    return chosen, refusals


def _shared_training(a: Analysis, chosen: Setup, candidates: list[Scope]) -> Refused | None:
    """Why ``chosen`` cannot be converted alone: code it trains through (a ``train()``) also
    trains another setup, which stays as it is. Converting would change that one too: its
    calls would miss the new ``accelerator`` parameter, or its bare model would step through
    ``accelerator.backward`` on a prepared loader's shard."""
    trains = _training_scopes(a)
    for other in candidates:
        if other is chosen.scope:
            continue
        theirs = reachable(a, other, stop=chosen.scope)
        shared = theirs & chosen.reach
        if not shared & trains:
            continue  # helpers the DDP rewrite drops whole (setup(), cleanup()), or none
        own = theirs - shared
        entries = [
            (call, callee)
            for call, where in a.calls
            if where in own
            and (callee := a.callee(call)) in shared
            and reachable(a, callee) & trains
        ]
        if not entries:  # the chosen setup runs the other one itself
            return Refused(
                other.node,
                SECOND_SETUP,
                f"the setup of {_called(chosen.scope)} runs {_called(other)}, which trains a "
                "setup of its own that is not converted; convert both by hand",
            )
        call, runs = entries[0]
        return Refused(
            call,
            SECOND_SETUP,
            f"{runs.name}() also trains the setup of {_called(other)}, which is not converted: "
            f"converting the setup of {_called(chosen.scope)} would change it too; convert both "
            "by hand",
        )
    return None


def _called(scope: Scope) -> str:
    return "the module" if scope.is_module else f"{scope.name}()"


# which scope -----------------------------------------------------------------------------------
def _owned(a: Analysis, scope: Scope) -> list[Binding]:
    return [b for b in a.bindings if b.scope is scope and a.role(scope, b.key) in TRAINING_ROLES]


def _candidate_scopes(a: Analysis) -> list[Scope]:
    """Scopes that build an optimizer for a model they have and reach a training step."""
    found = []
    trains = _training_scopes(a)
    for scope in a.scopes:
        roles = {a.role(scope, b.key) for b in _owned(a, scope) if not _handed_over(a, b)}
        has_model = Role.MODEL in roles or any(a.role(scope, p) is Role.MODEL for p in scope.params)
        if Role.OPTIMIZER in roles and has_model and reachable(a, scope) & trains:
            found.append(scope)
    return found


def _handed_over(a: Analysis, b: Binding) -> bool:
    """``self.optimizer = optimizer``: the scope keeps an object built elsewhere, which is where
    the setup is."""
    return b.value is not None and key_of(unwrap_moves(b.value)) is not None


def _training_scopes(a: Analysis) -> set[Scope]:
    """Scopes that run a ``.backward()`` themselves."""
    return {scope for _call, scope, _loop in a.backward_calls}


def reachable(a: Analysis, scope: Scope, stop: Scope | None = None) -> set[Scope]:
    """``scope``, the same-file functions it calls, transitively, its class's methods, and the
    functions defined inside any of them (closures handed to ``optimizer.step``); not through
    ``stop``."""
    seen = {scope} | {s for s in a.scopes if scope.cls is not None and s.cls is scope.cls}
    seen = _with_nested(a, seen)
    todo = list(seen)
    calls_by_scope: dict[int, list[cst.Call]] = {}
    for call, where in a.calls:
        calls_by_scope.setdefault(id(where), []).append(call)
    while todo:
        current = todo.pop()
        for call in calls_by_scope.get(id(current), ()):
            callee = a.callee(call)
            if callee is not None and callee not in seen and callee is not stop:
                fresh = _with_nested(a, {callee}) - seen
                seen |= fresh
                todo.extend(fresh)
    return seen


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


# what it prepares ------------------------------------------------------------------------------
def _plan(a: Analysis, scope: Scope) -> Setup:
    reach = reachable(a, scope)
    on_self = scope.cls is not None and any(b.key.startswith("self.") for b in _owned(a, scope))
    setup = Setup(
        scope, f"self.{ACCELERATOR}" if on_self else ACCELERATOR, Timeline(a, scope), reach
    )
    _refuse_training_forms(a, setup)
    keys = _trained_in_place_of_its_bare_name(a, setup, _models_and_optimizers(a, setup))
    keys += _loaders(a, setup, keys)
    keys += [
        b.key
        for b in _owned(a, scope)
        if a.role(scope, b.key) is Role.SCHEDULER and b.key not in keys
    ]
    setup.prepared = [_build_of(a, setup, key) for key in dict.fromkeys(keys)]
    _refuse_wrappers(a, setup)
    setup.prepare_at = _prepare_point(a, setup)
    return setup


def _refuse_wrappers(a: Analysis, setup: Setup) -> None:
    """``ar = Wrapper(model)`` trained through ``ar(...)``: prepare() wraps ``model``, the
    training step runs ``ar``, which holds the bare module, and replicas would drift apart."""
    models = set(setup.models(a))
    wrappers = {
        b.key: b
        for b in a.bindings
        if b.scope is setup.scope
        and b.key not in models
        and isinstance(b.value, cst.Call)
        and any(key_of(arg.value) in models for arg in b.value.args)
    }
    if not wrappers:
        return
    for call, where in a.calls:
        key = key_of(call.func)
        if where not in setup.reach or key is None or not in_training_step(a, call):
            continue
        for origin in origins(a, setup.scope, where, key) & wrappers.keys():
            inner = next(
                k for arg in wrappers[origin].value.args if (k := key_of(arg.value)) in models
            )  # type: ignore[union-attr]
            raise Refused(
                call,
                BARE_MODULE,
                f"the training step runs {origin}, built around {inner}: prepare() wraps "
                f"{inner}, so {origin} would train the bare module; prepare what the step runs",
            )


def in_training_step(a: Analysis, node: cst.CSTNode) -> bool:
    """Inside a loop that runs ``.backward()`` itself, and not under ``torch.no_grad()``."""
    current = a.parent(node)
    in_loop = False
    while current is not None and not isinstance(current, cst.FunctionDef | cst.Module):
        if _no_grad_block(current):
            return False
        if isinstance(current, cst.For | cst.While):
            in_loop = in_loop or any(lp.node is current and lp.trains for lp in a.loops)
        current = a.parent(current)
    return in_loop


def _no_grad_block(node: cst.CSTNode) -> bool:
    """``with torch.no_grad():`` (or ``inference_mode()``)."""
    return isinstance(node, cst.With) and any(
        isinstance(i.item, cst.Call) and callee_name(i.item) in _NO_GRAD for i in node.items
    )


def _under_no_grad(a: Analysis, node: cst.CSTNode) -> bool:
    """In a ``with torch.no_grad():`` block of its function, or in a function decorated with
    ``@torch.no_grad()``."""
    current = a.parent(node)
    while current is not None and not isinstance(current, cst.FunctionDef | cst.Module):
        if _no_grad_block(current):
            return True
        current = a.parent(current)
    return isinstance(current, cst.FunctionDef) and any(
        isinstance(d.decorator, cst.Call) and callee_name(d.decorator) in _NO_GRAD
        for d in current.decorators
    )


# What a frozen module may do besides running under no_grad: nothing that computes with it.
_FROZEN_USES = frozenset({"eval", "train", "to", "cuda", "cpu", "load_state_dict", "state_dict"})


def _frozen(a: Analysis, scope: Scope, key: str, seen: set[tuple[int, str]]) -> bool:
    """Whether the module ``key`` holds in ``scope`` only ever runs under ``torch.no_grad()``
    (SimCLR's linear evaluation extracts features with its pretrained encoder): it computes no
    gradient, so running it apart from the wrapper shares none. Followed into the functions
    of this file it is handed to; handed to any other call, or a method of it called to
    compute (``key.encode(x)``, ``key.parameters()``), it is not frozen."""
    if (id(scope.node), key) in seen:
        return True
    seen.add((id(scope.node), key))
    for call, where in a.calls:
        if where is not scope:
            continue
        func = call.func
        if key_of(func) == key and not _under_no_grad(a, call):
            return False
        if (
            isinstance(func, cst.Attribute)
            and key_of(func.value) == key
            and func.attr.value not in _FROZEN_USES
            and not _under_no_grad(a, call)
        ):
            return False
        handed = [arg for arg in call.args if key_of(arg.value) == key]
        if not handed:
            continue
        callee = a.callee(call)
        if callee is None:
            return False
        params = [p for p, value in arguments(call, callee) if key_of(value) == key]
        if len(params) < len(handed) or not all(_frozen(a, callee, p, seen) for p in params):
            return False
    return True


def _refuse_training_forms(a: Analysis, setup: Setup) -> None:
    """Training that prepare() and accelerator.backward() cannot take over."""
    for call, where in a.calls:
        if where not in setup.reach:
            continue
        name = a.names.last_part(call.func)
        if a.names.from_package(call.func, "torch.cuda.set_device"):
            raise Refused(
                call, HAND_PICKED_DEVICE, "the script picks its GPU by hand (torch.cuda.set_device)"
            )
        if name in CLOSURE_OPTIMIZERS:
            raise Refused(
                call,
                CLOSURE,
                f"{name} steps with a closure, which accel-convert does not rewrite (its backward "
                "runs inside the step): convert it by hand",
            )
        receiver = call.func.value if isinstance(call.func, cst.Attribute) else None
        if (
            name == "step"
            and call.args
            and receiver is not None
            and a.role(where, dotted_name(receiver) or "") is Role.OPTIMIZER
        ):
            raise Refused(call, CLOSURE, "optimizer.step(closure): closures cannot be converted")
    for b in a.bindings:
        optimizer = a.role(b.scope, b.key) is Role.OPTIMIZER
        if b.scope in setup.reach and b.in_loop and optimizer and not handed_back(a, b):
            raise Refused(b.node, BUILT_IN_LOOP, f"optimizer {b.key} is created inside a loop")
    _refuse_second_backward(a, setup)


def _refuse_second_backward(a: Analysis, setup: Setup) -> None:
    """``l1.backward(retain_graph=True)`` then ``l2.backward()`` through the same forward of a
    model: DDP averages gradients in the first backward after each forward only."""
    backwards = [(c, w) for c, w, _loop in a.backward_calls if w in setup.reach]
    for call, where in backwards:
        kept = keyword_arg(call, "retain_graph")
        if kept is None or dotted_name(kept.value) == "False":
            continue
        first = _forwards(a, where, call.func.value, 0, a.line(call))  # type: ignore[attr-defined]
        later = [
            c for c, w in backwards if w is where and a.line(c) > a.line(call) and c is not call
        ]
        again = set().union(*(_forwards(a, where, c.func.value, 0, a.line(c)) for c in later))  # type: ignore[attr-defined]
        shared = {key for key, forward in first & again if a.role(where, key) is Role.MODEL}
        # ESRGAN's discriminator: the later loss also goes through a forward made after this
        # backward, which DDP prepared for; that backward reduces all it reaches, old graph too
        calls = {id(c): c for c in nodes(where.node, cst.Call)}
        shared -= {
            key
            for key, forward in again
            if forward in calls and a.line(calls[forward]) > a.line(call)
        }
        if shared:
            raise Refused(
                call,
                UNSYNCED_GRADIENTS,
                f"a later backward goes through the same forward of {', '.join(sorted(shared))} "
                "(retain_graph): DistributedDataParallel averages gradients only in the first "
                "backward after each forward, so the second one's would stay per process",
            )


def _forwards(
    a: Analysis, scope: Scope, expr: cst.CSTNode, depth: int, line: int
) -> set[tuple[str, int]]:
    """The calls (``model(x)``, ``D(G(z))``: the name and the call) that what ``expr``, read at
    ``line``, is computed from goes through, following the scope's last assignment of each name
    above where it is read (every assignment, for a name only bound below: a loop carries it),
    not past a ``.detach()``. ESRGAN binds ``sr_output`` in its generator's step and again in
    its discriminator's: each read is of its own."""
    if depth > 8 or method_call(expr, "detach") is not None:
        return set()
    found: set[tuple[str, int]] = set()
    if isinstance(expr, cst.Call) and (key := key_of(expr.func)) is not None:
        found.add((key, id(expr)))
    if isinstance(expr, cst.Name):
        binds = [
            node
            for node, where in a.assignments
            if where is scope
            and isinstance(node, cst.Assign)
            and any(expr.value in target_names(t.target) for t in node.targets)
        ]
        above = [node for node in binds if a.line(node) < line]
        for node in [max(above, key=a.line)] if above else binds:
            found |= _forwards(a, scope, node.value, depth + 1, a.line(node))
        return found
    for child in children(expr):
        found |= _forwards(a, scope, child, depth, line)
    return found


# several optimizers ----------------------------------------------------------------------------
BACKWARD = "backward"


def stepped_optimizers(a: Analysis, setup: Setup) -> dict[str, cst.Call]:
    """The setup's optimizers that some ``.step()`` in its training steps, by key."""
    found: dict[str, cst.Call] = {}
    for call, keys in _optimizer_steps(a, setup):
        for key in keys:
            found.setdefault(key, call)
    return found


def _optimizer_steps(a: Analysis, setup: Setup) -> Iterator[tuple[cst.Call, list[str]]]:
    """Each ``optimizer.step()`` of the training, with the setup's names for that optimizer."""
    for call, where in a.calls:
        if where not in setup.reach or method_call(call, "step") is None:
            continue
        key = key_of(call.func.value)  # type: ignore[union-attr]
        if key is not None and a.role(where, key) is Role.OPTIMIZER:
            yield call, sorted(origins(a, setup.scope, where, key)) or [key]


def step_order(a: Analysis, setup: Setup, within: cst.CSTNode) -> list[tuple[str, cst.Call]]:
    """The backward passes (:data:`BACKWARD`) and optimizer steps (the optimizer's key) one run
    of ``within`` makes, in source order: what decides whether one accumulate window or one
    loss scaler keeps several optimizers' alternation. Refused when some of them run in a
    function ``within`` calls, where their order is not in sight."""
    inside = [(BACKWARD, c) for c, _s, _lp in a.backward_calls if a.contains(within, c)]
    inside += [(keys[0], c) for c, keys in _optimizer_steps(a, setup) if a.contains(within, c)]
    hidden = [c for c, s, _lp in a.backward_calls if s in setup.reach and not a.contains(within, c)]
    hidden += [c for c, _s in _optimizer_steps(a, setup) if not a.contains(within, c)]
    if hidden:
        raise Refused(
            hidden[0],
            STEP_ORDER,
            "several optimizers step, and this backward or step runs outside the loop that "
            "trains them, so their order cannot be checked; convert by hand",
        )
    return sorted(inside, key=lambda event: a.line(event[1]))


def origins(a: Analysis, setup: Scope, scope: Scope, key: str) -> set[str]:
    """The names of ``setup`` that ``key`` in ``scope`` stands for: itself there, the global it
    reads, or the arguments passed for it at every same-file call, transitively."""
    out: set[str] = set()
    seen: set[tuple[int, str]] = set()
    todo = [(scope, key)]
    links = _links(a)
    while todo:
        where, name = todo.pop()
        if (id(where), name) in seen:
            continue
        seen.add((id(where), name))
        if (
            where is setup
            or (setup.is_module and a.reads_global(where, name))
            or (setup.cls is not None and name.startswith("self.") and where.cls is setup.cls)
        ):
            out.add(name)
        else:
            owner = where.cls if name.startswith("self.") and where.cls else where.node
            todo.extend(links.get((id(owner), name), ()))
    return out


def _links(a: Analysis) -> dict[tuple[int, str], list[tuple[Scope, str]]]:
    """(callee, parameter) -> the (caller, argument name) pairs passed for it; (class,
    ``self.x``) -> the (method, name) it was set from."""
    cached = getattr(a, "_param_links", None)
    if cached is not None:
        return cached
    out: dict[tuple[int, str], list[tuple[Scope, str]]] = {}
    for caller, arg, callee, param in call_links(a):
        out.setdefault((id(callee.node), param), []).append((caller, arg))
    for method, key, _same, name in attribute_links(a):
        out.setdefault((id(method.cls), key), []).append((method, name))
    a._param_links = out  # type: ignore[attr-defined]
    return out


def _models_and_optimizers(a: Analysis, setup: Setup) -> list[str]:
    """The optimizer and every model whose parameters it holds (all of them, or replicas of
    the ones left out would drift apart on several processes)."""
    scope = setup.scope
    optimizers = [
        b
        for b in _owned(a, scope)
        if a.role(scope, b.key) is Role.OPTIMIZER and not _handed_back(b)
    ]
    models: list[str] = []
    for b in optimizers:
        value = b.value
        held = (
            optimized_models(a, scope, value, setup.partly_trained)
            if isinstance(value, cst.Call)
            else None
        )
        if not held:  # none read (``[{"params": trunk_params}]`` filled in a loop): what trains
            held = _trained_models(a, setup)
            built = constructor_role(value, a.names) is Role.OPTIMIZER
            if len(held) != 1 or (built and not _filled_from(a, setup, value, next(iter(held)))):
                raise Refused(
                    b.node,
                    OBJECTS_NOT_FOLLOWED,
                    f"cannot tell which model {b.key} trains (its parameters come from an "
                    "expression accel-convert does not read)",
                )
        models.extend(sorted(held, key=lambda k: _first_bound(a, scope, k)))
    cls = scope.cls
    for key in models:
        if key == "self":
            raise Refused(optimizers[0].node, BARE_MODULE, _trains_itself(a, setup, optimizers[0]))
        if key.startswith("self.") and cls is not None and cls.name.value in a.model_classes:
            raise Refused(
                optimizers[0].node,
                BARE_MODULE,
                f"{key} is a submodule of {cls.name.value}, an nn.Module that trains it in its "
                f"own methods: prepare() would put the wrapper inside {cls.name.value} (its "
                f"state_dict keys change, and code that moves or saves {cls.name.value} reaches "
                "the wrapper); convert by hand",
            )
        param = key if key in scope.params else _alias_of_a_parameter(a, scope, key)
        if param is not None:
            named = key if param == key else f"{key} (bound from {param})"
            raise Refused(
                optimizers[0].node,
                OBJECTS_NOT_FOLLOWED,
                f"{named} comes in as a parameter of {scope.name}(): whoever calls it owns the "
                "model (and may share it with other processes); convert where it is built",
            )
        if not _bound_here(a, scope, key):
            raise Refused(
                optimizers[0].node,
                OBJECTS_NOT_FOLLOWED,
                f"{key} is not built in {scope.name}(), where its optimizer is; prepare() "
                "needs both in one place",
            )
    return [*models, *(b.key for b in optimizers)]


def _filled_from(a: Analysis, setup: Setup, value: cst.BaseExpression | None, model: str) -> bool:
    """Whether what an optimizer is built over names ``model`` where it is made or filled:
    ``params += list(model.encoder.parameters())``, ``for n, p in model.named_parameters():
    params.append(p)``. monodepth2 fills ``self.parameters_to_train`` from ``self.models[...]``
    while the one module its step calls by name is a parameterless SSIM: that is not it."""
    if value is None:
        return False
    names = {k for node in nodes(value, (cst.Name, cst.Attribute)) if (k := key_of(node))}
    found: list[cst.CSTNode] = [value]
    for node in nodes(a.module, (cst.Assign, cst.AugAssign, cst.Call)):
        if isinstance(node, cst.Call):
            func = node.func
            if not (
                isinstance(func, cst.Attribute)
                and func.attr.value in _FILLS
                and key_of(func.value) in names
            ):
                continue
            loop = a.enclosing(node, cst.For)
            found += [node, *([loop.iter] if isinstance(loop, cst.For) else [])]
            continue
        targets = node.targets if isinstance(node, cst.Assign) else [node]
        if any(key_of(t.target) in names for t in targets):
            found.append(node.value)
    # the names they mention, and what those are bound to, twice over: an alias of the model
    # (``model_without_ddp = model.module``) names it too
    seen: set[str] = set()
    for _ in range(3):
        keys = {k for expr in found for n in nodes(expr, (cst.Name, cst.Attribute))
                if (k := key_of(n)) is not None} - seen  # fmt: skip
        if any(k == model or k.startswith(f"{model}.") for k in keys):
            return True
        seen |= keys
        found = [b.value for b in a.bindings if b.key in keys and b.value is not None]
    return False


_FILLS = frozenset({"append", "extend", "add", "insert", "update"})


def _alias_of_a_parameter(a: Analysis, scope: Scope, key: str) -> str | None:
    """The parameter of ``scope`` that some binding of the plain name ``key`` there names,
    moved or not (efficient_densenet's ``model_wrapper = model`` in ``train(model, ...)``), or
    None. A trainer class's ``self.model = model.to(device)`` in ``__init__`` is its own case:
    the object keeps the model it is given."""
    if key.startswith("self."):
        return None
    for b in a.bindings:
        if b.scope is scope and b.key == key and b.value is not None:
            named = key_of(unwrap_moves(b.value))
            if named is not None and named in scope.params:
                return named
    return None


def _handed_back(b: Binding) -> bool:
    """``model, optimizer = accelerator.prepare(model, optimizer)``: the object it was given comes
    back wrapped (a converted script read again, by the linter), not a new optimizer."""
    value = b.node.value if isinstance(b.node, cst.Assign) else None
    if not isinstance(value, cst.Call) or not isinstance(value.func, cst.Attribute):
        return False
    return value.func.attr.value == "prepare" and any(key_of(x.value) == b.key for x in value.args)


def _trained_in_place_of_its_bare_name(a: Analysis, setup: Setup, keys: list[str]) -> list[str]:
    """Research code's ``model_without_ddp``: the optimizer holds the parameters of a name bound
    only from the model the training calls (``= model``, ``= model.module``). That model is what
    prepare() wraps, and the other name stays the bare module, as it is under DDP. A name bound
    from the trained model any other way is refused: prepare() of either would leave the other
    training unwrapped, its gradients never shared."""
    scope = setup.scope
    called = _trained_models(a, setup) | _called_in_training(a, setup)
    unprepared = {
        k
        for k in called - set(keys)
        if _bound_here(a, scope, k) and not _a_loss(a, scope, k) and not _frozen(a, scope, k, set())
    }
    out = []
    for key in keys:
        bindings = [b for b in a.bindings if b.scope is scope and b.key == key]
        sources = (
            set()
            if a.role(scope, key) is Role.OPTIMIZER
            else {n.value for b in bindings if b.value is not None for n in names_in(b.value)}
            & unprepared
        )
        if not sources:
            out.append(key)
            continue
        bare = [_bare_view_of(b.value) for b in bindings]
        if len(sources) > 1 or any(view != next(iter(sources)) for view in bare):
            found = sorted(sources)[0]
            raise Refused(
                bindings[0].node,
                OBJECTS_NOT_FOLLOWED,
                f"{key} is bound from {found}, and the script runs both: prepare() can wrap "
                "only one, and what runs the other skips the wrapper (and its gradient "
                "sharing); train and optimize one name, or convert by hand",
            )
        out.append(next(iter(sources)))
    return list(dict.fromkeys(out))


def _a_loss(a: Analysis, scope: Scope, key: str) -> bool:
    """``criterion = nn.CrossEntropyLoss()``: bound only to torch's loss modules, which hold no
    parameters, so handing one beside the model is no second model trained."""
    values = [b.value for b in a.bindings if b.scope is scope and b.key == key]
    return bool(values) and all(
        isinstance(v, cst.Call)
        and (q := a.names.qualify(v.func)) is not None
        and q.startswith("torch.nn.")
        and q.endswith("Loss")
        for v in values
    )


def _called_in_training(a: Analysis, setup: Setup) -> set[str]:
    """The setup's names the training steps call (``model(x)``), whatever their role says."""
    found = set()
    for call, where in a.calls:
        key = key_of(call.func)
        if where in setup.reach and key is not None and in_training_step(a, call):
            found |= origins(a, setup.scope, where, key)
    return found


def _bare_view_of(value: cst.BaseExpression | None) -> str | None:
    """``m`` for ``m``, ``m.module`` or ``unwrap_model(m)``: the bare module a DDP model is."""
    if isinstance(value, cst.Attribute) and value.attr.value == "module":
        value = value.value
    elif isinstance(value, cst.Call) and len(value.args) == 1:
        callee = placeholder_of(value.func) or callee_name(value) or ""
        value = value.args[0].value if callee.endswith("unwrap_model") else None
    return value.value if isinstance(value, cst.Name) else None


def _trains_itself(a: Analysis, setup: Setup, optimizer: Binding) -> str:
    """Why a module whose method steps an optimizer over its own parameters stays as it is."""
    cls = setup.scope.cls
    name = cls.name.value if cls is not None else "this module"
    steps = sorted({s.name for _c, s, _lp in a.backward_calls if s.cls is cls and s in setup.reach})
    where = f"{', '.join(f'{m}()' for m in steps)} steps" if steps else "its own method steps"
    return (
        f"{name} trains itself ({where} {optimizer.key}, built over self.parameters()): "
        "gradients are synchronised by the wrapper prepare() returns, when its forward runs, "
        "and a method of the module cannot run that wrapper in place of self; convert by hand"
    )


def _trained_models(a: Analysis, setup: Setup) -> set[str]:
    """Models of the setup scope that its training calls."""
    found = set()
    for call, where in a.calls:
        key = key_of(call.func)
        if where in setup.reach and key is not None and a.role(where, key) is Role.MODEL:
            found |= origins(a, setup.scope, where, key)
    return found


def _bound_here(a: Analysis, scope: Scope, key: str) -> bool:
    return key in scope.params or any(b.scope is scope and b.key == key for b in a.bindings)


def _first_bound(a: Analysis, scope: Scope, key: str) -> int:
    """Where ``key`` is first bound in ``scope``, in source order (the analysis records bindings
    as it reads them): the order models are prepared in, with no line numbers to compute."""
    return next((i for i, b in enumerate(a.bindings) if b.scope is scope and b.key == key), -1)


def _loaders(a: Analysis, setup: Setup, trained: list[str]) -> list[str]:
    """Loaders the training iterates: prepared. Loaders only evaluation iterates stay as they
    are (every process evaluates all of it, which is slower but always right)."""
    trains = _trains(a)
    training: dict[str, cst.CSTNode] = {}
    evaluating: dict[str, cst.CSTNode] = {}
    elsewhere: list[tuple[cst.CSTNode, str]] = []  # training loaders built out of the setup
    for node, scope, key, in_training in _loader_uses(a, setup, trains):
        if a.role(scope, key) is not Role.DATALOADER:
            continue  # a loop over something else (a list of features, a batch's chunks)
        found = origins(a, setup.scope, scope, key)
        if in_training and not found:
            elsewhere.append((node, key))
        for origin in found:
            (training if in_training else evaluating).setdefault(origin, node)
    prepared = []
    for key, node in training.items():
        kind, what = _loader_kind(a, setup.scope, key)
        if kind == "other":
            setup.unsharded.append((node, f"{key} is not a torch DataLoader ({what})", _SHARD))
            continue
        prepared.append(key)
        if kind == "factory":
            setup.factory_loaders[key] = node
            setup.factory_calls[key] = what
    for key in evaluating.keys() - training.keys():
        built = [b for b in a.bindings if b.scope is setup.scope and b.key == key]
        if built and _loader_kind(a, setup.scope, key)[0] != "other":
            setup.kept_loaders[key] = built[0]
    fed = set(prepared)
    for call, where, _loop in a.backward_calls:
        if where in setup.reach and not _fed(a, setup, call, fed, set()):
            if runs_ahead_of_builds(a, setup, call, trained):
                continue  # an autograd demo before the model: the backward step says so
            node = a.enclosing(call, (cst.For, cst.While)) or call
            if any(_in(a, node, n) for n, _r, _w in setup.unsharded):
                continue
            outside = next((key for n, key in elsewhere if _in(a, node, n)), None)
            if outside is None:
                setup.unsharded.append((node, "no DataLoader feeds this training step", _SHARD))
                continue
            there = "at module level" if setup.scope.is_module else f"in {setup.scope.name}()"
            setup.unsharded.append(
                (
                    node,
                    f"{outside} feeds this training step but is not built {there}, where "
                    "prepare() runs (it stays unprepared)",
                    "build it there (or prepare it where it is built) to shard the data",
                )
            )
    setup.loaders = set(prepared)
    return sorted(prepared, key=lambda k: _first_bound(a, setup.scope, k))


_SHARD = "iterate a DataLoader and prepare() it to shard the data"


def _fed(a: Analysis, setup: Setup, node: cst.CSTNode, loaders: set[str], seen: set[int]) -> bool:
    """Whether a loop over one of ``loaders`` runs around ``node``, in its function or around
    every call that reaches it."""
    scope = a.scope_of[id(node)]
    current = a.parent(node)
    while current is not None and current is not scope.node:
        if isinstance(current, cst.For | cst.While) and _walks(a, setup, current, loaders):
            return True
        current = a.parent(current)
    if scope is setup.scope or id(scope) in seen:
        return False
    seen.add(id(scope))
    calls = [c for c, where in a.calls if where in setup.reach and _calls(a, c, scope)]
    return bool(calls) and all(_fed(a, setup, c, loaders, seen) for c in calls)


def _calls(a: Analysis, call: cst.Call, scope: Scope) -> bool:
    return a.callee(call) is scope


def _walks(a: Analysis, setup: Setup, loop: cst.For | cst.While, loaders: set[str]) -> bool:
    """A ``for`` over a loader, or a loop that takes ``next()`` of an iterator over one."""
    found = next((lp for lp in a.loops if lp.node is loop), None)
    if found is None:
        return False
    if any(origins(a, setup.scope, found.scope, k) & loaders for k in found.iterables):
        return True
    return any(
        where is found.scope
        and callee_name(call) == "iter"
        and len(call.args) == 1
        and (key := key_of(call.args[0].value)) is not None
        and origins(a, setup.scope, where, key) & loaders
        for call, where in a.calls
    )


def _in(a: Analysis, outer: cst.CSTNode, node: cst.CSTNode) -> bool:
    return a.contains(outer, node) or a.contains(node, outer)


def _loader_uses(
    a: Analysis, setup: Setup, trains: set[Scope]
) -> Iterator[tuple[cst.CSTNode, Scope, str, bool]]:
    """(node, scope, name, in training) for each ``for`` over a name and each ``iter(name)``."""
    for loop in a.loops:
        if loop.scope in setup.reach:
            for key in loop.iterables:
                yield loop.node, loop.scope, key, _loop_trains(a, loop, trains)
    for call, where in a.calls:
        if where in setup.reach and callee_name(call) == "iter" and len(call.args) == 1:
            key = key_of(call.args[0].value)
            if key is not None:
                yield call, where, key, _next_in_training(a, call, trains)


def _next_in_training(a: Analysis, call: cst.Call, trains: set[Scope]) -> bool:
    """Whether batches drawn from ``iter(loader)`` feed a training loop: ``next()`` of it (or of
    the name it is bound to) runs inside a loop that trains."""
    parent = a.parent(a.parent(call) or call)
    nexts: list[cst.CSTNode] = []
    if isinstance(parent, cst.Call) and callee_name(parent) == "next":
        nexts.append(parent)
    assign = a.parent(call)
    if isinstance(assign, cst.Assign) and len(assign.targets) == 1:
        name = key_of(assign.targets[0].target)
        scope = a.scope_of[id(call)]
        nexts += [
            c
            for c, where in a.calls
            if where is scope
            and callee_name(c) == "next"
            and c.args
            and key_of(c.args[0].value) == name
        ]
    loops = [lp for lp in a.loops if _loop_trains(a, lp, trains)]
    return any(a.contains(lp.node, n) for n in nexts for lp in loops)


def _trains(a: Analysis) -> set[Scope]:
    """Scopes that run a ``.backward()`` themselves or through the functions they call."""
    found = _training_scopes(a)
    callers: dict[int, set[Scope]] = {}
    for call, where in a.calls:
        callee = a.callee(call)
        if callee is not None:
            callers.setdefault(id(callee), set()).add(where)
    todo = list(found)
    while todo:
        for caller in callers.get(id(todo.pop()), ()):
            if caller not in found:
                found.add(caller)
                todo.append(caller)
    return found


def _loop_trains(a: Analysis, loop: Loop, trains: set[Scope]) -> bool:
    if loop.trains:
        return True
    for call, where in a.calls:
        if where is loop.scope and a.contains(loop.node, call):
            callee = a.callee(call)
            if callee is not None and callee in trains:
                return True
    return False


# Packages whose iterables are not torch DataLoaders (torch's own, but for torch.utils.data).
_NOT_LOADERS = ("torchtext.", "datasets.", "numpy.", "torch.")


def _loader_kind(a: Analysis, scope: Scope, key: str, depth: int = 0) -> tuple[str, str]:
    """Whether prepare() can shard what ``key`` holds: ("loader", ""), ("factory", the call that
    builds it where we cannot look) or ("other", what it is instead)."""
    # ``train = DataLoader(train, ...)``: what the name held before is the loader's dataset.
    wraps = [
        a.line(b.node)
        for b in a.bindings
        if b.scope is scope
        and b.key == key
        and isinstance(b.value, cst.Call)
        and constructor_role(b.value, a.names) is Role.DATALOADER
        and any(key_of(arg.value) == key for arg in b.value.args[:1])
    ]
    for b in a.bindings:
        value = b.value if b.value is not None else getattr(b.node, "value", None)
        if b.scope is not scope or b.key != key or value is None:
            continue
        if constructor_role(value, a.names) is Role.DATALOADER:
            continue
        if any(line > a.line(b.node) for line in wraps):
            continue
        if isinstance(value, cst.List | cst.Tuple | cst.ListComp | cst.SimpleString):
            return "other", a.module.code_for_node(value)[:40]
        func = value.func if isinstance(value, cst.Call) else None
        if func is None:
            return "factory", a.module.code_for_node(value)[:40]
        what = f"{dotted_name(func) or 'a call'}(...)"
        local = a.callee(value) if a.constructed_class(value) is None else None
        qualified = a.names.qualify(func)
        if local is not None:
            if not _returns_loaders(a, b, local, depth):
                return "other", what
        elif qualified is None or not qualified.startswith(_NOT_LOADERS):
            return "factory", what
        elif not qualified.startswith("torch.utils.data."):
            return "other", what
    return "loader", ""


def _returns_loaders(a: Analysis, binding: Binding, function: Scope, depth: int) -> bool:
    """Whether ``function`` (called for ``binding``) returns DataLoaders for it: built in the
    return statement, or bound to the name it returns (``return model, train_loader``)."""
    found = returned_values(a, binding)
    if found is None:  # a return we cannot place: any loader it returns counts
        values = [r.value for r in returns(function) if r.value is not None]
        items = [
            item
            for v in values
            for item in ([e.value for e in v.elements] if isinstance(v, cst.Tuple) else [v])
        ]
        return any(constructor_role(v, a.names) is Role.DATALOADER for v in items)
    return all(
        constructor_role(v, a.names) is Role.DATALOADER
        or (
            (name := key_of(v)) is not None
            and depth < 3
            and _loader_kind(a, function, name, depth + 1)[0] == "loader"
        )
        for v in found[1]
    )


# where -----------------------------------------------------------------------------------------
def _build_of(a: Analysis, setup: Setup, key: str) -> Binding:
    """The binding that stands for ``key`` in prepare(): its first build in the setup scope."""
    scope = setup.scope
    for b in a.bindings:
        if b.scope is scope and b.key == key:
            return b
    # A parameter of the setup function: prepared where it is, nothing builds it.
    return Binding(key, scope, scope.body[0], scope.node, None, False, False)


def runs_ahead_of_builds(a: Analysis, setup: Setup, node: cst.CSTNode, keys: list[str]) -> bool:
    """Whether ``node`` runs before any of ``keys`` is built: a notebook's autograd demo
    (``loss.backward(); print(w.grad)`` on plain tensors) ahead of the model trains none of them."""
    timeline = setup.timeline
    return bool(keys) and all(
        timeline.before(timeline.point_before(_build_of(a, setup, key).statement), node)
        for key in keys
    )


def _training_nodes(a: Analysis, setup: Setup) -> list[cst.CSTNode]:
    """Where training starts to use the prepared objects: backward calls, loops over prepared
    loaders, steps of prepared optimizers and schedulers."""
    nodes: list[cst.CSTNode] = [c for c, where, _lp in a.backward_calls if where in setup.reach]
    keys = set(setup.keys)
    for loop in a.loops:
        if (
            loop.scope in setup.reach
            and any(origins(a, setup.scope, loop.scope, k) & keys for k in loop.iterables)
            and not _only_looks(a, setup, loop)
            and not _walks_an_earlier_loader(a, setup, loop)
        ):
            nodes.append(loop.node)
    return nodes


def _walks_an_earlier_loader(a: Analysis, setup: Setup, loop: Loop) -> bool:
    """A loop with no backward over a loader name the setup binds again after it runs (BYOL's
    features read through the image loader, then ``train_loader`` bound again to the features'
    loader): it walks the earlier object, which prepare() does not wrap."""
    if any(a.contains(loop.node, call) for call, _where, _lp in a.backward_calls):
        return False
    keys = {k for it in loop.iterables for k in origins(a, setup.scope, loop.scope, it)}
    keys &= set(setup.loaders)
    if not keys:
        return False
    timeline = setup.timeline
    for key in keys:
        builds = [b for b in a.bindings if b.scope is setup.scope and b.key == key]
        last = max(builds, key=lambda b: a.line(b.node), default=None)
        if last is None or len(builds) < 2:
            return False
        if not timeline.before(timeline.point_before(last.statement), loop.node):
            return False
        shuffled = [b for b in builds if b is not last and _shuffles(b.value)]
        if shuffled and not seeded(a):
            raise Refused(
                loop.node,
                LOCKSTEP,
                f"this walks {key} (line {a.line(shuffled[0].node)}), shuffled in each "
                f"process's own order (nothing seeds the script), before {key} is bound again "
                f"(line {a.line(last.node)}): what the walk builds may feed the loader prepare() "
                "shards, in a different order on each process, and accel-convert does not "
                "follow it; seed the script (set_seed), then convert again",
            )
    return True


def _shuffles(value: cst.BaseExpression | None) -> bool:
    """``DataLoader(..., shuffle=True)`` (or any shuffle that is not ``False``)."""
    flag = keyword_arg(value, "shuffle") if isinstance(value, cst.Call) else None
    return flag is not None and not (
        isinstance(flag.value, cst.Name) and flag.value.value in {"False", "None"}
    )


def _only_looks(a: Analysis, setup: Setup, loop: Loop) -> bool:
    """``for x, y in loader: print(x.shape); break``: a loop of the setup's own scope that uses
    no other training object, calls no function of this file and runs no backward. It looks at
    the data, trains nothing, and may run on the bare loader before prepare()."""
    if loop.scope is not setup.scope:
        return False
    if any(a.contains(loop.node, call) for call, _where, _lp in a.backward_calls):
        return False
    if any(a.callee(call) is not None for call in nodes(loop.node, cst.Call)):
        return False
    others = set(setup.keys) - set(loop.iterables)
    used = (key_of(n) for n in nodes(loop.node.body, (cst.Name, cst.Attribute)))
    return not others.intersection(used)


def unfollowed(a: Analysis, scope: Scope) -> str | None:
    """Why a step in ``scope`` cannot be followed, where the function says it: defined again
    beside it (a notebook's second ``def training_loop``: calls are linked to one definition
    only), or run, itself or through the functions that call it, by what it is handed to
    (ignite's ``Engine(step)``, a ``@trainer.on(...)`` handler calling ``finish_episode``)."""
    if scope.is_module:
        return None
    same = [s for s in a.scopes if s.parent is scope.parent and s.cls is scope.cls]
    if sum(s.name == scope.name for s in same) > 1:
        return (
            f"{scope.name}() is defined more than once: which definition a call runs depends "
            "on where the call is, which accel-convert does not follow; give each its own name"
        )
    seen: set[int] = set()
    functions = [scope]
    while functions:
        function = functions.pop()
        if id(function) in seen or function.is_module:
            continue
        seen.add(id(function))
        handed = _handed_to_a_runner(a, function)
        if handed is not None:
            return f"{handed}, which runs the step where accel-convert cannot follow it"
        functions += [where for call, where in a.calls if a.callee(call) is function]
    return None


def _handed_to_a_runner(a: Analysis, function: Scope) -> str | None:
    """``@trainer.on(EPISODE_COMPLETED)`` on the function, or the function named as an argument
    (``Engine(step)``): something accel-convert does not read calls it."""
    if not isinstance(function.node, cst.FunctionDef):
        return None
    code = a.module.code_for_node
    for decorator in function.node.decorators:
        called = decorator.decorator
        # ``@trainer.on(EVENT)`` of an object of the file registers; ``@torch.no_grad()`` wraps
        if (
            isinstance(called, cst.Call)
            and isinstance(called.func, cst.Attribute)
            and a.names.qualify(called.func) is None
        ):
            return (
                f"{function.name}() is handed to the @{code(decorator.decorator.func)}(...) "
                f"decorator (line {a.line(decorator)})"
            )
    for call, _where in a.calls:
        if any(isinstance(g.value, cst.Name) and g.value.value == function.name for g in call.args):
            return f"{function.name}() is handed to {code(call.func)}(...) (line {a.line(call)})"
    return None


def _prepare_point(a: Analysis, setup: Setup) -> Point:
    """Right after the last build of a prepared object, before training first uses one."""
    timeline = setup.timeline
    anchors: list[cst.CSTNode] = []
    after_scope = False  # training in other methods of the setup's class, once it returned
    for node in _training_nodes(a, setup):
        found = timeline.anchors(node)
        if found is None:
            raise Refused(
                node,
                STEP_OUTSIDE_SETUP,
                unfollowed(a, a.scope_of[id(node)])
                or f"this training step is not reached from {setup.scope.name}() by calls "
                "accel-convert follows (an object or a callback may run it)",
            )
        anchors.extend(found)
        after_scope = after_scope or not found
    block = timeline.body() if after_scope or not anchors else _common_block(timeline, anchors)
    uses: list[tuple[int, cst.CSTNode]] = [
        (timeline.index(block, timeline.top_in(block, n)), n)  # type: ignore[arg-type]
        for n in anchors
    ]
    if after_scope:
        uses.append((len(block.body), setup.scope.node))
    built = [
        timeline.index(block, top)
        for b in a.bindings
        if b.scope is setup.scope
        and b.key in setup.keys
        and (top := timeline.top_in(block, b.node)) is not None
    ]
    # A backward before any training object exists (an autograd demo) does not train them.
    start = min(built, default=0)
    uses = [(p, n) for p, n in uses if p >= start] or uses
    positions = [p for p, _n in uses]
    first, first_use = min(uses, key=lambda use: use[0])
    index = 0
    for b in setup.prepared:
        for build in (x for x in a.bindings if x.scope is setup.scope and x.key == b.key):
            if switched_itself(build):
                continue  # ``model = model.to("cpu")``: a move hands back the object it moved
            if handed_back(a, build) and a.role(setup.scope, b.key) is Role.OPTIMIZER:
                continue  # ``optimizer = lr_decay(optimizer, ...)``; a model a function
                # returns may come back trained, which the analysis does not follow
            top = timeline.top_in(block, build.node)
            if top is None:
                if not timeline.precedes_block(build.node, block):
                    setup.rebuilds.setdefault(b.key, []).append(build)
                continue
            at = timeline.index(block, top)
            if at < first:
                index = max(index, at + 1)
            elif at == first:
                raise _built_with_training(a, build, top)
            elif any(position > at for position in positions):
                again = any(
                    timeline.top_in(block, x.node) is not None
                    and timeline.index(block, timeline.top_in(block, x.node)) < at  # type: ignore[arg-type]
                    for x in a.bindings
                    if x.scope is setup.scope and x.key == b.key
                )
                what = "built again here" if again else "built only here"
                raise Refused(
                    build.node,
                    BUILD_ORDER,
                    f"{b.key} is {what}, after line {a.line(first_use)} already uses what "
                    "prepare() wraps, and training uses it; convert by hand",
                )
            else:
                setup.rebuilds.setdefault(b.key, []).append(build)
    point = _out_of_try(timeline, Point(block, index))
    if timeline.in_loop(point):
        raise Refused(block, BUILT_IN_LOOP, "the training objects are built inside a loop")
    for b in setup.prepared:
        free = not any(x.scope is setup.scope and x.key == b.key for x in a.bindings)
        if not free and not timeline.assigned_at(point, b.key):  # a free name: the snippet's
            raise Refused(
                b.node,
                OBJECTS_NOT_FOLLOWED,
                f"{b.key} is not built on every path before training starts: prepare() "
                "needs it in one place",
            )
    _refuse_kept_early(a, setup, point)
    return point


def _out_of_try(timeline: Timeline, point: Point) -> Point:
    """The start of a ``try`` body is the moment just before the ``try``: prepare() placed there
    also comes before its handlers and the code after it (word_language_model's ``except
    KeyboardInterrupt:``, then the test run of the best model), which can then use the
    prepared objects."""
    while point.index == 0:
        owner = timeline.a.parent(point.block)
        outer = timeline.block_of(owner) if isinstance(owner, cst.Try) else None
        if outer is None or owner.body is not point.block:  # type: ignore[union-attr]
            return point
        point = Point(outer, timeline.index(outer, owner))
    return point


def _built_with_training(a: Analysis, build: Binding, top: cst.CSTNode) -> Refused:
    """Why a build in the statement where training starts blocks prepare(): a loop builds it,
    or it is what a function of this file returns after training it (``model = train(model)``)."""
    value = build.value
    if top is a.statement_of(build.node) and isinstance(value, cst.Call) and a.callee(value):
        name = a.module.code_for_node(value.func)
        why = (
            f"{build.key} is rebound to what {name}() returns, and {name}() trains it: "
            "accel-convert does not follow the object that comes back; convert by hand"
        )
        return Refused(build.node, BUILD_ORDER, why)
    return Refused(build.node, BUILT_IN_LOOP, f"{build.key} is built inside the training loop")


def _refuse_kept_early(a: Analysis, setup: Setup, point: Point) -> None:
    """``trainer = Trainer(model, optimizer)`` or ``pbar = tqdm(loader)`` before ``prepare()``:
    the instance or the bar would keep the bare objects, whatever prepare() returns afterwards."""
    keys = set(setup.keys)
    trains = _trains(a)
    for call, where in a.calls:
        if where is not setup.scope or setup.timeline.after(point, call):
            continue
        if a.constructed_class(call) is not None:
            handed = [k for arg in call.args if (k := key_of(arg.value)) in keys]
            if handed:
                raise Refused(
                    call,
                    BUILD_ORDER,
                    f"{a.constructed_class(call)}(...) is handed {', '.join(handed)} before "
                    "prepare() can wrap them, and would keep the bare objects; build it after "
                    "them",
                )
        elif (loader := _kept_view(a, call, trains)) in setup.loaders:
            raise Refused(
                call,
                BUILD_ORDER,
                f"{callee_name(call)}({loader}) is kept before prepare() can wrap {loader}: "
                "the loop over it would walk the bare loader, unsharded; make it after the "
                "training objects are built",
            )


def _kept_view(a: Analysis, call: cst.Call, trains: set[Scope]) -> str | None:
    """The loader of ``pbar = tqdm(loader)`` or ``batches = iter(loader)`` when the training
    walks that name later (a loop over it, or ``next()`` of it in a loop that trains); not a
    batch drawn once to look at (``images, labels = next(iter(loader))``)."""
    assign = a.parent(call)
    if not isinstance(assign, cst.Assign) or loop_iterable(call) is call:
        return None
    name = key_of(assign.targets[0].target)
    walks = any(
        isinstance(lp.node, cst.For)
        and key_of(loop_iterable(lp.node.iter, a.through)) == name
        and _loop_trains(a, lp, trains)
        for lp in a.loops
    )
    if name is None or not (walks or _next_in_training(a, call, trains)):
        return None
    return key_of(loop_iterable(call))


def _common_block(timeline: Timeline, nodes: list[cst.CSTNode]) -> cst.Module | cst.IndentedBlock:
    """The innermost block of the setup scope that holds all of ``nodes`` and runs once (the
    block around the epoch loop, not the loop's own body)."""
    chains = [timeline.enclosing_blocks(n) for n in nodes]
    for block in chains[0]:
        if all(any(block is other for other in chain) for chain in chains[1:]) and (
            not timeline.in_loop(Point(block, 0))
        ):
            return block
    return timeline.body()


def _snippet(a: Analysis) -> Setup | None:
    """A module-level snippet that trains objects it never builds (the HF guide's example):
    prepare them before their first use."""
    module = a.scopes[0]
    if not any(loop.trains and loop.scope is module for loop in a.loops):
        return None
    roles = {
        key: role
        for (owner, key), role in a.roles.items()
        if owner == id(module.node) and role in TRAINING_ROLES
    }
    if Role.OPTIMIZER not in roles.values() or any(b.scope is module for b in _owned(a, module)):
        return None
    if _loop_bound(a, module) & roles.keys():
        return None  # ``for net, opt in zip(nets, opts)``: built here, one per iteration
    order = {role: i for i, role in enumerate(TRAINING_ROLES)}
    keys = sorted(roles, key=lambda k: order[roles[k]])
    setup = Setup(module, ACCELERATOR, Timeline(a, module), reachable(a, module))
    setup.prepared = [
        Binding(k, module, module.body[0], module.node, None, False, False) for k in keys
    ]
    setup.loaders = {k for k in keys if roles[k] is Role.DATALOADER}
    return setup


def _loop_bound(a: Analysis, scope: Scope) -> set[str]:
    """Names a ``for`` or a comprehension of ``scope`` binds."""
    loops = (*nodes(scope.node, cst.For), *nodes(scope.node, cst.CompFor))
    return {
        key
        for loop in loops
        if a.scope_of.get(id(loop)) is scope
        for key in target_names(loop.target)  # type: ignore[attr-defined]
    }
