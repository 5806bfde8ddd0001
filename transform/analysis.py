"""One pass over a script: which names are the training objects, where they are built and used.

Roles come from three kinds of evidence, strongest first: the constructor that builds a name
(``torch.optim.SGD(...)``), how the name is used (``opt(model.parameters())`` makes ``model`` a
model, ``for batch in loader`` with a ``.backward()`` inside makes ``loader`` a loader), and call
sites that pass a name into a function of the same file (``train(model, loader)`` gives the
parameters the arguments' roles, and back; ``Trainer(model, ...)`` reaches ``__init__``, and
``model, optimizer = build()`` what ``build`` returns). ``self.x`` attributes are tracked per class,
and one set once from a name (``self.model = model``) holds what that name holds.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass, field

import libcst as cst

from accelify.transform.lines import start_lines
from accelify.transform.loss_scaler import loss_scaler_beside
from accelify.transform.names import NameCollector, Names
from accelify.transform.neighbours import class_passes_through, passes_through
from accelify.transform.patterns import (
    CLOSURE_OPTIMIZERS,
    SCHEDULERS,
    Role,
    callee_name,
    constructor_role,
    dotted_name,
    is_device,
    method_call,
    target_names,
)
from accelify.transform.sources import python_ast
from accelify.transform.walk import Visitor, nodes, walk

# Wrappers around a loader in a ``for`` statement whose items are still the loader's batches.
# Calls that hand on what their first argument yields, item for item (``enumerate`` numbers it).
PASS_ON = frozenset({"tqdm", "iter"})
_ITER_WRAPPERS = PASS_ON | {"enumerate"}
_LOOPS = (cst.For, cst.While)
_NESTED_BLOCKS = (cst.If, cst.For, cst.While, cst.Try, cst.With, cst.Else, cst.ExceptHandler)
TRAINING_ROLES = (Role.MODEL, Role.OPTIMIZER, Role.DATALOADER, Role.SCHEDULER)


@dataclass(eq=False)
class Scope:
    """The module, or one function/method, with the statements directly in its body."""

    node: cst.Module | cst.FunctionDef
    parent: Scope | None
    cls: cst.ClassDef | None = None

    @property
    def body(self) -> Sequence[cst.BaseStatement]:
        body = self.node.body
        return body if isinstance(body, Sequence) else body.body  # type: ignore[return-value]

    @property
    def is_module(self) -> bool:
        return isinstance(self.node, cst.Module)

    @property
    def name(self) -> str:
        return "<module>" if isinstance(self.node, cst.Module) else self.node.name.value

    @property
    def params(self) -> list[str]:
        if isinstance(self.node, cst.Module):
            return []
        p = self.node.params
        return [x.name.value for x in (*p.posonly_params, *p.params, *p.kwonly_params)]


@dataclass(eq=False)
class Binding:
    """One assignment of a tracked name."""

    key: str  # "model", or "self.model" for attributes
    scope: Scope
    statement: cst.BaseStatement  # the top-level statement of ``scope`` that contains it
    node: cst.BaseSmallStatement | cst.CSTNode  # the Assign (or AugAssign/AnnAssign)
    value: cst.BaseExpression | None
    nested: bool  # inside an if/for/while/try of the scope
    in_loop: bool


@dataclass(eq=False)
class Loop:
    """A ``for`` (over something) or a ``while``; the batch names are what its target binds."""

    node: cst.For | cst.While
    scope: Scope
    iterable: str | None  # the loader's key, when a ``for`` walks a plain name
    batch_names: set[str]
    trains: bool = False  # a ``.backward()`` runs inside, in this function
    iterables: tuple[str, ...] = ()  # every loader a ``for`` walks (``zip(a, b)`` walks two)


@dataclass
class Analysis:
    module: cst.Module
    path: str = "<string>"  # where the file is: the modules beside it may be read
    names: Names = field(default_factory=Names)
    scopes: list[Scope] = field(default_factory=list)
    bindings: list[Binding] = field(default_factory=list)
    loops: list[Loop] = field(default_factory=list)
    roles: dict[tuple[int, str], Role] = field(default_factory=dict)
    # Every ``x.backward(...)`` call with the scope and innermost loop it runs in, and every
    # call of a loss scaler that runs one (``loss_scaler(loss, optimizer, ...)``).
    backward_calls: list[tuple[cst.Call, Scope, Loop | None]] = field(default_factory=list)
    # Parent links for statements and blocks, for steps that need to climb.
    parents: dict[int, cst.CSTNode] = field(default_factory=dict)
    scope_of: dict[int, Scope] = field(default_factory=dict)  # id(any node) -> its scope
    model_classes: set[str] = field(default_factory=set)
    scheduler_classes: set[str] = field(default_factory=set)  # this file's LR schedulers
    functions: dict[str, Scope] = field(default_factory=dict)  # module-level defs and methods
    methods: dict[str, dict[str, Scope]] = field(default_factory=dict)  # class name -> its defs
    calls: list[tuple[cst.Call, Scope]] = field(default_factory=list)
    # ``(... for x in loader)`` and friends: (comprehension's for, scope, the walked name's key).
    comprehensions: list[tuple[cst.CompFor, Scope, str]] = field(default_factory=list)
    # ``x += ...`` targets (the name) with their scope: running sums and counters.
    augmented: list[tuple[str, Scope]] = field(default_factory=list)
    # Every assignment statement (``=``, ``+=``, annotated) with its scope, whatever its target.
    assignments: list[tuple[cst.Assign | cst.AugAssign | cst.AnnAssign, Scope]] = field(
        default_factory=list
    )
    # ``x.attr`` / ``self.x.attr`` reads of names the analysis can track, with their scope.
    attributes: list[tuple[cst.Attribute, Scope]] = field(default_factory=list)
    # (caller, name, callee, name) pairs that hold the same object: arguments and parameters,
    # ``self.x = x``, returned values (see ``_infer_roles``).
    links: list[tuple[Scope, str, Scope, str]] = field(default_factory=list)
    # ``metric_logger.log_every(loader, ...)`` calls (ids) whose method is proven to hand a loop
    # the loader's own items: a loop over one walks the loader (see ``_see_through``).
    through: set[int] = field(default_factory=set)
    left_calls: list[tuple[cst.Call, Scope]] = field(default_factory=list)  # in excluded code
    _lines: dict[int, int] | None = field(default=None, repr=False)
    _bound: set[tuple[int, str]] | None = field(default=None, repr=False)

    def line(self, node: cst.CSTNode) -> int:
        """The line ``node`` starts on, 0 for a node the steps made; computed at the first ask,
        since files with nothing to report never need any."""
        if self._lines is None:
            self._lines = start_lines(self.module)
        return self._lines.get(id(node), 0)

    def exclude(self, scopes: set[Scope]) -> None:
        """Forget what happens in ``scopes``, so no step touches code left for a human."""
        if not scopes:
            return
        self.bindings = [b for b in self.bindings if b.scope not in scopes]
        self._bound = None
        self.loops = [lp for lp in self.loops if lp.scope not in scopes]
        self.left_calls += [c for c in self.calls if c[1] in scopes]
        self.calls = [c for c in self.calls if c[1] not in scopes]
        self.assignments = [x for x in self.assignments if x[1] not in scopes]
        self.attributes = [x for x in self.attributes if x[1] not in scopes]
        self.comprehensions = [x for x in self.comprehensions if x[1] not in scopes]
        self.backward_calls = [c for c in self.backward_calls if c[1] not in scopes]

    def owner(self, scope: Scope, key: str) -> int:
        """Attributes belong to the class, plain names to the function (or module) using them."""
        if key.startswith("self.") and scope.cls is not None:
            return id(scope.cls)
        return id(scope.node)

    def role(self, scope: Scope, key: str) -> Role | None:
        found = self.roles.get((self.owner(scope, key), key))
        if found is None and self.reads_global(scope, key):
            return self.roles.get((id(self.scopes[0].node), key))
        return found

    def reads_global(self, scope: Scope, key: str) -> bool:
        """Whether ``key`` in ``scope`` is the module's global: a plain name the function
        neither binds nor takes as a parameter."""
        if key.startswith("self.") or key in scope.params or scope is self.scopes[0]:
            return False
        if self._bound is None:  # asked for every role look-up: an index, not a scan
            self._bound = {(id(b.scope), b.key) for b in self.bindings}
        return (id(scope), key) not in self._bound

    def bindings_of(self, role: Role) -> Iterator[Binding]:
        for b in self.bindings:
            if self.roles.get((self.owner(b.scope, b.key), b.key)) is role:
                yield b

    def parent(self, node: cst.CSTNode) -> cst.CSTNode | None:
        return self.parents.get(id(node))

    def enclosing(self, node: cst.CSTNode, kind: type | tuple[type, ...]) -> cst.CSTNode | None:
        current = self.parent(node)
        while current is not None and not isinstance(current, kind):
            current = self.parent(current)
        return current

    def contains(self, ancestor: cst.CSTNode, node: cst.CSTNode) -> bool:
        """Whether ``node`` lies inside ``ancestor`` (or is it)."""
        current: cst.CSTNode | None = node
        while current is not None and current is not ancestor:
            current = self.parent(current)
        return current is ancestor

    def statement_of(self, node: cst.CSTNode) -> cst.BaseStatement | None:
        """The innermost statement (line or compound) that contains ``node``."""
        current: cst.CSTNode | None = node
        while current is not None and not isinstance(current, cst.BaseStatement):
            current = self.parent(current)
        return current

    def holds_ordinal(self, scope: Scope, key: str) -> bool:
        """Whether ``key`` in ``scope`` only ever holds an integer literal (a GPU's number)."""
        return _only_ints(self, scope, key, self.links)

    def callee(self, call: cst.Call) -> Scope | None:
        """The function of this file that ``call`` runs: ``f(...)``, ``self.m(...)``, the
        ``__init__`` of a (non-module) class ``C(...)``, or ``obj.m(...)`` / ``C(...).m(...)``
        where ``obj`` is only ever bound to ``C(...)`` in the calling scope."""
        func = call.func
        if isinstance(func, cst.Attribute) and isinstance(func.value, cst.Call):
            cls = self.constructed_class(func.value)
            return self.methods[cls].get(func.attr.value) if cls else None
        name = dotted_name(func)
        if name is None:
            return None
        if (cls := self.constructed_class(call)) is not None:
            return self.methods[cls].get("__init__")
        head, _, method = name.rpartition(".")
        scope = self.scope_of[id(call)]
        if head and head != "self":
            cls = self.instance_class(scope, head)
            return self.methods[cls].get(method) if cls else None
        own = self.methods.get(scope.cls.name.value, {}) if head and scope.cls else {}
        return own.get(method) or self.functions.get(method)

    def constructed_class(self, call: cst.BaseExpression) -> str | None:
        """``C`` for ``C(...)`` building an instance of a class of this file that is not a
        module (a module's construction is its build, not a call into training code)."""
        name = dotted_name(call.func) if isinstance(call, cst.Call) else None
        if name in self.methods and name not in self.model_classes | self.scheduler_classes:
            return name
        return None

    def instance_class(self, scope: Scope, key: str) -> str | None:
        """The class of this file that ``key`` holds in ``scope``: every binding of it there
        builds one instance of the same class."""
        built = {
            self.constructed_class(b.value) if b.value is not None else None
            for b in self.bindings
            if b.scope is scope and b.key == key
        }
        return built.pop() if len(built) == 1 else None

    def loop_of(self, node: cst.CSTNode) -> Loop | None:
        loop_node = self.enclosing(node, cst.For)
        while loop_node is not None:
            loop = next((lp for lp in self.loops if lp.node is loop_node), None)
            if loop is not None and loop.iterable is not None:
                return loop
            loop_node = self.enclosing(loop_node, cst.For)
        return None


def key_of(node: cst.BaseExpression) -> str | None:
    """``x`` or ``self.x``: the only expressions whose role we track."""
    if isinstance(node, cst.Name):
        return node.value
    if (
        isinstance(node, cst.Attribute)
        and isinstance(node.value, cst.Name)
        and node.value.value == "self"
    ):
        return f"self.{node.attr.value}"
    return None


def unwrap_moves(value: cst.BaseExpression) -> cst.BaseExpression:
    """``Net().to(device).cuda()`` -> ``Net()``: the object a chain of moves starts from."""
    while (call := method_call(value, "to", "cuda")) is not None:
        value = call.func.value  # type: ignore[union-attr]
    return value


def loop_iterable(
    iterable: cst.BaseExpression,
    through: Collection[int] = (),
    wrappers: Collection[str] = _ITER_WRAPPERS,
) -> cst.BaseExpression:
    """``enumerate(tqdm(loader))`` -> ``loader``; also through the calls (ids) in ``through``
    (``Analysis.through``). With ``wrappers=PASS_ON``, an ``enumerate`` stays."""
    while (
        isinstance(iterable, cst.Call)
        and (callee_name(iterable) in wrappers or id(iterable) in through)
        and iterable.args
        and iterable.args[0].keyword is None
        and not iterable.args[0].star
    ):
        iterable = iterable.args[0].value
    return iterable


def zipped(iterable: cst.BaseExpression, through: Collection[int] = ()) -> list[cst.BaseExpression]:
    """``zip(a, tqdm(b))`` -> ``[a, b]``; anything else -> ``[iterable]``."""
    if (
        isinstance(iterable, cst.Call)
        and callee_name(iterable) == "zip"
        and all(arg.keyword is None and not arg.star for arg in iterable.args)
    ):
        return [loop_iterable(arg.value, through) for arg in iterable.args]
    return [iterable]


def mentions(node: cst.CSTNode, keys: set[str]) -> bool:
    """Whether ``node`` reads any of ``keys`` (names, or ``self.x`` attributes)."""
    finder = _KeyFinder(keys)
    walk(node, finder)
    return finder.found


def names_in(node: cst.CSTNode) -> list[cst.Name]:
    """The ``Name`` nodes under ``node``, not entering functions defined inside it."""
    finder = _NameCollector(node)
    walk(node, finder)
    return finder.found


def name_nodes(node: cst.CSTNode, name: str) -> list[cst.Name]:
    """Every ``Name`` spelling ``name`` under ``node``, inside functions and classes too."""
    return [n for n in nodes(node, cst.Name) if n.value == name]


class _NameCollector(Visitor):
    def __init__(self, root: cst.CSTNode) -> None:
        super().__init__()
        self.root = root
        self.found: list[cst.Name] = []

    def visit_Name(self, node: cst.Name) -> None:
        self.found.append(node)

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        return node is self.root  # nested functions have names of their own


class _KeyFinder(Visitor):
    def __init__(self, keys: set[str]) -> None:
        super().__init__()
        self.keys = keys
        self.found = False

    def visit_Name(self, node: cst.Name) -> bool:
        self.found = self.found or node.value in self.keys
        return not self.found

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        self.found = self.found or key_of(node) in self.keys
        return not self.found


def analyse(module: cst.Module, path: str = "<string>") -> Analysis:
    """The facts every step and rule reads; ``path`` locates the modules beside the file (its
    classes' methods may be read, never run)."""
    analysis = Analysis(module, path)
    walk(module, _Collector(analysis))
    _see_named_wrappers(analysis)
    _see_through(analysis, path)
    _infer_roles(analysis)
    return analysis


class _Collector(NameCollector):
    """Records scopes, imports, assignments, loops, backward calls and parent links in one
    traversal."""

    def __init__(self, analysis: Analysis) -> None:
        super().__init__(analysis.names)
        self.a = analysis
        self.stack: list[cst.CSTNode] = []
        self.scopes: list[Scope] = []
        self.classes: list[cst.ClassDef] = []
        self.loops: list[Loop | None] = []

    def on_visit(self, node: cst.CSTNode) -> bool:
        if self.stack:
            self.a.parents[id(node)] = self.stack[-1]
        self.stack.append(node)
        if self.scopes:
            self.a.scope_of[id(node)] = self.scopes[-1]
        return super().on_visit(node)

    def on_leave(self, original_node: cst.CSTNode) -> None:
        super().on_leave(original_node)
        self.stack.pop()

    # scopes -------------------------------------------------------------------------------
    def visit_Module(self, node: cst.Module) -> None:
        self._enter(Scope(node, None))

    def leave_Module(self, original_node: cst.Module) -> None:
        self.scopes.pop()

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        super().visit_ClassDef(node)
        self.classes.append(node)
        bases = {dotted_name(b.value) or "" for b in node.bases}
        if any(b.split(".")[-1] in {"Module", "PreTrainedModel"} for b in bases) or (
            bases & self.a.model_classes
        ):
            self.a.model_classes.add(node.name.value)
        if (
            any(b.split(".")[-1] in _SCHEDULER_BASES for b in bases)
            or bases & self.a.scheduler_classes
        ) and _only_schedules(node):
            self.a.scheduler_classes.add(node.name.value)

    def leave_ClassDef(self, original_node: cst.ClassDef) -> None:
        self.classes.pop()

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        super().visit_FunctionDef(node)
        cls = self.classes[-1] if self.classes and self._directly_in_class(node) else None
        scope = Scope(node, self.scopes[-1], cls)
        self._enter(scope)
        if scope.parent is self.a.scopes[0] or cls is not None:
            self.a.functions.setdefault(node.name.value, scope)
        if cls is not None:
            self.a.methods.setdefault(cls.name.value, {}).setdefault(node.name.value, scope)
        self.loops.append(None)  # loops do not reach into nested functions

    def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
        self.scopes.pop()
        self.loops.pop()

    def _directly_in_class(self, node: cst.FunctionDef) -> bool:
        parent = self.a.parents.get(id(node))
        return (
            isinstance(parent, cst.IndentedBlock)
            and self.a.parents.get(id(parent)) is (self.classes[-1])
        )

    def _enter(self, scope: Scope) -> None:
        self.scopes.append(scope)
        self.a.scopes.append(scope)
        self.a.scope_of[id(scope.node)] = scope

    # facts --------------------------------------------------------------------------------
    def visit_Assign(self, node: cst.Assign) -> None:
        self.a.assignments.append((node, self.scopes[-1]))
        for target in node.targets:
            if (key := key_of(target.target)) is not None:
                self._bind(key, node, node.value)
            else:
                for name in target_names(target.target):
                    self._bind(name, node, None)

    def visit_CompFor(self, node: cst.CompFor) -> None:
        key = key_of(loop_iterable(node.iter))
        if key is not None:
            self.a.comprehensions.append((node, self.scopes[-1], key))

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        self.a.assignments.append((node, self.scopes[-1]))
        if (key := key_of(node.target)) is not None:
            self.a.augmented.append((key, self.scopes[-1]))

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        self.a.assignments.append((node, self.scopes[-1]))
        if (key := key_of(node.target)) is not None:
            self._bind(key, node, node.value)

    def _bind(self, key: str, node: cst.CSTNode, value: cst.BaseExpression | None) -> None:
        scope = self.scopes[-1]
        statement, nested, in_loop = self._position_in_scope()
        self.a.bindings.append(Binding(key, scope, statement, node, value, nested, in_loop))

    def _position_in_scope(self) -> tuple[cst.BaseStatement, bool, bool]:
        """The top-level statement of the current scope above us, and what lies between."""
        scope_node = self.scopes[-1].node
        nested = in_loop = False
        for i in range(len(self.stack) - 1, 0, -1):
            node = self.stack[i]
            parent = self.stack[i - 1]
            if isinstance(node, _LOOPS) and i < len(self.stack) - 1:
                in_loop = True
            if isinstance(node, _NESTED_BLOCKS) and i < len(self.stack) - 1:
                nested = True
            if parent is scope_node or (
                isinstance(parent, cst.IndentedBlock) and self.stack[i - 2] is scope_node
            ):
                return node, nested, in_loop  # type: ignore[return-value]
        raise AssertionError("statement outside any scope")

    def visit_For(self, node: cst.For) -> None:
        loop = Loop(node, self.scopes[-1], None, set())
        _read_iterable(loop, ())
        self.a.loops.append(loop)
        self.loops.append(loop)

    def leave_For(self, original_node: cst.For) -> None:
        self.loops.pop()

    def visit_While(self, node: cst.While) -> None:
        loop = Loop(node, self.scopes[-1], None, set())
        self.a.loops.append(loop)
        self.loops.append(loop)

    def leave_While(self, original_node: cst.While) -> None:
        self.loops.pop()

    def _innermost_loop(self) -> Loop | None:
        """The innermost ``for`` of the current function (``None`` marks a function boundary)."""
        return self.loops[-1] if self.loops else None

    def visit_Attribute(self, node: cst.Attribute) -> None:
        if key_of(node.value) is not None:
            self.a.attributes.append((node, self.scopes[-1]))

    def visit_Call(self, node: cst.Call) -> None:
        scope = self.scopes[-1]
        self.a.calls.append((node, scope))
        if method_call(node, "backward") is not None:
            loop = self._innermost_loop()
            if loop is not None:
                loop.trains = True
                for outer in self.loops:
                    if outer is not None and outer.scope is loop.scope:
                        outer.trains = True
            self.a.backward_calls.append((node, scope, loop))


def _read_iterable(
    loop: Loop, through: Collection[int], written: cst.BaseExpression | None = None
) -> None:
    """What a ``for`` walks (the loader's key, every zipped one) and the names of its batches;
    ``written``: the wrapper the name it walks was bound to (``loop = tqdm(enumerate(loader))``,
    then ``for i, batch in loop:`` or ``in enumerate(loop)``)."""
    node = loop.node
    assert isinstance(node, cst.For)
    # What the target unpacks: the bound wrapper when the loop walks its name, else the loop's
    # own iterable (``enumerate(pbar)`` of ``pbar = tqdm(loader)``); what it walks: the loader.
    walked = written if written is not None and isinstance(node.iter, cst.Name) else node.iter
    iterable = loop_iterable(written if written is not None else node.iter, through)
    batch_target = node.target
    if (
        walked is not iterable
        and callee_name(walked) == "enumerate"  # type: ignore[arg-type]
        and isinstance(node.target, cst.Tuple)
        and len(node.target.elements) == 2
    ):
        batch_target = node.target.elements[1].value
    loop.iterable = key_of(iterable)
    loop.batch_names = set(target_names(batch_target))
    loop.iterables = tuple(k for it in zipped(iterable, through) if (k := key_of(it)) is not None)


def _see_named_wrappers(a: Analysis) -> None:
    """``loop = tqdm(enumerate(loader))`` then ``for i, batch in loop:`` (or ``in
    enumerate(loop)``): a progress bar bound to a name once in the loop's function walks the
    loader as the written-out form does (one kept from before prepare() is refused there). A
    name bound again for another loop (the validation's ``loop = tqdm(enumerate(dl_val))``)
    walks what the binding right above the loop, in its block, wraps."""
    for loop in a.loops:
        if not isinstance(loop.node, cst.For):
            continue
        walked = loop_iterable(loop.node.iter, a.through)
        if not isinstance(walked, cst.Name):
            continue
        found = [b for b in a.bindings if b.scope is loop.scope and b.key == walked.value]
        one = found[0].value if len(found) == 1 else _bound_right_above(a, loop.node, found)
        if isinstance(one, cst.Call) and callee_name(one) in _ITER_WRAPPERS:
            _read_iterable(loop, a.through, one)


def _bound_right_above(
    a: Analysis, node: cst.For, found: list[Binding]
) -> cst.BaseExpression | None:
    """The value of the binding among ``found`` made by the last statement before ``node`` in
    its block that binds the name, when that statement is the binding itself (not an ``if``
    around one) and the loop does not bind the name again."""
    block = a.parent(node)
    body = list(getattr(block, "body", ()))
    if node not in body or any(a.contains(node, b.node) for b in found):
        return None
    for statement in reversed(body[: body.index(node)]):
        hit = [b for b in found if a.contains(statement, b.node)]
        if hit:
            alone = len(hit) == 1 and a.statement_of(hit[0].node) is statement
            return hit[0].value if alone else None
    return None


def _see_through(a: Analysis, path: str) -> None:
    """Loops over ``metric_logger.log_every(loader, ...)`` walk ``loader`` when the method is
    read and proven to yield each item of its first argument once, in order (research code's
    metric loggers): the instance is bound once in the loop's function, to a class of this file
    or of a module beside ``path``."""
    proven: dict[tuple[str, str], bool] = {}  # (class, method): each read once per file
    for loop in a.loops:
        if not isinstance(loop.node, cst.For):
            continue
        call = loop_iterable(loop.node.iter, a.through)
        if isinstance(call, cst.Call) and _passes_through(a, path, loop.scope, call, proven):
            a.through.add(id(call))
            _read_iterable(loop, a.through)


def _passes_through(
    a: Analysis, path: str, scope: Scope, call: cst.Call, proven: dict[tuple[str, str], bool]
) -> bool:
    func = call.func
    if not (isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name) and call.args):
        return False
    built = [b.value for b in a.bindings if b.scope is scope and b.key == func.value.value]
    if len(built) != 1 or not isinstance(built[0], cst.Call):
        return False
    cls, method = built[0].func, func.attr.value
    own = dotted_name(cls) in a.methods  # a class of this file
    qualified = dotted_name(cls) if own else a.names.qualify(cls)
    if qualified is None:
        return False
    if (qualified, method) not in proven:
        proven[qualified, method] = (
            class_passes_through(python_ast(a.module.code, path), qualified, method)
            if own
            else passes_through(path, qualified, method)
        )
    return proven[qualified, method]


