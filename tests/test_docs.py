"""The documentation site builds strictly, shows every lint rule, and its commands run as written.

A docs page that drifts from the code is worse than none: the site is built with ``--strict`` (a
broken link, anchor or a page left out of the nav fails), the rule pages are checked against the
rules themselves, and every shell block of the tutorial, and the README's "whole path" from a
plain script to 2 processes and a CI gate, is run with the exit status it promises.
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
from accelify.transform import cli as convert_cli
from accelify.transform.codes import CONVERSIONS, DOCS_URL, url
from accelify.transform.plan import NOTE_RULES
from accelify.transform.refusals import REFUSALS

ROOT = Path(__file__).resolve().parents[1]
TUTORIAL = ROOT / "docs" / "tutorial.md"
README = ROOT / "README.md"
# The files the runnable pages start from (the bundled example), copied to the same paths in a
# temporary folder that stands for the root of a checkout.
EXAMPLE_FIXTURES = ("fixtures/convert/mnist.in.py",)
# A runnable block: an HTML comment naming its exit status, then a fenced bash block.
RUN_MARKER = re.compile(r"<!-- run: exit (\d+) -->\n```bash\n(.*?)\n```", re.S)


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """A temporary folder holding the files the runnable blocks start from, as a checkout would."""
    for fixture in EXAMPLE_FIXTURES:
        (tmp_path / fixture).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / fixture, tmp_path / fixture)
    return tmp_path


def run_blocks(page: Path, cwd: Path) -> None:
    """Run each ``<!-- run: exit N -->`` block of ``page`` in order, as pasted into one terminal.

    The tools come from this interpreter's environment (no virtual environment is made); a block
    may ``cd``, and the next one starts where it ended. Each block runs under ``set -e``: its
    status is that of its first failing command, else of its last, and must be the one promised.
    No block may print a traceback, whatever its status.
    """
    blocks = RUN_MARKER.findall(page.read_text("utf-8"))
    assert blocks, f"{page.name} has no runnable block"
    bin_dir = str(Path(sys.executable).parent)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.pop("FORCE_COLOR", None)
    where = cwd / ".cwd"  # hidden: no walk of the tools reads it
    for status, block in blocks:
        script = f"trap 'pwd > \"{where}\"' EXIT\nset -e\n{block}\n"
        done = subprocess.run(
            ["bash", "-c", script], cwd=cwd, capture_output=True, text=True, env=env, check=False
        )
        shown = f"{block}\n{done.stdout}\n{done.stderr}"
        assert done.returncode == int(status), shown
        assert "Traceback (most recent call last)" not in done.stdout + done.stderr, shown
        cwd = Path(where.read_text().strip())


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


def test_readme_whole_path_is_runnable() -> None:
    """The README's path is marked to run, and goes from a plain script to 2 processes and CI."""
    blocks = "\n".join(block for _, block in RUN_MARKER.findall(README.read_text("utf-8")))
    for step in (
        "cp fixtures/convert/mnist.in.py",
        "accel-convert --diff",
        "accel-convert --inplace",
        "accel-run --cpu --num-processes 1",
        "accel-run --cpu --num-processes 2",
        "accel-convert --check",
        "accel-lint",
    ):
        assert step in blocks, step


@pytest.mark.slow
def test_tutorial_runs_as_written(checkout: Path) -> None:
    run_blocks(TUTORIAL, checkout)


@pytest.mark.slow
def test_readme_runs_as_written(checkout: Path) -> None:
    """A fresh checkout, the README's path pasted in order: converted, on 2 processes, gated."""
    run_blocks(README, checkout)


def _built(site: Path, url: str) -> Path:
    """The file of the built site a report link opens (directory URLs end in index.html)."""
    assert url.startswith(DOCS_URL), url
    return site / url.removeprefix(DOCS_URL) / "index.html"


def test_every_report_code_has_a_page(site: Path) -> None:
    codes = [c.code for c in CONVERSIONS] + [r.code for r in REFUSALS]
    codes += [code for _phrase, code in NOTE_RULES if code is not None]
    for code in codes:
        page = _built(site, url(code))
        assert page.is_file(), code
        assert code in _text(page), code
    for index in ("conversions", "refusals"):
        text = _text(site / "reference" / index / "index.html")
        assert all(code in text for code in codes if code.startswith(("ACC", "ACR")))


def test_every_link_the_report_prints_opens_a_built_page(
    site: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every fixture through ``--check -v``: in a pipe (the URLs after needs-a-human lines) and on
    a terminal (each code's hyperlink), every link is a page of the strict build."""
    fixtures = [str(p) for p in sorted((ROOT / "fixtures" / "convert").rglob("*.in.py"))]
    monkeypatch.delenv("NO_COLOR", raising=False)
    links: set[str] = set()
    for force in ("", "1"):
        monkeypatch.setenv("FORCE_COLOR", force)
        convert_cli.run(["--check", "-v", *fixtures])
        err = capsys.readouterr().err
        pattern = r"\x1b\]8;[^;]*;(\S+?)\x1b\\" if force else rf"\(see ({re.escape(DOCS_URL)}\S+)\)"
        found = set(re.findall(pattern, err))
        assert found, err[-2000:]
        links |= found
    assert {link.split("/")[-2][:3] for link in links} == {"ACC", "ACR", "ACL"}
    for link in links:
        assert _built(site, link).is_file(), link
