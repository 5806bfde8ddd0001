"""What the rules share about an Accelerate-style script, gathered in the engine's one traversal.

The facts visitor runs before every rule on each node (and leaves after them), so a rule looking at
a statement sees everything above it in source order: which names hold an ``Accelerator``, which
came out of ``accelerator.prepare`` (per function, rebinding forgets them), which names are batches
of a prepared loader, and whether the statement sits under a main-process guard. Whether a whole
function runs on one process or all is known only at the end (who calls it), so rules keep a
:class:`Where` and ask :meth:`Facts.runs_on` in ``leave_Module``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Literal

import libcst as cst

from accelify.transform.patterns import (
    Role,
    callee_name,
    constructor_role,
    dotted_name,
    target_names,
)

# ``accelerator.is_main_process``, ``is_local_main_process``, ``is_master``, ``rank_zero()``...
_GUARD_NAME = re.compile(r"^(is_)?(local_)?(main|master|rank_?0|rank_zero)(_process)?$")
RANK_NAMES = frozenset(
    {"process_index", "local_process_index", "rank", "local_rank", "global_rank", "get_rank"}
)
GUARD_DECORATORS = frozenset({"on_main_process", "on_local_main_process"})
PREPARE_ONE = {
    "prepare_model": Role.MODEL,
    "prepare_data_loader": Role.DATALOADER,
    "prepare_optimizer": Role.OPTIMIZER,
    "prepare_scheduler": Role.SCHEDULER,
}
# Calls that pass a loader's batches through unchanged: ``for i, batch in enumerate(tqdm(loader))``.
_ITER_WRAPPERS = frozenset({"enumerate", "tqdm", "iter"})
# Hook registrations on the accelerator, and the call that runs each kind of hook.
_HOOK_EVENTS = {
    "register_save_state_pre_hook": "save_state",
    "register_load_state_pre_hook": "load_state",
}
_HOOK_NAMES = frozenset(_HOOK_EVENTS) | frozenset(_HOOK_EVENTS.values())
# Calls whose result yields the same batches as the loader they are given.
_SAME_BATCHES = frozenset({"iter", "skip_first_batches", "tqdm"})
# Calls that read a loader without running a pass over it for training.
_LOADER_READERS = _ITER_WRAPPERS | {"len", "next"}
_EXITS = (cst.Return, cst.Continue, cst.Break, cst.Raise)
_MODEL_WORDS = ("model", "net", "module", "encoder", "decoder", "unet", "vae", "transformer")

RunsOn = Literal["main", "others", "all", "unknown"]


@dataclass(frozen=True)
class Prepared:
    """A name bound to the result of ``accelerator.prepare``."""

    name: str
    source: str | None  # the argument's dotted name, when it was a name
    role: Role | None
    accelerator: str  # the receiver of the prepare call


@dataclass(frozen=True)
class Where:
    """Where a node sits: its innermost function and the process guards around it there."""

    function: cst.FunctionDef | None
    guarded: bool  # under ``if accelerator.is_main_process:`` (or after an early exit of others)
    others: bool = False  # in the ``else`` of such a guard: every process but the main one
    accelerator: bool = False  # an accelerator name is visible here
    branch: tuple[cst.If, int] | None = (
        None  # the innermost guard ``if`` and side (1 body, -1 else)
    )
    first: bool = False  # under ``with accelerator.main_process_first():``


@dataclass(eq=False)
class Loop:
    """A ``for`` or ``while`` loop and what runs on each of its iterations.

    Only a loop that steps an optimizer (or runs a backward pass) itself is a batch loop; one
    that does not, but runs such a loop, a function with such a loop, or hands a prepared loader
    to a call, repeats a whole training pass per iteration: an epoch loop. A function that takes
    one step (``train_step(model, batch, optimizer)``), even over micro-batches, is no training
    pass: its loop must run over a loader (or be a ``while``) to count.
    """

    node: cst.For | cst.While
    passes: bool  # runs over a loader, or a ``while``: what a training pass looks like
    trains: bool = False  # an optimizer step or a backward pass at this loop's own level
    inner_trains: bool = False  # a loop inside it trains
    hands_over: bool = False  # passes a prepared loader to a call
    calls: set[str] = field(default_factory=set)  # names of the functions it calls


_Bindings = tuple[dict[str, "Prepared | None"], dict[str, "Prepared | None"]]  # prepared, parts


def _agree(one: _Bindings, other: _Bindings) -> _Bindings:
    """What is known after two paths join: a binding both paths agree on, else unknown."""
    joined: list[dict[str, Prepared | None]] = []
    for a, b in zip(one, other, strict=True):
        joined.append({k: a.get(k) if a.get(k) == b.get(k) else None for k in a.keys() | b.keys()})
    return joined[0], joined[1]


@dataclass(eq=False)
class _Class:
    """What a class's methods bind on ``self``, for its other methods (source order)."""

    name: str
    prepared: dict[str, Prepared] = field(default_factory=dict)  # ``self.model`` -> ...
    accelerators: set[str] = field(default_factory=set)  # ``self.accelerator``


