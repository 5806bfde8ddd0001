"""Whole scripts: a correct one stays silent, planted mistakes are found exactly, fixes converge."""

from __future__ import annotations

import json
from pathlib import Path

from accelify.rules.checks import all_rules
from accelify.rules.engine import fix, lint, parse
from accelify.rules.runner import Options, check_file

from .conftest import FIXTURES, expected_marks

ALL = all_rules()


def test_realistic_clean_training_script_gives_no_finding_with_every_rule_on() -> None:
    assert lint((FIXTURES / "clean_train.py").read_text(), ALL) == []


def test_planted_mistakes_are_found_exactly() -> None:
    text = (FIXTURES / "planted.py").read_text()
    found = {(f.line, f.code) for f in lint(text, ALL)}
    assert found == expected_marks(text)


def test_real_script_shapes_give_exactly_the_planted_findings_with_the_default_rules() -> None:
    """Resume over `skip_first_batches`, `next()` update loops, `no_sync` by hand, a Megatron-LM
    branch, save hooks, a model prepared on one path only: silent; the planted lines: found."""
    text = (FIXTURES / "real_shapes.py").read_text()
    default = [rule for rule in ALL if rule.enabled_by_default]
    assert {(f.line, f.code) for f in lint(text, default)} == expected_marks(text)


def test_fixes_reparse_are_idempotent_and_leave_only_unfixable_findings() -> None:
    text = (FIXTURES / "planted.py").read_text()
    fixed, notes = fix(text, ALL, unsafe=True)
    assert notes == []
    parse(fixed)
    compile(fixed, "planted.py", "exec")
    assert fix(fixed, ALL, unsafe=True)[0] == fixed
    remaining = {f.code for f in lint(fixed, ALL)}
    fixable = {f.code for f in lint(text, ALL) if f.fix}
    assert remaining.isdisjoint(fixable - {"ACL102"})  # 102 stays where the fix had no accelerator
    assert "accelerator.save(accelerator.unwrap_model(model).state_dict()" in fixed


def test_safe_fixes_only_without_unsafe_flag() -> None:
    text = (FIXTURES / "planted.py").read_text()
    fixed, _ = fix(text, ALL)
    assert "weights_only" not in fixed  # unsafe: not applied
    assert "accelerator.clip_grad_norm_(model.parameters(), 1.0)" in fixed  # safe: applied


def test_notebook_findings_are_reported_by_cell_and_line() -> None:
    path = FIXTURES / "notebook.ipynb"
    result = check_file(str(path), Options())
    assert result.error is None
    cells = [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]
    expected = {
        (number, line, code)
        for number, cell in enumerate(cells, start=1)
        for line, code in expected_marks("".join(cell["source"]))
    }
    assert {(f.cell, f.line, f.code) for f in result.findings} == expected
    assert all(f.fix is None for f in result.findings)  # notebooks are never rewritten


def test_notebook_syntax_error_names_the_cell(tmp_path: Path) -> None:
    book = {
        "cells": [
            {"cell_type": "code", "source": ["import torch\n"]},
            {"cell_type": "code", "source": ["x = (\n"]},
        ]
    }
    path = tmp_path / "broken.ipynb"
    path.write_text(json.dumps(book))
    result = check_file(str(path), Options())
    assert result.error is not None
    assert result.error.startswith(f"{path}:cell 2:")
    assert "\n" not in result.error


def test_values_that_differ_between_processes_are_found_exactly_in_real_shapes() -> None:
    """Python numbers and ragged tensors gathered, a loop left on one process's loss, a resume
    before `prepare`, a split after a per-process seed: in functions, a class, module level."""
    text = (FIXTURES / "per_process_values.py").read_text()
    default = [rule for rule in ALL if rule.enabled_by_default]
    assert {(f.line, f.code) for f in lint(text, default)} == expected_marks(text)


def test_prepared_objects_are_followed_along_the_paths_that_reach_them() -> None:
    """`if True:`, a second `if` on the test that prepared, a progress bar over the loader."""
    text = (FIXTURES / "path_shapes.py").read_text()
    default = [rule for rule in ALL if rule.enabled_by_default]
    assert {(f.line, f.code) for f in lint(text, default)} == expected_marks(text)
