"""Every use of every object ``prepare()`` wraps is accounted for, or the setup is refused.

``prepare()`` hands back new objects (on several processes a DistributedDataParallel wrapper and
a sharded loader) and the conversion rebinds them to the names the setup built them under. Any
other path to an object still holds what it held when it was made: ``net = model`` or
``nets = [g, d]`` taken before ``prepare()`` keep the bare module, so a step through them trains
without gradient synchronisation; handed to code this file does not show (a privacy engine,
``torch.compile``, another module's helper), an object may be kept, wrapped or trained there.
This step follows every reference of a prepared object: through the setup's names, the same-file
functions and ``self`` attributes the analysis links, and plain aliases, whose own uses must fit
what they hold (the bare module is never run by the training step; the wrapper is only asked for
what it answers itself). Any other use refuses the whole setup, naming the line and the use.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import libcst as cst

from accelify.transform.analysis import (
    Analysis,
    Scope,
    handed_back,
    key_of,
    name_nodes,
    names_in,
)
from accelify.transform.model_runners import only_runs
from accelify.transform.neighbours import uses_only
from accelify.transform.patterns import (
    LOG_METHODS,
    PREFIX,
    Role,
    callee_name,
    constructor_role,
    dotted_name,
    method_call,
    names_a_rank,
    unpacked,
)
from accelify.transform.plan import Plan
from accelify.transform.refusals import HAND_PICKED_DEVICE, UNTRACKED_USE
from accelify.transform.setup import Refused, Setup, in_training_step, origins
from accelify.transform.steps.unwrap import MODULE_API
from accelify.transform.walk import Visitor, walk

# Calls that only look at what they are handed, whatever its role.
READERS = frozenset(
    {"print", "len", "str", "repr", "format", "isinstance", "type", "id", "hasattr", "callable"}
)
# Calls that walk a loader (or its batches) and keep nothing of it.
_LOADER_READERS = frozenset({"enumerate", "iter", "next", "zip", "tqdm", "trange", "cycle", "list"})
# What may be handed the bare module before prepare(): they read its parameters (timm's weight
# decay groups for the optimizer), copy it (an EMA or a teacher is a separate module) or swap one
# of its layers (``setattr``, LoRA-style), and prepare() then wraps the module as it is.
_BARE_MODEL_READERS = frozenset(
    {
        "deepcopy", "summary", "watch", "add_graph", "ModelEma", "ModelEmaV2", "ModelEmaV3",
        "EMA", "EMAModel", "AveragedModel", "setattr", "add_weight_decay",
        "param_groups_weight_decay",
    }
)  # fmt: skip
# GradScaler's calls and torch.save, which take an optimizer or a model as they are.
_STEPPERS = frozenset({"step", "unscale_", "save"})
# Wrappers that take the objects over, each with why prepare() cannot go on top of them.
_PRIVACY = (
    "the privacy engine owns the model, optimizer and loader (per-sample gradients, clipping, "
    "noise and its own sampling loader); prepare() on top would shard the data and average the "
    "gradients underneath it, which its privacy accounting does not know of (opacus has its "
    "own DPDDP for several processes)"
)
_OWNERS = {
    "make_private": _PRIVACY,
    "make_private_with_epsilon": _PRIVACY,
    "initialize": "apex/DeepSpeed's initialize owns the model and optimizer (its own loss "
    "scaling and wrapping), which prepare() would wrap again",
    "compile": "torch.compile returns a compiled wrapper that the training step runs, and "
    "accel-convert does not model how prepare() wraps it (compile through the accelerator, or "
    "after prepare(), by hand)",
    "DataParallel": "nn.DataParallel replicates the module itself inside each process",
}

# What seeds torch's own stream (``torch.manual_seed``, ``set_seed``), by the called name.
_TORCH_SEEDS = frozenset({"manual_seed", "set_seed"})


@dataclass(frozen=True)
class _Use:
    """One reference to a prepared object: ``node`` in ``scope``, holding ``key``'s object bare
    (made before prepare()), prepared, or either (``bare`` is None)."""

    node: cst.BaseExpression
    scope: Scope
    key: str
    role: Role
    bare: bool | None


def uses(plan: Plan) -> None:
    setup = plan.setup
    if setup is None or setup.prepare_at is None:
        return
    a = plan.analysis
    roles = {b.key: a.role(setup.scope, b.key) for b in setup.prepared}
    _refuse_batches_to_numpy(a, setup)
    _refuse_fixed_gpus(a, setup)
    for use in _references(a, setup, roles):  # type: ignore[arg-type]
        why = _unaccounted(a, setup, use)
        if why is not None:
            raise Refused(why[0], UNTRACKED_USE, why[1])


def _refuse_fixed_gpus(a: Analysis, setup: Setup) -> None:
    """``x.cuda(self.cuda_index)``: a tensor put on a GPU by number, while the accelerator gives
    each process its own device (and chooses the GPU itself, whatever switch guards this)."""
    for call, scope in a.calls:
        if scope not in setup.reach or method_call(call, "cuda") is None:
            continue
        index = next((arg.value for arg in call.args if _names_the_device(arg)), None)
        if index is None:
            continue  # .cuda(non_blocking=True): the current device, as .cuda()
        if any(n.value.startswith(PREFIX) for n in names_in(index)):
            continue  # a rank the DDP rewrite made the accelerator's device
        raise Refused(
            call,
            HAND_PICKED_DEVICE,
            f".cuda({a.module.code_for_node(index)}) picks the GPU by its number, while the "
            "accelerator gives each process its own device and decides itself whether to use "
            "one: unless that number is always the accelerator's device, they would meet on "
            "different devices; move it to accelerator.device by hand",
        )


def _names_the_device(arg: cst.Arg) -> bool:
    """``.cuda(1)``, ``.cuda(device=1)`` or an unpacked ``*args`` that may hold one; not
    ``non_blocking=`` nor ``memory_format=``."""
    return arg.star != "" or arg.keyword is None or arg.keyword.value == "device"


def _refuse_batches_to_numpy(a: Analysis, setup: Setup) -> None:
    """``labels.numpy()`` on a batch of a prepared loader: the script's batch was on the CPU, the
    prepared loader's is on the accelerator's device, where ``.numpy()`` raises."""
    for loop in a.loops:
        walked = {*loop.iterables, loop.iterable}
        if not walked & setup.loaders or loop.scope not in setup.reach:
            continue
        for node, scope in a.attributes:
            if (
                node.attr.value == "numpy"
                and scope is loop.scope
                and key_of(node.value) in loop.batch_names
                and a.contains(loop.node, node)
            ):
                raise Refused(
                    node,
                    HAND_PICKED_DEVICE,
                    f"{key_of(node.value)}.numpy() reads a batch of the prepared loader, which "
                    "comes on the accelerator's device (a GPU's tensors have no .numpy()); "
                    "move it with .cpu() first, by hand",
                )


# where the prepared objects are referred to ---------------------------------------------------
def _references(a: Analysis, setup: Setup, roles: dict[str, Role]) -> Iterator[_Use]:
    finder = _Loads()
    walk(a.module, finder)
    cache: dict[tuple[int, str], set[str]] = {}
    # Only these names can stand for a prepared object: its own name, a parameter it is passed
    # to, a ``self`` attribute it is stored in.
    possible = set(roles) | {p for s in a.scopes for p in s.params}
    for node in finder.found:
        scope = a.scope_of.get(id(node))
        key = key_of(node)
        if scope is None or key is None or (key not in possible and not key.startswith("self.")):
            continue
        found = cache.get((id(scope), key))
        if found is None:
            found = cache[(id(scope), key)] = _origins(a, setup, scope, key) & roles.keys()
        for origin in found:
            if setup.current(a, origin, node):
                yield _Use(node, scope, origin, roles[origin], _bare(setup, node))


def _origins(a: Analysis, setup: Setup, scope: Scope, key: str) -> set[str]:
    """The setup's names ``key`` stands for in ``scope``, closures of the setup included."""
    found = origins(a, setup.scope, scope, key)
    inner = scope
    while not found and inner.parent is not None and not key.startswith("self."):
        if key in inner.params or any(b.scope is inner and b.key == key for b in a.bindings):
            break
        inner = inner.parent
        if inner is setup.scope:
            found = {key}
    return found


