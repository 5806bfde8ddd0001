"""Run one of HF Accelerate's own test scripts function by function, under either runtime.

Started by ``accel-run`` (one launch per script and process count)::

    hf_runner.py accelify|hf SCRIPT OUT_DIR [SKIP,...]

The script (``accelerate/test_utils/scripts/SCRIPT.py``) is imported as HF ships it. With
``accelify``, every module-level name it imported from ``accelerate`` that ``accelify.runtime``
also exports (``Accelerator``, ``set_seed``, ``DistributedType``, the config classes, ...) is
rebound to accelify's before anything runs; HF's fixtures (``RegressionModel``, ...) and helpers
that accelify does not export stay HF's. With ``hf`` nothing is swapped: the baseline.

The script's own ``main()`` still decides which checks run and with which arguments; each check
it calls (a module function named ``test_*``, ``check_*`` or ``*_check``) is wrapped so that a
failure is recorded and ``main()`` goes on. Each rank writes ``OUT_DIR/rank<R>.jsonl``: one line
``{"function", "ok", "error"}`` per check (a check called several times passes if every call
does), plus ``"<main>"`` when ``main()`` itself fails outside a check. Checks named in SKIP are
not called (known to hang under that runtime) and recorded as failed with ``"skipped"``.
"""

from __future__ import annotations

import ast
import functools
import importlib
import inspect
import json
import os
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

SCRIPTS_PACKAGE = "accelerate.test_utils.scripts"


def swap_to_accelify(module: ModuleType) -> list[str]:
    """Rebind the module's HF Accelerate names that accelify exports; return them, sorted."""
    import accelify.runtime as ours

    swapped = []
    for name, value in list(vars(module).items()):
        came_from_hf = getattr(value, "__module__", "").split(".")[0] == "accelerate"
        if came_from_hf and name in ours.__all__:
            setattr(module, name, getattr(ours, name))
            swapped.append(name)
    return sorted(swapped)


def checks_called_by_main(module: ModuleType) -> list[str]:
    """The module's check functions that ``main()`` calls directly, in source order."""
    tree = ast.parse(inspect.getsource(module))
    main = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "main")
    called = [
        node.func.id
        for node in ast.walk(main)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
    ]
    return list(dict.fromkeys(name for name in called if _is_check(module, name)))


def _is_check(module: ModuleType, name: str) -> bool:
    named_as_check = name.startswith(("test_", "check_")) or name.endswith("_check")
    return named_as_check and inspect.isfunction(getattr(module, name, None))


class Recorder:
    """Per-check outcomes of this rank, written as they happen (a hang keeps what came before)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.outcomes: dict[str, dict[str, Any]] = {}

    def wrap(self, name: str, function: Callable) -> Callable:
        @functools.wraps(function)
        def recorded(*args: Any, **kwargs: Any) -> Any:
            try:
                result = function(*args, **kwargs)
            except BaseException as err:  # every failure is a result here
                self.record(name, err)
                return None
            self.record(name, None)
            return result

        return recorded

    def record(self, name: str, err: BaseException | None) -> None:
        previous = self.outcomes.get(name, {"ok": True, "error": ""})
        if previous["ok"] and err is not None:
            previous = {"ok": False, "error": _first_line(err)}
            if os.environ.get("PEER_TRACEBACKS"):
                traceback.print_exception(err)
        self.outcomes[name] = previous
        lines = [json.dumps({"function": n, **o}) for n, o in self.outcomes.items()]
        self.path.write_text("\n".join(lines) + "\n")


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0] if text else ''}"[:300]


def _skipped(*args: Any, **kwargs: Any) -> None:
    raise RuntimeError("skipped")


def main(runtime: str, script: str, out_dir: str, skip: str = "") -> None:
    rank = int(os.environ.get("RANK", "0"))
    recorder = Recorder(Path(out_dir) / f"rank{rank}.jsonl")
    module = importlib.import_module(f"{SCRIPTS_PACKAGE}.{script}")
    if runtime == "accelify":
        swapped = swap_to_accelify(module)
        if rank == 0:
            print(f"swapped to accelify: {', '.join(swapped)}", flush=True)
    skipped = set(filter(None, skip.split(",")))
    for name in checks_called_by_main(module):
        function = _skipped if name in skipped else getattr(module, name)
        setattr(module, name, recorder.wrap(name, function))
    try:
        module.main()
    except BaseException as err:
        recorder.record("<main>", err)
        traceback.print_exception(err)
    for name, outcome in recorder.outcomes.items():
        print("PEER-RESULT", json.dumps({"rank": rank, "function": name, **outcome}), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
