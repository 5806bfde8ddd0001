"""A prepared model is a wrapper: what the model class adds is reached through
``accelerator.unwrap_model(model)``.

On several processes ``prepare()`` wraps the model (DistributedDataParallel, FSDP, DeepSpeed),
and the wrapper forwards ``model(x)`` and nn.Module's own methods but nothing the model's class
adds: ``model.decode(z)``, ``model.init_hidden(n)`` or ``policy.rewards`` raise AttributeError.
``state_dict``/``load_state_dict`` exist on the wrapper but with its key prefix, so a checkpoint
would not load into a plain model. Both go through ``accelerator.unwrap_model(model)``, as HF's
guides write them; on one process, or on a model not yet prepared, it returns the model itself.
A method the training step itself calls is refused instead: computing the loss through the bare
module would bypass the wrapper, and the replicas would not stay synchronised. Unless what the
call computes cannot reach that loss:

- the method, read in the model's class in this file, runs none of the module: ``init_hidden``
  returning ``torch.zeros(self.n_layers, batch, self.hidden_size)`` reads only plain attributes
  set in the class, and ``next(self.parameters()).new_zeros(...)`` only a parameter's device and
  dtype; what it returns is the same through the bare module, which computes nothing on it;
- or the call is made for its value and nothing computed from it feeds a backward pass of the
  function: a sample drawn with ``model.generate(...)`` every N steps to be printed or logged.
  Read over the whole function, whatever the order (a value kept for the next iteration
  counts), through assignments, calls that may store it (``samples.append(out)``) and the
  file's functions that train on what they are given. A call made for what it does
  (``model.save()``) may write on every process: refused.
"""

from __future__ import annotations

import libcst as cst

from accelify.transform.analysis import Analysis, Scope, key_of, names_in
from accelify.transform.participation import built_models
from accelify.transform.patterns import callee_name, dotted_name
from accelify.transform.plan import Plan
from accelify.transform.refusals import BARE_MODULE
from accelify.transform.setup import Refused, in_training_step, origins
from accelify.transform.walk import nodes

# What DistributedDataParallel and friends answer for the module itself.
MODULE_API = frozenset(
    {
        "train", "eval", "parameters", "named_parameters", "buffers", "named_buffers",
        "children", "named_children", "modules", "named_modules", "zero_grad",
        "requires_grad_", "to", "cuda", "cpu", "float", "half", "double", "bfloat16", "type",
        "apply", "register_forward_hook", "register_forward_pre_hook",
        "register_full_backward_hook", "register_backward_hook", "training", "forward",
        "__call__",
    }
)  # fmt: skip
# DistributedDataParallel's own switch, set on the wrapper itself (nanoGPT's micro-steps).
SYNC_TOGGLE = "require_backward_grad_sync"
# Not the model's computation: fine from inside the training step too.
_BOOKKEEPING = frozenset({"state_dict", "load_state_dict"})
# What a parameter tells without computing on it: ``weight.new_zeros(...)`` builds a new tensor.
_METADATA = frozenset(
    {"new", "new_zeros", "new_ones", "new_empty", "new_full", "device", "dtype", "is_cuda", "data"}
)
# What builds a new tensor from sizes (``Variable`` wraps one, as old scripts write it).
_FACTORIES = frozenset(
    {"zeros", "ones", "empty", "full", "randn", "rand", "arange", "tensor", "Variable"}
)
# Values an attribute may be set to and stay plain data: numbers, names, ``args.hidden``, sums.
_PLAIN_CALLS = frozenset({"int", "float", "len", "bool", "str", "max", "min"})


