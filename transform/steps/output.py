"""Output that every process would repeat: ``print`` and ``tqdm`` bars.

``print`` in training code becomes ``accelerator.print`` (main process only); ``tqdm(...)`` gets
``disable=not accelerator.is_local_main_process`` so one bar per machine is drawn. Output that runs
before the accelerator exists (``print(args)`` at the top of ``main()``) stays as it is.
"""

from __future__ import annotations

import libcst as cst

from accelify.transform.patterns import keyword_arg
from accelify.transform.plan import Plan

_BARS = frozenset({"tqdm", "trange"})


def output(plan: Plan) -> None:
    for call, _scope in plan.training_calls():
        name = plan.analysis.names.last_part(call.func)
        if isinstance(call.func, cst.Name) and name == "print":
            accelerator = plan.accelerator(call, optional=True)
            if accelerator is None:
                plan.info(call, "print runs before the accelerator exists: every process prints")
                continue
            plan.edits.replace(call.func, cst.Attribute(accelerator, cst.Name("print")))
            plan.changed(call, "print -> accelerator.print (main process only)")
        elif name in _BARS and keyword_arg(call, "disable") is None:
            accelerator = plan.accelerator(call, optional=True)
            if accelerator is None:
                continue
            test = cst.UnaryOperation(
                cst.Not(), cst.Attribute(accelerator, cst.Name("is_local_main_process"))
            )
            disable = cst.Arg(
                test,
                keyword=cst.Name("disable"),
                equal=cst.AssignEqual(
                    whitespace_before=cst.SimpleWhitespace(""),
                    whitespace_after=cst.SimpleWhitespace(""),
                ),
            )
            plan.edits.replace(
                call,
                lambda node, arg=disable: node.with_changes(args=[*_with_comma(node.args), arg]),
            )
            plan.changed(call, "progress bar shown on the local main process only")


def _with_comma(args):
    """Existing arguments, the last one followed by ", " so one more can follow."""
    if not args:
        return []
    last = args[-1].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
    return [*args[:-1], last]