def _bare(setup: Setup, node: cst.CSTNode) -> bool | None:
    point = setup.prepare_at
    assert point is not None
    if setup.timeline.after(point, node):
        return False
    return True if setup.timeline.before(point, node) else None


class _Loads(Visitor):
    """Names and ``self.x`` attributes read as values (not bound, not attribute names, not
    keywords), in source order."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[cst.BaseExpression] = []

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        if key_of(node) is not None:  # self.x: the attribute is the reference
            self.found.append(node)
        else:  # a.b: only ``a`` can be one
            walk(node.value, self)
        return False

    def visit_Name(self, node: cst.Name) -> None:
        self.found.append(node)

    def visit_AssignTarget(self, node: cst.AssignTarget) -> bool:
        return _walk_target(node.target, self)

    def visit_For(self, node: cst.For) -> bool:
        _walk_target(node.target, self)
        walk(node.iter, self)
        walk(node.body, self)
        if node.orelse is not None:
            walk(node.orelse, self)
        return False

    def visit_CompFor(self, node: cst.CompFor) -> bool:
        _walk_target(node.target, self)
        walk(node.iter, self)
        for cond in node.ifs:
            walk(cond, self)
        if node.inner_for_in is not None:
            walk(node.inner_for_in, self)
        return False

    def visit_AugAssign(self, node: cst.AugAssign) -> bool:
        walk(node.value, self)
        return False

    def visit_AnnAssign(self, node: cst.AnnAssign) -> bool:
        if node.value is not None:
            walk(node.value, self)
        return False

    def visit_Arg(self, node: cst.Arg) -> bool:
        walk(node.value, self)
        return False

    def visit_AsName(self, node: cst.AsName) -> bool:
        return False

    def visit_Param(self, node: cst.Param) -> bool:
        if node.default is not None:
            walk(node.default, self)
        return False

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        walk(node.params, self)
        for decorator in node.decorators:
            walk(decorator, self)
        walk(node.body, self)
        return False

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        walk(node.body, self)
        return False

    def visit_Import(self, node: cst.Import) -> bool:
        return False

    def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
        return False

    def visit_Global(self, node: cst.Global) -> bool:
        return False

    def visit_Nonlocal(self, node: cst.Nonlocal) -> bool:
        return False


def _walk_target(target: cst.BaseExpression, visitor: _Loads) -> bool:
    """Reads inside an assignment target (``x[i] = ``, ``obj.attr = ``), not the names bound."""
    if isinstance(target, cst.Tuple | cst.List):
        for element in target.elements:
            _walk_target(element.value, visitor)
    elif isinstance(target, cst.StarredElement):
        _walk_target(target.value, visitor)
    elif isinstance(target, cst.Subscript):
        walk(target, visitor)
    elif isinstance(target, cst.Attribute) and key_of(target) is None:
        walk(target.value, visitor)
    return False


# what each use does --------------------------------------------------------------------------
def _unaccounted(a: Analysis, setup: Setup, use: _Use) -> tuple[cst.CSTNode, str] | None:
    """``(node, why)`` when ``use`` is not one the conversion keeps right, else None."""
    node = _value_of(a, use.node)
    parent = a.parent(node)
    key = use.key
    if isinstance(parent, cst.Attribute) and parent.value is node:
        copy = _state_copied_before_prepare(a, use, parent)
        if copy is not None and not _built_after_one_seed(a, use):
            return copy, (
                f"{a.module.code_for_node(copy.func)}(...) copies {key}'s weights before "
                f"prepare(), which then gives every process the main process's {key}: on the "
                "others the copy keeps their own initial weights (a target network then "
                "differs between processes); copy after prepare(), from "
                f"accelerator.unwrap_model({key}), or convert by hand"
            )
        if _set_on_a_wrapper(a, use, parent):
            return parent, (
                f"{a.module.code_for_node(parent)} is set on the prepared {_noun(use.role)}, a "
                f"wrapper whose attributes read through to the {_noun(use.role)} it wraps but "
                "are not written through: set it before prepare(), or convert by hand"
            )
        return None  # methods and attributes: the unwrap step sends the wrapper's to the module
    if isinstance(parent, cst.Call) and parent.func is node:
        if use.bare and in_training_step(a, node):
            return node, f"the training step calls {key} before prepare() can wrap it"
        return None
    if isinstance(parent, cst.Arg):
        return _handed(a, setup, use, parent)
    if isinstance(parent, cst.Element | cst.DictElement | cst.StarredElement):
        return _contained(a, setup, use, parent)
    if isinstance(parent, cst.Assign) and parent.value is node:
        return _aliased(a, setup, use, parent)
    if isinstance(parent, cst.Return):
        if _result_unused(a, use.scope) or _handed_back_everywhere(a, use.scope):
            return None
        return parent, (
            f"{key} is returned here: whoever called {use.scope.name}() would get the prepared "
            f"{_noun(use.role)} (a wrapper on several processes), and its uses are not followed"
        )
    if isinstance(parent, cst.Subscript) and parent.value is node and use.role is Role.MODEL:
        if use.bare:
            return None
        return parent, (
            f"{key}[...] indexes the prepared model, which on several processes is a "
            "DistributedDataParallel wrapper that cannot be indexed"
        )
    if isinstance(parent, cst.For | cst.CompFor) and parent.iter is node:
        if use.role is Role.MODEL and not use.bare:
            return parent, f"iterating {key} walks the wrapper prepare() returns, not the model"
        return None
    if isinstance(
        parent,
        cst.Comparison
        | cst.ComparisonTarget
        | cst.UnaryOperation
        | cst.If
        | cst.While
        | cst.FormattedStringExpression
        | cst.Del
        | cst.Expr
        | cst.AssignTarget
        | cst.With
        | cst.WithItem,
    ):
        return None
    return node, f"{key} is used here in a way accel-convert does not follow"


def _state_copied_before_prepare(
    a: Analysis, use: _Use, attribute: cst.Attribute
) -> cst.Call | None:
    """``target.load_state_dict(model.state_dict())`` before prepare(): the load that copies a
    model's initial weights into another module (DQN's and DDPG's target networks)."""
    if use.bare is not True or use.role is not Role.MODEL or attribute.attr.value != "state_dict":
        return None
    call = a.parent(attribute)
    arg = a.parent(call) if isinstance(call, cst.Call) and call.func is attribute else None
    load = a.parent(arg) if isinstance(arg, cst.Arg) else None
    if isinstance(load, cst.Call) and method_call(load, "load_state_dict") is not None:
        return load
    return None


