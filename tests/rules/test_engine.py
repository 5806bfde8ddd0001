"""The engine's contracts: one parse and one traversal, the prefilter, breaking fixes dropped."""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m
import pytest

from accelify.rules import engine
from accelify.rules.checks import all_rules
from accelify.rules.rule import Rule
from accelify.rules.runner import Options, check_file

from .conftest import FIXTURES


class _CountingRule(Rule):
    """Counts the ``Call`` nodes it is shown."""

    code = "ACL990"
    name = "counting"
    seen = 0

    def visit_Call(self, node: cst.Call) -> None:
        type(self).seen += 1


class _BreakingFix(Rule):
    """Offers a fix that cannot compile for ``x`` and a good one for ``y``."""

    code = "ACL991"
    name = "breaking-fix"

    def visit_Name(self, node: cst.Name) -> None:
        if node.value == "x":
            self.report(node, "x", new=cst.Call(cst.Name("f")))  # `f() = 1`
        elif node.value == "y":
            self.report(node, "y", new=cst.Name("z"))


def test_all_rules_share_one_parse_and_one_traversal(monkeypatch: pytest.MonkeyPatch) -> None:
    text = (FIXTURES / "planted.py").read_text()
    calls = len(m.findall(cst.parse_module(text), m.Call()))
    parses = []
    real_parse = cst.parse_module
    monkeypatch.setattr(cst, "parse_module", lambda text: parses.append(1) or real_parse(text))
    walks, located, visits = [], [], []  # the rules' walk; positions; libcst visits
    real_walk, real_positions, real_visit = engine.walk, engine.positions, cst.Module.visit
    monkeypatch.setattr(engine, "walk", lambda n, v, **kw: walks.append(v) or real_walk(n, v, **kw))
    monkeypatch.setattr(
        engine, "positions", lambda m, nodes: located.append(nodes) or real_positions(m, nodes)
    )
    monkeypatch.setattr(
        cst.Module, "visit", lambda self, v: visits.append(v) or real_visit(self, v)
    )
    _CountingRule.seen = 0
    findings = engine.lint(text, [*all_rules(), _CountingRule])
    assert findings and len(parses) == 1
    assert [type(v) for v in walks] == [engine._Dispatcher]
    assert len(located) == 1 and not visits  # findings: their nodes' positions, in one pass
    assert _CountingRule.seen == calls
    walks.clear()
    located.clear()
    assert engine.lint((FIXTURES / "clean_train.py").read_text(), all_rules()) == []
    assert len(walks) == 1
    assert not located  # no findings: positions are never computed


def test_files_that_cannot_matter_are_not_parsed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine, "parse", lambda text: pytest.fail("parsed"))
    assert engine.lint("import os\nprint(os.sep)\n", all_rules()) == []


def test_fixes_that_would_not_compile_are_dropped_with_a_note() -> None:
    fixed, notes = engine.fix("import torch\nx = 1\ny = 2\n", [_BreakingFix])
    assert fixed == "import torch\nx = 1\nz = 2\n"
    assert notes == ["2: ACL991 fix dropped: it would produce invalid code"]


def test_a_crashing_rule_is_a_one_line_error_not_a_traceback(monkeypatch, tmp_path) -> None:
    def boom(self, node):
        raise RuntimeError("boom")

    monkeypatch.setattr(_CountingRule, "visit_Call", boom)
    monkeypatch.setattr("accelify.rules.runner.all_rules", lambda: [_CountingRule])
    path = tmp_path / "t.py"
    path.write_text("import torch\ntorch.ones(1)\n")
    result = check_file(str(path), Options())
    assert result.error == f"{path}:0: internal error (please report): RuntimeError: boom"


def test_a_fix_that_removes_a_line_keeps_its_comments_and_the_block_end_ones() -> None:
    """The last line of a loop at the end of the file is removed: the comment above it, the one
    at its end and the indented one after it all stay, byte for byte, at the loop's end."""
    rule = next(rule for rule in all_rules() if rule.code == "ACL206")
    head = (
        "from accelify.runtime import Accelerator\n\naccelerator = Accelerator()\n"
        "model, loader = accelerator.prepare(model, loader)\n"
        "for batch in loader:\n    out = model(batch)\n    # the model must be on the GPU\n"
    )
    end = "    # a comment the user wrote, indented, at the very end\n"
    fixed, notes = engine.fix(f"{head}    model.to(device)  # moved after prepare\n{end}", [rule])
    assert notes == []
    assert fixed == f"{head}    # moved after prepare\n{end}"