def unwrap(plan: Plan) -> None:
    setup = plan.setup
    if setup is None or setup.prepare_at is None:
        return
    a = plan.analysis
    models = set(setup.models(a))
    bypassing: list[tuple[cst.Attribute, Scope, str]] = []
    for node, scope in a.attributes:
        key = key_of(node.value)
        if key is None or node.attr.value in MODULE_API | {SYNC_TOGGLE}:
            continue
        if scope not in plan.training:
            continue
        found = origins(a, setup.scope, scope, key)
        if (
            not found
            or not found <= models
            or not setup.timeline.may_follow(setup.prepare_at, node)
        ):
            continue
        if not all(setup.current(a, k, node) for k in found):
            continue
        called = isinstance(a.parent(node), cst.Call) and a.parent(node).func is node  # type: ignore[union-attr]
        if (
            called
            and node.attr.value not in _BOOKKEEPING
            and in_training_step(a, node)
            and not _runs_none_of_the_module(plan, found, node.attr.value)
            and (why := _not_aside(a, scope, a.parent(node))) is not None  # type: ignore[arg-type]
        ):
            bypassing.append((node, scope, why))
            continue
        accelerator = plan.accelerator(node)
        unwrapped = cst.Call(
            cst.Attribute(accelerator, cst.Name("unwrap_model")),  # type: ignore[arg-type]
            args=[cst.Arg(node.value)],
        )
        plan.edits.replace(node.value, unwrapped)
        plan.changed(
            node, f"{key}.{node.attr.value} -> accelerator.unwrap_model({key}).{node.attr.value}"
        )
    if bypassing:
        _refuse_the_bypass(a, bypassing)


def _refuse_the_bypass(a: Analysis, bypassing: list[tuple[cst.Attribute, Scope, str]]) -> None:
    """Refuse at the call whose result reaches the backward by assignments alone (c51's
    ``_, old_pmfs = q_network.get_action(obs, actions)`` into the loss) before one whose result
    gets there only through what other calls store (its action picks, kept in a replay buffer
    that is sampled again)."""
    node, _scope, why = next(
        (b for b in bypassing if _feeds_backward(a, b[1], a.parent(b[0]), through_calls=False)),  # type: ignore[arg-type]
        bypassing[0],
    )
    key = key_of(node.value)
    raise Refused(
        node,
        BARE_MODULE,
        f"the training step calls {key}.{node.attr.value}(...), which the prepared (wrapped) "
        f"model does not have, {why}; call {key}(...) itself or convert by hand",
    )


def _runs_none_of_the_module(plan: Plan, models: set[str], method: str) -> bool:
    """Whether ``method`` of every model in ``models`` (each built from a class of this file)
    reads only plain attributes of ``self``, a parameter's metadata and such methods of its own:
    then the bare module's answer is the wrapper's, and no computation passes it by."""
    a = plan.analysis
    classes = dict(built_models(a, plan.setup))  # type: ignore[arg-type]
    for model in models:
        cls = classes.get(model)
        scope = a.methods.get(cls, {}).get(method) if cls else None
        if scope is None or not _reads_only_data(a, cls, scope, models, set()):  # type: ignore[arg-type]
            return False
    return True


def _reads_only_data(a: Analysis, cls: str, scope: Scope, models: set[str], seen: set[str]) -> bool:
    if scope.name in seen or not scope.params:
        return scope.name in seen
    seen.add(scope.name)
    this = scope.params[0]
    weights = _parameter_names(a, scope, this)
    for name in nodes(scope.node.body, cst.Name):  # type: ignore[union-attr]
        value = name.value  # type: ignore[attr-defined]
        parent = a.parent(name)
        if value in models or value == "super":
            return False
        if value in weights:
            read = isinstance(parent, cst.Attribute) and parent.attr.value in _METADATA
            if not (read or _binds(a, name)):
                return False
        if value != this or _binds(a, name):
            continue
        if not (isinstance(parent, cst.Attribute) and parent.value is name):
            return False  # self handed to something: it could run the module
        attr = parent.attr.value
        other = a.methods[cls].get(attr)
        called = isinstance(a.parent(parent), cst.Call) and a.parent(parent).func is parent  # type: ignore[union-attr]
        if other is not None:
            if not (called and _reads_only_data(a, cls, other, models, seen)):
                return False
        elif attr == "parameters":
            if not _next_parameter(a, parent):
                return False
        elif called or not _plain_attribute(a, cls, attr) or not _sizes(a, parent, weights):
            return False
    return True


def _sizes(a: Analysis, attribute: cst.Attribute, weights: set[str]) -> bool:
    """Whether ``self.n_layers`` (through arithmetic and tuples) only sizes a new tensor:
    an argument of ``torch.zeros(...)`` and its kin, or of ``weight.new_zeros(...)``."""
    node: cst.CSTNode = attribute
    parent = a.parent(node)
    while isinstance(parent, cst.BinaryOperation | cst.UnaryOperation | cst.Element | cst.Tuple):
        node, parent = parent, a.parent(parent)
    call = a.parent(parent) if isinstance(parent, cst.Arg) else None
    if not isinstance(call, cst.Call):
        return False
    name = dotted_name(call.func) or ""
    head, _, last = name.rpartition(".")
    if head in weights:
        return last in _METADATA
    return last in _FACTORIES and (head.split(".")[0] == "torch" or name == "Variable")