def _built_after_one_seed(a: Analysis, use: _Use) -> bool:
    """Whether every process builds the model with the same weights: each of its bindings in
    the scope follows, in the same block or one inside it, a seed of torch's stream with a
    value that reads no rank (cleanrl's ``torch.manual_seed(args.seed)`` before ``actor =
    Actor(envs)``). Then a copy of its initial weights before prepare() is the same copy on
    every process, and prepare() gives them all the weights they already hold."""
    bindings = [b for b in a.bindings if b.scope is use.scope and b.key == use.key]
    seeds = [
        a.statement_of(call)
        for call, scope in a.calls
        if scope is use.scope
        and callee_name(call) in _TORCH_SEEDS
        and call.args
        and not any(names_a_rank(n.value) for n in names_in(call))
    ]
    return bool(bindings) and all(
        any(
            a.line(seed) < a.line(b.node) and a.contains(a.parent(seed), b.node)  # type: ignore[arg-type]
            for seed in seeds
        )
        for b in bindings
    )


def _set_on_a_wrapper(a: Analysis, use: _Use, attribute: cst.Attribute) -> bool:
    """``scheduler.last_epoch = n`` after prepare(): the prepared scheduler or optimizer is a
    wrapper that reads unknown attributes through, so the write stays on the wrapper."""
    if use.bare or use.role not in (Role.SCHEDULER, Role.OPTIMIZER):
        return False
    parent = a.parent(attribute)
    return (isinstance(parent, cst.AssignTarget) and parent.target is attribute) or (
        isinstance(parent, cst.AugAssign) and parent.target is attribute
    )


