"""Bugs planted into real Accelerate scripts, kept as data: well-formed always, and all found
when ``ACCELIFY_REALCODE`` names a folder of checkouts (``plant_check.py`` prints recall)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from plant_check import PLANTS, Plant, load, planted, run

from accelify.rules.checks import all_rules

ROWS = load(PLANTS)


def test_every_plant_names_a_default_rule_and_a_shape() -> None:
    default = {rule.code for rule in all_rules() if rule.enabled_by_default}
    assert len(ROWS) >= 20
    for row in ROWS:
        assert row.code in default and row.shape in {"function", "class", "module", "guard"}, row


def test_a_plant_goes_after_its_line_with_that_line_s_indent() -> None:
    text = "def f():\n    x = 1\n    for a in b:\n        y = 2\n"
    plant = Plant("f.py", "for a in b:", "if y:\n    break", "ACL010", "function")
    assert planted(text, plant) == (
        "def f():\n    x = 1\n    for a in b:\n        if y:\n            break\n        y = 2\n",
        range(4, 6),
    )
    assert planted(text, Plant("f.py", "z = 3", "pass", "ACL010", "function")) is None


def test_a_missed_plant_is_reported(tmp_path: Path) -> None:
    folder = tmp_path / "owner+repo"
    folder.mkdir()
    (folder / "train.py").write_text("import torch\n\nx = 1\n")
    plant = Plant("owner+repo/train.py", "x = 1", "y = 2", "ACL009", "module")
    found, total, misses = run(tmp_path, [plant])
    assert sum(found.values()) == 0 and total[("ACL009", "module")] == 1
    assert misses == ["owner+repo/train.py after 'x = 1': ACL009 (module) not found"]


@pytest.mark.skipif(not os.environ.get("ACCELIFY_REALCODE"), reason="set ACCELIFY_REALCODE")
def test_every_plant_is_found() -> None:
    assert run(Path(os.environ["ACCELIFY_REALCODE"]), ROWS)[2] == []
