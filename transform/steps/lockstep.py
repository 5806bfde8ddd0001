"""Every process runs the same training steps, or the setup is refused.

On several processes each ``accelerator.backward()`` ends in an all-reduce that every process
must join. A loop, a branch or an early exit around the training step decided by a value that
processes compute apart (a loss or a batch of the process's own shard, a clock, the process's
rank, a random draw or an environment the script does not seed) can send one process out of the
loop while the others wait for it: gloo fails with "Connection closed by peer", NCCL hangs.

Values known to be equal on every process: constants, arguments and configuration, loop counters
over them, the lengths of prepared loaders (Accelerate evens their batches), values that every
process computes from the same data with the same weights (an evaluation over an unprepared
loader, tensors sliced by hand), random draws and environments when the script seeds them with
one seed, and anything passed through ``accelerator.reduce``/``gather``. What reads a process's
own shard, its rank or a clock is not.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import libcst as cst

from accelify.transform.analysis import (
    PASS_ON,
    Analysis,
    Scope,
    key_of,
    loop_iterable,
    returns,
    yields,
)
from accelify.transform.draws import (
    drawn_apart,
    drawn_beside,
    drawn_for_every_step,
    seeded,
    unseeded_draw,
)
from accelify.transform.patterns import (
    RANK_NAMES,
    Role,
    callee_name,
    dotted_name,
    method_call,
    random_draw,
    target_names,
    unpacked,
    unseeded_split,
)
from accelify.transform.plan import Plan
from accelify.transform.refusals import LOCKSTEP
from accelify.transform.setup import Refused, Setup, reachable
from accelify.transform.walk import Visitor, children, walk

# Calls whose result every process shares: the collectives, under any of their names.
_SHARED = frozenset(
    {"reduce", "gather", "gather_for_metrics", "all_reduce", "all_gather", "broadcast",
     "pad_across_processes"}
)  # fmt: skip
_CLOCKS = frozenset(
    {"time.time", "time.perf_counter", "time.monotonic", "time.time_ns", "datetime.datetime.now",
     "datetime.now"}
)  # fmt: skip
_RANK_ATTRIBUTES = frozenset(
    {"process_index", "local_process_index", "is_main_process", "is_local_main_process"}
)
_SHAPES = frozenset({"shape", "size", "numel", "dim", "ndim", "ndimension"})
_RANK = "the process's rank"
_BATCH = "this process's own batch (its shard of the prepared loader)"
_RANDOM = "a random draw the script does not seed"
# Reasons that make values differ but not sizes: a random tensor of a fixed shape, a batch of a
# prepared loader (Accelerate evens their sizes).
_VALUES_ONLY = frozenset({_BATCH, _RANDOM, None})
_THROUGH = ", through the loop or branch it runs under"
_MUTATORS = frozenset({"append", "extend", "add", "update", "insert", "appendleft"})
_STEP_DRAWS = frozenset({"step", "reset", "sample", "rsample"})  # env.step(a), dist.sample()


@dataclass
class Values:
    """What the lockstep step knows of one script's values while it spreads them."""

    seeded: bool
    _statements: dict[int, list[cst.CSTNode]]  # scope -> its assignments, loops and calls
    # (owner, key) -> what makes the value differ between processes
    taint: dict[tuple[int, str], str] = field(default_factory=dict)
    # (owner, key) -> the first line of its own function that makes it differ (0: elsewhere)
    first: dict[tuple[int, str], int] = field(default_factory=dict)
    _loop_bound: dict[int, set[str]] = field(default_factory=dict)
    deps: dict[tuple[int, int], _Deps] = field(default_factory=dict)  # (scope, expression)
    leaving: dict[int, list[cst.CSTNode]] = field(default_factory=dict)  # loop -> its exits
    grown: set[int] = field(default_factory=set)  # owners whose taint grew in this pass
    # What does not change while the taint spreads, asked for again and again.
    _callees: dict[int, Scope | None] = field(default_factory=dict)
    _results: dict[int, list[cst.BaseExpression]] = field(default_factory=dict)
    _sources: dict[int, str | None] = field(default_factory=dict)
    _instances: dict[tuple[int, str], cst.ClassDef | None] = field(default_factory=dict)

    def statements(self, scope: Scope) -> list[cst.CSTNode]:
        return self._statements.get(id(scope.node), [])

    def callee(self, a: Analysis, call: cst.Call) -> Scope | None:
        if id(call) not in self._callees:
            self._callees[id(call)] = a.callee(call)
        return self._callees[id(call)]

    def results(self, function: Scope) -> list[cst.BaseExpression]:
        """What a call of ``function`` hands back: its returned and its yielded values."""
        if id(function.node) not in self._results:
            found = [r.value for r in (*returns(function), *yields(function))]
            self._results[id(function.node)] = [x for x in found if x is not None]
        return self._results[id(function.node)]

    def source(self, a: Analysis, call: cst.Call) -> str | None:
        if id(call) not in self._sources:
            self._sources[id(call)] = _source(a, call, self.seeded)
        return self._sources[id(call)]

    def instance_of(
        self, a: Analysis, scope: Scope, value: cst.BaseExpression
    ) -> cst.ClassDef | None:
        """The class of this file that ``value`` (a name) is an instance of, when it is known."""
        key = key_of(value)
        if key is None:
            return None
        if (id(scope.node), key) not in self._instances:
            name = a.instance_class(scope, key)
            methods = a.methods.get(name or "")
            first = next(iter(methods.values()), None) if methods else None
            self._instances[(id(scope.node), key)] = first.cls if first is not None else None
        return self._instances[(id(scope.node), key)]

    def loop_bound(self, scope: Scope) -> set[str]:
        """Names a ``for`` of ``scope`` binds (the analysis records assignments, not these)."""
        found = self._loop_bound.get(id(scope.node))
        if found is None:
            found = self._loop_bound[id(scope.node)] = {
                key
                for node in self.statements(scope)
                if isinstance(node, cst.For)
                for key in target_names(node.target)
            }
        return found