def _result_unused(a: Analysis, function: Scope) -> bool:
    """Whether every call of ``function`` drops what it returns (``train(rnn)`` as a statement,
    or ``trained = train(rnn)`` never read)."""
    calls = [(call, where) for call, where in a.calls if a.callee(call) is function]
    for call, where in calls:
        parent = a.parent(call)
        if isinstance(parent, cst.Expr):
            continue
        target = parent.targets[0].target if isinstance(parent, cst.Assign) else None
        if not isinstance(target, cst.Name) or len(name_nodes(where.node, target.value)) > 1:
            return False
    return bool(calls)


def _handed_back_everywhere(a: Analysis, function: Scope) -> bool:
    """Whether every call of ``function`` binds what it returns to the name it handed in, the
    object it returns (``optimizer = lr_decay(optimizer, ...)``, :func:`handed_back`): the
    caller holds the same object as before."""
    calls = [call for call, _where in a.calls if a.callee(call) is function]
    bound = [b for b in a.bindings if any(b.value is call for call in calls) and handed_back(a, b)]
    return bool(calls) and len(bound) == len(calls)


def _value_of(a: Analysis, node: cst.BaseExpression) -> cst.BaseExpression:
    """``model`` in ``model if c else other`` or ``model or other`` stands for the whole."""
    current = node
    while isinstance(parent := a.parent(current), cst.IfExp | cst.BooleanOperation):
        if isinstance(parent, cst.IfExp) and parent.test is current:
            break
        current = parent  # type: ignore[assignment]
    return current