def _infer_roles(a: Analysis) -> None:
    give = _RoleGiver(a)
    _roles_from_constructors(a, give)
    _roles_from_usage(a, give)
    links = a.links = [
        *call_links(a),
        *attribute_links(a),
        *alias_links(a),
        *return_links(a, give),
    ]
    _spread(a, give, links)
    if _roles_from_ordinals(a, give, links):
        _spread(a, give, links)
    if _loss_scaler_steps(a):  # the loops they run in train: what they walk is a loader
        _roles_from_usage(a, give)
        _spread(a, give, links)


def _loss_scaler_steps(a: Analysis) -> bool:
    """Calls of loss scalers (:mod:`~accelify.transform.loss_scaler`) run a backward pass:
    recorded with the others, their loops marked as training."""
    found = False
    for call, scope in a.calls:
        key = key_of(call.func)
        if key is None or a.role(scope, key) is not Role.LOSS_SCALER:
            continue
        loops = [lp for lp in a.loops if lp.scope is scope and a.contains(lp.node, call)]
        for loop in loops:
            loop.trains = True
        around = a.enclosing(call, _LOOPS)
        innermost = next((lp for lp in loops if lp.node is around), None)
        a.backward_calls.append((call, scope, innermost))
        found = True
    return found


def _spread(a: Analysis, give: _RoleGiver, links: list[tuple[Scope, str, Scope, str]]) -> None:
    """Call sites (and attributes, and returns), both ways, until nothing changes."""
    changed = True
    while changed:
        changed = False
        for caller, arg, callee, param in links:
            there = a.role(callee, param)
            here = a.role(caller, arg)
            if here is not None and there is None:
                changed |= give(callee, param, here)
            elif there is not None and here is None:
                changed |= give(caller, arg, there)