@dataclass(eq=False)
class _Scope:
    node: cst.Module | cst.FunctionDef
    params: frozenset[str]
    cls: _Class | None = None  # the class this function is a method of
    guard: int = 0
    others: int = 0
    first: int = 0  # open ``main_process_first()`` blocks
    branches: list[tuple[cst.If, int, int]] = field(default_factory=list)  # if, side, polarity
    prepared: dict[str, Prepared | None] = field(default_factory=dict)
    parts: dict[str, Prepared | None] = field(default_factory=dict)  # batch name -> its loader
    accelerators: set[str] = field(default_factory=set)
    loops: list[Loop] = field(default_factory=list)  # the open loops, innermost last
    # Per open ``if``: the bindings before it, and at the end of its body once the else starts.
    paths: list[tuple[_Bindings, _Bindings | None]] = field(default_factory=list)
    exits: list[int] = field(default_factory=list)  # per open block: guards added by early exits
    # The test of an ``if`` with no else -> what its body prepared that the join made unknown:
    # a later ``if`` on the same test runs on the same path, where it is prepared.
    on_test: dict[str, dict[str, Prepared]] = field(default_factory=dict)


def name_role(name: str | None) -> Role | None:
    """The role a conventional variable name suggests (``train_dataloader``, ``lr_scheduler``)."""
    if not name:
        return None
    last = name.rsplit(".", 1)[-1].lower()
    if "loader" in last or last == "dl" or last.endswith("_dl"):
        return Role.DATALOADER
    if "sched" in last:
        return Role.SCHEDULER
    if "optim" in last or last == "opt" or last.endswith("_opt"):
        return Role.OPTIMIZER
    if any(word in last for word in _MODEL_WORDS):
        return Role.MODEL
    return None


def guard_polarity(test: cst.BaseExpression, aliases: dict[str, int] | None = None) -> int:
    """+1 if ``test`` is true only on the main process, -1 if only elsewhere, 0 if unknown.

    ``aliases`` maps names that hold such a test (``is_main = accelerator.is_main_process``).
    """
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        return -guard_polarity(test.expression, aliases)
    if isinstance(test, cst.BooleanOperation):
        sides = (guard_polarity(test.left, aliases), guard_polarity(test.right, aliases))
        if isinstance(test.operator, cst.And):  # true only where both are: either side narrows
            return 1 if 1 in sides else -1 if -1 in sides else 0
        return -1 if -1 in sides else 0
    if isinstance(test, cst.Call):
        return 1 if _GUARD_NAME.match(callee_name(test) or "") else 0
    name = dotted_name(test)
    if name is not None:
        if aliases and name in aliases:
            return aliases[name]
        return 1 if _GUARD_NAME.match(name.rsplit(".", 1)[-1]) else 0
    if isinstance(test, cst.Comparison) and len(test.comparisons) == 1:
        return _rank_comparison(test)
    return 0


def _rank_comparison(test: cst.Comparison) -> int:
    left = test.left
    left_name = callee_name(left) if isinstance(left, cst.Call) else dotted_name(left)
    if left_name is None or left_name.rsplit(".", 1)[-1] not in RANK_NAMES:
        return 0
    target = test.comparisons[0]
    op, right = target.operator, target.comparator
    if isinstance(right, cst.Integer) and right.value == "0":
        return 1 if isinstance(op, cst.Equal) else -1 if isinstance(op, cst.NotEqual) else 0
    if isinstance(op, cst.In | cst.NotIn) and isinstance(right, (cst.List, cst.Tuple, cst.Set)):
        values = {_code(e.value) for e in right.elements}  # -1: not distributed at all
        if values <= {"0", "-1"}:
            return 1 if isinstance(op, cst.In) else -1
    return 0


def batches_walked(
    iterable: cst.BaseExpression, target: cst.BaseExpression
) -> tuple[cst.BaseExpression, cst.BaseExpression] | None:
    """What a ``for`` walks under its wrappers (``enumerate(tqdm(loader))``), and the part of
    its target bound to the items; None when the target does not unpack as ``enumerate`` gives."""
    while isinstance(iterable, cst.Call) and callee_name(iterable) in _ITER_WRAPPERS:
        if not iterable.args:
            return None
        if callee_name(iterable) == "enumerate":
            if not isinstance(target, cst.Tuple) or len(target.elements) != 2:
                return None
            target = target.elements[1].value
        iterable = iterable.args[0].value
    return iterable, target