def lockstep(plan: Plan) -> None:
    setup = plan.setup
    if setup is None or setup.prepare_at is None:
        return
    a = plan.analysis
    steps = [
        node
        for call, scope, _loop in a.backward_calls
        if scope in setup.reach
        for node in _runs_through(a, call)
    ]
    # The functions the training step runs through, and what they call: their values decide it.
    scopes = {a.scope_of[id(node)] for node in steps}
    for scope in list(scopes):
        scopes |= reachable(a, scope)
    v = _spread(a, setup, [s for s in a.scopes if s in scopes], Values(seeded(a), _statements(a)))
    for node in steps:
        for control, test in _controls(a, node, v):
            if isinstance(control, cst.For) and _walks_loader(a, control):
                continue  # as many batches everywhere: a loader's length is its data's size
            why = _reads(a, a.scope_of[id(test)], test, v)
            if isinstance(control, cst.For) and why in _VALUES_ONLY and not _counts(control):
                continue  # how often a loop runs over a value is its size, not its values
            if why is not None:
                raise Refused(control, LOCKSTEP, _reason(a, control, test, why))
    _refuse_schedules_apart(a, scopes, v)
    _refuse_splits_apart(plan, v)
    for call, name in drawn_beside(a, plan.training):
        plan.needs_human(call, unseeded_draw(a.module.code_for_node(call.func), name))
    for drawn in drawn_for_every_step(a):
        plan.needs_human(drawn.node, drawn_apart(a, drawn))


def _refuse_splits_apart(plan: Plan, v: Values) -> None:
    """``random_split(ds, [50000, 10000])`` with no generator in a script that seeds nothing:
    each process draws its own split, so the items one trains on are another's held-out ones
    (the loader prepared over its part shards a different set on each process)."""
    a = plan.analysis
    if v.seeded:
        return
    for call, scope in a.calls:
        if (scope in plan.training or scope.is_module) and unseeded_split(call):
            raise Refused(
                call,
                LOCKSTEP,
                f"{a.module.code_for_node(call.func)}(...) draws its split from each process's "
                "own unseeded random stream: the processes would split the data differently, "
                "and one would train on the items another holds out; give the split its own "
                "seed (generator=torch.Generator().manual_seed(0), random_state=0) or seed the "
                "script, and convert again",
            )


