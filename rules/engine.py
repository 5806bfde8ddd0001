"""Parse once, run every selected rule in one traversal, drop suppressed findings, fix to fixpoint.

The traversal is a single read-only walk that dispatches each node to the facts visitor and then to
every rule that has a handler for that node type (Fixit's batched visitor). Positions are resolved
only when something was found, and only for the reported nodes: libcst's ``PositionProvider`` costs
about twice the parse and keeps a range for every node of the file (a tenth of its memory).
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import libcst as cst
from libcst._nodes.internal import CodegenState  # private: tests/test_memory.py pins it
from libcst.metadata import CodePosition, CodeRange

from accelify.rules.facts import Facts
from accelify.rules.rule import Report, Rule, Severity
from accelify.transform import edits
from accelify.transform.depth import deep_enough
from accelify.transform.sources import python_syntax_error
from accelify.transform.walk import walk

# A file that mentions none of these cannot contain anything the rules look for.
_RELEVANT = re.compile(r"\b(torch|accelerate|accelify|Accelerator|cuda)\b")
_FILE_NOQA = re.compile(r"^[ \t]*#[ \t]*accelify:[ \t]*noqa\b", re.MULTILINE | re.IGNORECASE)
_BACKWARD = re.compile(r"\.backward\(")
_ACCELERATOR = re.compile(r"\b[Aa]ccelerator\b")
_NEWLINE = re.compile(r"\r\n?|\n")  # libcst's line breaks
_NOQA = re.compile(r"#\s*noqa(?::\s*(?P<codes>[A-Z]+[0-9]+(?:[\s,]+[A-Z]+[0-9]+)*))?", re.I)
MAX_FIX_PASSES = 10


@dataclass(frozen=True)
class Finding:
    """One reported problem, in plain data so it can cross process boundaries."""

    code: str
    name: str
    severity: Severity
    message: str
    line: int
    column: int  # 1-based, like every linter's text output
    end_line: int
    end_column: int
    fix: str | None = None  # "safe", "unsafe" or None when the rule offers none
    source: str = ""  # the text of ``line``, for excerpts and fingerprints
    cell: int | None = None  # notebooks: the code cell, and ``line`` counts within it


class _Dispatcher(cst.CSTVisitor):
    """Calls ``visit_<Node>``/``leave_<Node>`` (and ``visit_<Node>_<field>``) on many visitors."""

    def __init__(self, visitors: Sequence[object]) -> None:
        super().__init__()
        self._visit: dict[str, list[Callable[..., object]]] = defaultdict(list)
        self._leave: dict[str, list[Callable[..., object]]] = defaultdict(list)
        for visitor in visitors:
            for attr in dir(type(visitor)):
                if attr.startswith("visit_"):
                    self._visit[attr[6:]].append(getattr(visitor, attr))
                elif attr.startswith("leave_"):
                    self._leave[attr[6:]].insert(0, getattr(visitor, attr))
        # Node types with field handlers (``visit_If_body``): the walk calls the field hooks
        # only on these.
        self.with_fields = frozenset(
            key.split("_", 1)[0] for key in (*self._visit, *self._leave) if "_" in key
        )

    def on_visit(self, node: cst.CSTNode) -> bool:
        for handler in self._visit.get(type(node).__name__, ()):
            handler(node)
        return True

    def on_leave(self, original_node: cst.CSTNode) -> None:
        for handler in self._leave.get(type(original_node).__name__, ()):
            handler(original_node)

    def on_visit_attribute(self, node: cst.CSTNode, attribute: str) -> None:
        for handler in self._visit.get(f"{type(node).__name__}_{attribute}", ()):
            handler(node)

    def on_leave_attribute(self, original_node: cst.CSTNode, attribute: str) -> None:
        for handler in self._leave.get(f"{type(original_node).__name__}_{attribute}", ()):
            handler(original_node)


def is_relevant(text: str) -> bool:
    """Cheap text prefilter: skip files that cannot matter, and files opted out as a whole."""
    return bool(_RELEVANT.search(text)) and not _FILE_NOQA.search(text)


def trains_alone(text: str) -> bool:
    """Whether ``text`` calls ``.backward(`` and never names an accelerator: training the
    Accelerate rules have nothing to read in (what ACL210, off by default, looks into)."""
    return bool(_BACKWARD.search(text)) and not _ACCELERATOR.search(text)


def parse(text: str) -> cst.Module:
    """Parse, or raise ``SyntaxError`` with CPython's message (libcst's lists token sets);
    nesting libcst's parser would crash on is refused before it gets there."""
    python_error = python_syntax_error(text, "<lint>")
    try:
        return cst.parse_module(text)
    except cst.ParserSyntaxError as err:
        if python_error is not None:
            raise python_error from None
        raise SyntaxError(err.message, ("", err.raw_line, err.raw_column, "")) from None