def prepare_call(value: cst.BaseExpression | None, facts: Facts) -> cst.Call | None:
    """``value`` as ``<accelerator>.prepare(...)``, else None."""
    if (
        isinstance(value, cst.Call)
        and isinstance(value.func, cst.Attribute)
        and value.func.attr.value == "prepare"
        and facts.is_accelerator(value.func.value)
    ):
        return value
    return None


# Accelerator methods every process must call together; the sharded ones only under
# DeepSpeed/FSDP, where they gather or scatter shards (with DDP they run alone).
SHARDED_COLLECTIVES = frozenset({"save_state", "load_state", "save_model", "get_state_dict"})
ACCELERATOR_COLLECTIVES = SHARDED_COLLECTIVES | {
    "gather", "gather_for_metrics", "reduce", "pad_across_processes", "wait_for_everyone",
    "broadcast",
}  # fmt: skip
DIST_COLLECTIVES = frozenset(
    {
        "barrier", "all_reduce", "all_gather", "all_gather_object", "broadcast",
        "broadcast_object_list", "reduce", "gather", "scatter", "all_to_all", "reduce_scatter",
    }
)  # fmt: skip
_DIST_MODULES = frozenset({"dist", "torch.distributed"})


def collective(call: cst.Call, facts: Facts) -> str | None:
    """The method name when ``call`` is a collective (``accelerator.gather``, ``dist.barrier``)."""
    func = call.func
    if not isinstance(func, cst.Attribute):
        return None
    method = func.attr.value
    if (method in ACCELERATOR_COLLECTIVES and facts.is_accelerator(func.value)) or (
        method in DIST_COLLECTIVES and dotted_name(func.value) in _DIST_MODULES
    ):
        return method
    return None


class _FirstCollective(cst.CSTVisitor):
    def __init__(self, facts: Facts) -> None:
        super().__init__()
        self.facts = facts
        self.found: str | None = None

    def visit_Call(self, node: cst.Call) -> bool:
        self.found = self.found or collective(node, self.facts)
        return self.found is None


class _FirstShared(_FirstCollective):
    def visit_Call(self, node: cst.Call) -> bool:
        self.found = self.found or self._model(node)
        return super().visit_Call(node)

    def _model(self, call: cst.Call) -> str | None:
        """The prepared model ``call`` runs: ``model(x)`` (only a model is called), or a method
        of one (``model.generate(x)``)."""
        func = call.func
        receiver = func.value if isinstance(func, cst.Attribute) else func
        prepared = self.facts.prepared(receiver)
        if prepared is None or (receiver is not func and prepared.role is not Role.MODEL):
            return None
        return prepared.name


def first_shared_call(node: cst.CSTNode, facts: Facts) -> str | None:
    """The first call in ``node`` that every process must make together: a collective (its
    method name) or a prepared model (its name: under DeepSpeed/FSDP its forward gathers
    shards, and a DDP model with buffers broadcasts them). Asked during the traversal, where
    what is prepared is known."""
    finder = _FirstShared(facts)
    node.visit(finder)
    return finder.found


def mentions_rank(node: cst.CSTNode) -> bool:
    """Whether ``node`` reads the process index: a path built from it names a per-process file,
    which every process may write."""
    code = _code(node)
    return any(name in code for name in RANK_NAMES)


def _code(node: cst.CSTNode) -> str:
    return cst.Module([]).code_for_node(node)


def _always(test: cst.BaseExpression) -> bool:
    """``True`` or a non-zero number: a test with one outcome."""
    if isinstance(test, cst.Name):
        return test.value == "True"
    return isinstance(test, cst.Integer) and test.evaluated_value != 0


def _exits(block: cst.BaseSuite) -> bool:
    """Whether ``block`` ends by leaving: return/continue/break/raise or ``sys.exit()``."""
    lines = block.body
    if not lines:
        return False
    last = lines[-1]
    if isinstance(last, cst.SimpleStatementLine):
        last = last.body[-1]
    if isinstance(last, cst.Expr) and isinstance(last.value, cst.Call):
        return callee_name(last.value) in {"exit", "quit"}
    return isinstance(last, _EXITS)