def _refuse_schedules_apart(a: Analysis, scopes: set[Scope], v: Values) -> None:
    """``scheduler.step(val_loss)`` (ReduceLROnPlateau) handed a value processes compute apart:
    each process would lower its learning rate at its own epoch, and the models drift apart
    with no error."""
    for call, scope in a.calls:
        stepped = method_call(call, "step")
        receiver = key_of(stepped.func.value) if stepped is not None else None  # type: ignore[union-attr]
        if scope not in scopes or not call.args or receiver is None:
            continue
        if a.role(scope, receiver) is not Role.SCHEDULER:
            continue
        why = _reads(a, scope, call.args[0].value, v)
        if why is not None:
            code = a.module.code_for_node(call.args[0].value).strip()
            raise Refused(
                call,
                LOCKSTEP,
                f"{receiver}.step({code}) is handed a value that reads {why}: each process "
                "would change its learning rate at its own step, and their models would drift "
                "apart; step it on a value every process shares (accelerator.reduce it first) "
                "and convert by hand",
            )


def _walks_loader(a: Analysis, loop: cst.For) -> bool:
    walked = key_of(loop_iterable(loop.iter, a.through))
    return walked is not None and a.role(a.scope_of[id(loop)], walked) is Role.DATALOADER


def _reason(a: Analysis, control: cst.CSTNode, test: cst.CSTNode, why: str) -> str:
    code = a.module.code_for_node(test).strip()
    code = code if len(code) <= 40 else code[:37] + "..."
    what = {
        cst.While: "whether this loop goes on",
        cst.For: "how often this loop runs",
    }.get(type(control), "whether this branch runs")  # type: ignore[arg-type]
    return (
        f"{what} ({code}) reads {why}, so accel-convert cannot show that every "
        "process decides it alike: a process that leaves the training step first leaves the "
        "others waiting for it in the gradient all-reduce (a hang); decide it from a value "
        "every process shares (accelerator.reduce it first) and convert by hand"
    )


# where the training step can be skipped or left ----------------------------------------------
def _runs_through(a: Analysis, node: cst.CSTNode) -> list[cst.CSTNode]:
    """``node`` and every call of the file's functions through which it runs (from the setup,
    or from the code that drives a trainer class)."""
    found = [node]
    todo = [a.scope_of[id(node)]]
    seen = set(todo)
    while todo:
        scope = todo.pop()
        for call, where in a.calls:
            if a.callee(call) is scope:
                found.append(call)
                if where not in seen:
                    seen.add(where)
                    todo.append(where)
    return found


def _controls(
    a: Analysis, node: cst.CSTNode, v: Values
) -> Iterator[tuple[cst.CSTNode, cst.CSTNode]]:
    """(statement, the expression deciding it) for every ``if``/``while``/``for`` around
    ``node`` in its function, and for every conditional ``break``/``continue``/``return`` of
    the loops around it."""
    current: cst.CSTNode | None = node
    while current is not None and not isinstance(current, cst.FunctionDef | cst.Module):
        parent = a.parent(current)
        if isinstance(parent, cst.If) and current is not parent.test:
            yield parent, parent.test
        elif isinstance(parent, cst.While) and current is not parent.test:
            yield parent, parent.test
            yield from _exits(a, parent, v)
        elif isinstance(parent, cst.For) and current is not parent.iter:
            yield parent, parent.iter
            yield from _exits(a, parent, v)
        current = parent


def _exits(
    a: Analysis, loop: cst.For | cst.While, v: Values
) -> Iterator[tuple[cst.CSTNode, cst.CSTNode]]:
    leaving = v.leaving.get(id(loop))
    if leaving is None:
        leaving = v.leaving[id(loop)] = _leaving(loop)
    for leave in leaving:
        current = a.parent(leave)
        while current is not None and current is not loop:
            if isinstance(current, cst.If):
                yield current, current.test
            current = a.parent(current)


def _leaving(loop: cst.For | cst.While) -> list[cst.CSTNode]:
    leaves = _Leaves()
    walk(loop.body, leaves)
    return leaves.found