def run_rules(
    module: cst.Module, rules: Sequence[type[Rule]], source: str, path: str | None = None
) -> list[Report]:
    """One traversal of ``module`` (parsed from ``source``, read from ``path``) with the facts
    visitor and an instance of each rule."""
    reports: list[Report] = []
    facts = Facts(source, path)
    dispatcher = _Dispatcher([facts, *(rule(facts, reports) for rule in rules)])
    walk(module, dispatcher, fields=dispatcher.with_fields)
    return reports


def _suppressed(report: Report, line_text: str) -> bool:
    match = _NOQA.search(line_text)
    if match is None:
        return False
    codes = match.group("codes")
    return codes is None or report.rule.code in re.split(r"[\s,]+", codes.upper())


class _Syntactic:
    """``record_syntactic_position``'s context: the span of the node's own syntax."""

    __slots__ = ("_end_node", "_start", "_start_node", "_state")

    def __init__(self, state: _Positions, start: object, end: object) -> None:
        self._state, self._start_node, self._end_node = state, start, end

    def __enter__(self) -> None:
        self._start = (self._state.line, self._state.column)

    def __exit__(self, *exc: object) -> None:
        state = self._state
        # libcst hoists the start or end from a direct child, whose span its frame holds.
        children = state.frames[-1][2]
        start = self._start if self._start_node is None else children[self._start_node][0]
        end = (state.line, state.column) if self._end_node is None else children[self._end_node][1]
        state.frames[-1][1] = (start, end)


class _Positions(CodegenState):
    """libcst's position codegen (``PositionProvider``: same spans, same hoisting), keeping the
    spans of ``wanted`` nodes only. An open node's frame holds its children's spans until it
    closes, so memory follows the tree's depth, not its size; no source text is assembled."""

    def __init__(self, module: cst.Module, wanted: set[cst.CSTNode]) -> None:
        super().__init__(module.default_indent, module.default_newline)
        self.wanted = wanted
        self.found: dict[cst.CSTNode, CodeRange] = {}
        self.line, self.column = 1, 0
        # Per open node: [start, its syntactic span or None, {child: span}].
        self.frames: list[list] = [[(1, 0), None, {}]]

    def _advance(self, value: str) -> None:
        if "\n" in value or "\r" in value:
            parts = _NEWLINE.split(value)
            self.line += len(parts) - 1
            self.column = len(parts[-1])
        else:
            self.column += len(value)

    def add_indent_tokens(self) -> None:
        for token in self.indent_tokens:
            self.add_token(token)

    def add_token(self, value: str) -> None:
        if not self.tokens:  # ``Module`` asks only whether anything was written
            self.tokens.append(value)
        self._advance(value)

    def pop_trailing_newline(self) -> None:
        pass  # only the text would change: positions are recorded before it, as in libcst

    def before_codegen(self, node: cst.CSTNode) -> None:
        self.frames.append([(self.line, self.column), None, {}])

    def after_codegen(self, node: cst.CSTNode) -> None:
        start, syntactic, _children = self.frames.pop()
        span = syntactic or (start, (self.line, self.column))
        self.frames[-1][2][node] = span
        if node in self.wanted:
            self.found[node] = CodeRange(CodePosition(*span[0]), CodePosition(*span[1]))

    def record_syntactic_position(  # type: ignore[override]
        self,
        node: cst.CSTNode,
        *,
        start_node: cst.CSTNode | None = None,
        end_node: cst.CSTNode | None = None,
    ) -> _Syntactic:
        return _Syntactic(self, start_node, end_node)  # ``node`` is always the open one


def positions(module: cst.Module, nodes: set[cst.CSTNode]) -> dict[cst.CSTNode, CodeRange]:
    """The span of each of ``nodes`` (of ``module``), as libcst's ``PositionProvider`` gives it."""
    state = _Positions(module, nodes)
    module._codegen(state)
    return state.found


def _unsuppressed(
    reports: list[Report], positions: Mapping[cst.CSTNode, CodeRange], text: str
) -> list[tuple[Report, CodeRange]]:
    """``reports`` with their positions, minus those a ``# noqa`` comment on their line silences."""
    lines = text.splitlines()
    located = []
    for report in reports:
        where = positions[report.node]
        line_text = lines[where.start.line - 1] if where.start.line <= len(lines) else ""
        if not _suppressed(report, line_text):
            located.append((report, where))
    return located


