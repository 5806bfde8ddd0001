"""Judge one generated script: convert it, run original and converted, compare what they did.

The verdict, in the order the checks run (the first failure decides):

1. Both targets convert, and converting the output again changes nothing.
2. The original runs, and its losses stay finite (if not, the generator is at fault:
   GENERATOR-BUG).
3. A script left unchanged must say why (REFUSED), else UNCHANGED-WITHOUT-REASON.
4. On one process, the accelify and the accelerate conversions exit 0 and produce bit-identical
   losses (every value ``backward()`` was called on) and final weights.
5. On two processes (``accel-run --cpu --num-processes 2``) the accelify conversion exits 0, both
   ranks end with identical weights, each loader pass gave the ranks disjoint training samples,
   and together they fetched exactly what the one-process original fetched. A report saying no
   DataLoader feeds the loop makes the script PARTIAL instead (no sharding to check); a script
   with no DataLoader and no such report is WRONG.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import traceback
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch
from idioms import TRAIN_SIZE

from accelify.transform.convert import Options, Result, convert
from accelify.transform.sources import SourceError

HERE = Path(__file__).resolve().parent
PROBE = HERE / "probe.py"
ROOT = HERE.parents[1]
BIN = Path(sys.executable).parent
TARGETS = ("accelify", "accelerate")

CONVERTED = "converted"
WITH_NOTES = "converted-with-notes"
PARTIAL = "partial"
REFUSED = "refused-with-reason"
UNEXPLAINED = "unchanged-without-reason"
WRONG = "wrong"
GENERATOR_BUG = "generator-bug"
CATEGORIES = (CONVERTED, WITH_NOTES, PARTIAL, REFUSED, UNEXPLAINED, WRONG, GENERATOR_BUG)
FAILURES = (UNEXPLAINED, WRONG, GENERATOR_BUG)
EXCEPTION = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception|Interrupt|Exit)\b")
NO_LOADER_REPORT = ("every process trains on all the data", "no DataLoader")
Converter = Callable[..., Result]  # convert's signature: (source, options, path=...)


def clean_env() -> dict[str, str]:
    """The environment every run gets: nothing inherited that selects a launch or a device
    (the GPU is hidden unless ``sweep.py --cuda`` set ``ORACLE_CUDA=1``)."""
    drop = ("ACCELERATE_", "MASTER_", "TORCHELASTIC_")
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(drop)
        and k not in {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK"}
    }
    env.update(PYTHONHASHSEED="0", OMP_NUM_THREADS="1")
    if os.environ.get("ORACLE_CUDA") != "1":
        env["CUDA_VISIBLE_DEVICES"] = ""
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


@dataclass
class Run:
    """One execution: exit code, output, and the probe's records per rank."""

    code: int
    timed_out: bool
    stdout: str
    stderr: str
    records: list[dict[str, Any]] = field(default_factory=list)

    def tail(self, chars: int = 1500) -> str:
        text = (self.stderr.strip() or self.stdout.strip())[-chars:]
        return ("(timed out) " if self.timed_out else "") + text

    def error(self) -> str:
        """The first exception line of the output (the failing rank's comes first)."""
        if self.timed_out:
            return "timed out"
        lines = self.stderr.splitlines()
        found = next((ln for ln in lines if EXCEPTION.match(ln) and "SystemExit" not in ln), "")
        return found or next((ln for ln in reversed(lines) if ln.strip()), f"exit {self.code}")


def _load(out: Path) -> list[dict[str, Any]]:
    """The records the run's ranks left, by rank: a one-process run that launches a notebook's
    training leaves one per launched worker."""
    paths = sorted(out.glob("rank*.pt"), key=lambda path: int(path.stem.removeprefix("rank")))
    return [torch.load(path, weights_only=True) for path in paths]


