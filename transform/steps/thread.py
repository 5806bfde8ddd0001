"""Hand the accelerator to the functions that now need it.

When the accelerator is created inside ``main()``, a ``train(model, loader, optimizer)`` function
that calls ``accelerator.backward`` gets an ``accelerator`` parameter, and every call to it in the
file passes ``accelerator=accelerator``. Callers that are not the setup get it the same way, up
the call chain. A class whose methods need it (a ``Trainer`` handed the prepared objects) gets it
in ``__init__``, which keeps it as ``self.accelerator`` before anything else runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

import libcst as cst

from accelify.transform.analysis import Scope, name_nodes
from accelify.transform.plan import Plan
from accelify.transform.refusals import NAME_TAKEN, UNTRACKED_USE
from accelify.transform.setup import ACCELERATOR, Refused
from accelify.transform.steps.accelerator import is_docstring

_Item = TypeVar("_Item", cst.Arg, cst.Param)


def thread(plan: Plan) -> None:
    a = plan.analysis
    done: set[Scope] = set()
    while pending := plan.borrowers - done:
        for scope in pending:
            done.add(scope)
            _refuse_calls_left_alone(plan, scope)
            _add_parameter(plan, scope)
            if scope.cls is not None:
                _keep_on_self(plan, scope)
            for call, _caller in a.calls:
                if a.callee(call) is not scope:
                    continue
                value = plan.accelerator(call)  # may enlist ``_caller`` as a borrower too
                assert value is not None  # not optional: where it cannot be had, it refuses
                arg = cst.Arg(value, keyword=cst.Name(ACCELERATOR), equal=_tight_equal())
                plan.edits.replace(
                    call, lambda node, arg=arg: node.with_changes(args=_appended(node.args, arg))
                )


def _refuse_calls_left_alone(plan: Plan, scope: Scope) -> None:
    """A call of ``scope`` in code left for a human (another setup's) would miss the new
    parameter: a TypeError where the original ran."""
    a = plan.analysis
    for call, _where in a.left_calls:
        if a.callee(call) is scope:
            raise Refused(
                call,
                UNTRACKED_USE,
                f"{scope.name}() now needs the accelerator, but this call is in code left as it "
                "is, which cannot hand it over: convert by hand",
            )


def _keep_on_self(plan: Plan, init: Scope) -> None:
    """``self.accelerator = accelerator`` first in ``__init__``, so every method reaches it.

    Only when each mention of the class in the file is a call that builds it (each is handed
    the accelerator above): a subclass, or the class passed around and built elsewhere, would
    miss the new argument.
    """
    a = plan.analysis
    cls = init.cls
    assert cls is not None
    name = cls.name.value
    builds = {id(call.func) for call, _scope in a.calls if a.callee(call) is init}
    for mention in name_nodes(a.module, name):
        if mention is not cls.name and id(mention) not in builds:
            raise Refused(
                mention,
                UNTRACKED_USE,
                f"{name} is used here other than built, so it cannot be handed the accelerator",
            )
    if any(b.key == f"self.{ACCELERATOR}" and b.scope.cls is cls for b in a.bindings):
        raise Refused(cls, NAME_TAKEN, f"{name} already has an attribute {ACCELERATOR}")
    body = init.body
    first = 1 if body and is_docstring(body[0]) else 0
    statement = plan.statement(f"self.{ACCELERATOR} = {ACCELERATOR}\n")
    if first < len(body):
        plan.edits.insert_before(body[first], statement, first=True)
    else:
        plan.edits.insert_after(body[-1], statement)


def _add_parameter(plan: Plan, scope: Scope) -> None:
    node = scope.node
    params = node.params  # type: ignore[union-attr]
    new = cst.Param(cst.Name(ACCELERATOR))
    if params.star_arg is not cst.MaybeSentinel.DEFAULT or any(p.default for p in params.params):
        star = params.star_arg
        if star is cst.MaybeSentinel.DEFAULT:
            star = cst.ParamStar()
        changed = params.with_changes(
            star_arg=star, kwonly_params=_appended(params.kwonly_params, new)
        )
    else:
        changed = params.with_changes(params=_appended(params.params, new))
    plan.edits.replace(params, changed)
    name = f"{scope.cls.name.value}.{scope.name}" if scope.cls is not None else scope.name
    elsewhere = ""
    if _importable(scope):  # every call in this file passes it; one in a notebook cannot
        called = scope.cls.name.value if scope.cls is not None else name
        elsewhere = f": a call of {called}() in another file must pass accelerator= too"
    plan.changed(node, f"{name}() now receives the accelerator{elsewhere}")


def _importable(scope: Scope) -> bool:
    """A public function or class of the module, which other files and notebooks may import."""
    if scope.parent is None or not scope.parent.is_module:
        return False
    public = scope.cls.name.value if scope.cls is not None else scope.name
    return not public.startswith("_") and public != "main"


def _tight_equal() -> cst.AssignEqual:
    empty = cst.SimpleWhitespace("")
    return cst.AssignEqual(whitespace_before=empty, whitespace_after=empty)


def _appended(items: Sequence[_Item], new: _Item) -> list[_Item]:
    """``items`` followed by ``new``, laid out as they are: after a trailing comma (one item a
    line), ``new`` gets a line of its own and the trailing comma."""
    if not items:
        return [new]
    last = items[-1]
    if isinstance(last.comma, cst.Comma) and len(items) > 1:
        between = items[-2].comma
        return [*items[:-1], last.with_changes(comma=between), new.with_changes(comma=last.comma)]
    comma = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
    # The space before ``)`` (a line break when the bracket has a line of its own) follows ``new``.
    space = "whitespace_after_arg" if isinstance(last, cst.Arg) else "whitespace_after_param"
    before_bracket = {space: getattr(last, space)}
    empty = {space: cst.SimpleWhitespace("")}
    return [
        *items[:-1],
        last.with_changes(comma=comma, **empty),
        new.with_changes(**before_bracket),
    ]
