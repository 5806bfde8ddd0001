"""Run one of HF Accelerate's own test scripts function by function, under either runtime.

Started by ``accel-run`` (one launch per script and process count)::

    hf_runner.py accelify|hf SCRIPT OUT_DIR [SKIP,...]

The script (``accelerate/test_utils/scripts/SCRIPT.py``) is imported as HF ships it. With
``accelify``, every module-level name it imported from HF Accelerate's runtime (``Accelerator``,
``set_seed``, ``GradientState``, ``prepare_data_loader``, ...) is rebound to accelify's before
anything runs, in the HF test helpers it calls too; only HF's fixtures (``accelerate.test_utils``:
``RegressionModel``, ...) stay HF's. A runtime name accelify lacks is recorded as the failed check
``"<hf-left>"``. With ``hf`` nothing is swapped: the baseline.

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


def swap_to_accelify(module: ModuleType) -> tuple[list[str], list[str]]:
    """Rebind the script's HF Accelerate runtime names to accelify's, also inside the HF test
    helpers it imports (``are_the_same_tensors`` reads ``AcceleratorState``); return the names
    swapped and the runtime names left HF's because accelify has no such name, both sorted.

    HF's test fixtures (``accelerate.test_utils``: ``RegressionModel``, ``assert_exception``, ...)
    are data and checks, not runtime, so they stay HF's; nothing else may.
    """
    import accelify.runtime as ours

    helpers = {
        sys.modules[value.__module__]
        for value in vars(module).values()
        if _from_hf(value) and _is_fixture(value)
    }
    swapped, left = set(), set()
    for namespace in [module, *helpers]:
        for name, value in list(vars(namespace).items()):
            if not _from_hf(value) or _is_fixture(value) or inspect.ismodule(value):
                continue
            if name in ours.__all__:
                setattr(namespace, name, getattr(ours, name))
                swapped.add(name)
            elif namespace is module:
                left.add(name)
    return sorted(swapped), sorted(left)


def _from_hf(value: Any) -> bool:
    return (getattr(value, "__module__", None) or "").split(".")[0] == "accelerate"


def _is_fixture(value: Any) -> bool:
    return value.__module__.startswith("accelerate.test_utils")


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
        swapped, left = swap_to_accelify(module)
        if rank == 0:
            print(f"swapped to accelify: {', '.join(swapped)}", flush=True)
        if left:
            recorder.record("<hf-left>", RuntimeError(f"left HF's: {', '.join(left)}"))
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