class _Leaves(Visitor):
    """The ``break``, ``continue`` and ``return`` statements of a loop body, not of the
    functions defined in it; of a loop inside it only the ``return``s, as its own ``break``
    (cleanrl's ``for info in infos["final_info"]: ... break``) leaves that loop alone. Defined
    once, at module level: the walk caches handlers per visitor class, so a class made per call
    would be kept, with the tree it saw."""

    def __init__(self, returns_only: bool = False) -> None:
        super().__init__()
        self.found: list[cst.CSTNode] = []
        self.returns_only = returns_only

    def on_visit(self, node: cst.CSTNode) -> bool:
        if isinstance(node, cst.Return) or (
            not self.returns_only and isinstance(node, cst.Break | cst.Continue)
        ):
            self.found.append(node)
        if isinstance(node, cst.For | cst.While):
            inner = _Leaves(returns_only=True)
            walk(node.body, inner)
            self.found += inner.found
            if node.orelse is not None:  # ``for ... else: break`` leaves the outer loop
                walk(node.orelse, self)
            return False
        return not isinstance(node, cst.FunctionDef)


# which values differ between processes -------------------------------------------------------
def _spread(a: Analysis, setup: Setup, scopes: list[Scope], v: Values) -> Values:
    """Names (per function, ``self.x`` per class) holding values that differ between processes,
    to a fixpoint over assignments, loops, mutations, calls and returns. After the first pass
    only the functions whose inputs grew are read again: their own names, their parameters,
    their class's attributes, the module's globals, or what a function they call returns."""
    loaders = set(setup.loaders)
    callers: dict[int, set[int]] = {}
    for call, where in a.calls:
        callee = a.callee(call)
        if callee is not None:
            callers.setdefault(id(callee.node), set()).add(id(where.node))
    module = id(a.scopes[0].node)
    dirty = scopes
    for _ in range(10):
        v.grown.clear()
        for scope in dirty:
            _spread_in(a, scope, v, loaders)
        if not v.grown:
            break
        touched = {
            id(s.node)
            for s in scopes
            if id(s.node) in v.grown
            or (s.cls is not None and id(s.cls) in v.grown)
            or module in v.grown
        }
        for owner in list(touched):
            touched |= callers.get(owner, set())
        dirty = [s for s in scopes if id(s.node) in touched]
    return v


def _spread_in(a: Analysis, scope: Scope, v: Values, loaders: set[str]) -> None:
    def mark(owner: Scope, key: str, why: str, node: cst.CSTNode | None = None) -> None:
        # A model or an optimizer is one object, not a value; a loader carries its data's. A
        # reason that changes sizes replaces one that changes values only (a list filled with
        # random draws, found later to be filled a random number of times).
        place = (a.owner(owner, key), key)
        line = a.line(node) if node is not None and owner is scope else 0
        v.first[place] = min(v.first.get(place, line), line)
        news = place not in v.taint or why not in _VALUES_ONLY
        if news and not _sized_apart(v, place) and a.role(owner, key) in (None, Role.DATALOADER):
            v.taint[place] = why
            v.grown.add(place[0])

    controls: dict[int, str | None] = {}

    def under(node: cst.CSTNode) -> str | None:
        return _under(a, scope, node, v, controls)

    for node in v.statements(scope):
        if isinstance(node, cst.Assign | cst.AnnAssign | cst.AugAssign) and node.value:
            for target, value in _paired(node):
                keys = list(target_names(target))
                if all(_sized_apart(v, (a.owner(scope, key), key)) for key in keys):
                    continue  # already known to differ in size: nothing more to learn here
                why = _reads(a, scope, value, v, _once_at(a, scope, node)) or under(node)
                if why is not None:
                    for key in keys:
                        mark(scope, key, why, node)
        elif isinstance(node, cst.For):
            for key, why in _loop_targets(a, scope, node, v, loaders):
                mark(scope, key, why, node)
        elif isinstance(node, cst.Call) and callee_name(node) in _MUTATORS:
            receiver = node.func.value if isinstance(node.func, cst.Attribute) else None
            key = key_of(receiver) if receiver is not None else None
            if key is None or _sized_apart(v, (a.owner(scope, key), key)):
                continue
            # Appended a per-process number of times: its size differs, not only its values.
            why = under(node) or next(
                (w for arg in node.args if (w := _reads(a, scope, arg.value, v))), None
            )
            if why is not None:
                mark(scope, key, why, node)
        elif isinstance(node, cst.Call):
            callee = a.callee(node)
            assert callee is not None  # _statements keeps only same-file calls and mutators
            params = callee.params[1:] if callee.cls is not None else callee.params
            for i, arg in enumerate(node.args):
                why = _reads(a, scope, arg.value, v)
                name = arg.keyword.value if arg.keyword else params[i] if i < len(params) else None
                if why is not None and name is not None:
                    mark(callee, name, why)
            if (why := under(node)) is not None:  # runs a per-process number of times
                for key in _kept_by(callee, v):
                    mark(callee, key, why)