def _roles_from_ordinals(
    a: Analysis, give: _RoleGiver, links: list[tuple[Scope, str, Scope, str]]
) -> bool:
    """``x.to(gpu_id)`` where ``gpu_id`` only ever holds an integer (``device = 0  # cuda:0``,
    handed down through calls and attributes): a GPU's ordinal, so a device. A dtype or a
    tensor is never an ``int``, which makes this the one reading of such a move."""
    found = False
    for call, scope in a.calls:
        move = method_call(call, "to")
        first = move.args[0] if move is not None and move.args else None
        key = key_of(first.value) if first is not None and first.keyword is None else None
        if key is not None and a.role(scope, key) is None and _only_ints(a, scope, key, links):
            found |= give(scope, key, Role.DEVICE)
    return found


def _only_ints(
    a: Analysis, scope: Scope, key: str, links: list[tuple[Scope, str, Scope, str]]
) -> bool:
    """Whether every value ``key`` in ``scope`` can hold, through same-file call sites and
    attributes set once, is an integer literal (and there is at least one)."""
    seen: set[tuple[int, str]] = set()
    todo = [(scope, key)]
    values: list[cst.BaseExpression | None] = []
    while todo:
        where, name = todo.pop()
        if (id(where), name) in seen:
            continue
        seen.add((id(where), name))
        if name.startswith("self.") and where.cls is not None:
            sources = [(t, p) for s, k, t, p in links if k == name and s.cls is where.cls]
            if not sources:  # set more than once, or to more than a name: what it is set to
                values += [
                    b.value for b in a.bindings if b.scope.cls is where.cls and b.key == name
                ]
        else:
            sources = [(s, n) for s, n, t, p in links if t is where and p == name and s is not t]
            if a.reads_global(where, name):
                sources.append((a.scopes[0], name))
            values += [b.value for b in a.bindings if b.scope is where and b.key == name]
        todo.extend(sources)
        default = _default(where, name)
        if default is not None:
            values.append(default)
        elif not sources and name in where.params:
            return False  # a parameter no call of this file passes
    return bool(values) and all(isinstance(v, cst.Integer) for v in values)


