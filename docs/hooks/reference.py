"""MkDocs hook: the reference pages that must never drift from the code, generated at build time.

The lint rules' pages come from their docstrings (one page per rule, and an index table), and the
command-line page from each tool's own ``--help``. Nothing here is written to ``docs/``: the pages
exist only in the build, so the site always shows what the installed code says.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files

from accelify.rules.checks import all_rules
from accelify.rules.rule import Rule

RULES_INDEX = "reference/rules/index.md"
CLI_PAGE = "reference/cli.md"
TOOLS = ("accel-convert", "accel-lint", "accel-run")


def rule_page(rule: type[Rule]) -> str:
    """One rule's page: its code and name, how it is enabled, then its docstring as written."""
    default = "on by default" if rule.enabled_by_default else "off by default (`--select` it)"
    return (
        f"# {rule.code} {rule.name}\n\n"
        f"Severity: **{rule.severity.value}**, {default}. "
        f"The same text in a terminal: `accel-lint rule {rule.code}`.\n\n"
        f"{rule.docs()}\n"
    )


def rules_index() -> str:
    """The table of every rule, linking each page; the intro says what the code ranges mean."""
    rows = [
        f"| [{rule.code}]({rule.code}.md) | {rule.name} | {rule.severity.value} | "
        f"{'yes' if rule.enabled_by_default else 'no'} | {rule.summary().replace('|', '&#124;')} |"
        for rule in all_rules()
    ]
    return (
        "# Lint rules\n\n"
        "Every rule `accel-lint` has, generated from the rules' own documentation. Ranges: "
        "`ACL0xx` hangs and crashes on many processes, `ACL1xx` checkpoints and files, `ACL2xx` "
        "training-loop correctness, `ACL3xx` noise. Turn rules on and off with `--select`, "
        "`--ignore` or `[tool.accelify.lint]` in `pyproject.toml`; silence a line with "
        "`# noqa: ACL101`.\n\n"
        "| code | name | severity | on by default | what it finds |\n"
        "|---|---|---|---|---|\n" + "\n".join(rows) + "\n"
    )


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
    """Expand the nav entry of the rules index into a section listing every rule's page."""
    pages = [{f"{r.code} {r.name}": f"reference/rules/{r.code}.md"} for r in all_rules()]

    def expand(item: Any) -> Any:
        if not isinstance(item, dict):
            return item
        ((title, value),) = item.items()
        if value == RULES_INDEX:
            return {title: [RULES_INDEX, *pages]}
        if isinstance(value, list):
            return {title: [expand(child) for child in value]}
        return item

    config.nav = [expand(item) for item in config.nav or []]
    return config


def on_files(files: Files, config: MkDocsConfig) -> Files:
    """Add the generated pages to the build."""
    pages = {RULES_INDEX: rules_index(), CLI_PAGE: cli_page()}
    for rule in all_rules():
        pages[f"reference/rules/{rule.code}.md"] = rule_page(rule)
    for uri, text in pages.items():
        files.append(File.generated(config, uri, content=text))
    return files