def _paired(
    node: cst.Assign | cst.AnnAssign | cst.AugAssign,
) -> list[tuple[cst.BaseExpression, cst.BaseExpression]]:
    """Each target with the value it gets: ``i, t0 = 0, time.time()`` gives ``i`` the 0 and
    ``t0`` the clock; any other unpacking gives every name the whole value."""
    assert node.value is not None
    if not isinstance(node, cst.Assign):
        return [(node.target, node.value)]
    return unpacked(node) or [(t.target, node.value) for t in node.targets]


def _sized_apart(v: Values, place: tuple[int, str]) -> bool:
    """Whether the value at ``place`` is known to differ between processes in its size too."""
    return v.taint.get(place) not in _VALUES_ONLY


def _under(
    a: Analysis, scope: Scope, node: cst.CSTNode, v: Values, cache: dict[int, str | None]
) -> str | None:
    """What makes a loop or branch around ``node`` (in its own function) differ between
    processes, so that ``node`` runs a different number of times on each."""
    current = a.parent(node)
    while current is not None and current is not scope.node:
        if isinstance(current, cst.If | cst.For | cst.While) and not a.contains(
            _decider(current), node
        ):
            if id(current) not in cache:
                cache[id(current)] = _decided_apart(a, scope, current, v)
            if (why := cache[id(current)]) is not None:
                return why if why.endswith(_THROUGH) else why + _THROUGH
        current = a.parent(current)
    return None


def _decider(control: cst.If | cst.For | cst.While) -> cst.CSTNode:
    return control.iter if isinstance(control, cst.For) else control.test


def _decided_apart(
    a: Analysis, scope: Scope, control: cst.If | cst.For | cst.While, v: Values
) -> str | None:
    """What makes ``control`` run its body differently on each process: its test or iterable,
    or for a loop, a ``break``/``continue``/``return`` decided apart."""
    if isinstance(control, cst.For):
        # How often a loop runs over a value is its size (a random tensor's is fixed).
        counted = None if _walks_loader(a, control) else _reads(a, scope, control.iter, v)
        found = None if counted in _VALUES_ONLY and not _counts(control) else counted
    else:
        found = _reads(a, scope, control.test, v)
    if found is not None or isinstance(control, cst.If):
        return found
    exits = (_reads(a, scope, test, v) for _leave, test in _exits(a, control, v))
    return next((w for w in exits if w is not None), None)


def _counts(loop: cst.For) -> bool:
    """``for _ in range(n)``: the value itself is how often the loop runs."""
    return isinstance(loop.iter, cst.Call) and callee_name(loop.iter) == "range"


def _kept_by(function: Scope, v: Values) -> set[str]:
    """The ``self.x`` attributes and globals a function assigns or appends to."""
    kept = set()
    for node in v.statements(function):
        if isinstance(node, cst.Assign | cst.AugAssign | cst.AnnAssign):
            targets = (
                [t.target for t in node.targets] if isinstance(node, cst.Assign) else [node.target]
            )
            kept |= {k for t in targets for k in target_names(t) if k.startswith("self.")}
        elif isinstance(node, cst.Call) and callee_name(node) in _MUTATORS:
            receiver = node.func.value if isinstance(node.func, cst.Attribute) else None
            key = key_of(receiver) if receiver is not None else None
            if key is not None and key.startswith("self."):
                kept.add(key)
    return kept


