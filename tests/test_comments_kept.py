"""No comment is lost where the tools edit inside a multi-line construct.

Every call of every converter golden input, lint fixture and rule case is laid out one argument
a line with a comment after each (and after the opening bracket), and every tuple assigned is
too: a device expression, ``.to(`` arguments, ``loss.backward(`` arguments, a batch move, a
``prepare(`` call. Converting and ``accel-lint --fix`` must keep every comment, give code that
compiles, and change nothing when run again.
"""

from __future__ import annotations

import io
import itertools
import tokenize
from collections import Counter
from pathlib import Path

import libcst as cst
import pytest

from accelify.rules.checks import all_rules
from accelify.rules.engine import fix
from accelify.transform.convert import convert
from accelify.transform.sources import SourceError

ROOT = Path(__file__).resolve().parents[1]
RULES = all_rules()


class _Spread(cst.CSTTransformer):
    """One argument or element a line, each followed by its own comment."""

    def __init__(self) -> None:
        super().__init__()
        self.numbers = itertools.count()

    def _line_end(self, indent: str = "    ") -> cst.ParenthesizedWhitespace:
        comment = cst.Comment(f"# k{next(self.numbers)}")
        return cst.ParenthesizedWhitespace(
            first_line=cst.TrailingWhitespace(cst.SimpleWhitespace("  "), comment),
            indent=True,
            last_line=cst.SimpleWhitespace(indent),
        )

    def _spread(self, items: list, last_indent: str) -> list:
        return [
            item.with_changes(
                comma=cst.Comma(
                    whitespace_after=self._line_end(last_indent if i == len(items) - 1 else "    ")
                )
            )
            for i, item in enumerate(items)
        ]

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        if not updated.args or any(
            isinstance(a.value, cst.GeneratorExp) and not a.value.lpar for a in updated.args
        ):
            return updated  # f(x for x in y,) is a syntax error
        return updated.with_changes(
            whitespace_before_args=self._line_end(), args=self._spread(list(updated.args), "")
        )

    def leave_Assign(self, original: cst.Assign, updated: cst.Assign) -> cst.Assign:
        value = updated.value
        if not isinstance(value, cst.Tuple) or not value.elements:
            return updated
        lpar = cst.LeftParen(whitespace_after=self._line_end())
        elements = self._spread(list(value.elements), "")
        return updated.with_changes(
            value=value.with_changes(lpar=[lpar], rpar=[cst.RightParen()], elements=elements)
        )


def spread(text: str) -> str | None:
    """``text`` with its calls and assigned tuples spread out; None where that does not compile."""
    code = cst.parse_module(text).visit(_Spread()).code
    try:
        compile(code, "<spread>", "exec")
    except SyntaxError:
        return None
    return code


def _comments(text: str) -> Counter[str]:
    tokens = tokenize.generate_tokens(io.StringIO(text).readline)
    return Counter(token.string for token in tokens if token.type == tokenize.COMMENT)


def _lost(before: str, after: str) -> list[str]:
    return sorted((_comments(before) - _comments(after)).elements())


def _sources() -> dict[str, str]:
    files = sorted((ROOT / "fixtures" / "convert").rglob("*.in.py"))
    files += sorted((ROOT / "fixtures" / "lint").glob("*.py"))
    texts = {str(p.relative_to(ROOT / "fixtures")): p.read_text() for p in files}
    for rule in RULES:
        texts.update({f"{rule.code}-{i}": case.code for i, case in enumerate(rule.INVALID)})
    return texts


SOURCES = _sources()


def test_spreading_puts_a_comment_inside_every_call() -> None:
    spread_out = spread("x = f(a, g(b))\ny, z = a.to(d), b\n")
    # f: after "(", a, g(...); g: after "(", b; the tuple: after "(", a.to(d), b; to: "(", d
    assert spread_out is not None and _comments(spread_out) == Counter(f"# k{i}" for i in range(10))


@pytest.mark.parametrize("tool", ["convert", "fix"])
def test_no_comment_is_lost_inside_what_the_tools_edit(tool: str) -> None:
    failures, edited = [], 0
    for name, original in SOURCES.items():
        text = spread(original)
        if text is None:
            continue
        try:
            out = (
                convert(text, path=name).code
                if tool == "convert"
                else fix(text, RULES, unsafe=True)[0]
            )
        except SourceError as err:  # a refusal of the whole file is not an edit
            assert "syntax error" not in err.message, f"{name}: {err}"
            continue
        if out == text:
            continue
        edited += 1
        compile(out, name, "exec")
        if lost := _lost(text, out):
            failures.append(f"{name}: {tool} lost {lost[:4]}")
        again = (
            convert(out, path=name).code if tool == "convert" else fix(out, RULES, unsafe=True)[0]
        )
        if again != out:
            failures.append(f"{name}: {tool} again changes it")
    assert failures == []
    assert edited > 20, edited  # the edits the test is about happened