def _noun(role: Role) -> str:
    return {Role.MODEL: "model", Role.OPTIMIZER: "optimizer", Role.DATALOADER: "loader"}.get(
        role, "scheduler"
    )


def _handed(a: Analysis, setup: Setup, use: _Use, arg: cst.Arg) -> tuple[cst.CSTNode, str] | None:
    call = a.parent(arg)
    assert isinstance(call, cst.Call)
    name = dotted_name(call.func) or ""
    last = a.names.last_part(call.func) or callee_name(call) or ""
    head = name.split(".", 1)[0]
    if head == "accelerator" or name.startswith((setup.accelerator, PREFIX)):
        return None  # the accelerator's API, or the DDP rewrite's placeholder for it
    if last in _OWNERS and (use.bare is not False or last != "compile"):
        return call, f"{use.key} is handed to {name or last}(...): {_OWNERS[last]}"
    if a.callee(call) is not None:
        if _linked(a, call, arg):
            return None
        return call, (
            f"{use.key} is handed to {name}(...) in a way its parameters do not show "
            "(*args, **kwargs), so its uses there are not followed"
        )
    if constructor_role(call, a.names) in (Role.OPTIMIZER, Role.SCHEDULER):
        return None
    if use.role is Role.OPTIMIZER and last in a.scheduler_classes:
        return None  # a scheduler class of this file: it sets the learning rates only
    if use.role is Role.DATALOADER and use.bare and constructor_role(call, a.names) is use.role:
        return None  # ``train = DataLoader(train, ...)``: the name held the dataset until here
    if _stepped_by_loss_scaler(a, use, call, arg) or _helper_reads(a, use, call, arg, setup):
        return None
    if last in READERS or (isinstance(call.func, cst.Attribute) and last in LOG_METHODS):
        return None
    if use.role is Role.DATALOADER and (last in _LOADER_READERS or id(call) in a.through):
        return None
    if use.role is Role.MODEL and use.bare and last in _BARE_MODEL_READERS:
        return None
    # ``scaler.step(optimizer)``, ``torch.save(model, ...)``; a ``save`` of another module
    # (``d2l.save(net, ...)``) is code this file does not show
    if (
        isinstance(call.func, cst.Attribute)
        and last in _STEPPERS
        and (last != "save" or a.names.refers_to(call.func, ("torch",), "save"))
    ):
        return None
    what = "bare" if use.bare else "prepared" if use.bare is False else ""
    # A function of the file the analysis does not follow (one defined inside another).
    unseen = (
        "accel-convert does not follow" if name in a.names.defined else "this file does not show"
    )
    return call, (
        f"{use.key} is handed to {name or 'a call'}(...), which {unseen}: what "
        f"it does with the {what + ' ' if what else ''}{_noun(use.role)} (keep, wrap or train "
        "it) cannot be checked"
    )


