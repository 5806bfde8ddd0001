"""Output formats: text for people, JSON/GitHub/GitLab/SARIF for machines.

Text is ``path:line:col: CODE message`` (``path:cell N:line:col`` in notebooks): rich colours and a
source excerpt on a terminal, plain greppable lines in a pipe. Machine formats go to stdout whole
and valid even when some files failed (those errors go to stderr).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from accelify.rules.engine import Finding
from accelify.rules.rule import Rule, Severity
from accelify.rules.runner import FileResult
from accelify.transform.console import PlainConsole, github_annotation

if TYPE_CHECKING:
    from rich.console import Console

OutputFormat = Literal["text", "json", "github", "gitlab", "sarif"]
_GITHUB_LEVEL = {Severity.ERROR: "error", Severity.WARNING: "warning", Severity.INFO: "notice"}
_GITLAB_SEVERITY = {Severity.ERROR: "critical", Severity.WARNING: "major", Severity.INFO: "info"}
_STYLE = {Severity.ERROR: "bold red", Severity.WARNING: "yellow", Severity.INFO: "cyan"}


def position(path: str, finding: Finding) -> str:
    """``path:line:col``, with the cell for notebooks."""
    cell = f"cell {finding.cell}:" if finding.cell is not None else ""
    return f"{path}:{cell}{finding.line}:{finding.column}"


def _pairs(results: Sequence[FileResult]) -> list[tuple[str, Finding]]:
    return [(r.path, f) for r in results for f in r.findings]


def render_text(
    results: Sequence[FileResult],
    out: Console | PlainConsole,
    show_fixes: bool = False,
    quiet: bool = False,
) -> None:
    """Findings one per line, excerpts on a terminal, and a summary (with ``show_fixes``, the
    fixes applied per file and rule, as Ruff's ``--show-fixes``; with ``quiet``, findings only)."""
    pairs = _pairs(results)
    for path, finding in pairs:
        mark = " [*]" if finding.fix == "safe" else ""
        if not out.is_terminal:
            out.print(
                f"{position(path, finding)}: {finding.code}{mark} {finding.message}", markup=False
            )
            continue
        from rich.markup import escape  # only a terminal needs rich

        out.print(
            f"[bold]{escape(position(path, finding))}[/]: [{_STYLE[finding.severity]}]"
            f"{finding.code}[/]{mark} {escape(finding.message)}"
        )
        if finding.source:
            gutter = f"{finding.line:>4} | "
            out.print(f"[dim]{gutter}[/]{escape(finding.source)}")
            width = max(
                1,
                (
                    finding.end_column
                    if finding.end_line == finding.line
                    else len(finding.source) + 1
                )
                - finding.column,
            )
            out.print(
                " " * (len(gutter) + finding.column - 1)
                + f"[{_STYLE[finding.severity]}]"
                + "^" * width
                + "[/]"
            )
    if not quiet:
        _summary(results, pairs, out, show_fixes)


def _summary(
    results: Sequence[FileResult],
    pairs: list[tuple[str, Finding]],
    out: Console | PlainConsole,
    show_fixes: bool,
) -> None:
    fixed = sum(r.fixed.total() for r in results)
    if fixed:
        end = ":" if show_fixes else "."
        out.print(f"Fixed {fixed} problem{'s' * (fixed != 1)}{end}", markup=False)
    for result in results if show_fixes else ():
        if result.fixed:
            out.print(f"- {result.path}:", markup=False)
            for (code, name), count in sorted(result.fixed.items()):
                out.print(f"    {count} x {code} ({name})", markup=False)
    if pairs:
        safe = sum(f.fix == "safe" for _, f in pairs)
        unsafe = sum(f.fix == "unsafe" for _, f in pairs)
        hints = []
        if safe:
            hints.append(f"{safe} fixable with --fix")
        if unsafe:
            more = "more with --unsafe-fixes" if safe else "fixable with --fix --unsafe-fixes"
            hints.append(f"{unsafe} {more}")
        hint = f" ({', '.join(hints)})" if hints else ""
        out.print(f"Found {len(pairs)} problem{'s' * (len(pairs) != 1)}{hint}.", markup=False)
    elif not any(r.error for r in results):
        out.print("All checks passed!", markup=False)
    unchecked = sum(r.unchecked for r in results)
    if unchecked:  # "passed" must not read as "safe on many processes" for plain scripts
        files, them = (
            ("1 file trains", "it") if unchecked == 1 else (f"{unchecked} files train", "them")
        )
        out.print(
            f"Note: {files} with no Accelerator in {them}, where the multi-process rules have "
            "nothing to read (accel-convert converts such scripts; --select ACL210 lists what "
            "it would leave alone).",
            markup=False,
        )


def render_statistics(results: Sequence[FileResult], out: Console | PlainConsole) -> None:
    """One line a rule that fired, most findings first (Ruff's ``--statistics``)."""
    counts = Counter((f.code, f.name, f.fix == "safe") for _, f in _pairs(results))
    for (code, name, safe), count in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
        out.print(f"{count:>5}  {code}  {'[*] ' if safe else ''}{name}", markup=False)


def render_json(results: Sequence[FileResult], rules: Sequence[type[Rule]]) -> str:
    return json.dumps(
        [
            {
                "code": f.code,
                "name": f.name,
                "severity": f.severity.value,
                "message": f.message,
                "filename": path,
                "cell": f.cell,
                "location": {"row": f.line, "column": f.column},
                "end_location": {"row": f.end_line, "column": f.end_column},
                "fix": {"applicability": f.fix} if f.fix else None,
            }
            for path, f in _pairs(results)
        ],
        indent=2,
    )


def render_github(results: Sequence[FileResult], rules: Sequence[type[Rule]]) -> str:
    """GitHub Actions workflow commands: each finding becomes an annotation on the PR diff."""
    return "\n".join(
        github_annotation(
            _GITHUB_LEVEL[f.severity],
            f"{f.code} {f.message}",
            file=path,
            line=f.line,
            col=f.column,
            endLine=f.end_line,
            endColumn=f.end_column,
            title=f"accel-lint {f.code} ({f.name})",
        )
        for path, f in _pairs(results)
    )


def render_gitlab(results: Sequence[FileResult], rules: Sequence[type[Rule]]) -> str:
    """GitLab code quality report; fingerprints survive unrelated edits that move lines."""
    import hashlib  # only this format: off the start-up path

    issues = []
    seen: dict[str, int] = {}
    for path, f in _pairs(results):
        basis = f"{path}\0{f.code}\0{f.cell}\0{f.source.strip()}"
        seen[basis] = seen.get(basis, 0) + 1
        fingerprint = hashlib.sha256(f"{basis}\0{seen[basis]}".encode()).hexdigest()
        issues.append(
            {
                "description": f"{f.code} {f.message}",
                "check_name": f"{f.code} {f.name}",
                "fingerprint": fingerprint,
                "severity": _GITLAB_SEVERITY[f.severity],
                "location": {
                    "path": Path(path).as_posix(),
                    "lines": {"begin": f.line, "end": f.end_line},
                },
            }
        )
    return json.dumps(issues, indent=2)


def render_sarif(results: Sequence[FileResult], rules: Sequence[type[Rule]]) -> str:
    from accelify.rules.sarif import render  # rarely used: keep it off the start-up path

    return render(results, rules)


MACHINE: dict[str, Callable[[Sequence[FileResult], Sequence[type[Rule]]], str]] = {
    "json": render_json,
    "github": render_github,
    "gitlab": render_gitlab,
    "sarif": render_sarif,
}
