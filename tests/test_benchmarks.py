"""benchmarks/: the corpus is what the numbers claim it is, and every section runs end to end.

No timing is asserted anywhere: the numbers belong to the machine, not to the code.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"


@pytest.fixture
def corpus(monkeypatch: pytest.MonkeyPatch):
    """benchmarks/corpus.py, loaded by path (benchmarks/ is scripts, not an installed package)."""
    spec = importlib.util.spec_from_file_location("bench_corpus", BENCH / "corpus.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def bench(monkeypatch: pytest.MonkeyPatch):
    """benchmarks/ on sys.path for one test (its modules import one another by bare name); the
    modules loaded from there are forgotten afterwards."""
    monkeypatch.syspath_prepend(str(BENCH))
    yield importlib.import_module
    for name, module in list(sys.modules.items()):
        if Path(getattr(module, "__file__", None) or "/").parent == BENCH:
            del sys.modules[name]


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*.py"))}


def test_corpus_is_deterministic_parseable_and_mixes_in_files_without_torch(
    corpus, tmp_path: Path
) -> None:
    made = corpus.build(tmp_path / "a", 30)
    corpus.build(tmp_path / "b", 30)
    files = _tree(tmp_path / "a")
    assert files == _tree(tmp_path / "b")  # same arguments, same bytes: runs are comparable
    assert len(files) == made.files == 30
    assert made.lines == sum(text.count(b"\n") for text in files.values())
    plain = [name for name, text in files.items() if b"torch" not in text]
    assert len(plain) == made.plain_files > 0
    for name, text in files.items():
        ast.parse(text, name)  # a syntax error would time the tools' error paths instead
        assert text.count(b"\n") >= corpus.MIN_LINES
    torch_files = [text for name, text in files.items() if name not in plain]
    assert all(b"optimizer" in text or b"optim" in text for text in torch_files)
    assert max(text.count(b"\n") for text in files.values()) > 500  # not only toy files


def _bench(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(BENCH / "run.py"), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=False,
    )


def test_unknown_section_is_a_usage_error(tmp_path: Path) -> None:
    result = _bench("--only", "throughput,nope", "--out", str(tmp_path), cwd=tmp_path)
    assert result.returncode == 2
    assert "unknown section nope" in result.stderr
    assert not (tmp_path / "latest.json").exists()


@pytest.mark.slow
def test_every_section_runs_and_writes_its_record(tmp_path: Path) -> None:
    result = _bench("--smoke", "--out", str(tmp_path / "results"), cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    record = json.loads((tmp_path / "results" / "latest.json").read_text())
    sections = {s["key"]: s for s in record["sections"]}
    assert list(sections) == [
        "throughput",
        "startup",
        "scaling",
        "imports",
        "per_step",
        "distributed",
        "sync_check",
        "gpu",
        "exits",
        "memory",
    ]
    for key, section in sections.items():
        if key == "gpu" and section["status"].startswith("skipped"):
            continue
        assert section["status"] == "ok", section["status"]
        assert section["rows"] and all(len(r) == len(section["columns"]) for r in section["rows"])
    # Every target of our own tools got a number; only anchors may be missing (not installed).
    for target in (t for s in record["sections"] for t in s["targets"]):
        if "Fixit" not in target["name"]:
            assert isinstance(target["value"], float), target
            assert target["met"] in (True, False)
    # Section 6 really ran distributed: its loops refuse to report otherwise, so all rows exist.
    launchers = {row[1] for row in sections["distributed"]["rows"]}
    assert {"torchrun", "accel-run"} <= launchers
    # The replica check's section measured each setting, each on 2 processes (checked by the loop).
    assert [row[0] for row in sections["sync_check"]["rows"]] == [
        "off",
        "unset (the default)",
        "every:100",
    ]
    # Section 8 ran the clean-exit job under both launchers (counts are the run's, not asserted).
    assert {row[1] for row in sections["exits"]["rows"]} >= {"accel-run", "torchrun"}
    table = (tmp_path / "results" / "latest.md").read_text()
    assert table in result.stdout
    assert "| accel-lint | 1 |" in table


def test_gpt2_small_has_gpt2s_parameter_count_and_palm_flops(bench) -> None:
    import torch

    loops = bench("loops")
    with torch.device("meta"):  # the shapes without the memory
        model = loops.GPT(loops.GPTS["gpt2"])
    assert sum(p.numel() for p in model.parameters()) == 124_439_808  # GPT-2 small, tied head
    # nanoGPT's estimate: 6 per non-embedding parameter (position table out), plus attention.
    assert loops.flops_per_token(model) == 6 * (124_439_808 - 1024 * 768) + 12 * 12 * 768 * 1024


def test_a_gpt_loop_reports_what_mfu_needs(bench, tmp_path: Path) -> None:
    loops = bench("loops")
    result = tmp_path / "result.json"
    args = ["--model=gpt", "--steps=2", "--blocks=1", "--warmup=1", f"--result={result}"]
    done = subprocess.run(
        [sys.executable, str(BENCH / "loops.py"), "raw", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    record = json.loads(result.read_text())
    shape = loops.GPTS["gpt"]
    assert record["tokens_per_step"] == shape.batch * shape.context
    assert len(record["us_per_step"]) == 1
    assert record["flops_per_token"] == loops.flops_per_token(loops.GPT(shape))


@pytest.mark.parametrize(
    ("device", "peak"),
    [
        ("NVIDIA H100 80GB HBM3", 989.4e12),
        ("NVIDIA H200", 989.4e12),
        ("NVIDIA A100-SXM4-80GB", 312e12),
        ("NVIDIA H100 PCIe", None),  # lower clocks: left to ACCELIFY_PEAK_FLOPS
        ("NVIDIA L4", None),
    ],
)
def test_mfu_peak_is_known_by_name_or_left_out(
    bench, monkeypatch: pytest.MonkeyPatch, device: str, peak: float | None
) -> None:
    monkeypatch.delenv("ACCELIFY_PEAK_FLOPS", raising=False)
    assert bench("runtime_bench").peak_flops(device) == peak


def test_mfu_peak_from_the_environment_wins(bench, monkeypatch: pytest.MonkeyPatch) -> None:
    runtime_bench = bench("runtime_bench")
    monkeypatch.setenv("ACCELIFY_PEAK_FLOPS", "121e12")
    assert runtime_bench.peak_flops("NVIDIA H100 80GB HBM3") == 121e12
    for bad in ("fast", "0", "nan"):
        monkeypatch.setenv("ACCELIFY_PEAK_FLOPS", bad)
        with pytest.raises(RuntimeError, match=f"ACCELIFY_PEAK_FLOPS='{bad}': not a positive"):
            runtime_bench.peak_flops("NVIDIA L4")


@pytest.mark.parametrize(
    ("tool", "args"),
    [("accelify.rules.cli", []), ("accelify.transform.cli", ["--check", "--quiet"])],
)
def test_start_up_in_a_pipe_does_not_load_rich(tool: str, args: list[str]) -> None:
    """Section 2's budget: rich (~45 ms) loads only to style a terminal, never for a pipe."""
    probe = (
        f"import sys\nfrom {tool} import run\nrun(sys.argv[1:])\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'rich'), file=sys.stderr)"
    )
    script = ROOT / "fixtures" / "convert" / "mnist.in.py"
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "TTY_COMPATIBLE")}
    result = subprocess.run(
        [sys.executable, "-c", probe, *args, str(script)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert result.returncode in (0, 1), result.stderr
    assert result.stderr.splitlines()[-1] == "[]"


@pytest.mark.parametrize(
    "env",
    [{}, {"FORCE_COLOR": "1"}, {"FORCE_COLOR": ""}, {"TTY_COMPATIBLE": "1"}, {"NO_COLOR": "1"}],
)
@pytest.mark.parametrize("color", ["auto", "always", "never"])
def test_plain_console_only_where_rich_sees_no_terminal(
    env: dict[str, str], color: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The plain writer stands in for rich exactly where rich would have written plain text."""
    from rich.console import Console

    from accelify.transform import console

    for name in ("FORCE_COLOR", "TTY_COMPATIBLE", "NO_COLOR"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    console.use_color(color)  # type: ignore[arg-type]
    try:
        ours = console.console(stderr=True)
        rich = Console(stderr=True, force_terminal=True if color == "always" else None)
        assert ours.is_terminal == rich.is_terminal
    finally:
        console.use_color("auto")
