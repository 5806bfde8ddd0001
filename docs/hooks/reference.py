"""MkDocs hook: the reference pages that must never drift from the code, generated at build time.

Three sections are generated the same way (a :class:`Section`: an index table and one page per
code, expanded into the nav under its index's entry): the lint rules' pages from their
docstrings, the conversions' from their step modules' docstrings (with a before/after from the
step's fixtures), and the refusal reasons' from ``transform/refusals.py``. The command-line page
comes from each tool's own ``--help``. Nothing here is written to ``docs/``: the pages exist only
in the build, so the site always shows what the installed code says.
"""

from __future__ import annotations

import difflib
import importlib
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files

from accelify.rules.checks import all_rules
from accelify.rules.rule import Rule
from accelify.transform.codes import CONVERSIONS, DOCS_URL, Conversion, page
from accelify.transform.refusals import REFUSALS, Refusal

CLI_PAGE = "reference/cli.md"
TOOLS = ("accel-convert", "accel-lint", "accel-run")
ROOT = Path(__file__).resolve().parents[2]
CASES = ROOT / "fixtures" / "convert"  # a step's cases: fixtures/convert/<module name>/
_EXAMPLE_LINES = 40  # a before/after longer than this teaches less than the text above it


@dataclass(frozen=True)
class Page:
    """One generated page: its nav title, its path under docs/ and its Markdown."""

    title: str
    uri: str
    text: str


@dataclass(frozen=True)
class Section:
    """An index page (the nav entry mkdocs.yml names) and the pages it lists, one per code."""

    index: Page
    pages: tuple[Page, ...]


def code_page(code: str, name: str, text: str) -> Page:
    """The page of one report code, at the path :func:`accelify.transform.codes.page` links."""
    return Page(f"{code} {name}", page(code).rstrip("/") + ".md", f"# {code} {name}\n\n{text}")


def index_page(
    uri: str, title: str, intro: str, header: tuple[str, ...], rows: list[tuple[str, ...]]
) -> Page:
    """A section's index: a title, what its codes mean, and a table whose first column links
    each code's page (beside the index)."""

    def cell(text: str) -> str:
        return text.replace("|", "&#124;").replace("\n", " ")

    lines = [
        f"| [{code}]({code}.md) | " + " | ".join(map(cell, rest)) + " |" for code, *rest in rows
    ]
    table = "| " + " | ".join(header) + " |\n" + "|---" * len(header) + "|\n"
    return Page(title, uri, f"# {title}\n\n{intro}\n\n{table}" + "\n".join(lines) + "\n")


# lint rules --------------------------------------------------------------------------------------
def rule_page(rule: type[Rule]) -> Page:
    """One rule's page: its code and name, how it is enabled, then its docstring as written."""
    default = "on by default" if rule.enabled_by_default else "off by default (`--select` it)"
    text = (
        f"Severity: **{rule.severity.value}**, {default}. "
        f"The same text in a terminal: `accel-lint rule {rule.code}`.\n\n"
        f"{rule.docs()}\n"
    )
    return code_page(rule.code, rule.name, text)


def rules_section() -> Section:
    """Every rule, from the rules' own documentation."""
    rows = [
        (
            rule.code,
            rule.name,
            rule.severity.value,
            "yes" if rule.enabled_by_default else "no",
            rule.summary(),
        )
        for rule in all_rules()
    ]
    intro = (
        "Every rule `accel-lint` has, generated from the rules' own documentation. Ranges: "
        "`ACL0xx` hangs and crashes on many processes, `ACL1xx` checkpoints and files, `ACL2xx` "
        "training-loop correctness, `ACL3xx` noise. Turn rules on and off with `--select`, "
        "`--ignore` or `[tool.accelify.lint]` in `pyproject.toml`; silence a line with "
        "`# noqa: ACL101`."
    )
    header = ("code", "name", "severity", "on by default", "what it finds")
    index = index_page("reference/rules/index.md", "Lint rules", intro, header, rows)
    return Section(index, tuple(rule_page(r) for r in all_rules()))


# conversions -------------------------------------------------------------------------------------
def _markdown(docstring: str) -> str:
    """A module docstring as Markdown: Sphinx roles (``:func:`place```) become code spans."""
    return re.sub(r":(?:func|mod|class|meth):`\.?([^`]+)`", r"`\1`", docstring)


def _example(conversion: Conversion) -> str:
    """A before/after of the step's shortest case, as a diff, where the step has cases."""
    folder = CASES / conversion.module.rsplit(".", 1)[-1]
    cases = sorted(folder.glob("*.in.py"), key=lambda case: (len(case.read_text()), case.name))
    for case in cases:
        before = case.read_text().splitlines(keepends=True)
        after = case.with_name(case.name.replace(".in.py", ".out.py")).read_text()
        diff = list(difflib.unified_diff(before, after.splitlines(keepends=True), n=2))[2:]
        if diff and len(diff) <= _EXAMPLE_LINES:
            shown = "".join(line if line.endswith("\n") else line + "\n" for line in diff)
            where = case.relative_to(ROOT).as_posix()
            return f"\n## Example\n\n`{where}`, converted:\n\n```diff\n{shown}```\n"
    return ""