def _parameter_names(a: Analysis, scope: Scope, this: str) -> set[str]:
    """Names bound to one of the module's parameters: ``weight = next(self.parameters())``."""
    found = set()
    for statement in nodes(scope.node.body, cst.Assign):  # type: ignore[union-attr]
        value = statement.value  # type: ignore[attr-defined]
        if isinstance(value, cst.Attribute) and value.attr.value == "data":
            value = value.value
        targets = statement.targets  # type: ignore[attr-defined]
        if (
            len(targets) == 1
            and isinstance(targets[0].target, cst.Name)
            and isinstance(value, cst.Call)
            and dotted_name(value.func) == "next"
            and value.args
            and dotted_name(_inner(value.args[0].value)) == f"{this}.parameters"
        ):
            found.add(targets[0].target.value)
    return found


def _inner(value: cst.BaseExpression) -> cst.BaseExpression:
    """``self.parameters`` of ``self.parameters()`` or ``iter(self.parameters())``."""
    if isinstance(value, cst.Call) and dotted_name(value.func) == "iter" and value.args:
        value = value.args[0].value
    return value.func if isinstance(value, cst.Call) and not value.args else value


def _next_parameter(a: Analysis, parameters: cst.Attribute) -> bool:
    """``next(self.parameters())`` bound to a name (checked where read), or read for metadata."""
    call = a.parent(parameters)
    if isinstance(a.parent(call), cst.Arg) and dotted_name(a.parent(a.parent(call)).func) == "iter":  # type: ignore[union-attr]
        call = a.parent(a.parent(call))
    outer = a.parent(a.parent(call))  # Arg, then next(...)
    if not (isinstance(outer, cst.Call) and dotted_name(outer.func) == "next"):
        return False
    use = a.parent(outer)
    if isinstance(use, cst.Attribute) and use.attr.value == "data":
        use = a.parent(use)
    return isinstance(use, cst.Assign) or (
        isinstance(use, cst.Attribute) and use.attr.value in _METADATA
    )


def _binds(a: Analysis, name: cst.CSTNode) -> bool:
    parent = a.parent(name)
    return isinstance(parent, cst.AssignTarget | cst.Param)


def _plain_attribute(a: Analysis, cls: str, attr: str) -> bool:
    """Every ``self.attr = value`` in the class sets plain data (and there is one)."""
    values = [
        statement.value  # type: ignore[attr-defined]
        for method in a.methods[cls].values()
        for statement in nodes(method.node, (cst.Assign, cst.AugAssign, cst.AnnAssign))
        if any(
            dotted_name(target) == f"{method.params[0]}.{attr}" for target in _targets(statement)
        )
        if method.params
    ]
    return bool(values) and all(_plain(v) for v in values)


def _targets(statement: cst.CSTNode) -> list[cst.BaseExpression]:
    if isinstance(statement, cst.Assign):
        return [t.target for t in statement.targets]
    return [statement.target]  # type: ignore[attr-defined]


def _plain(value: cst.BaseExpression | None) -> bool:
    if isinstance(value, cst.Integer | cst.Float | cst.SimpleString):
        return True
    if isinstance(value, cst.Name | cst.Attribute):
        return (dotted_name(value) or "self").split(".")[0] != "self"
    if isinstance(value, cst.UnaryOperation):
        return _plain(value.expression)
    if isinstance(value, cst.BinaryOperation):
        return _plain(value.left) and _plain(value.right)
    if isinstance(value, cst.Call) and dotted_name(value.func) in _PLAIN_CALLS:
        return all(_plain(arg.value) for arg in value.args)
    return False


_RESULT = "<result>"  # stands for the call's value in the flow below
# Builtins that write into nothing they are handed (``print(x, sample)`` leaves ``x`` as it was).
_READS_ONLY = frozenset(
    {"print", "len", "str", "repr", "int", "float", "bool", "isinstance", "range", "enumerate",
     "zip", "sorted", "list", "tuple", "dict", "set", "min", "max", "sum", "abs", "round"}
)  # fmt: skip