def _stepped_by_loss_scaler(a: Analysis, use: _Use, call: cst.Call, arg: cst.Arg) -> bool:
    """``loss_scaler(loss, optimizer, ...)``: a loss scaler steps the optimizer it is handed
    second, as it is (``GradScaler.step``), like ``scaler.step(optimizer)``."""
    key = key_of(call.func)
    return (
        use.role is Role.OPTIMIZER
        and key is not None
        and a.role(use.scope, key) is Role.LOSS_SCALER
        and list(call.args).index(arg) == 1
        and arg.keyword is None
    )


# What a function beside the file may do with each object it is handed, that it does alike to
# the object prepare() returns (the optimizer hands on the groups and state of the one it wraps)
# and to the one it wrapped: a learning-rate schedule, a checkpoint's save or load. The bare model
# (``model_without_ddp``) may be saved or loaded too; the prepared one, whose keys differ on N
# processes, only tested against None or read where the call's arguments rule out.
_HELPER_READS = {
    Role.OPTIMIZER: frozenset({"param_groups", "state_dict", "load_state_dict"}),
    Role.MODEL: frozenset({"state_dict", "load_state_dict"}),
}


def _helper_reads(
    a: Analysis, use: _Use, call: cst.Call, arg: cst.Arg, setup: Setup | None = None
) -> bool:
    """``lr_sched.adjust_learning_rate(optimizer, ...)``, ``misc.load_model(model_without_ddp=
    model_without_ddp, optimizer=optimizer)``: a function beside the file that reads what it is
    handed only as :data:`_HELPER_READS` allows. Before prepare(), the bare model may be read
    in any way that keeps no hold of it (``initialize_weights(gen)``: ``nn.init`` over its
    modules): whatever it does, prepare() then wraps the module as it is. After it, a helper
    may run the prepared model (:func:`only_runs`: ``validate(net, loader)``)."""
    qualified = a.names.qualify(call.func)
    attributes = _HELPER_READS.get(use.role)
    if use.role is Role.MODEL and not use.bare:
        attributes = frozenset()
    elif (
        use.role is Role.MODEL
        and setup is not None
        and setup.prepare_at is not None
        and a.scope_of.get(id(call)) is setup.scope
        and setup.timeline.before(setup.prepare_at, call)
    ):
        attributes = None
    if use.role not in _HELPER_READS or qualified is None or "." not in qualified or arg.star:
        return False
    objects = [
        other.keyword.value if other.keyword is not None else i
        for i, other in enumerate(call.args)
        if not other.star and _an_object(a, use.scope, other.value)
    ]
    landing = _landing(call, arg)
    if use.role is Role.MODEL and not use.bare and only_runs(a.path, qualified, landing):
        return True  # ``validate(net, loader)``: forwards the wrapper answers as its module
    return uses_only(a.path, qualified, landing, attributes, objects)


def _landing(call: cst.Call, arg: cst.Arg) -> int | str:
    return arg.keyword.value if arg.keyword is not None else list(call.args).index(arg)


def _an_object(a: Analysis, scope: Scope, value: cst.BaseExpression) -> bool:
    """A name every binding of which in ``scope`` builds one of the objects the analysis knows
    (``loss_scaler = NativeScaler()``): never None."""
    key = key_of(value)
    built = [b for b in a.bindings if b.scope is scope and b.key == key]
    return (
        key is not None
        and bool(built)
        and a.role(scope, key) is not None
        and all(isinstance(b.value, cst.Call) for b in built)
    )


def _linked(a: Analysis, call: cst.Call, arg: cst.Arg) -> bool:
    """Whether ``arg`` lands on a named parameter of the same-file function ``call`` runs."""
    callee = a.callee(call)
    if callee is None or arg.star:
        return False
    if arg.keyword is not None:
        return arg.keyword.value in callee.params
    params = callee.params
    if callee.cls is not None and params and params[0] == "self":
        params = params[1:]
    return list(call.args).index(arg) < len(params)


