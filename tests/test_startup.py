"""The CLIs' start-up cache of dataclass methods: reused across runs, the same classes as without
it, and never a reason for a tool to fail."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from accelify.transform import startup

# Every libcst node class as built, by what its generated methods are and do.
DESCRIBE = """
import inspect, json, libcst
classes = [c for _, c in sorted(vars(libcst).items()) if isinstance(c, type)]
def method(f):
    return None if f is None else [str(inspect.signature(f)), repr(f.__annotations__),
                                   f.__code__.co_code.hex(), repr(f.__code__.co_consts)]
print(json.dumps({c.__name__: [method(vars(c).get(m)) for m in ("__init__", "__eq__", "__repr__")]
                  for c in classes}))
"""


def _python(code: str, cache: Path | None) -> str:
    """Run ``code`` in a fresh interpreter, inside ``compiled_once(cache)`` unless None."""
    if cache is not None:
        body = "".join(f"    {line}\n" for line in code.strip().splitlines())
        code = (
            "from pathlib import Path\n"
            "from accelify.transform.startup import compiled_once\n"
            f"with compiled_once(Path({str(cache)!r})) as counts:\n{body}"
            "import sys; print(json.dumps(counts), file=sys.stderr)\n"
        )
        code = "import json\n" + code
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    return done.stdout + ("\n" + done.stderr.strip().splitlines()[-1] if cache else "")


def _counts(output: str) -> dict[str, int]:
    return json.loads(output.splitlines()[-1])


def test_the_second_start_compiles_nothing(tmp_path: Path) -> None:
    cache = tmp_path / "methods.marshal"
    first = _counts(_python("import libcst", cache))
    assert first["compiled"] > 500 and first["reused"] == 0 and cache.exists()
    second = _counts(_python("import libcst", cache))
    assert second == {"reused": first["compiled"], "compiled": 0}


def test_the_classes_are_the_ones_dataclasses_builds_without_it(tmp_path: Path) -> None:
    """Same signatures, annotations (not strings: the cached code must not inherit this
    package's ``from __future__ import annotations``) and bytecode, from a cold and a warm cache."""
    plain = json.loads(_python(DESCRIBE, None))
    assert len(plain) > 150
    cache = tmp_path / "methods.marshal"
    for _ in ("cold", "warm"):
        cached = json.loads(_python(DESCRIBE, cache).splitlines()[0])
        assert cached == plain


@pytest.mark.parametrize("damage", ["garbage", "empty", "not a dict", "no folder possible"])
def test_a_damaged_or_unwritable_cache_is_compiled_around(tmp_path: Path, damage: str) -> None:
    cache = tmp_path / "methods.marshal"
    if damage == "garbage":
        cache.write_bytes(b"\xe3\x00\x01 not marshal")
    elif damage == "empty":
        cache.write_bytes(b"")
    elif damage == "not a dict":
        cache.write_bytes(b"N")  # marshal of None
    else:  # a file where the cache folder would go: unwritable even for root
        (tmp_path / "file").write_text("")
        cache = tmp_path / "file" / "methods.marshal"
    counts = _counts(_python("import libcst; assert libcst.parse_module('x = 1').code", cache))
    assert counts["compiled"] > 500
    if damage != "no folder possible":  # repaired for the next start
        assert _counts(_python("import libcst", cache))["compiled"] == 0


def test_both_tools_start_through_the_cache(tmp_path: Path) -> None:
    """The installed console scripts fill the cache under XDG_CACHE_HOME and still work."""
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path)}
    script = tmp_path / "train.py"
    script.write_text("import torch\nmodel = torch.nn.Linear(2, 2)\n")
    bin_dir = Path(sys.executable).parent
    for tool, extra in (("accel-lint", []), ("accel-convert", ["--check", "--quiet"])):
        done = subprocess.run(
            [str(bin_dir / tool), *extra, str(script)],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode in (0, 1), done.stderr
    [cache] = (tmp_path / "accelify").iterdir()
    assert cache.name == startup.cache_file().name and cache.stat().st_size > 100_000
