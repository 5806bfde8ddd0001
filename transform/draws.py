"""Random values each process would draw on its own: what a converted script must seed alike.

Every process runs the whole script. A value drawn once before training (``permute =
np.random.permutation(784)``, a split) from a stream the script does not seed, or seeds only
for torch, is each process's own: a pixel permutation every step applies would differ from one
process to the next, so the replicas learn different tasks; a split would give one process's
held-out items to another to train on. Draws inside the training step (dropout, noise) are
meant to differ and are not looked at. The converter notes what it finds and ACL216 flags it in
a script that already has an accelerator: both read it here.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

import libcst as cst

from accelify.transform.analysis import Analysis, Loop, Scope
from accelify.transform.neighbours import drawing_functions
from accelify.transform.patterns import RANK_NAMES, callee_name, dotted_name, random_stream
from accelify.transform.walk import nodes

_SEEDS = frozenset({"manual_seed", "seed", "set_seed", "manual_seed_all"})
STREAMS = frozenset({"torch", "numpy", "random"})


def seeded(a: Analysis) -> bool:
    """Whether the script seeds any of its random streams with a value equal on every process."""
    return bool(seeded_streams(a))


def seeded_streams(a: Analysis) -> frozenset[str]:
    """The random streams the script seeds alike on every process: ``torch.manual_seed`` seeds
    torch's, ``np.random.seed`` numpy's, ``random.seed`` Python's; ``set_seed`` (or a seed
    function this does not know) all of them."""
    found: set[str] = set()
    for call, _scope in a.calls:
        if callee_name(call) not in _SEEDS or not call.args:
            continue
        if {n.value for n in nodes(call, cst.Name)} & RANK_NAMES:
            continue  # ``seed + rank``: a seed of each process's own
        dotted = a.names.qualify(call.func) or dotted_name(call.func) or ""
        if dotted.startswith("torch."):
            found.add("torch")
        elif dotted.startswith(("numpy.", "np.")):
            found.add("numpy")
        elif dotted == "random.seed":
            found.add("random")
        else:
            return STREAMS
    return frozenset(found)


@dataclass(frozen=True)
class Drawn:
    """A name bound once, before training, from a draw of a stream no seed covers."""

    key: str
    node: cst.CSTNode  # the assignment
    stream: str


def drawn_for_every_step(a: Analysis) -> list[Drawn]:
    """Names bound outside any loop from an unseeded draw and read by a loop that trains (its
    own body, or a function of the file it calls), which does not bind them again."""
    unseeded = STREAMS - seeded_streams(a)
    if not unseeded:
        return []
    steps = {id(loop.node): loop for _call, _scope, loop in a.backward_calls if loop is not None}
    read: set[str] = set()
    rebound: set[str] = set()
    for loop in steps.values():
        bodies = [loop.node]
        bodies += [
            callee.node
            for call in nodes(loop.node, cst.Call)
            if (callee := a.callee(call)) is not None
        ]
        for body in bodies:
            read |= {n.value for n in nodes(body, cst.Name) if _read(a, n)}
        rebound |= {b.key for b in a.bindings if a.contains(loop.node, b.node)}
    found: dict[str, Drawn] = {}
    for b in a.bindings:
        if b.in_loop or b.value is None or b.key not in read - rebound or b.key in found:
            continue
        if a.role(b.scope, b.key) is not None or _holds_data(a, b.value):
            continue  # a model's random weights are broadcast by prepare(); a demo's data
        if not _outer(a, b.scope, b.key, steps.values()):
            continue
        streams = {random_stream(c, a.names) for c in nodes(b.value, cst.Call)} & unseeded
        if streams:
            found[b.key] = Drawn(b.key, b.node, sorted(streams)[0])
    return list(found.values())


def _holds_data(a: Analysis, value: cst.BaseExpression) -> bool:
    """A dataset or loader made of random draws (a demo's ``TensorDataset(torch.randn(...))``):
    a stand-in for data read from disk. Left out by choice: a note on every demo would bury
    the ones on values every step applies."""
    return any(
        (a.names.last_part(c.func) or "").endswith(("Dataset", "DataLoader"))
        for c in nodes(value, cst.Call)
    )


def _read(a: Analysis, name: cst.Name) -> bool:
    """A name read as a value, not an attribute's or a keyword's (``x.permute(0, 2, 1)``)."""
    parent = a.parent(name)
    if isinstance(parent, cst.Attribute) and parent.attr is name:
        return False
    return not (isinstance(parent, cst.Arg) and parent.keyword is name)


def _outer(a: Analysis, scope: Scope, key: str, steps: Collection[Loop]) -> bool:
    """A name of the module, or the one binding of a function that runs a training loop
    itself (``main()``): bound once for all its steps. A function a step calls draws anew at
    each call (``alpha`` of a gradient penalty, a batch sampler's indices)."""
    if "." in key:
        return False
    if scope.is_module:
        return True
    return any(loop.scope is scope for loop in steps) and (
        sum(b.scope is scope and b.key == key for b in a.bindings) == 1
    )


def drawn_beside(
    a: Analysis, training: Collection[Scope] | None = None
) -> list[tuple[cst.Call, str]]:
    """In a script that seeds nothing, the calls bound to a name (``adj_train, ... =
    mask_test_edges(adj)``), at module level or in ``training`` (anywhere, for None), of a
    function beside the script that draws from an unseeded stream as it runs, with its
    qualified name. What it draws for is not read: said as a possibility."""
    if seeded(a):
        return []
    calls = [
        (call, name)
        for call, scope in a.calls
        if (training is None or scope in training or scope.is_module)
        and isinstance(a.parent(call), cst.Assign)
        and (name := a.names.qualify(call.func)) is not None
        and "." in name
    ]
    drawing = drawing_functions(a.path, {name for _call, name in calls})
    return [(call, name) for call, name in calls if name in drawing]


def drawn_apart(a: Analysis, drawn: Drawn) -> str:
    """What the note, and ACL216, say of ``drawn``."""
    seeds = sorted(seeded_streams(a))
    only = f" (the script seeds only {' and '.join(seeds)}'s)" if seeds else ""
    return (
        f"{drawn.key} is drawn once from {drawn.stream}'s random stream, which nothing "
        f"seeds{only}, and the training steps read it: each process draws its own {drawn.key}; "
        f"if every process must use the same, seed {drawn.stream} too (set_seed seeds every "
        "stream), then check"
    )


def unseeded_draw(function: str, qualified: str) -> str:
    """What the note, and ACL216, say of ``function`` (``qualified`` beside the script)
    drawing from an unseeded random stream in a script that seeds nothing."""
    module = qualified.lstrip(".").rpartition(".")[0].replace(".", "/")
    return (
        f"{function}(...) draws from each process's own random stream ({module}.py) and the "
        "script seeds nothing: if it splits, samples or orders the data, each process builds "
        "its own and one trains on what another holds out; seed the script before it "
        "(set_seed), then check"
    )
