"""Every golden input, mutated the ways real files differ (line endings, tabs, no final newline,
non-ASCII names, newer syntax, a comment on every line, deep nesting): either tool gives a result
or a one-line error, the conversion parses, converting again changes nothing, ``accel-lint
--fix`` run again changes nothing, and neither loses a comment of the input.
"""

from __future__ import annotations

import io
import re
import tokenize
from collections.abc import Callable

import pytest

from accelify.rules.checks import all_rules
from accelify.rules.engine import fix, lint
from accelify.transform.convert import convert
from accelify.transform.sources import SourceError

from .conftest import cases


def _tabs(text: str) -> str:
    return re.sub(r"^((?:    )+)", lambda m: "\t" * (len(m.group(1)) // 4), text, flags=re.M)


def _comment_every_line(text: str) -> str:
    """A trailing comment on each line that can end with one (not inside a docstring, not on a
    line continued by a bracket or backslash)."""
    out, in_string = [], False
    for number, line in enumerate(text.split("\n")):
        if line.count('"""') % 2:
            in_string = not in_string
            out.append(line)
            continue
        open_end = line.rstrip().endswith(("\\", ",", "(", "[", "{"))
        keep = in_string or not line.strip() or open_end or '"""' in line
        out.append(line if keep else f"{line}  # c{number}")
    return "\n".join(out)


MUTATIONS: dict[str, Callable[[str], str]] = {
    "crlf": lambda t: t.replace("\n", "\r\n"),
    "tabs": _tabs,
    "no-final-newline": lambda t: t.rstrip("\n"),
    "unicode-names": lambda t: re.sub(r"\bloss\b", "pérte", t),
    "match": lambda t: f"{t}\nmatch 1:\n    case 1:\n        pass\n",
    "walrus-async": lambda t: f"async def helper():\n    if (n := 1):\n        return n\n{t}",
    "comment-every-line": _comment_every_line,
    "deep-brackets": lambda t: t + "\nz = " + "[" * 150 + "1" + "]" * 150 + "\n",
    "long-expression": lambda t: t + "\nz = " + " + ".join(["1"] * 1200) + "\n",
}
RULES = all_rules()
# Every n-th case only, for the mutations whose subject is the added code, not the script around
# it: the nesting (each such case takes seconds to parse four times over, 151 cases in all), and
# syntax appended or prepended whole. The mutations of the whole text take every other case, the
# odd and the even ones in turn, so each case meets some of them and each meets ~240 shapes.
STRIDES = {"deep-brackets": 30, "long-expression": 30, "match": 5, "walrus-async": 5}
WHOLE_TEXT_STRIDE = 2


def _comments(text: str) -> list[str]:
    tokens = tokenize.generate_tokens(io.StringIO(text).readline)
    return [token.string for token in tokens if token.type == tokenize.COMMENT]


def fix_problems(text: str) -> list[str]:
    """What is wrong with ``accel-lint --fix --unsafe-fixes`` on ``text``: a comment it lost, or
    a second run that changes the result."""
    fixed = fix(text, RULES, unsafe=True)[0]
    problems = [f"--fix lost {c}" for c in _comments(text) if c not in fixed]
    if fixed != text and fix(fixed, RULES, unsafe=True)[0] != fixed:
        problems.append("--fix again changes it")
    return problems


@pytest.mark.parametrize("mutation", MUTATIONS)
def test_mutated_inputs_convert_cleanly(mutation: str) -> None:
    failures, converted = [], 0
    stride = STRIDES.get(mutation, WHOLE_TEXT_STRIDE)
    start = 0 if mutation in STRIDES else list(MUTATIONS).index(mutation) % stride
    for case in cases()[start::stride]:
        text = MUTATIONS[mutation](case.read_text())
        name = f"{case.parent.name}/{case.name}"
        try:
            result = convert(text, path=name)
        except SourceError as err:  # one line: only for what the tools cannot analyse
            assert "nested too deeply" in err.message, f"{name}: {err}"
            continue
        converted += 1
        compile(result.code, name, "exec")
        if convert(result.code, path=name).changed:
            failures.append(f"{name}: converting again changes it")
        lost = [c for c in _comments(text) if c not in result.code]
        if lost:
            failures.append(f"{name}: comments lost: {lost[:3]}")
        try:
            lint(text, RULES)
            failures.extend(f"{name}: {problem}" for problem in fix_problems(text))
        except SyntaxError as err:
            assert "nested too deeply" in str(err), f"{name}: {err}"
        except RecursionError:  # accel-lint's runner makes it one line (test_odd_inputs.py)
            assert mutation == "deep-brackets", name
    assert failures == []
    assert converted > 0
