"""The cheap traversal and line numbers must agree with libcst's own on real scripts: steps and
rules see nodes in source order, and reports keep PositionProvider's line numbers."""

from __future__ import annotations

from pathlib import Path

import libcst as cst
import pytest
from libcst.metadata import MetadataWrapper, PositionProvider

from accelify.transform.lines import LineMap, start_lines
from accelify.transform.walk import children, walk

FIXTURES = sorted((Path(__file__).parents[2] / "fixtures").rglob("*.py"))
# Some dataclass order, then the source-order overrides, and syntax the fixtures lack.
EXTRA = """
@deco(a)
async def f(a, /, b: int = g(1), *c, d, **e) -> h(2):
    async with x() as y, z():
        async for i in j:
            v = k if cond(i) else m
    print([p async for p in q if p], key=val)
class C(Base, metaclass=M):
    pass
try:
    pass
except (A, B) as err:
    pass
from .. import u as w
match cmd:
    case [a, *rest] if rest:
        pass
"""
# Fields and nodes of whitespace and punctuation: they may come in another order among their
# siblings, since nothing reads them.
_WHITESPACE = (
    *("whitespace", "lpar", "rpar", "comma", "semicolon", "leading", "trailing", "lines_"),
    *("header", "footer", "equal", "colon", "dot", "lbracket", "rbracket", "lbrace", "rbrace"),
    *("first_colon", "second_colon"),
)
_PUNCTUATION = (
    cst.BaseParenthesizableWhitespace,
    cst.LeftParen,
    cst.RightParen,
    cst.Comma,
    cst.EmptyLine,
    cst.TrailingWhitespace,
    cst.Newline,
    cst.Comment,
    cst.Semicolon,
    cst.Colon,
    cst.AssignEqual,
    cst.Dot,
    cst.LeftSquareBracket,
    cst.RightSquareBracket,
    cst.LeftCurlyBrace,
    cst.RightCurlyBrace,
)


_ALL_TYPES = {
    name
    for name, value in vars(cst).items()
    if isinstance(value, type) and issubclass(value, cst.CSTNode)
}


class _Events(cst.CSTVisitor):
    """Every visit/leave, and field hooks on fields that hold a node or a list of them."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[tuple[str, int, str]] = []

    def on_visit(self, node: cst.CSTNode) -> bool:
        self.events.append(("visit", id(node), ""))
        return True

    def on_leave(self, original_node: cst.CSTNode) -> None:
        self.events.append(("leave", id(original_node), ""))

    def on_visit_attribute(self, node: cst.CSTNode, attribute: str) -> None:
        self._field("enter", node, attribute)

    def on_leave_attribute(self, original_node: cst.CSTNode, attribute: str) -> None:
        self._field("exit", original_node, attribute)

    def _field(self, kind: str, node: cst.CSTNode, attribute: str) -> None:
        value = getattr(node, attribute)
        if isinstance(value, (cst.CSTNode, tuple, list)) and value:
            self.events.append((kind, id(node), attribute))


def _significant(events: list[tuple[str, int, str]], whitespace: set[int]):
    return [e for e in events if e[1] not in whitespace and not e[2].startswith(_WHITESPACE)]


@pytest.mark.parametrize("source", [EXTRA, *(p.read_text() for p in FIXTURES)])
def test_walk_and_lines_agree_with_libcst(source: str) -> None:
    module = cst.parse_module(source)
    ours, theirs = _Events(), _Events()
    walk(module, ours, fields=_ALL_TYPES)
    module.visit(theirs)
    positions = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
    whitespace = {id(n) for n in positions if isinstance(n, _PUNCTUATION)}
    assert _significant(ours.events, whitespace) == _significant(theirs.events, whitespace)
    for statement in module.body:
        theirs = [id(c) for c in statement.children if id(c) not in whitespace]
        assert [id(c) for c in children(statement) if id(c) not in whitespace] == theirs
    assert {id(n): r.start.line for n, r in positions.items()} == start_lines(module)


def test_lines_count_every_newline_style() -> None:
    source = 'a = 1\nb = """x\r\ny\rz"""\nc = 2\n'
    for newline in ("\n", "\r\n", "\r"):
        module = cst.parse_module(source.replace("\n", newline))
        positions = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
        assert {id(n): r.start.line for n, r in positions.items()} == start_lines(module)


def test_line_map_follows_moved_rewritten_and_removed_lines() -> None:
    before = (
        "import torch\nmodel = Net().to(device)\nfor x in loader:\n    loss.backward()\nend()\n"
    )
    after = (
        "import torch\nfrom accelify.runtime import Accelerator\n"  # inserted: 1 line down
        "accelerator = Accelerator()\nmodel = Net()\n"  # rewritten, after an inserted line
        "for x in loader:\n    accelerator.backward(loss)\nend()\n"
    )
    moved = LineMap(before, after)
    got = [moved.new_line(line) for line in range(1, 6)]
    assert got == [1, 4, 5, 6, 7]  # model's line maps to its rewrite, not the inserted line
    removed = LineMap("a = 1\nmodel.to(device)\nb = 2\n", "a = 1\nb = 2\n")
    assert removed.new_line(2) == 2  # gone: the line that now stands where it stood
    assert removed.hunks() == [(2, 2, ["model.to(device)"], [])]


def test_line_map_counts_lines_as_libcst_does() -> None:
    """CRLF, CR and LF end a line; a form feed does not (str.splitlines would split there)."""
    before = "a = 1\r\nb = 2\x0c\rc = 3\nd = 4\n"
    after = "x = 0\n" + before
    assert [LineMap(before, after).new_line(line) for line in (1, 2, 3, 4)] == [2, 3, 4, 5]
    module = cst.parse_module(before)
    assert start_lines(module)[id(module.body[3])] == 4