def _default(scope: Scope, name: str) -> cst.BaseExpression | None:
    """The default value of parameter ``name`` of ``scope``, if it has one."""
    if isinstance(scope.node, cst.Module):
        return None
    p = scope.node.params
    found = [x.default for x in (*p.params, *p.kwonly_params) if x.name.value == name]
    return found[0] if found else None


class _RoleGiver:
    """Records a role once; the first (strongest) evidence wins."""

    def __init__(self, a: Analysis) -> None:
        self.a = a

    def __call__(self, scope: Scope, key: str, role: Role) -> bool:
        a = self.a
        slot = (a.owner(scope, key), key)
        if scope.cls is None and a.reads_global(scope, key):
            slot = (id(a.scopes[0].node), key)  # a global used inside a function
        if slot in a.roles:
            return False
        a.roles[slot] = role
        return True


# A class deriving from one of these is a learning-rate scheduler (warm-up schedules, LR finders).
_SCHEDULER_BASES = SCHEDULERS | {"_LRScheduler", "LRScheduler"}


def _only_schedules(cls: cst.ClassDef) -> bool:
    """A scheduler class that steps, clears or back-propagates nothing but through ``super()``:
    it only sets the optimizer's learning rates, alike for the bare and the prepared one."""
    for call in nodes(cls, cst.Call):
        func = call.func  # type: ignore[attr-defined]
        if (
            isinstance(func, cst.Attribute)
            and func.attr.value in {"step", "zero_grad", "backward"}
            and not (isinstance(func.value, cst.Call) and callee_name(func.value) == "super")
        ):
            return False
    return True