def _docs(conversion: Conversion) -> tuple[str, str]:
    """A step module's docstring as a one-line summary and the rest."""
    docs = _markdown(importlib.import_module(conversion.module).__doc__ or "")
    summary, _, rest = docs.partition("\n\n")
    return " ".join(summary.split()), rest.strip()


def conversion_page(conversion: Conversion) -> Page:
    """A step's page: its module's docstring (what it changes and why that is right on N
    processes), then a before/after."""
    summary, rest = _docs(conversion)
    text = (
        f"**{summary}**\n\n{rest}\n\n"
        f"`accel-convert -v` prints `{conversion.code}` before each change this step makes. "
        f"Source: `{conversion.module}`.\n{_example(conversion)}"
    )
    return code_page(conversion.code, conversion.name, text)


def conversions_section() -> Section:
    """Every conversion step, in the order accel-convert runs them."""
    rows = [(c.code, c.name, _docs(c)[0]) for c in CONVERSIONS]
    intro = (
        "Every step of `accel-convert`, in the order it runs them, generated from each step's "
        "own documentation. Ranges: `ACC1xx` a plain training script, `ACC2xx` a hand-written "
        "DistributedDataParallel script made single-process first, `ACC3xx` notebooks. "
        "`accel-convert -v` prints the code before each change; why code is left unchanged has "
        "its own codes, the [refusal reasons](../refusals/index.md)."
    )
    index = index_page(
        "reference/conversions/index.md",
        "Conversions",
        intro,
        ("code", "name", "what it does"),
        rows,
    )
    return Section(index, tuple(conversion_page(c) for c in CONVERSIONS))


# refusal reasons ---------------------------------------------------------------------------------
def refusal_page(refusal: Refusal) -> Page:
    """A family's page: its cause, a script of that shape, and the manual fix."""
    text = (
        f"**{refusal.summary}**\n\n"
        f"## Cause\n\n{refusal.cause}\n\n"
        f"## Example\n\n```python\n{refusal.example}\n```\n\n"
        f"## Fix by hand\n\n{refusal.fix}\n\n"
        "The report shows this code before the reason, with the line it is about. accel-lint "
        "reports a training setup left unchanged as [ACL210](../rules/ACL210.md).\n"
    )
    return code_page(refusal.code, refusal.name, text)


def refusals_section() -> Section:
    """Every family of reasons accel-convert leaves code unchanged."""
    rows = [(r.code, r.name, r.summary) for r in REFUSALS]
    intro = (
        "Why `accel-convert` leaves a file or a training setup unchanged, one code per family "
        "of reasons, each with its cause and the fix by hand. Ranges: `ACR1xx` the whole file, "
        "`ACR2xx` one training setup, `ACR3xx` a hand-written DistributedDataParallel script. "
        "The report prints the code before each `needs a human` line, with this site's page."
    )
    header = ("code", "name", "left unchanged because")
    return Section(
        index_page("reference/refusals/index.md", "Refusal reasons", intro, header, rows),
        tuple(refusal_page(r) for r in REFUSALS),
    )


@cache
def sections() -> tuple[Section, ...]:
    """Built once per build: the nav and the files both need them."""
    return (rules_section(), conversions_section(), refusals_section())


def _tool(name: str) -> str:
    """The console script installed beside this interpreter, so the docs show this checkout's."""
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.exists() else shutil.which(name)
    if found is None:
        raise RuntimeError(f"{name} is not installed: pip install -e '.[docs]' first")
    return found


def help_text(name: str) -> str:
    """``NAME --help`` as a plain 100-column terminal shows it (no colour, no box drawing)."""
    env = {**os.environ, "COLUMNS": "100", "NO_COLOR": "1", "TERM": "dumb"}
    env.pop("FORCE_COLOR", None)
    done = subprocess.run(
        [_tool(name), "--help"], capture_output=True, text=True, env=env, check=True
    )
    return done.stdout.rstrip()


def cli_page() -> str:
    """Each tool's ``--help``, verbatim, under its own heading."""
    parts = [
        "# Command line\n\n"
        "The output of each tool's `--help`, taken from the installed tools when this site was "
        "built. The [tutorial](../tutorial.md) walks through them in use.\n"
    ]
    for name in TOOLS:
        parts.append(f"## {name}\n\n```text\n{help_text(name)}\n```\n")
    return "\n".join(parts)


def on_config(config: MkDocsConfig) -> MkDocsConfig:
    """Check that the report's links point at this site, and expand each section's nav entry
    into its index and one page per code."""
    if config.site_url != DOCS_URL:
        raise PluginError(f"site_url is {config.site_url!r}; accel-convert links {DOCS_URL!r}")
    expanded = {
        s.index.uri: [s.index.uri, *({p.title: p.uri} for p in s.pages)] for s in sections()
    }

    def expand(item: Any) -> Any:
        if not isinstance(item, dict):
            return item
        ((title, value),) = item.items()
        if isinstance(value, str) and value in expanded:
            return {title: expanded[value]}
        if isinstance(value, list):
            return {title: [expand(child) for child in value]}
        return item

    config.nav = [expand(item) for item in config.nav or []]
    return config


def on_files(files: Files, config: MkDocsConfig) -> Files:
    """Add the generated pages to the build."""
    files.append(File.generated(config, CLI_PAGE, content=cli_page()))
    for section in sections():
        for generated in (section.index, *section.pages):
            files.append(File.generated(config, generated.uri, content=generated.text))
    return files