def _loop_targets(
    a: Analysis, scope: Scope, loop: cst.For, v: Values, loaders: set[str]
) -> Iterator[tuple[str, str]]:
    target = loop.target
    iterable = loop.iter
    counted = loop_iterable(iterable, wrappers=PASS_ON)  # ``tqdm(enumerate(loader))`` counts
    if (
        isinstance(counted, cst.Call)
        and callee_name(counted) == "enumerate"
        and isinstance(target, cst.Tuple)
        and len(target.elements) == 2
    ):
        target = target.elements[1].value  # the index is a counter, equal everywhere
    walked = loop_iterable(iterable, a.through)
    if key_of(walked) in loaders:
        why: str | None = _BATCH
    else:
        why = _reads(a, scope, iterable, v)
    if why is not None:
        for key in target_names(target):
            yield key, why


def _statements(a: Analysis) -> dict[int, list[cst.CSTNode]]:
    """The assignments, ``for`` loops and calls (of the file's functions, or that append to
    something) of every function and the module, by scope, from what the analysis recorded."""
    found: dict[int, list[cst.CSTNode]] = {}
    loops = [(lp.node, lp.scope) for lp in a.loops if isinstance(lp.node, cst.For)]
    defined = set(a.functions) | set(a.methods) | {m for ms in a.methods.values() for m in ms}
    calls = [
        (call, scope)
        for call, scope in a.calls
        if (name := callee_name(call)) in _MUTATORS
        or (name in defined and a.callee(call) is not None)
    ]
    for node, scope in (*a.assignments, *loops, *calls):
        found.setdefault(id(scope.node), []).append(node)
    # In source order (the analysis met nodes in it): values flow forward, so a pass in that
    # order reaches the fixpoint in fewer rounds.
    order = {key: i for i, key in enumerate(a.scope_of)}
    for bucket in found.values():
        bucket.sort(key=lambda node: order[id(node)])
    return found


@dataclass(frozen=True)
class _Deps:
    """What an expression's value depends on, read once: the taint is then looked up, not
    walked, at every pass of the spread."""

    fixed: str | None  # a source in it: the clock, the rank, an unseeded draw
    names: tuple[str, ...]  # names and ``self.x`` it reads
    sized: tuple[str, ...]  # names it reads only through a size (``len(x)``, ``x.shape``)
    attributes: tuple[tuple[int, str], ...]  # (class, ``self.x``) of an instance's attribute
    calls: tuple[Scope, ...]  # same-file functions whose results it reads


def _reads(
    a: Analysis, scope: Scope, expr: cst.CSTNode, v: Values, once_at: int | None = None
) -> str | None:
    """What makes ``expr`` differ between processes, or None when it is equal on all.
    ``once_at``: the line of a statement its function runs once per call, outside any loop,
    which a local name made to differ only by later lines of that function cannot reach."""
    return _evaluate(a, scope, _deps(a, scope, expr, v), v, set(), once_at=once_at)


def _once_at(a: Analysis, scope: Scope, node: cst.CSTNode) -> int | None:
    """``node``'s line when no loop of its function runs it more than once, else None."""
    return None if a.enclosing(node, (cst.For, cst.While)) is not None else a.line(node)


def _deps(a: Analysis, scope: Scope, expr: cst.CSTNode, v: Values) -> _Deps:
    key = (id(scope.node), id(expr))
    found = v.deps.get(key)
    if found is None:
        collected = _Collected()
        _collect(a, scope, expr, v, collected, sized=False)
        found = v.deps[key] = collected.freeze()
    return found


@dataclass
class _Collected:
    fixed: str | None = None
    names: list[str] = field(default_factory=list)
    sized: list[str] = field(default_factory=list)
    attributes: list[tuple[int, str]] = field(default_factory=list)
    calls: list[Scope] = field(default_factory=list)

    def freeze(self) -> _Deps:
        return _Deps(
            self.fixed,
            tuple(dict.fromkeys(self.names)),
            tuple(dict.fromkeys(self.sized)),
            tuple(dict.fromkeys(self.attributes)),
            tuple(dict.fromkeys(self.calls)),
        )


