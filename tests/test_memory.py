"""Linting a very large file holds little beyond libcst's own tree (issue 14: a 200k-line file).

Findings get positions from :func:`accelify.rules.engine.positions`, which walks libcst's position
codegen keeping only the reported nodes' spans; libcst's ``PositionProvider`` keeps one for every
node (about a tenth of the tree again) and costs about twice the parse.
"""

from __future__ import annotations

import gc
import random
import subprocess
import sys
from pathlib import Path

import libcst as cst
import pytest
from libcst.metadata import MetadataWrapper, PositionProvider

from accelify.rules.engine import positions

ROOT = Path(__file__).resolve().parents[1]
ODD = [
    "",
    "x",
    "x = 1\r\ny = (1,\r\n  2)\r\n",
    "x = 1\ry = 2\r",
    "if a:\n\tf(b)\n\tg(\n\t  c)\n",
    "x = \\\n  1\n",
    's = """a\nb""".format(c)\n',
    "# c\n\n@d\n# e\n@f(\n  1)\nasync def g():\n    async with a as b: pass\n",
    "match x:\n    case [1, *r] if r: pass\n    case _:\n        pass\n",
    "try:\n  pass\nexcept* E as e:\n  pass\nelse:\n  pass\nfinally:\n  pass\n",
    "x = 1;y = 2;",
]


@pytest.mark.parametrize(
    "text",
    [pytest.param(text, id=f"odd{i}") for i, text in enumerate(ODD)]
    + [
        pytest.param(p.read_text(), id=str(p.relative_to(ROOT / "fixtures")))
        for p in sorted((ROOT / "fixtures").rglob("*.py"))
    ],
)
def test_positions_match_libcst_position_provider(text: str) -> None:
    """Every node's span, asked for all at once, is libcst's: also pins the private codegen
    hooks ``positions`` relies on against a libcst upgrade."""
    module = cst.parse_module(text)
    expected = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
    assert positions(module, set(expected)) == dict(expected)


def _peak_mib(code: str, path: Path) -> float:
    """Peak RSS of ``code`` run in a fresh interpreter with ``path`` as ``sys.argv[1]``."""
    probe = f"{code}\nimport resource\nprint(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)"
    out = subprocess.run(
        [sys.executable, "-c", probe, str(path)], capture_output=True, text=True, check=True
    )
    return int(out.stdout.split()[-1]) / 1024


@pytest.mark.slow
def test_linting_a_large_file_costs_little_more_memory_than_parsing_it(tmp_path: Path) -> None:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import corpus
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    planted = (ROOT / "fixtures" / "lint" / "planted.py").read_text()
    path = tmp_path / "train.py"
    path.write_text(corpus.grow_script(planted, 8000, random.Random(0)))
    parse = _peak_mib("import sys, libcst; libcst.parse_module(open(sys.argv[1]).read())", path)
    lint = _peak_mib(
        "import sys\nfrom accelify.rules.runner import Options, check_file\n"
        "assert check_file(sys.argv[1], Options()).findings",  # positions are computed
        path,
    )
    # Imports differ by a few MiB; every node's position would add a tenth of the tree.
    assert lint - parse < 0.06 * parse + 12, (lint, parse)


def test_a_hundred_conversions_in_one_process_hold_no_more_objects_than_the_first_few() -> None:
    """The walk caches handlers per visitor class: a class made inside a function on every call
    was kept there, with the tree it closed over (651 objects per conversion, 932 MB over 800
    copies of one script). After one round has filled what caches there are, 100 more
    conversions of the same scripts must leave as many live objects as there were."""
    from accelify.transform import walk
    from accelify.transform.convert import convert

    scripts = [
        (ROOT / "fixtures" / "convert" / name).read_text()
        for name in (
            "native_amp.in.py",
            "sound/early_stop_on_validation.in.py",
            "report/file_writes.in.py",
            "mnist.in.py",
            "device/branch_chain.in.py",
        )
    ]

    def convert_all() -> tuple[int, int, int]:
        for text in scripts:
            convert(text)
        gc.collect()
        handlers = len(walk._VISITS) + len(walk._LEAVES)
        return len(walk.Visitor.__subclasses__()), handlers, len(gc.get_objects())

    classes, handlers, objects = convert_all()
    for _ in range(100 // len(scripts)):
        after = convert_all()
    assert after[:2] == (classes, handlers)
    # One conversion used to keep 651; a few may be a cache filled late (a regex, a string).
    assert after[2] - objects < 50, (objects, after[2])
