"""The script's own way to ask for the CPU becomes ``Accelerator(cpu=...)``.

``device = "cpu"`` gives ``cpu=True``: the script computes on the CPU even where a GPU is.

``device = torch.device("cuda" if use_cuda else "cpu")`` (or an ``if``/``else`` that picks the
two) gives way to ``accelerator.device``; without this step a ``--no-cuda`` flag would stop
working and the converted script would take the GPU anyway. The condition goes over as it is
(``cpu=not use_cuda``), so it is read where the accelerator is created: :func:`place` passes it
on only when what it reads is set by then, and says so when it is not. A condition made only of
``*.is_available()`` calls needs no flag: the accelerator makes the same choice.
"""

from __future__ import annotations

import libcst as cst

from accelify.transform.analysis import Analysis, Binding, Scope, key_of, mentions
from accelify.transform.patterns import (
    Role,
    asks_availability,
    device_call,
    dotted_name,
    is_device,
    method_call,
)
from accelify.transform.plan import Plan
from accelify.transform.steps.device import device_chain
from accelify.transform.walk import nodes


def cpu_choice(plan: Plan) -> None:
    setup = plan.setup
    if setup is None:
        return
    a = plan.analysis
    devices = [
        b
        for b in a.bindings
        if b.scope is setup.scope
        and isinstance(b.node, cst.Assign)
        and a.role(b.scope, b.key) is Role.DEVICE
    ]
    keys = {b.key for b in devices}
    # ``device_type = "cuda" if "cuda" in str(device) else "cpu"`` follows the device: not a choice.
    bindings = [b for b in devices if b.value is None or not mentions(b.value, keys - {b.key})]
    if not bindings:
        _moved_under_a_switch(plan)
        return
    if len({b.key for b in bindings}) != 1:
        return  # several devices: no one choice to carry over
    found = _condition(a, bindings)
    if found is not None:
        condition, cpu_when_true = found
        if _availability_only(a, condition, bindings[0].scope):
            return
        flag = condition if cpu_when_true else _negated(a, condition)
    elif len(bindings) == 1 and bindings[0].value is not None and _is_cpu(a, bindings[0].value):
        flag = cst.Name("True")  # ``device = "cpu"``: the script runs on the CPU, wherever it is
    elif len(bindings) == 1 and (named := _named_at_run_time(a, bindings[0])) is not None:
        # str(): ``args.device`` may hold "cpu" or torch.device("cpu"), which equals no string.
        shown = cst.Call(cst.Name("str"), [cst.Arg(named)])
        flag = cst.Comparison(shown, [cst.ComparisonTarget(cst.Equal(), cst.SimpleString('"cpu"'))])
    else:
        return
    plan.cpu_choice = (bindings[0].node, flag)


def _moved_under_a_switch(plan: Plan) -> None:
    """``if args.cuda: model.cuda()`` or ``net = net.cuda()`` (with the batches' own moves
    beside it), and no device named: the switch decides between the GPU and the CPU, so
    ``cpu=not args.cuda``."""
    a = plan.analysis
    setup = plan.setup
    assert setup is not None
    models = set(setup.models(a))
    for call, scope in a.calls:
        receiver = call.func.value if isinstance(call.func, cst.Attribute) else None
        if (
            method_call(call, "cuda") is None
            or receiver is None
            or key_of(receiver) not in models
            or scope is not setup.scope
            or not _alone(a, call, receiver)
        ):
            continue
        switch = a.enclosing(call, cst.If)
        if switch is None or switch.orelse is not None or a.scope_of.get(id(switch)) is not scope:  # type: ignore[attr-defined]
            return
        test = switch.test  # type: ignore[attr-defined]
        if not _availability_only(a, test, scope) and not _counts_gpus(a, test):
            plan.cpu_choice = (switch, _negated(a, test))
        return


def _counts_gpus(a: Analysis, test: cst.BaseExpression) -> bool:
    """``if torch.cuda.device_count() > 1:``, DataParallel's test: it asks how many GPUs there
    are to spread over, not whether to use one, so the accelerator takes the GPU where there is
    one."""
    return any(a.names.last_part(c.func) == "device_count" for c in nodes(test, cst.Call))  # type: ignore[attr-defined]