def _roles_from_constructors(a: Analysis, give: _RoleGiver) -> None:
    for b in a.bindings:
        if b.value is None:
            continue
        base = unwrap_moves(b.value)
        name = a.names.last_part(base.func) if isinstance(base, cst.Call) else None
        role = constructor_role(base, a.names)
        if role is None and name in a.model_classes:
            role = Role.MODEL
        if role is None and name in a.scheduler_classes:
            role = Role.SCHEDULER
        if role is None and name in CLOSURE_OPTIMIZERS:
            role = Role.OPTIMIZER
        if role is None and is_device(b.value, by_name=False, names=a.names):
            role = Role.DEVICE
        if role is None and isinstance(base, cst.Call) and _loss_scaler(a, base.func):
            role = Role.LOSS_SCALER
        if role is not None:
            give(b.scope, b.key, role)


def _loss_scaler(a: Analysis, cls: cst.BaseExpression) -> bool:
    """A class imported from a module beside the file that runs the backward and the step."""
    qualified = a.names.qualify(cls)
    return qualified is not None and "." in qualified and loss_scaler_beside(a.path, qualified)


def _roles_from_usage(a: Analysis, give: _RoleGiver) -> None:
    """``opt(model.parameters())``, ``for batch in loader``, ``x.step()``, bare ``x.to(device)``."""
    for call, scope in a.calls:
        role = constructor_role(call, a.names)
        if role is Role.OPTIMIZER or a.names.last_part(call.func) in CLOSURE_OPTIMIZERS:
            for key in optimized_models(a, scope, call) or ():
                give(scope, key, Role.MODEL)
    for loop in a.loops:
        key = loop.iterable
        trained = key is not None and (loop.trains or "loader" in key.lower())
        if trained and not _a_range(a, loop.scope, key):  # ``epochs = range(n)``: no data
            give(loop.scope, key, Role.DATALOADER)
    for call, scope in a.calls:
        receiver = call.func.value if isinstance(call.func, cst.Attribute) else None
        key = key_of(receiver) if receiver is not None else None
        if key is None:
            continue
        method = call.func.attr.value  # type: ignore[union-attr]
        if method in {"zero_grad", "step"} and "sched" in key.lower():
            give(scope, key, Role.SCHEDULER)
        elif method in {"zero_grad", "step"} and "opt" in key.lower():
            give(scope, key, Role.OPTIMIZER)
        elif method in {"to", "cuda"} and isinstance(a.parent(call), cst.Expr):
            give(scope, key, Role.MODEL)  # a bare ``x.to(device)`` only makes sense on a module
        elif method in {"train", "eval"} and not call.args and isinstance(a.parent(call), cst.Expr):
            give(scope, key, Role.MODEL)  # ``model.train()``: only modules switch modes


