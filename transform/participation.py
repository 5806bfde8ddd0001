"""Which prepared models leave parameters without a gradient in a training step.

DistributedDataParallel reduces gradients bucket by bucket and waits for every parameter it
wraps; a parameter that gets no gradient in a step (the auxiliary head of ``validity, _ = D(x)``,
InfoGAN's code head in the generator's step, a head the file's model class builds and its
``forward`` never calls, layers whose output the forward cuts off the graph with ``.data``)
stops it with "Expected to have finished reduction in the prior iteration" at the next one,
unless it was told to look for unused parameters.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

import libcst as cst

from accelify.transform.analysis import Analysis, key_of, name_nodes, unwrap_moves
from accelify.transform.patterns import dotted_name, random_draw
from accelify.transform.setup import Setup, in_training_step, origins
from accelify.transform.walk import nodes


def partly_used(a: Analysis, setup: Setup) -> dict[str, cst.Call]:
    """Prepared model -> the first training-step forward whose outputs are partly discarded,
    for models whose every training-step forward discards some. One forward that keeps all its
    outputs (A2C's rollout steps, before a last ``_, next_value = model(s)``) gives their
    parameters a gradient; and with several forwards per backward, DistributedDataParallel's
    search for unused parameters starts from the last one only, so it would mark parameters the
    others use as unused, then fail when their gradients come."""
    models = set(setup.models(a))
    found: dict[str, cst.Call] = {}
    whole: set[str] = set()
    for call, scope in a.calls:
        key = key_of(call.func)
        if scope not in setup.reach or key is None or not in_training_step(a, call):
            continue
        held = origins(a, setup.scope, scope, key) & models
        if not held:
            continue
        if _discards(a, call):
            for model in held - _same_parameters(a, setup):
                found.setdefault(model, call)
        else:
            whole |= held
    return {model: call for model, call in found.items() if model not in whole}


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


def idle_submodules(a: Analysis, setup: Setup) -> dict[str, cst.Attribute]:
    """Prepared model -> a submodule built for it that nothing ever reads: ``self.head =
    nn.Linear(...)`` in its class's ``__init__`` (in this file), or ``model.out_head =
    nn.Linear(...)`` attached from outside, with no ``.head`` read anywhere. A class that reaches
    its submodules by name or by iteration is left alone."""
    found: dict[str, cst.Attribute] = {}
    for model, cls in built_models(a, setup):
        idle = _idle_in(a, cls, set()) or _attached_idle(a, setup, model, cls)
        if idle is not None:
            found[model] = idle
    return found


def built_models(a: Analysis, setup: Setup) -> Iterator[tuple[str, str]]:
    """(prepared model, the class its build calls) for each model the setup builds itself."""
    models = setup.models(a)
    for b in setup.prepared:
        value = unwrap_moves(b.value) if b.value is not None else None
        if b.key in models and isinstance(value, cst.Call):
            yield b.key, a.names.last_part(value.func) or ""


def random_layers(a: Analysis, setup: Setup) -> dict[str, cst.CSTNode]:
    """Prepared model -> the ``for``/``while``/``if`` of its class's ``forward`` (in this file)
    that a random draw decides (``for _ in range(random.randint(0, 3))``): a step that draws
    none leaves the layers under it without a gradient, seeded or not."""
    found: dict[str, cst.CSTNode] = {}
    for model, cls in built_models(a, setup):
        forward = a.methods.get(cls, {}).get("forward")
        controls = nodes(forward.node, (cst.For, cst.While, cst.If)) if forward else ()
        for control in controls:
            decider = control.iter if isinstance(control, cst.For) else control.test  # type: ignore[attr-defined]
            if any(random_draw(call, a.names) for call in nodes(decider, cst.Call)):  # type: ignore[arg-type]
                found[model] = control
                break
    return found


def cut_layers(a: Analysis, setup: Setup) -> dict[str, cst.CSTNode]:
    """Prepared model -> a ``.data`` or ``.detach()`` in its class's methods, or in those of the
    file's model classes it builds in (``torch.cat((x, h.cpu().data))``): what feeds the cut
    value trains no further, so layers that only feed it may get no gradient."""

    def cut(method: cst.CSTNode) -> cst.CSTNode | None:
        return next((n for n in nodes(method, cst.Attribute) if _detaches(a, n)), None)

    return _in_model_classes(a, setup, cut)


def replaced_parameters(a: Analysis, setup: Setup) -> dict[str, cst.CSTNode]:
    """Prepared model -> an assignment of a new ``nn.Parameter`` to a module's attribute in a
    method that runs after construction (the EMA vector quantizer's ``self._ema_w =
    nn.Parameter(...)`` in ``forward``): DistributedDataParallel keeps to the parameters it
    was given, so each process updates the new ones apart, and the replicas part."""

    def replaces(method: cst.CSTNode) -> cst.CSTNode | None:
        for assign in nodes(method, cst.Assign):
            value = assign.value  # type: ignore[attr-defined]
            if (
                isinstance(value, cst.Call)
                and a.names.last_part(value.func) == "Parameter"
                and any(isinstance(t.target, cst.Attribute) for t in assign.targets)  # type: ignore[attr-defined]
            ):
                return assign
        return None

    return _in_model_classes(a, setup, replaces)


def _in_model_classes(
    a: Analysis, setup: Setup, find: Callable[[cst.CSTNode], cst.CSTNode | None]
) -> dict[str, cst.CSTNode]:
    """Prepared model -> what ``find`` finds in a method of its class that may run after
    construction, or in those of the file's model classes it builds in its ``__init__``."""
    found: dict[str, cst.CSTNode] = {}
    called = _called_after_construction(a)
    for model, cls in built_models(a, setup):
        node = _found_in(a, cls, called, set(), find)
        if node is not None:
            found[model] = node
    return found


def _found_in(
    a: Analysis,
    cls: str,
    called: set[str],
    seen: set[str],
    find: Callable[[cst.CSTNode], cst.CSTNode | None],
) -> cst.CSTNode | None:
    if cls in seen or cls not in a.methods:
        return None
    seen.add(cls)
    for name, method in a.methods[cls].items():
        if name not in called:
            continue  # construction only (``initialize_weights``): no graph yet
        if (node := find(method.node)) is not None:
            return node
    init = a.methods[cls].get("__init__")
    # every submodule it may build, under an ``if decay > 0:`` too
    for stmt in nodes(init.node, cst.SimpleStatementLine) if init is not None else ():
        built = _built_submodule(a, stmt)
        if built is not None and (inner := _found_in(a, built[1], called, seen, find)):
            return inner
    return None


def _called_after_construction(a: Analysis) -> set[str]:
    """Method names that may run on a built module: ``forward``, and every name called as a
    method anywhere in the file outside an ``__init__`` (``self.encode(x)``, ``model.generate``)."""
    called = {"forward", "__call__"}
    for call, scope in a.calls:
        if scope.name != "__init__" and isinstance(call.func, cst.Attribute):
            called.add(call.func.attr.value)
    return called


def _detaches(a: Analysis, node: cst.Attribute) -> bool:
    """``x.data`` read (not ``p.data = ...`` written) or ``x.detach()``/``x.detach_()``."""
    parent = a.parent(node)
    if node.attr.value in ("detach", "detach_"):
        return isinstance(parent, cst.Call) and parent.func is node
    if node.attr.value != "data":
        return False
    if isinstance(node.value, cst.Call) and dotted_name(node.value.func) == "next":
        return False  # ``next(self.parameters()).data``: a parameter read for its dtype
    return not (isinstance(parent, cst.AssignTarget) and parent.target is node)


def _attached_idle(a: Analysis, setup: Setup, model: str, cls: str) -> cst.Attribute | None:
    """``model.out_head = nn.Linear(...)`` in the setup and no ``.out_head`` read in the file.
    Where the class is another package's, its forward is unseen: a head it reads by convention
    (``model.fc = ...`` on a torchvision ResNet) is taken as replaced, not idle."""
    if cls in a.methods and _dynamic(a, cls):
        return None
    for assign, scope in a.assignments:
        if scope is not setup.scope or not isinstance(assign, cst.Assign):
            continue
        target = assign.targets[0].target if len(assign.targets) == 1 else None
        if not (
            isinstance(target, cst.Attribute)
            and key_of(target.value) == model
            and _module_built(a, assign.value)
        ):
            continue
        attr = target.attr.value
        if _reads(a, attr) == 0 and (cls in a.methods or attr not in _LIBRARY_HEADS):
            return target
    return None


# The heads library models' forwards call by name (torchvision, timm, transformers): assigning
# one replaces the head the forward already uses.
_LIBRARY_HEADS = frozenset(
    {
        "fc", "classifier", "head", "heads", "lm_head", "score", "pre_classifier",
        "last_linear", "AuxLogits", "aux_logits", "qa_outputs", "cls",
    }
)  # fmt: skip


# torch.nn's modules that hold no parameters: one built and never used leaves no parameter
# without a gradient (a tutorial's ``self.softmax = nn.LogSoftmax()`` beside a CrossEntropyLoss).
NO_PARAMETERS = frozenset(
    {
        "ReLU", "ReLU6", "LeakyReLU", "ELU", "SELU", "CELU", "GELU", "SiLU", "Mish", "Sigmoid",
        "Tanh", "Softplus", "Softsign", "Hardtanh", "Hardswish", "Hardsigmoid", "Tanhshrink",
        "Softmax", "LogSoftmax", "Softmax2d", "Dropout", "Dropout1d", "Dropout2d", "Dropout3d",
        "AlphaDropout", "Identity", "Flatten", "Unflatten", "MaxPool1d", "MaxPool2d", "MaxPool3d",
        "AvgPool1d", "AvgPool2d", "AvgPool3d", "AdaptiveAvgPool1d", "AdaptiveAvgPool2d",
        "AdaptiveAvgPool3d", "AdaptiveMaxPool1d", "AdaptiveMaxPool2d", "AdaptiveMaxPool3d",
        "Upsample", "PixelShuffle", "ZeroPad2d", "CrossEntropyLoss", "NLLLoss", "MSELoss",
        "L1Loss", "BCELoss", "BCEWithLogitsLoss", "SmoothL1Loss", "KLDivLoss",
    }
)  # fmt: skip


def _idle_in(a: Analysis, cls: str, seen: set[str]) -> cst.Attribute | None:
    methods: Mapping = a.methods.get(cls, {})
    init = methods.get("__init__")
    if cls in seen or init is None or _dynamic(a, cls):
        return None
    seen.add(cls)
    for stmt in init.body:
        built = _built_submodule(a, stmt)
        if built is None:
            continue
        target, kind = built
        parameterless = kind in NO_PARAMETERS and kind not in a.model_classes
        if _reads(a, target.attr.value) == 0 and not parameterless:
            return target
        if kind in a.methods and (inner := _idle_in(a, kind, seen)) is not None:
            return inner
    return None


def _built_submodule(a: Analysis, stmt: cst.CSTNode) -> tuple[cst.Attribute, str] | None:
    """``self.x = SomeModule(...)`` -> (``self.x``, ``SomeModule``), for torch.nn's classes and
    the file's own model classes."""
    if not (isinstance(stmt, cst.SimpleStatementLine) and isinstance(stmt.body[0], cst.Assign)):
        return None
    assign = stmt.body[0]
    target = assign.targets[0].target if len(assign.targets) == 1 else None
    if not (
        isinstance(target, cst.Attribute)
        and isinstance(target.value, cst.Name)
        and target.value.value == "self"
        and isinstance(assign.value, cst.Call)
    ):
        return None
    return (
        (target, a.names.last_part(assign.value.func) or "")
        if _module_built(a, assign.value)
        else None
    )


def _module_built(a: Analysis, value: cst.BaseExpression) -> bool:
    """``nn.Linear(...)`` or one of the file's model classes: a call that builds a module."""
    if not isinstance(value, cst.Call):
        return False
    kind = a.names.last_part(value.func) or ""
    dotted = dotted_name(value.func) or ""
    from_nn = dotted.startswith(("nn.", "torch.nn.")) and kind[:1].isupper()
    return from_nn or kind in a.model_classes


def _reads(a: Analysis, attr: str) -> int:
    """How many times ``.attr`` is read (not assigned) in the file, other than to reach its
    parameters or its mode (``model.head.parameters()`` to freeze it runs nothing of it)."""
    stores = {
        id(target.target)
        for assign, _ in a.assignments
        if isinstance(assign, cst.Assign)
        for target in assign.targets
    }
    found = nodes(a.module, cst.Attribute)
    return sum(
        n.attr.value == attr and id(n) not in stores and not _bookkeeping(a, n)  # type: ignore[attr-defined]
        for n in found
    )


def _bookkeeping(a: Analysis, node: cst.CSTNode) -> bool:
    parent = a.parent(node)
    return isinstance(parent, cst.Attribute) and parent.attr.value in _BOOKKEEPING


_BOOKKEEPING = frozenset(
    {"parameters", "named_parameters", "requires_grad_", "train", "eval", "to", "cuda", "cpu"}
)


# Ways a module reaches its submodules without naming them.
_BY_ITERATION = frozenset(
    {"children", "named_children", "modules", "named_modules", "_modules", "__dict__"}
)


def _dynamic(a: Analysis, cls: str) -> bool:
    for scope in a.methods.get(cls, {}).values():
        if any(n.attr.value in _BY_ITERATION for n in nodes(scope.node, cst.Attribute)):  # type: ignore[attr-defined]
            return True
        if any(dotted_name(n.func) in {"getattr", "vars"} for n in nodes(scope.node, cst.Call)):  # type: ignore[attr-defined]
            return True
    return False
