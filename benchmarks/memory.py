"""Section 9: peak memory of linting one very large file, against libcst's own parse of it, and
of converting many files in one process, against converting a few.

libcst's tree is the floor any libcst tool pays (about 20 KB a line of typical training code), so
the number claimed is the ratio of peak resident memory, ``accel-lint FILE`` over
``libcst.parse_module`` of the same file, each a fresh process measured the same way. Converting
many files must hold nothing per file: ``accel-convert --check -j 1`` over copies of one ~780-line
script peaks about the same for 1,000 copies as for 50 (932 MB against 103 MB when the walk's
handler cache kept every conversion's tree).

``python benchmarks/memory.py CMD...`` runs CMD and prints its peak RSS in KiB: the rusage of a
process's children is the largest of all of them, so each measurement gets a parent of its own.
"""

from __future__ import annotations

import random
import resource
import subprocess
import sys
from pathlib import Path

import corpus
from report import Section, Target
from timing import run, tool

PLANTED = corpus.FIXTURES / "lint" / "planted.py"  # bugs in it: the file has findings to place


def big_file(path: Path, lines: int) -> int:
    """A training script with planted bugs, grown to about ``lines`` lines; its line count."""
    text = corpus.grow_script(PLANTED.read_text(), lines, random.Random(0))
    path.write_text(text)
    return text.count("\n")


def peak_kib(cmd: list[str]) -> int:
    """Peak resident memory of ``cmd`` (exit 0 or 1), measured by a fresh parent process."""
    return int(run([sys.executable, __file__, *cmd]).split()[-1])


def many_files(work: Path, copies: int) -> int:
    """Peak RSS of one process converting ``copies`` copies of a ~780-line training script."""
    folder = work / f"copies-{copies}"
    folder.mkdir(parents=True, exist_ok=True)
    script = corpus.grow_script(
        (corpus.FIXTURES / "convert" / "mnist.in.py").read_text(), 780, random.Random(0)
    )
    for n in range(copies):
        (folder / f"train_{n:04d}.py").write_text(script)
    return peak_kib([tool("accel-convert"), "--check", "-j", "1", str(folder)])


def memory(work: Path, lines: int, copies: tuple[int, int]) -> Section:
    """Peak RSS of ``accel-lint`` on one generated file, and of ``libcst.parse_module`` on it;
    of ``accel-convert`` on a few and on many copies of one script."""
    path = work / "big" / "train.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    made = big_file(path, lines)
    parse = [
        sys.executable,
        "-c",
        "import sys, libcst; libcst.parse_module(open(sys.argv[1]).read())",
    ]
    peaks = {
        "libcst.parse_module": peak_kib([*parse, str(path)]),
        "accel-lint": peak_kib([tool("accel-lint"), "--exit-zero", str(path)]),
    }
    floor = peaks["libcst.parse_module"]
    few, many = copies
    converts = {n: many_files(work, n) for n in copies}
    rows = [[name, f"{kib / 1024:,.0f}", f"{kib / floor:.2f}x"] for name, kib in peaks.items()]
    rows += [
        [
            f"accel-convert --check -j 1, {n:,} files",
            f"{kib / 1024:,.0f}",
            f"{kib / converts[few]:.2f}x",
        ]
        for n, kib in converts.items()
    ]
    section = Section(
        "memory",
        f"9. Peak memory on one {made:,}-line file, and converting {few:,} and {many:,} files",
        ["Command", "Peak RSS MiB", "vs anchor"],
        rows=rows,
        data={
            "lines": made,
            **{f"{name} KiB": kib for name, kib in peaks.items()},
            **{f"accel-convert {n} files KiB": kib for n, kib in converts.items()},
        },
        notes=[
            "Anchors: libcst.parse_module of the same file for the first two rows; the "
            f"{few:,}-file run for the conversions of many files."
        ],
    )
    section.targets = [
        # Reported nodes get positions, not every node: linting holds little beyond the tree.
        Target("lint peak memory vs libcst parse", peaks["accel-lint"] / floor, 1.1, False),
        # Nothing is kept per file converted.
        Target(
            f"convert peak memory, {many:,} files vs {few:,}",
            converts[many] / converts[few],
            1.2,
            False,
        ),
    ]
    return section


def _measure(cmd: list[str]) -> None:
    code = subprocess.run(cmd, stdout=subprocess.DEVNULL, check=False).returncode
    print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
    sys.exit(code)


if __name__ == "__main__":
    _measure(sys.argv[1:])