def _a_range(a: Analysis, scope: Scope, key: str) -> bool:
    """Whether ``key`` is bound in ``scope`` only to the builtin ``range(...)``."""
    values = [b.value for b in a.bindings if b.scope is scope and b.key == key]
    return bool(values) and all(
        isinstance(v, cst.Call)
        and dotted_name(v.func) == "range"
        and a.names.qualify(v.func) is None
        and "range" not in a.names.defined
        for v in values
    )


_PARAMETERS = ("parameters", "named_parameters")


def optimized_models(
    a: Analysis, scope: Scope, optimizer: cst.Call, partly: set[str] | None = None
) -> set[str] | None:
    """The modules whose parameters an optimizer is built from, or None when that cannot be read.

    Reads ``m.parameters()``, ``list(a.parameters()) + list(b.parameters())``, param groups,
    ``filter(..., m.parameters())``, ``m.fc.parameters()`` (the module is ``m``, and goes into
    ``partly``: only part of it is trained) and a local name bound to such an expression.
    """
    first = optimizer.args[0] if optimizer.args else None
    if first is None or (first.keyword is not None and first.keyword.value != "params"):
        return None
    reader = _ParameterReader(a, scope)
    if not reader.read(first.value, 0):
        return None
    if partly is not None:
        partly |= reader.partly - reader.whole  # ``m.fc`` in one group, all of ``m`` in another
    return reader.found


