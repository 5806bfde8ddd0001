"""Converted scripts compute what the originals computed.

Each runnable fixture runs as written and converted, in one CPU process with the same seed; the
printed losses and any saved weights must match. HF Accelerate is the reference runtime
(``--target accelerate``); the bundled runtime must agree with it.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from accelify.transform.convert import Options, convert

from .conftest import CASES_DIR

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "oracle"))
from runner import Zygote, zygote_fixture  # noqa: F401  (tests/oracle is scripts, not a package)

torch = pytest.importorskip("torch")

# script -> (arguments, saved weights file or None, relative tolerance)
RUNNABLE = {
    "mnist": (["--epochs", "2", "--save-model"], "mnist_cnn.pt", 1e-6),
    "dict_batches": ([], None, 1e-6),
    "accumulate_clip": ([], "classifier.pt", 1e-6),
    "trainer_class": ([], None, 1e-6),
    # fp16 autocast: the reference and the original may round differently in the last bits.
    "native_amp": ([], None, 1e-3),
}
NUMBER = re.compile(r"-?\d+\.\d+(?:e-?\d+)?")


def _run(zygote: Zygote, script: Path, args: list[str], cwd: Path) -> str:
    out = cwd / ".run"
    out.mkdir(exist_ok=True)
    result = zygote.run(script, cwd, out, 300, ranks=1, argv=args)
    assert result.code == 0, result.stderr[-3000:]
    return result.stdout


def _numbers(output: str) -> list[float]:
    return [float(x) for x in NUMBER.findall(output)]


@pytest.fixture(scope="module")
def originals(tmp_path_factory, zygote: Zygote) -> dict[str, tuple[str, Path]]:
    """Run each original once; every target compares against the same run."""
    out = {}
    for name, (args, _saved, _tol) in RUNNABLE.items():
        cwd = tmp_path_factory.mktemp(f"{name}-original")
        out[name] = (_run(zygote, CASES_DIR / f"{name}.in.py", args, cwd), cwd)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("target", ["accelerate", "accelify"])
@pytest.mark.parametrize("name", sorted(RUNNABLE))
def test_converted_script_matches_original(name, target, originals, zygote, tmp_path) -> None:
    if target == "accelerate":
        pytest.importorskip("accelerate")
    args, saved, tolerance = RUNNABLE[name]
    converted = tmp_path / f"{name}.py"
    converted.write_text(
        convert((CASES_DIR / f"{name}.in.py").read_text(), Options(target=target)).code
    )
    expected_output, original_dir = originals[name]

    output = _run(zygote, converted, args, tmp_path)

    expected, got = _numbers(expected_output), _numbers(output)
    assert len(got) == len(expected) > 0, output
    assert got == pytest.approx(expected, rel=tolerance, abs=1e-6)
    if saved is not None:
        before = torch.load(original_dir / saved, weights_only=True)
        after = torch.load(tmp_path / saved, weights_only=True)
        assert before.keys() == after.keys()  # the unwrapped model was saved
        for key in before:
            torch.testing.assert_close(after[key], before[key], rtol=tolerance, atol=1e-6)
