"""Golden output per format (pytest-regressions, files beside this test) and the SARIF schema."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import jsonschema
import pytest
from pytest_regressions.file_regression import FileRegressionFixture
from rich.console import Console

from accelify.rules.checks import all_rules
from accelify.rules.formats import MACHINE, render_text
from accelify.rules.runner import Options, check_file
from accelify.transform.console import package_version

from .conftest import ROOT

SCHEMA = Path(__file__).with_name("sarif-schema-2.1.0.json")
CASES = ["fixtures/lint/planted.py", "fixtures/lint/notebook.ipynb"]


@pytest.fixture(scope="module")
def results():
    """Findings for the fixtures, with paths relative to the repository as a user would type."""
    cwd = Path.cwd()
    os.chdir(ROOT)
    try:
        yield [check_file(path, Options()) for path in CASES]
    finally:
        os.chdir(cwd)


@pytest.mark.parametrize("fmt", sorted(MACHINE))
def test_machine_formats_match_golden_files(
    fmt: str, results, file_regression: FileRegressionFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)
    text = MACHINE[fmt](results, all_rules()).replace(package_version(), "VERSION")
    extension = {"github": ".txt"}.get(fmt, ".json")
    file_regression.check(text, basename=f"golden_{fmt}", extension=extension)


def test_text_format_plain_in_a_pipe(results, file_regression: FileRegressionFixture) -> None:
    buffer = io.StringIO()
    render_text(results, Console(file=buffer, force_terminal=False, soft_wrap=True))
    file_regression.check(buffer.getvalue(), basename="golden_text", extension=".txt")


def test_text_format_on_a_terminal_shows_an_excerpt(results) -> None:
    out = Console(record=True, force_terminal=True, width=200)
    render_text(results[:1], out)
    text = out.export_text()
    assert '  42 |     torch.save(model.state_dict(), "model.pt")' in text
    assert "\n" + " " * 11 + "^" * 38 in text  # under the call, as wide as it


def test_sarif_validates_against_the_official_schema(results, monkeypatch) -> None:
    monkeypatch.chdir(ROOT)
    log = json.loads(MACHINE["sarif"](results, all_rules()))
    jsonschema.validate(log, json.loads(SCHEMA.read_text()))
    run = log["runs"][0]
    assert {r["ruleId"] for r in run["results"]} >= {"ACL101", "ACL001"}
    for result in run["results"]:
        assert run["tool"]["driver"]["rules"][result["ruleIndex"]]["id"] == result["ruleId"]


def test_gitlab_fingerprints_are_unique(results) -> None:
    issues = json.loads(MACHINE["gitlab"](results, all_rules()))
    assert len({i["fingerprint"] for i in issues}) == len(issues)