def _alone(a: Analysis, call: cst.Call, receiver: cst.BaseExpression) -> bool:
    """``model.cuda()`` as a statement, or ``model = model.cuda()``: a move and nothing else."""
    parent = a.parent(call)
    if isinstance(parent, cst.Expr):
        return True
    return (
        isinstance(parent, cst.Assign)
        and len(parent.targets) == 1
        and key_of(parent.targets[0].target) == key_of(receiver)
    )


def _condition(a: Analysis, bindings: list[Binding]) -> tuple[cst.BaseExpression, bool] | None:
    """(condition, whether true means the CPU) of a two-way choice between the CPU and another
    device, written as a conditional expression or as an ``if``/``else``."""
    if len(bindings) == 1:
        value = bindings[0].value
        if isinstance(value, cst.Call) and len(value.args) == 1:  # torch.device(<choice>)
            value = value.args[0].value
        if isinstance(value, cst.IfExp):
            return _sides(a, value.test, value.body, value.orelse)
        return None
    chain = device_chain(a, bindings[0])
    if len(bindings) != 2 or chain is None or not isinstance(chain.orelse, cst.Else):
        return None
    first, second = (b.value for b in bindings)
    inside = a.contains(chain.body, bindings[0].node) and a.contains(chain.orelse, bindings[1].node)
    if not inside:
        return None
    return _sides(a, chain.test, first, second)  # type: ignore[arg-type]


def _sides(
    a: Analysis,
    test: cst.BaseExpression,
    when_true: cst.BaseExpression,
    when_false: cst.BaseExpression,
) -> tuple[cst.BaseExpression, bool] | None:
    cpu = (_is_cpu(a, when_true), _is_cpu(a, when_false))
    if cpu == (False, True) and is_device(when_true, by_name=False, names=a.names):
        return test, False
    if cpu == (True, False) and is_device(when_false, by_name=False, names=a.names):
        return test, True
    return None


def _named_at_run_time(a: Analysis, binding: Binding) -> cst.BaseExpression | None:
    """``args.device`` of ``device = torch.device(args.device)``: a device named by a string
    the run picks (``--device cpu``), which asks for the CPU when it says "cpu"."""
    value = _named(a, binding.value)  # type: ignore[arg-type]
    if isinstance(value, cst.Attribute) and dotted_name(value) is not None:
        return value
    return None


def _is_cpu(a: Analysis, value: cst.BaseExpression) -> bool:
    """``"cpu"`` or ``torch.device("cpu")``."""
    value = _named(a, value)
    return isinstance(value, cst.SimpleString) and value.evaluated_value == "cpu"


def _named(a: Analysis, value: cst.BaseExpression) -> cst.BaseExpression:
    """What names the device: ``x`` of ``torch.device(x)``, or the value itself."""
    if isinstance(value, cst.Call) and len(value.args) == 1 and device_call(value.func, a.names):
        return value.args[0].value
    return value


def _availability_only(a: Analysis, expr: cst.BaseExpression, scope: Scope) -> bool:
    """Made only of ``*.is_available()`` calls (through names bound once to such a test)."""

    def bound(name: cst.Name) -> cst.BaseExpression | None:
        values = [b.value for b in a.bindings if b.scope is scope and b.key == name.value]
        return values[0] if len(values) == 1 else None

    return asks_availability(expr, bound)


def _negated(a: Analysis, condition: cst.BaseExpression) -> cst.BaseExpression:
    if isinstance(condition, cst.UnaryOperation) and isinstance(condition.operator, cst.Not):
        return condition.expression.with_changes(lpar=[], rpar=[])
    code = a.module.code_for_node(condition.with_changes(lpar=[], rpar=[]))
    atomic = isinstance(condition, cst.Name | cst.Attribute | cst.Call | cst.Subscript)
    return cst.parse_expression(f"not {code}" if atomic else f"not ({code})")