def _not_aside(a: Analysis, scope: Scope, call: cst.Call) -> str | None:
    """Why the bare module may not make ``call``, or None for a call made for its value
    (``sample = model.generate(...)``) none of which feeds a backward pass. One made for what
    it does (``model.save()``) may write on every process."""
    if isinstance(a.parent(call), cst.Expr):
        return "and it is called for what it does, which every process would do"
    if _feeds_backward(a, scope, call):
        return "and what it returns reaches a backward pass, bypassing the wrapper"
    return None


def _feeds_backward(
    a: Analysis, scope: Scope, call: cst.Call, *, through_calls: bool = True
) -> bool:
    """Whether a value computed from ``call`` may reach a ``.backward()`` in ``scope``: the
    names each statement of the function makes from others (an assignment's targets from its
    value, a loop's target from its iterable, a call's receiver and the names it is handed
    from all it is handed, but an imported module: ``torch.argmax(out)`` stores nothing in
    ``torch``), followed back from what the backward passes are called on and with."""
    made: dict[str, set[str]] = {}

    def read(expr: cst.CSTNode) -> set[str]:
        # ``data.actions`` reads ``data``: an attribute's or a keyword's name is no variable.
        named = [
            *(x.attr for x in nodes(expr, cst.Attribute)),
            *(arg.keyword for arg in nodes(expr, cst.Arg)),
        ]  # type: ignore[attr-defined]
        skipped = {id(n) for n in named if n is not None}
        found = {n.value for n in names_in(expr) if id(n) not in skipped}
        return found | {_RESULT} if any(c is call for c in nodes(expr, cst.Call)) else found

    def make(targets: list[cst.BaseExpression], source: cst.CSTNode) -> None:
        for target in targets:
            for name in names_in(target):
                made.setdefault(name.value, set()).update(read(source))

    for node in nodes(scope.node, (cst.Assign, cst.AugAssign, cst.AnnAssign, cst.For, cst.Call)):
        if isinstance(node, cst.Assign):
            make([t.target for t in node.targets], node.value)
        elif isinstance(node, cst.AugAssign | cst.AnnAssign) and node.value is not None:
            make([node.target], node.value)
        elif isinstance(node, cst.For):
            make([node.target], node.iter)
        elif isinstance(node, cst.Call) and node.args and through_calls:
            given = cst.Tuple([cst.Element(arg.value) for arg in node.args])
            receiver = node.func.value if isinstance(node.func, cst.Attribute) else None
            if isinstance(receiver, cst.Name) and receiver.value in a.names.imports:
                receiver = None  # ``torch.argmax(out)`` stores nothing in ``torch``...
            # ... but ``np.copyto(dst, out)`` and ``out=`` may write into a name they are given.
            pure = isinstance(node.func, cst.Name) and node.func.value in _READS_ONLY
            written = (
                [] if pure else [arg.value for arg in node.args if isinstance(arg.value, cst.Name)]
            )
            make([*([receiver] if receiver is not None else []), *written], given)
    wanted: set[str] = set()
    for node in nodes(scope.node, cst.Call):
        arguments = read(cst.Tuple([cst.Element(arg.value) for arg in node.args]))  # type: ignore[attr-defined]
        if callee_name(node) == "backward" and isinstance(node.func, cst.Attribute):  # type: ignore[arg-type]
            wanted |= read(node.func.value) | arguments
        elif (callee := a.callee(node)) is not None and _runs_backward(a, callee, set()):  # type: ignore[arg-type]
            wanted |= arguments  # a function of this file that trains on what it is given
    seen: set[str] = set()
    while wanted - seen:
        name = (wanted - seen).pop()
        seen.add(name)
        wanted |= made.get(name, set())
    return _RESULT in seen


def _runs_backward(a: Analysis, scope: Scope, seen: set[int]) -> bool:
    """Whether ``scope`` calls ``.backward()``, itself or through the file's functions."""
    if id(scope.node) in seen:
        return False
    seen.add(id(scope.node))
    for call in nodes(scope.node, cst.Call):
        if callee_name(call) == "backward":  # type: ignore[arg-type]
            return True
        callee = a.callee(call)  # type: ignore[arg-type]
        if callee is not None and _runs_backward(a, callee, seen):
            return True
    return False