class Zygote:
    """A forking server (probe.py --zygote) that runs scripts without re-importing torch."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(PROBE), "--zygote"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=clean_env(),
            text=True,
            cwd=ROOT,
        )

    def run(
        self,
        script: Path,
        cwd: Path,
        out: Path,
        timeout: float,
        *,
        ranks: int,
        argv: Sequence[str] = (),
    ) -> Run:
        """Run ``script argv...`` on ``ranks`` forked processes; a run whose store found its port
        taken runs again on another."""
        for _attempt in range(3):
            run = self._run_once(script, cwd, out, timeout, ranks=ranks, argv=argv)
            if run.code == 0 or PORT_TAKEN not in run.stderr:
                break
        return run

    def _run_once(
        self, script: Path, cwd: Path, out: Path, timeout: float, *, ranks: int, argv: Sequence[str]
    ) -> Run:
        env = clean_env()
        if ranks > 1:
            env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), **LAUNCH_ENV)
        request = {"script": str(script), "argv": list(argv), "cwd": str(cwd), "out": str(out),
                   "env": env, "timeout": timeout, "ranks": ranks}  # fmt: skip
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        reply = self.proc.stdout.readline()
        if not reply:
            raise RuntimeError(f"the zygote died (exit {self.proc.wait()})")
        answer = json.loads(reply)
        codes, order = answer["codes"], answer["order"]
        first_failed = next((r for r, c in zip(order, codes, strict=True) if c != 0), None)
        stdout = "".join((out / f"stdout{r}.txt").read_text() for r in order)
        stderr = "".join((out / f"stderr{r}.txt").read_text() for r in order)
        if first_failed is not None and ranks > 1:  # the failing rank's traceback first
            stderr = (out / f"stderr{first_failed}.txt").read_text() + stderr
        code = next((c for c in codes if c != 0), 0)
        return Run(code, answer["timed_out"], stdout, stderr, _load(out))

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        self.proc.wait(timeout=30)


@pytest.fixture(scope="module", name="zygote")
def zygote_fixture() -> Iterator[Zygote]:
    """One fork server per test module: each run a fresh process forked from one that imported
    torch once (a launch imports it again in every process), with no launch variables, the GPU
    hidden and PYTHONHASHSEED=0. Imported by a module, it is that module's ``zygote``."""
    forks = Zygote()
    yield forks
    forks.close()


# What accel-run --cpu gives its workers besides torch elastic's rank variables.
LAUNCH_ENV = {"ACCELERATE_MIXED_PRECISION": "no", "ACCELERATE_USE_CPU": "True"}


# Why a run failed for the machine and not for the script, so that it runs again:
# - gloo's teardown aborted a rank that had finished (torch's race at the end of a hand-written
#   script; on a busy 2-core machine 1 run in 10 to 25 under torchrun);
# - the free port picked for a rendezvous was taken by another test's process before the store
#   bound it (one clean-clone CI run hit it).
TEARDOWN_ABORT = "terminate called without an active exception"
PORT_TAKEN = "EADDRINUSE"


def transient(code: int, output: str) -> bool:
    """Whether a failed run of a hand-written original should run again."""
    return code != 0 and (TEARDOWN_ABORT in output or PORT_TAKEN in output)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Runner:
    """Runs scripts on one process (zygote or fresh interpreter) and on two (accel-run, or forked
    by the zygote when ``fork_two``: the shrinker's fast stand-in)."""

    def __init__(self, *, fork: bool = True) -> None:
        self.fork = fork
        self._local = threading.local()
        self._zygotes: list[Zygote] = []
        self._lock = threading.Lock()

    def _zygote(self) -> Zygote:
        zygote = getattr(self._local, "zygote", None)
        if zygote is None or zygote.proc.poll() is not None:
            zygote = self._local.zygote = Zygote()
            with self._lock:
                self._zygotes.append(zygote)
        return zygote

    def close(self) -> None:
        for zygote in self._zygotes:
            zygote.close()

    def one(self, source: str, name: str, timeout: float = 120) -> Run:
        """Run ``source`` once on one process, in a fresh directory."""
        with _workspace(source, name) as (script, cwd, out):
            if self.fork:
                return self._zygote().run(script, cwd, out, timeout, ranks=1)
            env = {**clean_env(), "ORACLE_OUT": str(out)}
            command = [sys.executable, str(PROBE), str(script)]
            return Run(*_subprocess(command, cwd, env, timeout), _load(out))

    def two(self, source: str, name: str, timeout: float = 300, *, fork_two: bool = False) -> Run:
        """Run ``source`` on two processes with the probe on each rank: with
        ``accel-run --cpu --num-processes 2``, or forked by the zygote."""
        with _workspace(source, name) as (script, cwd, out):
            if fork_two:
                return self._zygote().run(script, cwd, out, timeout, ranks=2)
            command = [str(BIN / "accel-run"), "--cpu", "--num-processes", "2", str(PROBE),
                       str(script)]  # fmt: skip
            env = {**clean_env(), "ORACLE_OUT": str(out)}
            return Run(*_subprocess(command, cwd, env, timeout), _load(out))


