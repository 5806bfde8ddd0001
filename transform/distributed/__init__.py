"""Hand-written DistributedDataParallel -> the script it would be on one process, plus what must
stay rank-aware; the conversion then makes that an Accelerate script.

Each module here is one rewrite, with its cases in its docstring: :mod:`.refuse` (what is never
converted), :mod:`.switch` (``ddp = "RANK" in os.environ`` paths), :mod:`.spawn` (``mp.spawn``),
:mod:`.ranks` (rank reads and guards), :mod:`.process_group`, :mod:`.wrapper` (``DDP(...)``,
``.module``), :mod:`.sync` (``no_sync()``), :mod:`.sampler` (``DistributedSampler``),
:mod:`.collectives` (``all_reduce``, ``barrier``). Values that come from the accelerator are
written as placeholders, which :mod:`.resolve` (a step of the conversion) places once it knows
where the accelerator lives.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass, field

import libcst as cst

from accelify.transform.analysis import Analysis, analyse
from accelify.transform.distributed.collectives import collectives
from accelify.transform.distributed.context import Rewrite
from accelify.transform.distributed.helpers import drop_helpers
from accelify.transform.distributed.imports import drop_unused_imports
from accelify.transform.distributed.process_group import drop_process_group
from accelify.transform.distributed.ranks import rank_sources, rank_uses
from accelify.transform.distributed.refuse import refuse_other_parallelism
from accelify.transform.distributed.resolve import resolver
from accelify.transform.distributed.sampler import drop_samplers
from accelify.transform.distributed.spawn import unspawn
from accelify.transform.distributed.switch import collapse_switches
from accelify.transform.distributed.sync import keep_sync_toggles
from accelify.transform.distributed.wrapper import unwrap_ddp, wrapper_of
from accelify.transform.edits import apply
from accelify.transform.gate import file_verdict
from accelify.transform.plan import Note, Step, refused_note, run_step
from accelify.transform.setup import Refused

__all__ = ["Dedistributed", "dedistribute"]

# After refuse_other_parallelism, in the order they run: spawn's rank parameters and the
# switch's dropped branches are known
# before ranks are read, and ranks before the guards and devices that use them.
_REWRITES: tuple[Callable[[Rewrite], None], ...] = (
    drop_helpers,
    collapse_switches,
    unspawn,
    rank_sources,
    rank_uses,
    drop_process_group,
    unwrap_ddp,
    keep_sync_toggles,
    drop_samplers,
    collectives,
)
# Words without which a file cannot distribute itself: most files skip the analysis here.
_HINTS = ("torch.distributed", "DataParallel", "DistributedSampler", "multiprocessing")


@dataclass(frozen=True)
class Dedistributed:
    """The single-process script (None when the file is refused, with the reason in ``notes``)."""

    module: cst.Module | None
    notes: tuple[Note, ...]
    source_lines: list[int] = field(default_factory=list)  # intermediate line - 1 -> original
    step: Step | None = None

    def original_line(self, line: int) -> int:
        return (
            self.source_lines[min(line, len(self.source_lines)) - 1] if self.source_lines else line
        )


def dedistribute(module: cst.Module, source: str, path: str = "<string>") -> Dedistributed | None:
    """None when the file does not train a DistributedDataParallel model by hand: a file that
    starts processes but trains each apart is a different program from a prepared one, and the
    file's verdict refuses it."""
    if not any(hint in source for hint in _HINTS):
        return None
    analysis = analyse(module, path)
    verdict = file_verdict(analysis, analysis.names)
    if verdict is None or verdict.skip:
        return None
    rewrite = Rewrite(analysis, path)
    try:
        refuse_other_parallelism(rewrite)
        if not _wraps_a_model(analysis):
            return None  # processes that train apart (no DDP) would be changed by prepare()
        for run in _REWRITES:
            run_step(run, rewrite, rewrite.notes)
    except Refused as refused:
        return Dedistributed(None, (refused_note(analysis.line(refused.node), refused),))
    intermediate = drop_unused_imports(apply(module, rewrite.edits, analysis.parents))
    return Dedistributed(
        intermediate,
        tuple(rewrite.notes),
        _line_map(source, intermediate.code),
        resolver(rewrite.ddp_options, path),
    )


def _wraps_a_model(a: Analysis) -> bool:
    """Whether a DistributedDataParallel or DataParallel wrapper is built."""
    return any(wrapper_of(a, call) for call, _s in a.calls)


def _line_map(original: str, intermediate: str) -> list[int]:
    """For each line of the intermediate script, the original line it comes from: the same
    line, the same line re-indented (a branch's body without its ``if``), a line that assigned
    the same target, or else the original line it replaced (or the one before it)."""
    old, new = original.splitlines(), intermediate.splitlines()
    out = [0] * max(len(new), 1)
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(
        None, old, new, autojunk=False
    ).get_opcodes():
        replaced = [line.strip() for line in old[i1:i2]]
        targets = [_target(line) for line in replaced]
        for j in range(j1, j2):
            line = new[j].strip()
            if tag == "equal":
                i = i1 + (j - j1)
            elif line and line in replaced:
                i = i1 + replaced.index(line)
            elif _target(line) is not None and _target(line) in targets:
                i = i1 + targets.index(_target(line))
            else:
                i = min(i1 + (j - j1), max(i2 - 1, i1))
            out[j] = min(i, max(len(old) - 1, 0)) + 1
    return out


def _target(line: str) -> str | None:
    """What a stripped line of code assigns (``x`` of ``x = ...``), else None."""
    target, equals, _value = line.partition(" = ")
    return target if equals and target.isidentifier() else None