class _ParameterReader:
    """Follows an optimizer's ``params`` expression down to the modules it comes from."""

    def __init__(self, a: Analysis, scope: Scope) -> None:
        self.a, self.scope = a, scope
        self.found: set[str] = set()
        self.partly: set[str] = set()
        self.whole: set[str] = set()

    def read(self, expr: cst.CSTNode, depth: int) -> bool:
        """Add the modules ``expr`` takes parameters from; False when part of it is unreadable."""
        call = method_call(expr, *_PARAMETERS)
        if call is not None:
            return self._module(call.func.value)  # type: ignore[union-attr]
        if isinstance(expr, cst.Name) and depth < 3:  # params = [...]; SGD(params)
            values = [
                b.value
                for b in self.a.bindings
                if b.scope is self.scope and b.key == expr.value and b.value
            ]
            return bool(values) and all(self.read(v, depth + 1) for v in values)
        if isinstance(expr, cst.Call):  # list(...), itertools.chain(...), filter(f, ...)
            parts = [arg.value for arg in expr.args if not isinstance(arg.value, cst.Lambda)]
            return bool(parts) and all(self.read(part, depth) for part in parts)
        if isinstance(expr, cst.BinaryOperation):
            return self.read(expr.left, depth) and self.read(expr.right, depth)
        if isinstance(expr, cst.List | cst.Tuple):
            return all(self.read(e.value, depth) for e in expr.elements)
        if isinstance(expr, cst.Dict):  # a param group: its "params"
            params = [
                e.value
                for e in expr.elements
                if isinstance(e, cst.DictElement)
                and isinstance(e.key, cst.SimpleString)
                and e.key.evaluated_value == "params"
            ]
            return len(params) == 1 and self.read(params[0], depth)
        if isinstance(expr, cst.ListComp | cst.GeneratorExp):
            return self.read(expr.for_in.iter, depth)
        return False

    def _module(self, owner: cst.BaseExpression) -> bool:
        whole = True
        while isinstance(owner, cst.Attribute) and key_of(owner) is None:
            owner, whole = owner.value, False  # ``model.fc.parameters()`` trains part of it
        key = key_of(owner)
        if key is None:
            return False
        self.found.add(key)
        (self.whole if whole else self.partly).add(key)
        return True


def call_links(a: Analysis) -> Iterator[tuple[Scope, str, Scope, str]]:
    """(caller scope, argument name, callee scope, parameter name) for same-file calls."""
    for call, scope in a.calls:
        callee = a.callee(call)
        if callee is None or isinstance(callee.node, cst.Module):
            continue
        for param, value in arguments(call, callee):
            if (key := key_of(value)) is not None:
                yield scope, key, callee, param


def arguments(call: cst.Call, callee: Scope) -> Iterator[tuple[str, cst.BaseExpression]]:
    """(parameter, argument) for what ``call`` gives the function ``callee``, by position (a
    method's ``self`` skipped) or by keyword. Where a ``*args`` lands is unknown, so the
    positions after one give nothing."""
    params = callee.params
    if callee.cls is not None and params and params[0] == "self":
        params = params[1:]
    positional = True
    for i, arg in enumerate(call.args):
        if arg.star:
            positional = False
        elif arg.keyword is not None:
            yield arg.keyword.value, arg.value
        elif positional and i < len(params):
            yield params[i], arg.value


def attribute_links(a: Analysis) -> Iterator[tuple[Scope, str, Scope, str]]:
    """(method, ``self.x``, method, ``x``) for an attribute its class sets exactly once, in that
    method, to a plain name (``self.model = model.to(device)`` holds the object ``model`` is):
    every method of the class that reads ``self.x`` reads that object."""
    counts: dict[tuple[int, str], list[Binding]] = {}
    for b in a.bindings:
        if b.scope.cls is not None and b.key.startswith("self."):
            counts.setdefault((id(b.scope.cls), b.key), []).append(b)
    for (_cls, key), found in counts.items():
        b = found[0]
        value = unwrap_moves(b.value) if b.value is not None else None
        name = key_of(value) if value is not None else None
        if len(found) == 1 and name is not None and not name.startswith("self."):
            yield b.scope, key, b.scope, name


def alias_links(a: Analysis) -> Iterator[tuple[Scope, str, Scope, str]]:
    """(scope, ``alias``, scope, ``name``) for a plain name a scope binds exactly once, to another
    plain name (the PyTorch tutorial's ``ddp_model = model``, once DDP is gone): both name one
    object, so a role either has is the other's too."""
    counts: dict[tuple[int, str], list[Binding]] = {}
    for b in a.bindings:
        if not b.key.startswith("self.") and not moved_itself(b):
            counts.setdefault((id(b.scope), b.key), []).append(b)
    for (_scope, key), found in counts.items():
        b = found[0]
        value = unwrap_moves(b.value) if b.value is not None else None
        name = key_of(value) if value is not None else None
        if len(found) == 1 and name is not None and name != key and not name.startswith("self."):
            yield b.scope, key, b.scope, name