def _contained(
    a: Analysis, setup: Setup, use: _Use, element: cst.CSTNode
) -> tuple[cst.CSTNode, str] | None:
    container = a.parent(element)
    holder = a.parent(container) if container is not None else None
    pairs = unpacked(holder) if isinstance(holder, cst.Assign) else None
    if pairs is not None and holder.value is container:  # type: ignore[union-attr]
        # ``a, b = model, optimizer``: each target is an alias of its own value
        at = list(container.elements).index(element)  # type: ignore[union-attr,arg-type]
        return _aliased(a, setup, use, holder, pairs[at][0])  # type: ignore[arg-type]
    if isinstance(holder, cst.Return):
        return _unaccounted(a, setup, _Use(container, use.scope, use.key, use.role, use.bare))  # type: ignore[arg-type]
    kind = type(container).__name__.lower() if container is not None else "container"
    held = "bare" if use.bare else "prepared"
    return container or element, (
        f"{use.key} is put in a {kind} here, which keeps the {held} {_noun(use.role)}: uses "
        "through it are not followed, so the conversion cannot show them right"
    )


def _aliased(
    a: Analysis,
    setup: Setup,
    use: _Use,
    assign: cst.Assign,
    target: cst.BaseExpression | None = None,
) -> tuple[cst.CSTNode, str] | None:
    """``alias = key``: every use of ``alias`` must fit what it holds."""
    target = assign.targets[0].target if target is None else target
    alias = key_of(target)
    if len(assign.targets) != 1 or alias is None:
        return assign, (
            f"{use.key} is stored here ({a.module.code_for_node(target).strip()}), where its "
            "uses are not followed"
        )
    if alias == use.key:
        return None
    if alias.startswith("self."):
        return None  # ``self.model = model``: the analysis follows the attribute
    binds = [b for b in a.bindings if b.scope is use.scope and b.key == alias]
    if len(binds) > 1 and use.bare is not True:
        return assign, (
            f"{alias} is bound more than once, here to {use.key}: which object its uses "
            "hold is not followed"
        )
    for ref in _alias_reads(a, use.scope, alias):
        why = _alias_use(a, use, alias, ref)
        if why is not None:
            return why
    return None


def _alias_reads(a: Analysis, scope: Scope, alias: str) -> Iterator[cst.BaseExpression]:
    finder = _Loads()
    walk(scope.node, finder)
    for node in finder.found:
        if a.scope_of.get(id(node)) is scope and key_of(node) == alias:
            yield node


def _alias_use(
    a: Analysis, use: _Use, alias: str, ref: cst.BaseExpression
) -> tuple[cst.CSTNode, str] | None:
    node = _value_of(a, ref)
    parent = a.parent(node)
    made = "before" if use.bare else "after"
    if use.role is not Role.MODEL:
        if isinstance(parent, cst.Attribute) and parent.value is node:
            return None
        if isinstance(parent, cst.For | cst.CompFor) and parent.iter is node:
            return None
        return node, (
            f"{alias} is another name for {use.key}, made {made} prepare(), and is used here "
            "where that name is not followed"
        )
    if isinstance(parent, cst.Attribute) and parent.value is node:
        if use.bare or parent.attr.value in MODULE_API:
            return None
        return parent, (
            f"{alias} = {use.key} holds the prepared model, a wrapper on several processes: "
            f"{alias}.{parent.attr.value} is not one the wrapper answers"
        )
    if isinstance(parent, cst.Call) and parent.func is node:
        if use.bare is False:
            return None
        return node, (
            f"{alias} = {use.key} is made before prepare() and keeps the bare module: "
            f"{alias}(...) would run it without the wrapper, so its gradients would not be "
            "synchronised across processes"
        )
    if isinstance(parent, cst.Arg):
        call = a.parent(parent)
        last = a.names.last_part(call.func) if isinstance(call, cst.Call) else None
        if last in READERS or (use.bare and last in _BARE_MODEL_READERS):
            return None
        if isinstance(call, cst.Call) and _helper_reads(a, use, call, parent):
            return None
    if isinstance(parent, cst.Comparison | cst.ComparisonTarget | cst.Expr | cst.Del):
        return None
    return node, (
        f"{alias} is another name for {use.key}, made {made} prepare(), and is used here "
        "where that name is not followed"
    )