@contextlib.contextmanager
def _workspace(source: str, name: str) -> Iterator[tuple[Path, Path, Path]]:
    """A temporary folder with the script, an empty working directory and an output folder."""
    with tempfile.TemporaryDirectory(prefix="oracle-") as tmp:
        root = Path(tmp)
        cwd, out = root / "work", root / "out"
        cwd.mkdir()
        out.mkdir()
        script = root / f"{name}.py"
        script.write_text(source)
        yield script, cwd, out


def _subprocess(command: list[str], cwd: Path, env: dict[str, str], timeout: float) -> tuple:
    try:
        done = subprocess.run(
            command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired as err:
        return -9, True, _text(err.stdout), _text(err.stderr)
    return done.returncode, False, done.stdout, done.stderr


def _text(data: bytes | str | None) -> str:
    return data.decode(errors="replace") if isinstance(data, bytes) else (data or "")


# ----------------------------------------------------------------------------------------------
# The verdict.


@dataclass
class Verdict:
    category: str
    check: str = ""  # the check that failed, for wrong / unchanged / generator-bug
    detail: str = ""
    error: str = ""  # the exception line of a failed run, or the kind of mismatch
    notes: tuple[str, ...] = ()
    conversions: dict[str, str] = field(default_factory=dict)  # target -> converted code

    @property
    def failed(self) -> bool:
        return self.category in FAILURES

    def signature(self) -> str:
        """What tells one failure kind from another: the check, and the exception or mismatch."""
        what = self.error or (self.detail.strip().splitlines() or [""])[0]
        what = re.sub(r"(?:/[\w.+-]+){2,}", "<path>", what)
        what = re.sub(r"-?\d+(\.\d+)?(e-?\d+)?", "N", what)
        return f"{self.check}: {what.strip()}"[:200]


def _notes(result: Result) -> tuple[str, ...]:
    return tuple(
        f"{n.line}: {'needs a human: ' if n.manual else ''}{n.message}" for n in result.notes
    )


def compare(a: dict[str, Any], b: dict[str, Any]) -> tuple[str, str]:
    """How two one-process records differ, as (kind, detail); ('', '') when losses and weights
    are bit-identical. The kind names the shape of the difference without its numbers, so that
    different bugs make different kinds of failure."""
    la, lb = a["losses"], b["losses"]
    if len(la) != len(lb):
        return "backward count", f"{len(la)} backward() calls in the original, {len(lb)} converted"
    step = next((i for i, (x, y) in enumerate(zip(la, lb, strict=True)) if x != y), None)
    if step is not None:
        x, y = la[step], lb[step]
        detail = f"loss at backward #{step}: original {x!r}, converted {y!r}"
        ratio = y / x if x else float("inf")
        if any(abs(ratio * k - 1) < 1e-6 or abs(ratio - k) < 1e-6 for k in (2, 3, 4)):
            scale = f"x{round(ratio)}" if ratio > 1 else f"/{round(1 / ratio)}"
            return f"loss scaled {scale} from backward #{'0' if step == 0 else 'k'}", detail
        where = "the first backward" if step == 0 else "a later backward"
        size = "rounding" if abs(ratio - 1) < 1e-4 else "value"
        return f"loss differs ({size}) from {where}", detail
    wa, wb = a["weights"], b["weights"]
    if len(wa) != len(wb):
        return "weights count", f"{len(wa)} optimized tensors in the original, {len(wb)} converted"
    for i, (x, y) in enumerate(zip(wa, wb, strict=True)):
        if x.shape != y.shape or x.dtype != y.dtype or not torch.equal(x, y):
            diff = (x.double() - y.double()).abs().max().item() if x.shape == y.shape else "shape"
            return "final weights differ", f"final weight #{i} differs (max abs diff {diff})"
    return "", ""


def _train_fetches(record: dict[str, Any], train_size: int) -> list[tuple[int, int]]:
    return [(p, i) for size, p, i in record["fetches"] if size == train_size]


def _sharding(original: dict[str, Any], ranks: list[dict[str, Any]], train_size: int) -> str:
    """Why the ranks' training samples are not a partition of the original's ('' if they are)."""
    r0, r1 = (_train_fetches(r, train_size) for r in ranks)
    for p in sorted({p for p, _ in r0} & {p for p, _ in r1}):
        common = {i for q, i in r0 if q == p} & {i for q, i in r1 if q == p}
        if common:
            return f"pass {p}: both ranks fetched samples {sorted(common)[:8]}"
    want = Counter(i for _, i in _train_fetches(original, train_size))
    got = Counter(i for _, i in r0) + Counter(i for _, i in r1)
    if want != got:
        missing, extra = want - got, got - want
        return (
            f"the ranks fetched {sum(got.values())} training samples, the original "
            f"{sum(want.values())} (missing {sorted(missing)[:8]}, extra {sorted(extra)[:8]})"
        )
    return ""


def convert_both(source: str, name: str, converter: Converter = convert) -> dict[str, Result]:
    return {t: converter(source, Options(target=t), path=f"{name}.py") for t in TARGETS}


def judge(
    source: str,
    name: str,
    runner: Runner,
    *,
    stop_after: str = "",
    fork_two: bool = False,
    converter: Converter = convert,
    train_size: int = TRAIN_SIZE,
) -> Verdict:
    """The verdict for one script (see the module docstring). The shrinker's shortcuts:
    ``stop_after="1p"`` ends it once the one-process checks pass, ``fork_two`` runs the
    two-process check with the zygote's forked ranks instead of accel-run. ``converter`` stands
    in for ``convert`` (the notebook oracle converts the script as a notebook's cells);
    ``train_size`` is the length of the dataset the script trains on (the generator's own)."""
    try:
        results = convert_both(source, name, converter)
    except SourceError as err:  # the output did not parse: the input always does
        return Verdict(WRONG, "convert", str(err), str(err))
    except Exception as err:  # convert() may raise SourceError only: anything else is a crash
        return Verdict(WRONG, "convert-crash", traceback.format_exc()[-1500:], _exception(err))
    notes = _notes(results["accelify"])

    def verdict(category: str, check: str = "", detail: str = "", error: str = "") -> Verdict:
        codes = {t: r.code for t, r in results.items()}
        return Verdict(category, check, detail, error, notes, codes)

    for target, result in results.items():
        try:
            again = converter(result.code, Options(target=target), path=f"{name}.py")
        except Exception as err:
            detail = traceback.format_exc()[-1500:]
            return verdict(WRONG, f"idempotent-{target}", detail, _exception(err))
        if again.changed:
            diff = _diff(result.code, again.code)
            return verdict(WRONG, f"idempotent-{target}", f"a second conversion changes:\n{diff}")

    original = runner.one(source, f"{name}_original")
    if original.code != 0 or not original.records:
        return verdict(GENERATOR_BUG, "original-exit", original.tail(), original.error())
    if not all(math.isfinite(x) for x in original.records[0]["losses"]):
        # A diverging script hides every difference (nan != nan): the generator's fault.
        return verdict(GENERATOR_BUG, "original-diverges", str(original.records[0]["losses"]))
    changed = {t: r.changed for t, r in results.items()}
    if changed["accelify"] != changed["accelerate"]:
        return verdict(WRONG, "targets-disagree", f"changed: {changed}")
    if not changed["accelify"]:
        reasons = results["accelify"].reasons
        if reasons:
            return verdict(REFUSED, "", "; ".join(n.message for n in reasons))
        return verdict(UNEXPLAINED, "unchanged-without-reason")

    outcomes = {t: _one_process(results[t].code, f"{name}_{t}", original, runner) for t in TARGETS}
    for target, (check, detail, error) in outcomes.items():
        if check:
            also = _accelerate_too(outcomes) if target == "accelify" else ""
            return verdict(WRONG, f"1p-{target}-{check}", detail + also, error)
    if stop_after == "1p":
        return verdict(CONVERTED)

    run = runner.two(results["accelify"].code, f"{name}_accelify", fork_two=fork_two)
    decided = two_rank_verdict(original, run, notes, "2p", train_size)
    if decided:
        return verdict(*decided)
    return verdict(WITH_NOTES if results["accelify"].manual else CONVERTED)


def two_rank_verdict(
    original: Run, run: Run, notes: tuple[str, ...], check: str, train_size: int = TRAIN_SIZE
) -> tuple[str, str, str, str] | None:
    """What a two-rank ``run`` of a conversion decides against the one-process ``original``, as
    (category, failed check named after ``check``, detail, exception line): WRONG, or PARTIAL
    when the report says no DataLoader feeds the loop; None when it passes."""
    if run.code != 0 or len(run.records) != 2:
        return WRONG, f"{check}-exit", run.tail(), run.error()
    a, b = (r["weights"] for r in run.records)
    if len(a) != len(b) or not all(torch.equal(x, y) for x, y in zip(a, b, strict=True)):
        return WRONG, f"{check}-ranks-differ", "the two ranks ended with different weights", ""
    if any(text in note for note in notes for text in NO_LOADER_REPORT):
        return PARTIAL, "", "reported: no DataLoader to shard", ""
    if not _train_fetches(original.records[0], train_size):
        why = "no DataLoader feeds the training loop, so both ranks train on all the data, and "
        return WRONG, f"{check}-unsharded", why + "the report does not say so", ""
    why = _sharding(original.records[0], run.records, train_size)
    if why:
        return WRONG, f"{check}-sharding", why, ""
    return None


def _one_process(code: str, name: str, original: Run, runner: Runner) -> tuple[str, str, str]:
    """(failed check or '', detail, exception line) for one conversion run on one process."""
    run = runner.one(code, name)
    if run.code != 0 or not run.records:
        return "exit", run.tail(), run.error()
    kind, detail = compare(original.records[0], run.records[0])
    return ("match", detail, kind) if kind else ("", "", "")


def _exception(err: BaseException) -> str:
    return f"{type(err).__name__}: {err}".splitlines()[0]


def _accelerate_too(outcomes: dict[str, tuple[str, str, str]]) -> str:
    """Whether HF Accelerate fails too: tells a converter bug from a runtime difference."""
    (check, _, error), (other, detail, other_error) = outcomes["accelify"], outcomes["accelerate"]
    if not other:
        return "\n(the accelerate conversion passes)"
    if (other, other_error) == (check, error):
        return "\n(the accelerate conversion fails the same way)"
    return (
        f"\n(the accelerate conversion fails differently: {other}: {other_error or detail[:300]})"
    )


def _diff(a: str, b: str) -> str:
    import difflib

    return "".join(difflib.unified_diff(a.splitlines(True), b.splitlines(True), n=1))[-1500:]


def still_fails_like(verdict: Verdict, source: str, runner: Runner, name: str) -> bool:
    """Whether ``source`` fails the check ``verdict`` failed (the shrinker's predicate)."""
    stop = "1p" if verdict.check.startswith(("1p-", "idempotent", "convert", "targets")) else ""
    again = judge(source, name, runner, stop_after=stop, fork_two=True)
    return again.signature() == verdict.signature()


def dump(
    directory: Path,
    name: str,
    source: str,
    verdict: Verdict | None,
    conversions: Mapping[str, Result] | None = None,
) -> None:
    """Write a script, its conversions and its report for reading."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{name}.py").write_text(source)
    codes = verdict.conversions if verdict else {t: r.code for t, r in (conversions or {}).items()}
    for target, code in codes.items():
        (directory / f"{name}.{target}.py").write_text(code)
    notes = verdict.notes if verdict else _notes((conversions or {})["accelify"])
    text = "\n".join(notes) + "\n"
    if verdict:
        text += f"\nverdict: {verdict.category} {verdict.check}\n{verdict.detail}\n"
    (directory / f"{name}.report.txt").write_text(text)
