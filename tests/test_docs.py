"""The documentation site builds strictly, shows every lint rule, and its tutorial runs as written.

A docs page that drifts from the code is worse than none: the site is built with ``--strict`` (a
broken link, anchor or a page left out of the nav fails), the rule pages are checked against the
rules themselves, and every shell block of the tutorial is run with the exit status it promises.
"""

from __future__ import annotations

import html
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from accelify.rules.checks import all_rules

ROOT = Path(__file__).resolve().parents[1]
TUTORIAL = ROOT / "docs" / "tutorial.md"
# The files the tutorial starts from, copied to the same paths in its temporary folder.
TUTORIAL_FIXTURES = ("fixtures/convert/mnist.in.py",)
# A runnable block: an HTML comment naming its exit status, then a fenced bash block.
RUN_MARKER = re.compile(r"<!-- run: exit (\d+) -->\n```bash\n(.*?)\n```", re.S)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site, built once with ``mkdocs build --strict`` by this interpreter's mkdocs."""
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return out


def _text(page: Path) -> str:
    """A page's visible text: tags dropped, entities decoded, whitespace collapsed."""
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", page.read_text("utf-8"))).split())


def _squeezed(text: str) -> str:
    """``text`` without whitespace and asterisks, which markup moves or drops (``*emphasis*``)."""
    return "".join(text.replace("*", "").split())


def _what_it_does(docs: str) -> str:
    """The first paragraph of a rule's "What it does" section, without markup or whitespace."""
    section = docs.split("## What it does\n", 1)[1]
    paragraph = section.split("\n\n", 1)[0].split("\n## ", 1)[0]
    return _squeezed(paragraph.replace("`", ""))


def test_site_builds_strictly(site: Path) -> None:
    for page in ("index.html", "tutorial/index.html", "reference/cli/index.html"):
        assert (site / page).is_file(), page
    cli = _text(site / "reference" / "cli" / "index.html")
    for tool in ("accel-convert", "accel-lint", "accel-run"):
        assert f"Usage: {tool}" in cli or f"usage: {tool}" in cli, tool


def test_every_rule_has_a_generated_page(site: Path) -> None:
    index = _text(site / "reference" / "rules" / "index.html")
    for rule in all_rules():
        page = _text(site / "reference" / "rules" / rule.code / "index.html")
        assert f"{rule.code} {rule.name}" in page
        assert "What it does" in page
        assert _what_it_does(rule.docs()) in _squeezed(page), rule.code
        assert rule.code in index and rule.name in index


def test_tutorial_blocks_are_all_runnable() -> None:
    """No shell block of the tutorial escapes the run below by missing its marker."""
    text = TUTORIAL.read_text("utf-8")
    assert text.count("```bash\n") == len(RUN_MARKER.findall(text)) > 0


@pytest.mark.slow
def test_tutorial_runs_as_written(tmp_path: Path) -> None:
    for fixture in TUTORIAL_FIXTURES:
        (tmp_path / fixture).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / fixture, tmp_path / fixture)
    bin_dir = str(Path(sys.executable).parent)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.pop("FORCE_COLOR", None)
    # A block may `cd`: the next block starts where it ended, as in one terminal.
    cwd = tmp_path
    where = tmp_path / ".cwd"
    for status, block in RUN_MARKER.findall(TUTORIAL.read_text("utf-8")):
        script = f'{block}\nstatus=$?\npwd > "{where}"\nexit $status\n'
        done = subprocess.run(
            ["bash", "-c", script], cwd=cwd, capture_output=True, text=True, env=env, check=False
        )
        assert done.returncode == int(status), f"{block}\n{done.stdout}\n{done.stderr}"
        cwd = Path(where.read_text().strip())