@deep_enough
def lint(text: str, rules: Sequence[type[Rule]], path: str | None = None) -> list[Finding]:
    """Findings for ``text`` (the file ``path``, when it has one), sorted by position. Raises
    ``SyntaxError`` on unparsable input, also in a file no rule reads (as Ruff reports one
    everywhere)."""
    if not rules or not is_relevant(text):
        if python_syntax_error(text, "<lint>") is not None:
            parse(text)  # libcst reads syntax newer than this Python; else this raises
        return []
    module = parse(text)
    reports = run_rules(module, rules, text, path)
    if not reports:
        return []
    findings = []
    lines = text.splitlines()
    located = positions(module, {r.node for r in reports})
    for report, where in _unsuppressed(reports, located, text):
        fix = None if report.new is None else "safe" if report.safe else "unsafe"
        findings.append(
            Finding(
                report.rule.code,
                report.rule.name,
                report.rule.severity,
                report.message,
                where.start.line,
                where.start.column + 1,
                where.end.line,
                where.end.column + 1,
                fix,
                lines[where.start.line - 1] if where.start.line <= len(lines) else "",
            )
        )
    return sorted(set(findings), key=lambda f: (f.line, f.column, f.code, f.message))


def _apply(module: cst.Module, chosen: Sequence[Report]) -> str | None:
    """The code with ``chosen`` applied, or None if it would not compile.

    The converter's edit pass applies them, so that a fix never loses a comment: libcst drops a
    removed statement line with the comments it holds (the lines above it, the one at its end);
    the edit pass hands them to the next statement, or to the end of the block (its footer) when
    the line was the block's last.
    """
    code = edits.apply(module, _edits(chosen)).code
    try:
        compile(code, "<fixed>", "exec", dont_inherit=True)
    except (SyntaxError, ValueError):
        return None
    return code


def _edits(chosen: Sequence[Report]) -> edits.Edits:
    """The fixes of ``chosen`` as converter edits: removals of statement lines, replacements."""
    planned = edits.Edits()
    for report in chosen:
        if report.old is None or report.new is None:
            continue
        if isinstance(report.new, cst.RemovalSentinel):
            planned.remove(report.old)  # type: ignore[arg-type]  # a statement line: see Report
        else:
            planned.replace(report.old, report.new)
    return planned


@deep_enough
def fix(text: str, rules: Sequence[type[Rule]], unsafe: bool = False) -> tuple[str, list[str]]:
    """Apply fixes until nothing changes; returns the new text and notes on dropped fixes.

    Each pass applies the fixes whose spans do not overlap, then re-parses and re-lints, so a fix
    inside another fix's span lands in the next pass instead of being lost.
    """
    notes: list[str] = []
    blocked: set[tuple[str, str]] = set()
    if not is_relevant(text):
        return text, notes
    for _ in range(MAX_FIX_PASSES):
        module = parse(text)
        wanted = [
            r
            for r in run_rules(module, rules, text)
            if r.new is not None and (r.safe or unsafe) and _key(module, r) not in blocked
        ]
        if not wanted:
            break
        spans = positions(module, {n for r in wanted for n in (r.node, r.old)})
        chosen = _non_overlapping(
            [(r, spans[r.old]) for r, _ in _unsuppressed(wanted, spans, text)]  # type: ignore[index]
        )
        code = _apply(module, [r for r, _ in chosen])
        if code is None:  # find the culprits one by one, keep the rest
            good = []
            for report, where in chosen:
                if _apply(module, [report]) is None:
                    blocked.add(_key(module, report))
                    notes.append(
                        f"{where.start.line}: {report.rule.code} fix dropped: "
                        "it would produce invalid code"
                    )
                else:
                    good.append(report)
            code = _apply(module, good) if good else None
        if code is None or code == text:
            break
        text = code
    return text, notes


def _key(module: cst.Module, report: Report) -> tuple[str, str]:
    return report.rule.code, module.code_for_node(report.node)


def _non_overlapping(
    located: list[tuple[Report, CodeRange]],
) -> list[tuple[Report, CodeRange]]:
    chosen: list[tuple[Report, CodeRange]] = []
    end = (0, 0)
    for report, where in sorted(located, key=lambda x: (x[1].start.line, x[1].start.column)):
        start = (where.start.line, where.start.column)
        if start >= end:
            chosen.append((report, where))
            end = (where.end.line, where.end.column)
    return chosen