class Facts:
    """The facts visitor; the engine calls its handlers around every rule's."""

    def __init__(self, source: str, path: str | None = None) -> None:
        self.source = source  # the text the tree was parsed from
        self.path = path  # its file, whose neighbours a rule may read (None: no file)
        self.accelerators: dict[str, cst.Call] = {}
        self.roles: dict[str, Role] = {}
        self.prepared_anywhere: set[str] = set()  # argument names passed to any prepare call
        self.functions: dict[str, list[cst.FunctionDef]] = {}
        self.loader_loops: list[tuple[cst.For, Prepared]] = []
        self._scopes: list[_Scope] = []
        self._sites: list[tuple[str, Where]] = []  # a function name called or passed, and where
        self.methods: dict[str, list[cst.FunctionDef]] = {}
        self._method_sites: list[tuple[str, Where]] = []  # ``x.name(...)``, and where
        self._classes: list[tuple[_Class, int]] = []  # open classes, with the scope depth
        # ``accelerator.register_save_state_pre_hook(f)``: f runs where ``save_state`` runs.
        self._hooks: list[tuple[str, str]] = []  # (accelerator method, function name)
        self._hooked_calls: list[tuple[str, Where]] = []  # (accelerator method, where)
        self._reach: dict[cst.FunctionDef, set[str]] | None = None
        self._guard_aliases: dict[str, int] = {}
        self._training_functions: set[str] = set()  # names of functions with a training pass
        # Functions that create an Accelerator on whatever process runs them: every process must
        # (it starts the process group), so they run on all, called here or by a CLI (fire).
        self._entries: set[cst.FunctionDef] = set()

    # -- questions rules ask -------------------------------------------------------------------

    @property
    def creates_accelerator(self) -> bool:
        return bool(self.accelerators)

    def is_accelerator(self, expr: cst.BaseExpression) -> bool:
        name = dotted_name(expr)
        return name is not None and (
            name in self.accelerators or name.rsplit(".", 1)[-1] == "accelerator"
        )

    def prepared(self, expr: cst.BaseExpression) -> Prepared | None:
        """What ``expr`` came out of ``prepare`` as, if it is a name bound to its result here."""
        return self._lookup(dotted_name(expr), "prepared")

    def batch_of(self, expr: cst.BaseExpression) -> Prepared | None:
        """The prepared loader whose batch (or a part of one) the name ``expr`` holds."""
        return self._lookup(dotted_name(expr), "parts")

    def role(self, expr: cst.BaseExpression) -> Role | None:
        prepared = self.prepared(expr)
        if prepared is not None and prepared.role is not None:
            return prepared.role
        name = dotted_name(expr)
        return self.roles.get(name) if name else None

    def accelerator_here(self) -> str | None:
        """The one accelerator name visible at this point, for fixes that must name it."""
        names = self.visible_accelerators()
        return names.pop() if len(names) == 1 else None

    def visible_accelerators(self) -> set[str]:
        """The names that hold an accelerator at this point, in this scope or around it."""
        names: set[str] = set()
        for scope in self._scopes:
            names |= scope.accelerators
            if scope.cls is not None:
                names |= scope.cls.accelerators
            names |= {p for p in scope.params if p == "accelerator"}
        return names

    def function(self) -> cst.FunctionDef | None:
        """The innermost function around this point (None: module level); cheaper than where()."""
        node = self._scopes[-1].node
        return node if isinstance(node, cst.FunctionDef) else None

    def where(self) -> Where:
        scope = self._scopes[-1]
        function = self.function()
        visible = bool(self.visible_accelerators())
        branch = next(((n, side) for n, side, p in reversed(scope.branches) if p), None)
        return Where(function, scope.guard > 0, scope.others > 0, visible, branch, scope.first > 0)

    def runs_on(self, where: Where) -> RunsOn:
        """Which processes run code at ``where``: the main one, the others, all, or unknown."""
        if where.guarded:
            return "main"
        if where.others:
            return "others"
        if where.function is None:
            return "all"
        reach = self._reachability().get(where.function, set())
        return next((kind for kind in ("all", "main", "others") if kind in reach), "unknown")

    def runs_first(self, where: Where) -> bool:
        """Whether code at ``where`` runs under ``main_process_first()``: in such a block, or in
        a function every call of which (in this file) is, itself or through its callers."""
        if where.first:
            return True
        if where.function is None:
            return False
        return where.function in self._first_only()

    def _first_only(self) -> set[cst.FunctionDef]:
        """The functions run only from ``main_process_first()`` blocks: the largest set in
        which every call site is in such a block or in a function of the set."""
        called = {f for name, _w in self._sites for f in self.functions.get(name, ())}
        found = set(called)
        changed = True
        while changed:
            changed = False
            for name, where in self._sites:
                for function in self.functions.get(name, ()):
                    if function in found and not (where.first or where.function in found):
                        found.discard(function)
                        changed = True
        return found

    def innermost_loop(self) -> Loop | None:
        """The innermost loop around this point in the current function."""
        loops = self._scopes[-1].loops
        return loops[-1] if loops else None

    def repeats_training(self, loop: Loop) -> bool:
        """Whether ``loop`` is an epoch loop: each iteration runs a training pass it does not
        step itself. Final only once the module is read (``leave_Module``)."""
        return not loop.trains and (
            loop.inner_trains or loop.hands_over or bool(loop.calls & self._training_functions)
        )

    def called_with_accelerator(self, function: cst.FunctionDef | None) -> bool:
        """Whether some call of ``function`` in this file has an accelerator in sight."""
        if function is None:
            return False
        name = function.name.value
        return any(site == name and where.accelerator for site, where in self._sites)

    # -- scopes and guards ----------------------------------------------------------------------

    def visit_Module(self, node: cst.Module) -> None:
        self._scopes.append(_Scope(node, frozenset(), exits=[0]))

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self._classes.append((_Class(node.name.value), len(self._scopes)))

    def leave_ClassDef(self, node: cst.ClassDef) -> None:
        self._classes.pop()

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.functions.setdefault(node.name.value, []).append(node)
        cls = None
        if self._classes and self._classes[-1][1] == len(self._scopes):  # a method
            cls = self._classes[-1][0]
            self.methods.setdefault(node.name.value, []).append(node)
            if node.name.value == "__init__":  # ``Trainer(...)`` runs it
                self.functions.setdefault(cls.name, []).append(node)
        p = node.params
        params = frozenset(
            x.name.value for x in (*p.posonly_params, *p.params, *p.kwonly_params)
        ) | {x.name.value for x in (p.star_arg, p.star_kwarg) if isinstance(x, cst.Param)}
        guarded = any(
            callee_name(d.decorator) in GUARD_DECORATORS
            if isinstance(d.decorator, cst.Call)
            else (dotted_name(d.decorator) or "").rsplit(".", 1)[-1] in GUARD_DECORATORS
            for d in node.decorators
        )
        self._scopes.append(_Scope(node, params, cls, guard=int(guarded)))

    def leave_FunctionDef(self, node: cst.FunctionDef) -> None:
        self._scopes.pop()

    def visit_IndentedBlock(self, node: cst.IndentedBlock) -> None:
        self._scopes[-1].exits.append(0)

    def leave_IndentedBlock(self, node: cst.IndentedBlock) -> None:
        scope = self._scopes[-1]
        scope.guard -= scope.exits.pop()

    def visit_If_body(self, node: cst.If) -> None:
        self._enter_branch(node, 1)
        scope = self._scopes[-1]
        scope.paths.append(((dict(scope.prepared), dict(scope.parts)), None))
        if scope.on_test:
            for name, prepared in scope.on_test.get(_code(node.test), {}).items():
                if scope.prepared.get(name) is None:
                    scope.prepared[name] = prepared

    def leave_If_body(self, node: cst.If) -> None:
        self._leave_branch()

    def visit_If_orelse(self, node: cst.If) -> None:
        """The else branch starts from what was known before the ``if``, not after its body."""
        self._enter_branch(node, -1)
        scope = self._scopes[-1]
        before, _ = scope.paths[-1]
        scope.paths[-1] = (before, (scope.prepared, scope.parts))
        scope.prepared, scope.parts = dict(before[0]), dict(before[1])

    def leave_If_orelse(self, node: cst.If) -> None:
        self._leave_branch()

    def _enter_branch(self, node: cst.If, side: int) -> None:
        """The body (side 1) or else branch (-1) of ``node``; guards count while inside."""
        polarity = guard_polarity(node.test, self._guard_aliases) * side
        self._scopes[-1].branches.append((node, side, polarity))
        self._count_guard(polarity, 1)

    def _leave_branch(self) -> None:
        _, _, polarity = self._scopes[-1].branches.pop()
        self._count_guard(polarity, -1)

    def _count_guard(self, polarity: int, step: int) -> None:
        """Entering (``step`` 1) or leaving (-1) code under a test of this ``polarity``."""
        scope = self._scopes[-1]
        scope.guard += step * (polarity > 0)
        scope.others += step * (polarity < 0)

    # ``SummaryWriter(...) if accelerator.is_main_process else None`` guards like an ``if``,
    # with no branch of its own to place a fix in.
    def visit_IfExp_body(self, node: cst.IfExp) -> None:
        self._count_guard(guard_polarity(node.test, self._guard_aliases), 1)

    def leave_IfExp_body(self, node: cst.IfExp) -> None:
        self._count_guard(guard_polarity(node.test, self._guard_aliases), -1)

    def visit_IfExp_orelse(self, node: cst.IfExp) -> None:
        self._count_guard(-guard_polarity(node.test, self._guard_aliases), 1)

    def leave_IfExp_orelse(self, node: cst.IfExp) -> None:
        self._count_guard(-guard_polarity(node.test, self._guard_aliases), -1)

    def leave_If(self, node: cst.If) -> None:
        """``if not accelerator.is_main_process: return`` guards the rest of the block."""
        self._join_paths(node)
        polarity = guard_polarity(node.test, self._guard_aliases)
        if _exits(node.body) and node.orelse is None and polarity < 0:
            scope = self._scopes[-1]
            scope.guard += 1
            scope.exits[-1] += 1

    def _join_paths(self, node: cst.If) -> None:
        """After an ``if``, a name is prepared only if every path that goes on says so: a model
        prepared in one branch and moved by hand in the other is neither for sure."""
        scope = self._scopes[-1]
        before, body = scope.paths.pop()
        here = (scope.prepared, scope.parts)
        body, other = (here, before) if body is None else (body, here)
        else_exits = isinstance(node.orelse, cst.Else) and _exits(node.orelse.body)
        if _always(node.test):  # ``if True:``: the body is the only path
            scope.prepared, scope.parts = body
        elif _exits(node.body) != else_exits:
            scope.prepared, scope.parts = other if _exits(node.body) else body
        else:
            scope.prepared, scope.parts = _agree(body, other)
            if node.orelse is None:
                lost = {
                    name: prepared
                    for name, prepared in body[0].items()
                    if prepared is not None and scope.prepared.get(name) is None
                }
                if lost:
                    scope.on_test.setdefault(_code(node.test), {}).update(lost)

    # -- bindings -------------------------------------------------------------------------------

    def visit_Call(self, node: cst.Call) -> None:
        if self._note_hook(node):
            return
        if isinstance(node.func, cst.Name):
            self._sites.append((node.func.value, self.where()))
        elif isinstance(node.func, cst.Attribute) and (
            node.func.attr.value in self.methods  # defined above, as most are
            or (isinstance(node.func.value, cst.Name) and node.func.value.value == "self")
        ):
            self._method_sites.append((node.func.attr.value, self.where()))
        for arg in node.args:
            if isinstance(arg.value, cst.Name):
                self._sites.append((arg.value.value, self.where()))
        self._note_training(node)
        if isinstance(node.func, cst.Attribute) and node.func.attr.value in {
            "parameters",
            "named_parameters",
        }:
            name = dotted_name(node.func.value)
            if name is not None:
                self.roles.setdefault(name, Role.MODEL)
        call = prepare_call(node, self)
        if call is not None:
            self.prepared_anywhere |= {
                n for a in call.args if (n := dotted_name(a.value)) is not None
            }

    def leave_Assign(self, node: cst.Assign) -> None:
        for target in node.targets:
            self._bind(target.target, node.value)

    def leave_AnnAssign(self, node: cst.AnnAssign) -> None:
        if node.value is not None:
            self._bind(node.target, node.value)

    def visit_For(self, node: cst.For) -> None:
        loader, target = self._loader_loop(node.iter, node.target)
        self._forget(target_names(node.target))
        if loader is not None and target is not None:
            self.loader_loops.append((node, loader))
            for name in target_names(target):
                self._scopes[-1].parts[name] = loader

    def leave_For(self, node: cst.For) -> None:
        if self.loader_loops and self.loader_loops[-1][0] is node:
            self.loader_loops.pop()
        self._close_loop()

    def visit_For_body(self, node: cst.For) -> None:
        iterable = node.iter
        while isinstance(iterable, cst.Call) and callee_name(iterable) in _ITER_WRAPPERS:
            if not iterable.args:
                break
            iterable = iterable.args[0].value
        role = self.role(iterable) or name_role(dotted_name(iterable))
        self._scopes[-1].loops.append(Loop(node, role is Role.DATALOADER))

    def visit_While_body(self, node: cst.While) -> None:
        self._scopes[-1].loops.append(Loop(node, True))

    def leave_While(self, node: cst.While) -> None:
        self._close_loop()

    def _close_loop(self) -> None:
        """What a loop runs, its enclosing loop runs too."""
        loops = self._scopes[-1].loops
        inner = loops.pop()
        if loops:
            outer = loops[-1]
            outer.inner_trains |= inner.trains or inner.inner_trains
            outer.hands_over |= inner.hands_over
            outer.calls |= inner.calls

    def _note_hook(self, call: cst.Call) -> bool:
        """Record a hook registered on the accelerator (True), or a call that runs hooks."""
        func = call.func
        if not isinstance(func, cst.Attribute) or func.attr.value not in _HOOK_NAMES:
            return False
        if not self.is_accelerator(func.value):
            return False
        event = _HOOK_EVENTS.get(func.attr.value)
        if event is not None and call.args and isinstance(call.args[0].value, cst.Name):
            self._hooks.append((event, call.args[0].value.value))
            return True
        if event is None:
            self._hooked_calls.append((func.attr.value, self.where()))
        return False

    def _note_training(self, call: cst.Call) -> None:
        """A training step (``optimizer.step()``, a backward pass) or another call in a loop."""
        scope = self._scopes[-1]
        if not scope.loops:
            return
        loop = scope.loops[-1]
        func = call.func
        receiver = func.value if isinstance(func, cst.Attribute) else None
        method = callee_name(call)
        trains = method == "backward" or (
            method == "step"
            and receiver is not None
            and (self.role(receiver) or name_role(dotted_name(receiver))) is Role.OPTIMIZER
        )
        if trains:
            loop.trains = True
            if loop.passes and isinstance(scope.node, cst.FunctionDef):
                self._training_functions.add(scope.node.name.value)
        elif method is not None:
            loop.calls.add(method)
        if method not in _LOADER_READERS and not (receiver and self.is_accelerator(receiver)):
            loop.hands_over |= any(
                (p := self.prepared(a.value)) is not None and p.role is Role.DATALOADER
                for a in call.args
            )

    def visit_With(self, node: cst.With) -> None:
        self._scopes[-1].first += _main_first(node)

    def leave_With(self, node: cst.With) -> None:
        self._scopes[-1].first -= _main_first(node)

    def visit_WithItem(self, node: cst.WithItem) -> None:
        if node.asname is not None:
            self._forget(target_names(node.asname.name))

    def _bind(self, target: cst.BaseExpression, value: cst.BaseExpression) -> None:
        scope = self._scopes[-1]
        names = list(target_names(target))
        same, batch = self._same_object(value), self._batch_source(value)  # before rebinding
        self._forget(names)
        if isinstance(value, cst.Call) and callee_name(value) == "Accelerator" and names:
            self.accelerators[names[0]] = value
            where = self.where()
            if where.function is not None and not (where.guarded or where.others):
                self._entries.add(where.function)
            self._add_accelerator(names[0])
            return
        if len(names) == 1:
            if names[0].rsplit(".", 1)[-1] == "accelerator":  # built by a helper, by convention
                self._add_accelerator(names[0])
            polarity = guard_polarity(value, self._guard_aliases)
            if polarity:
                self._guard_aliases[names[0]] = polarity
            else:
                self._guard_aliases.pop(names[0], None)
        role = constructor_role(value)
        if role is not None and len(names) == 1:
            self.roles[names[0]] = role
        call = prepare_call(value, self)
        if call is not None and not isinstance(target, (cst.Tuple, cst.List)):
            names = names[:1] if len(call.args) == 1 else []
        if call is not None and len(names) == len(call.args):
            for name, arg in zip(names, call.args, strict=True):
                self._set_prepared(name, arg.value, call, None)
            return
        one = self._prepare_one(value)
        if names and one is not None:
            role = PREPARE_ONE.get(callee_name(one) or "")
            self._set_prepared(names[0], one.args[0].value, one, role)
        elif len(names) == 1:
            scope.prepared[names[0]] = same
        for name in names:
            scope.parts[name] = batch

    def _prepare_one(self, value: cst.BaseExpression) -> cst.Call | None:
        """``value`` as ``accelerator.prepare_model(x)`` (or ``_optimizer``, ...), else None."""
        if (
            isinstance(value, cst.Call)
            and isinstance(value.func, cst.Attribute)
            and value.func.attr.value in PREPARE_ONE
            and value.args
            and self.is_accelerator(value.func.value)
        ):
            return value
        return None

    def _same_object(self, value: cst.BaseExpression) -> Prepared | None:
        """The prepared object ``value`` still is: another name for it (``active = loader``),
        or the same batches (``iter(loader)``, ``accelerator.skip_first_batches(loader, n)``)."""
        if isinstance(value, (cst.Name, cst.Attribute)):
            return self.prepared(value)
        if isinstance(value, cst.Call) and value.args and callee_name(value) in _SAME_BATCHES:
            loader = self.prepared(value.args[0].value)
            return loader if loader is not None and loader.role is Role.DATALOADER else None
        return None

    def _batch_source(self, value: cst.BaseExpression) -> Prepared | None:
        """The prepared loader whose batch ``value`` is: ``next(it)``, ``batch["x"]``, ``b.x``."""
        if isinstance(value, cst.Call) and callee_name(value) == "next" and value.args:
            loader = self.prepared(value.args[0].value)
            return loader if loader is not None and loader.role is Role.DATALOADER else None
        source = value.value if isinstance(value, (cst.Subscript, cst.Attribute)) else value
        return self.batch_of(source) if isinstance(source, (cst.Name, cst.Attribute)) else None

    def _add_accelerator(self, name: str) -> None:
        scope = self._scopes[-1]
        scope.accelerators.add(name)
        if scope.cls is not None and name.startswith("self."):
            scope.cls.accelerators.add(name)

    def _set_prepared(
        self, name: str, arg: cst.BaseExpression, call: cst.Call, role: Role | None
    ) -> None:
        source = dotted_name(arg)
        if role is None:
            role = constructor_role(arg) or (self.roles.get(source) if source else None)
            role = role or name_role(source) or name_role(name)
        if role is not None:
            self.roles.setdefault(name, role)
        receiver = call.func.value if isinstance(call.func, cst.Attribute) else call.func
        accelerator = dotted_name(receiver) or "accelerator"
        scope = self._scopes[-1]
        scope.prepared[name] = Prepared(name, source, role, accelerator)
        if scope.cls is not None and name.startswith("self."):
            scope.cls.prepared[name] = scope.prepared[name]

    def _forget(self, names: Iterator[str] | list[str]) -> None:
        scope = self._scopes[-1]
        for name in names:
            scope.prepared[name] = None
            scope.parts[name] = None
            scope.accelerators.discard(name)
            for known in scope.on_test.values():
                known.pop(name, None)
            if scope.cls is not None:
                scope.cls.prepared.pop(name, None)

    def _loader_loop(
        self, iterable: cst.BaseExpression, target: cst.BaseExpression
    ) -> tuple[Prepared | None, cst.BaseExpression | None]:
        """The prepared loader a ``for`` walks and the part of its target bound to batches."""
        walked = batches_walked(iterable, target)
        loader = self.prepared(walked[0]) if walked is not None else None
        if walked is None or loader is None or loader.role is not Role.DATALOADER:
            return None, None
        return loader, walked[1]

    def _lookup(self, name: str | None, kind: Literal["prepared", "parts"]) -> Prepared | None:
        if name is None:
            return None
        for scope in reversed(self._scopes):
            table = getattr(scope, kind)
            if name in table:
                return table[name]
            root = name.split(".", 1)[0]
            if root in scope.params:  # another object: only ``self`` is known, by its class
                if kind == "prepared" and root == "self" and scope.cls is not None:
                    return scope.cls.prepared.get(name)
                return None
        return None

    def _hook_sites(self) -> list[tuple[str, Where]]:
        """A registered hook is called wherever the call that runs it is."""
        return [
            (function, where)
            for event, function in self._hooks
            for method, where in self._hooked_calls
            if method == event
        ]

    def _reachability(self) -> dict[cst.FunctionDef, set[str]]:
        """For each function: does some call run it on all processes, on the main one, or both."""
        if self._reach is not None:
            return self._reach
        reach: dict[cst.FunctionDef, set[str]] = {function: {"all"} for function in self._entries}
        sites = [(name, where, self.functions) for name, where in self._sites + self._hook_sites()]
        sites += [(name, where, self.methods) for name, where in self._method_sites]
        sites = [site for site in sites if site[0] in site[2]]
        changed = True
        while changed:
            changed = False
            for name, where, called in sites:
                for function in called[name]:
                    if where.function is function:
                        continue
                    if where.guarded:
                        new = {"main"}
                    elif where.others:
                        new = {"others"}
                    elif where.function is None:
                        new = {"all"}
                    else:
                        new = reach.get(where.function, set())
                    if not new <= reach.setdefault(function, set()):
                        reach[function] |= new
                        changed = True
        self._reach = reach
        return reach


def _main_first(node: cst.With) -> int:
    """1 for ``with accelerator.main_process_first():`` (or its per-machine form), else 0."""
    return int(
        any(isinstance(i.item, cst.Call) and callee_name(i.item) in _FIRST for i in node.items)
    )


_FIRST = frozenset({"main_process_first", "local_main_process_first"})