def _collect(
    a: Analysis, scope: Scope, expr: cst.CSTNode, v: Values, out: _Collected, *, sized: bool
) -> None:
    if isinstance(expr, (*_LEAVES, cst.Lambda, cst.FunctionDef)):
        return
    callee = v.callee(a, expr) if isinstance(expr, cst.Call) else None
    if _is_shape(expr) and callee is None:
        # a random tensor's or an evened batch's size is equal everywhere
        _collect(a, scope, _shaped(expr), v, out, sized=True)  # type: ignore[arg-type]
        return
    if isinstance(expr, cst.Call):
        if callee_name(expr) in _SHARED:
            return
        why = v.source(a, expr)
        if why is not None and not (sized and why in _VALUES_ONLY):
            out.fixed = out.fixed or why
        if callee is not None:
            out.calls.append(callee)
    key = key_of(expr) if isinstance(expr, cst.BaseExpression) else None
    if key is not None:
        (out.sized if sized else out.names).append(key)
        if key in RANK_NAMES:
            out.fixed = out.fixed or _RANK
        if isinstance(expr, cst.Name) or key.startswith("self."):
            return
    if isinstance(expr, cst.Attribute):
        if expr.attr.value in _RANK_ATTRIBUTES:
            out.fixed = out.fixed or _RANK
        owner = v.instance_of(a, scope, expr.value)
        if owner is not None:  # ``dqn.memory_counter``: what the class's methods keep
            out.attributes.append((id(owner), f"self.{expr.attr.value}"))
    for child in children(expr):
        _collect(a, scope, child, v, out, sized=sized)


def _evaluate(
    a: Analysis,
    scope: Scope,
    deps: _Deps,
    v: Values,
    seen: set[int],
    *,
    once_at: int | None = None,
) -> str | None:
    for key in deps.names:
        found = _tainted(a, scope, key, v, once_at)
        if found is not None:
            return found
    for key in deps.sized:
        found = _tainted(a, scope, key, v, once_at)
        if found not in _VALUES_ONLY:
            return found
    for place in deps.attributes:
        if place in v.taint:
            return v.taint[place]
    if deps.fixed is not None:
        return deps.fixed
    for callee in deps.calls:
        if id(callee.node) in seen:
            continue
        seen.add(id(callee.node))
        for result in v.results(callee):
            found = _evaluate(a, callee, _deps(a, callee, result, v), v, seen)
            if found is not None:
                return found
    return None


def _tainted(
    a: Analysis, scope: Scope, key: str, v: Values, once_at: int | None = None
) -> str | None:
    place = (a.owner(scope, key), key)
    if once_at is not None and place[0] == id(scope.node) and v.first.get(place, 0) > once_at:
        return None  # made to differ only further down, where this line does not come back
    found = v.taint.get(place)
    if found is None and a.reads_global(scope, key) and key not in v.loop_bound(scope):
        found = v.taint.get((a.owner(a.scopes[0], key), key))
    return found


_LEAVES = (cst.Integer, cst.Float, cst.Imaginary, cst.SimpleString, cst.Ellipsis)


def _is_shape(expr: cst.CSTNode) -> bool:
    if isinstance(expr, cst.Attribute):
        return expr.attr.value in _SHAPES
    if isinstance(expr, cst.Call):
        if callee_name(expr) == "len" and isinstance(expr.func, cst.Name):
            return len(expr.args) == 1
        return isinstance(expr.func, cst.Attribute) and expr.func.attr.value in _SHAPES
    return False


def _shaped(expr: cst.Attribute | cst.Call) -> cst.CSTNode:
    """What a shape read measures: ``x`` of ``len(x)``, ``x.size(0)``, ``x.shape``."""
    if isinstance(expr, cst.Attribute):
        return expr.value
    if isinstance(expr.func, cst.Name):
        return expr.args[0].value
    return expr.func.value  # type: ignore[attr-defined]


def _source(a: Analysis, call: cst.Call, seeded: bool) -> str | None:
    dotted = a.names.qualify(call.func) or dotted_name(call.func) or ""
    if dotted in _CLOCKS:
        return "the clock"
    if seeded:
        return None
    if random_draw(call, a.names):
        return _RANDOM
    if isinstance(call.func, cst.Attribute) and call.func.attr.value in _STEP_DRAWS:
        receiver = key_of(call.func.value)
        if receiver is not None and a.role(a.scope_of[id(call)], receiver) is None:
            return f"what {receiver}.{call.func.attr.value}() draws, unseeded"
    return None
