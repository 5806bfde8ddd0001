"""The driver: parse once, analyse once, let every step plan its edits, apply them, re-check.

Steps never edit the tree themselves. Each one reads the shared :class:`Analysis` of the *original*
module and records edits keyed by original nodes, so line numbers in the report always refer to
the file the user wrote, and steps cannot trip over each other's rewrites.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

import libcst as cst

from accelify.transform.analysis import analyse
from accelify.transform.edits import apply
from accelify.transform.plan import Note, Options, Plan
from accelify.transform.setup import find_setup
from accelify.transform.sources import SourceError
from accelify.transform.steps import STEPS

__all__ = ["Note", "Options", "Result", "convert", "parse"]


@dataclass(frozen=True)
class Result:
    code: str
    notes: tuple[Note, ...] = field(default=())
    original: str = ""

    @property
    def changed(self) -> bool:
        return self.code != self.original

    @property
    def manual(self) -> tuple[Note, ...]:
        return tuple(n for n in self.notes if n.manual)


def parse(source: str, path: str) -> cst.Module:
    """Parse or raise a one-line :class:`SourceError` at the offending line."""
    try:
        return cst.parse_module(source)
    except cst.ParserSyntaxError as err:
        # Python's own parser words syntax errors best; libcst's message is the fallback for the
        # rare code CPython accepts and libcst does not.
        try:
            compile(source, path, "exec", ast.PyCF_ONLY_AST)
        except SyntaxError as py_err:
            raise SourceError(path, py_err.lineno or 1, f"syntax error: {py_err.msg}") from None
        first = err.message.splitlines()[0] if err.message else "unsupported syntax"
        raise SourceError(path, err.raw_line, f"cannot parse: {first}") from None


def _check_valid(code: str, path: str) -> None:
    """Refuse output that does not parse: a bug in a step, never the user's fault.

    CPython's parser answers in a sixth of the time of a second libcst parse; libcst is asked only
    when it says no, so syntax newer than this interpreter (which libcst reads) is not refused.
    """
    try:
        compile(code, path, "exec", ast.PyCF_ONLY_AST, dont_inherit=True)
        return
    except SyntaxError:
        pass
    try:
        cst.parse_module(code)
    except cst.ParserSyntaxError as err:
        raise SourceError(
            path, err.raw_line, "conversion produced invalid code; file left unchanged"
        ) from None


def _refuse_unreachable_training(plan: Plan) -> None:
    """Convert all of a setup or none of it: a training step the accelerator cannot be handed to
    (objects built in a factory, trained in a class) would be left half-converted and wrong."""
    setup = plan.setup
    if setup is None or setup.exists:
        return
    for call, scope, _loop in plan.analysis.backward_calls:
        if plan.accelerator(call, borrow=False) is None:
            plan.needs_human(
                call,
                f"left unchanged: this training step in {scope.name}() cannot be handed the "
                f"accelerator of the objects built in {setup.scope.name}(); convert by hand",
            )
            plan.setup = None
            return


def convert(source: str, options: Options | None = None, path: str = "<string>") -> Result:
    """Convert one script's source text; raise :class:`SourceError` on input we cannot parse."""
    module = parse(source, path)
    analysis = analyse(module)
    setup, refusals = find_setup(analysis)
    plan = Plan(analysis, options or Options(), setup)
    for node, reason in refusals:
        plan.needs_human(node, f"left unchanged: {reason}")
    _refuse_unreachable_training(plan)
    for step in STEPS:
        step(plan)
    # Nothing to change: libcst would print the source back byte for byte, at a fifth of a parse.
    code = apply(module, plan.edits, analysis.parents).code if plan.edits else source
    if code != source:
        _check_valid(code, path)
    return Result(code=code, notes=tuple(sorted(set(plan.notes))), original=source)
