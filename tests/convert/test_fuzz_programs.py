"""Programs generated from Python's grammar (hypothesmith), alone and appended to a real training
script: both tools give a result or a one-line error, the conversion compiles, converting it again
or fixing it again changes nothing, and every comment of the input survives both.

The golden inputs show the shapes we wrote; generated programs reach the syntax nobody thought
of (decorators on odd targets, starred targets, nested f-strings, `global` in lambdas' shadows).
``ACCELIFY_FUZZ_EXAMPLES`` raises the number of programs for a longer run.
"""

from __future__ import annotations

import os

import pytest

hypothesis = pytest.importorskip("hypothesis")
hypothesmith = pytest.importorskip("hypothesmith")

from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402

from accelify.rules.checks import all_rules  # noqa: E402
from accelify.rules.engine import lint  # noqa: E402
from accelify.transform.convert import convert  # noqa: E402
from accelify.transform.sources import SourceError  # noqa: E402

from .conftest import CASES_DIR  # noqa: E402
from .test_fuzz import _comments, fix_problems  # noqa: E402

SCRIPT = (CASES_DIR / "mnist.in.py").read_text()
RULES = all_rules()
EXAMPLES = int(os.environ.get("ACCELIFY_FUZZ_EXAMPLES", "60"))


def _check(text: str) -> None:
    try:
        result = convert(text, path="fuzz.py")
    except SourceError as err:  # a user's mistake is one line naming the place
        assert "\n" not in str(err), str(err)
        return
    compile(result.code, "fuzz.py", "exec")
    assert not convert(result.code, path="fuzz.py").changed, "converting again changes it"
    lost = [c for c in _comments(text) if c not in result.code]
    assert lost == [], f"comments lost: {lost[:3]}"
    try:
        lint(text, RULES)
        assert fix_problems(text) == []
    except SyntaxError as err:
        assert "\n" not in str(err), str(err)
    except RecursionError:  # accel-lint's runner makes it one line (test_odd_inputs.py)
        pass


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,  # the same programs on every run: a failure here is reproducible
    suppress_health_check=list(HealthCheck),
    # Shrinking a whole training script takes minutes; the failing program is printed as found.
    phases=[Phase.explicit, Phase.generate],
)
@given(program=hypothesmith.from_grammar())
def test_generated_programs_alone_and_after_a_training_script(program: str) -> None:
    _check(program)
    _check(f"{SCRIPT}\n{program}\n")


def test_a_file_libcst_cannot_print_back_is_left_unchanged_at_that_line() -> None:
    """libcst drops an indented comment before a last line of blanks and a form feed; an edit
    anywhere would drop it too, so the file stays as it is and the report names the line."""
    text = f"{SCRIPT}\n\t# the last word\n \x0c "
    result = convert(text)
    assert result.code == text
    assert [(n.line, n.manual) for n in result.notes if "libcst" in n.message] == [
        (text.count("\n") - 1, True)
    ]
