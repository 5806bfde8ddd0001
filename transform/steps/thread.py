"""Hand the accelerator to the functions that now need it.

When the accelerator is created inside ``main()``, a ``train(model, loader, optimizer)`` function
that calls ``accelerator.backward`` gets an ``accelerator`` parameter, and every call to it in the
file passes ``accelerator=accelerator``. Callers that are not the setup get it the same way, up
the call chain.
"""

from __future__ import annotations

import libcst as cst

from accelify.transform.analysis import Scope
from accelify.transform.patterns import dotted_name
from accelify.transform.plan import Plan
from accelify.transform.setup import ACCELERATOR


def thread(plan: Plan) -> None:
    a = plan.analysis
    done: set[Scope] = set()
    while pending := plan.borrowers - done:
        for scope in pending:
            done.add(scope)
            _add_parameter(plan, scope)
            for call, caller in a.calls:
                if dotted_name(call.func) != scope.name:
                    continue
                value = plan.accelerator(call)  # may enlist ``caller`` as a borrower too
                if value is None:
                    plan.needs_human(call, f"{scope.name}() needs the accelerator; pass it by hand")
                    continue
                arg = cst.Arg(value, keyword=cst.Name(ACCELERATOR), equal=_tight_equal())
                plan.edits.replace(
                    call,
                    lambda node, arg=arg: node.with_changes(
                        args=[*_comma_after_last(node.args), arg]
                    ),
                )
                del caller


def _add_parameter(plan: Plan, scope: Scope) -> None:
    node = scope.node
    params = node.params  # type: ignore[union-attr]
    new = cst.Param(cst.Name(ACCELERATOR))
    if params.star_arg is not cst.MaybeSentinel.DEFAULT or any(p.default for p in params.params):
        star = params.star_arg
        if star is cst.MaybeSentinel.DEFAULT:
            star = cst.ParamStar()
        changed = params.with_changes(star_arg=star, kwonly_params=[*params.kwonly_params, new])
    else:
        changed = params.with_changes(params=[*_comma_after_last(params.params), new])
    plan.edits.replace(params, changed)
    plan.changed(node, f"{scope.name}() now receives the accelerator")


def _tight_equal() -> cst.AssignEqual:
    empty = cst.SimpleWhitespace("")
    return cst.AssignEqual(whitespace_before=empty, whitespace_after=empty)


def _comma_after_last(items):
    if not items:
        return []
    last = items[-1].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
    return [*items[:-1], last]
