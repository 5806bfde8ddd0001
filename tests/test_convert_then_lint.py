"""The converter and the linter agree on what is still wrong in a script.

Every "needs a human" note accel-convert writes has a kind, and each kind a lint rule: linting the
converted file reports each note's line with that rule's code, so what remains is tracked where
``noqa``, configuration and the CI formats apply. A file the converter finished on its own is
lint-clean; where it kept a manual accumulation (and said so), the linter's advice to move it to
``accelerator.accumulate`` is still right, and is the one finding allowed.
"""

from __future__ import annotations

import difflib
from pathlib import Path

import pytest

from accelify.rules.checks import all_rules
from accelify.rules.engine import lint
from accelify.transform.convert import Options, convert
from accelify.transform.plan import NOTE_RULES

FIXTURES = Path(__file__).parent.parent / "fixtures"
# The converter's own fixtures, and scripts whose notes no converter fixture has.
CASES = sorted((FIXTURES / "convert").rglob("*.in.py")) + sorted(
    (FIXTURES / "lint" / "converted").glob("*.py")
)
RULES = all_rules()


def output_lines(source: str, code: str, line: int) -> set[int]:
    """The lines of ``code`` that ``line`` of ``source`` became (a rewritten line may become
    several)."""
    matcher = difflib.SequenceMatcher(None, source.splitlines(), code.splitlines(), autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if i1 <= line - 1 < i2:
            if tag == "equal":
                return {j1 + line - i1}
            return set(range(j1 + 1, j2 + 1))
    return set()


@pytest.mark.parametrize("case", CASES, ids=lambda p: p.name.removesuffix(".py"))
@pytest.mark.parametrize("target", ["accelify", "accelerate"])
def test_converted_scripts_show_what_remains_to_the_linter(case: Path, target: str) -> None:
    source = case.read_text()
    result = convert(source, Options(target=target))
    if result.manual:
        findings = lint(result.code, RULES)
        found = {(f.line, f.code) for f in findings}
        missed = [
            f"{note.line}: [{note.code}] {note.message}"
            for note in result.manual
            if note.code is None
            or not any(
                (line, note.code) in found for line in output_lines(source, result.code, note.line)
            )
        ]
        assert missed == [], [f"{f.line}: {f.code}" for f in findings]
        return
    # The noise rules (off by default) would also flag what the converter rightly leaves outside
    # the training: an inference function's print runs on every process, as it did before.
    findings = lint(result.code, [rule for rule in RULES if rule.enabled_by_default])
    kept = any("kept the manual gradient accumulation" in n.message for n in result.notes)
    expected = {"ACL203"} if kept else set()
    assert [f"{f.line}: {f.code} {f.message}" for f in findings if f.code not in expected] == []


def test_a_note_on_a_rewritten_line_maps_to_what_it_became() -> None:
    source = "a = 1\nprint(a)\nb = 2\n"
    code = "a = 1\nx = 0\naccelerator.print(a)\nb = 2\n"
    assert output_lines(source, code, 1) == {1}
    assert output_lines(source, code, 2) == {2, 3}
    assert output_lines(source, code, 3) == {4}


def test_only_a_file_libcst_cannot_print_back_has_no_rule() -> None:
    """That note is the converter's limit, not a bug of the script (left as it was): every other
    kind of note names a rule."""
    text = f"{(FIXTURES / 'convert' / 'mnist.in.py').read_text()}\n\t# the last word\n \x0c "
    [note] = convert(text).manual
    assert note.code is None
    assert [
        phrase for phrase, code in NOTE_RULES if code is None and phrase not in note.message
    ] == []


def test_every_note_kind_names_a_rule_that_exists() -> None:
    codes = {rule.code for rule in RULES}
    assert [code for _phrase, code in NOTE_RULES if code is not None and code not in codes] == []