def moved_itself(b: Binding) -> bool:
    """``model = model.to(x)`` / ``model = model.cuda()``: the same object, moved (a module's
    ``.to`` moves it in place and returns it), so no new binding of the name."""
    return (
        b.value is not None
        and unwrap_moves(b.value) is not b.value
        and key_of(unwrap_moves(b.value)) == b.key
    )


# nn.Module's methods that return the module itself (``net.eval().float()``).
MODE_CALLS = ("eval", "train", "float", "half", "double", "bfloat16", "requires_grad_", "apply")


def unwrap_modes(value: cst.BaseExpression) -> cst.BaseExpression:
    """``net.train().cuda()`` -> ``net``: the module a chain of mode switches and moves
    returns."""
    while (call := method_call(value, "to", "cuda", *MODE_CALLS)) is not None:
        value = call.func.value  # type: ignore[union-attr]
    return value


def switched_itself(b: Binding) -> bool:
    """``model = model.train()`` (pointnet's, in its epoch loop) or ``model =
    model.apply(init).cuda()``: for a model, the same object again, as :func:`moved_itself`."""
    return (
        b.value is not None
        and unwrap_modes(b.value) is not b.value
        and key_of(unwrap_modes(b.value)) == b.key
    )


def handed_back(a: Analysis, b: Binding) -> bool:
    """``optimizer = lr_decay(optimizer, epoch, ...)``: a function of the file that returns,
    on every path, the parameter the name is handed on, never binding it again (NCRFpp's
    ``lr_decay`` sets each group's ``lr`` and returns the optimizer): the same object again."""
    call = b.value
    callee = a.callee(call) if isinstance(call, cst.Call) else None
    if callee is None or not isinstance(callee.node, cst.FunctionDef):
        return False
    param = next((p for p, arg in arguments(call, callee) if key_of(arg) == b.key), None)  # type: ignore[arg-type]
    found = returns(callee)
    return (
        param is not None
        and bool(found)
        and all(r.value is not None and key_of(r.value) == param for r in found)
        and not any(x.scope is callee and x.key == param for x in a.bindings)
        and not yields(callee)
    )


def return_links(a: Analysis, give: _RoleGiver) -> Iterator[tuple[Scope, str, Scope, str]]:
    """(caller, bound name, function, returned name) for ``x = f(...)`` and ``a, b = f(...)``
    where every ``return`` of the same-file function ``f`` gives a name (or a tuple of names of
    the same length) in that position. A returned constructor call gives its role at once."""
    for b in a.bindings:
        found = returned_values(a, b)
        if found is None:
            continue
        callee, values = found
        for value in values:
            if (name := key_of(value)) is not None:
                yield b.scope, b.key, callee, name
            elif (role := constructor_role(unwrap_moves(value), a.names)) is not None:
                give(b.scope, b.key, role)


def returned_values(a: Analysis, binding: Binding) -> tuple[Scope, list[cst.BaseExpression]] | None:
    """For ``x = f(...)`` or ``a, x = f(...)`` with ``f`` a function of this file: ``f`` and
    what each of its ``return`` statements gives ``x``; None when some return gives nothing
    that can be told (a bare ``return``, a tuple of another length)."""
    statement = binding.node
    if not isinstance(statement, cst.Assign) or not isinstance(statement.value, cst.Call):
        return None
    callee = a.callee(statement.value)
    if callee is None or callee.cls is not None:
        return None
    position = _target_position(statement, binding.key)
    if position == -1:
        return None
    values = [_returned_at(r, position) for r in returns(callee)]
    if not values or any(v is None for v in values):
        return None
    return callee, values  # type: ignore[return-value]


def _target_position(assign: cst.Assign, key: str) -> int | None:
    """None for ``key = ...``, the index of ``key`` in a single ``a, b = ...`` target, -1 when
    it sits deeper (``(a, b), c = ...``) or in a second target."""
    target = assign.targets[0].target
    if not isinstance(target, cst.Tuple | cst.List):
        return None if key_of(target) == key else -1
    if len(assign.targets) != 1:
        return -1
    return next((i for i, e in enumerate(target.elements) if key_of(e.value) == key), -1)


def _returned_at(statement: cst.Return, position: int | None) -> cst.BaseExpression | None:
    value = statement.value
    if position is None or value is None:
        return value
    if isinstance(value, cst.Tuple) and position < len(value.elements):
        element = value.elements[position]
        return None if isinstance(element, cst.StarredElement) else element.value
    return None


def returns(function: Scope) -> list[cst.Return]:
    """The ``return`` statements of ``function`` itself (not of functions defined inside it)."""
    return _own(function, cst.Return)  # type: ignore[return-value]


def yields(function: Scope) -> list[cst.Yield]:
    """The ``yield`` expressions of ``function`` itself: what a caller that iterates the
    generator it returns (or calls ``next`` on it) reads."""
    return _own(function, cst.Yield)  # type: ignore[return-value]


def _own(function: Scope, kind: type[cst.CSTNode]) -> list[cst.CSTNode]:
    finder = _OwnNodes(function.node, kind)
    walk(function.node, finder)
    return finder.found


class _OwnNodes(Visitor):
    def __init__(self, function: cst.CSTNode, kind: type[cst.CSTNode]) -> None:
        super().__init__()
        self.function = function
        self.kind = kind
        self.found: list[cst.CSTNode] = []

    def on_visit(self, node: cst.CSTNode) -> bool:
        if isinstance(node, self.kind):
            self.found.append(node)
        return not isinstance(node, cst.FunctionDef | cst.Lambda) or node is self.function
