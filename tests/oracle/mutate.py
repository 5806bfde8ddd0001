"""The oracle's mutation mode: inject real code's risky idioms into runnable training scripts.

    .venv/bin/python tests/oracle/mutate.py [--jobs 2] [--only NAME ...] [--dump DIR] [--list]

The seeds are the project's runnable scripts written in the shapes of reviewed public code
(``SEEDS``: pytorch/examples' MNIST, a transformers-style loop, a trainer class, ...). Each
mutator finds its anchor by syntax alone, independently of the converter's analysis (the
optimizer built from ``X.parameters()`` names the model ``X``; ``L.backward()`` names the loss and
its innermost loop), and rewrites the seed the way real repositories do: an alias or a container
made before ``prepare``, an attribute that holds the model, early stopping on the process's own
loss, a skipped batch, a builder function, a submodule ``forward`` never reaches, DataParallel.
A seed without the anchor yields no mutant. Every mutant is judged as a generated script is
(``runner.judge``): converted and right on 1 and 2 processes, or refused with a reason.
Exit 1 when any mutant is WRONG or UNCHANGED-WITHOUT-REASON.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import libcst as cst
import libcst.matchers as m

sys.path.insert(0, str(Path(__file__).resolve().parent))

from runner import UNEXPLAINED, WRONG, Runner, Verdict, dump, judge

ROOT = Path(__file__).resolve().parents[2]
# seed -> (script, length of the dataset it trains on)
SEEDS = {
    "mnist": (ROOT / "fixtures" / "convert" / "mnist.in.py", 128),
    "dict_batches": (ROOT / "fixtures" / "convert" / "dict_batches.in.py", 64),
    "accumulate_clip": (ROOT / "fixtures" / "convert" / "accumulate_clip.in.py", 128),
    "trainer_class": (ROOT / "fixtures" / "convert" / "trainer_class.in.py", 96),
    "native_amp": (ROOT / "fixtures" / "convert" / "native_amp.in.py", 64),
    "dcgan": (ROOT / "fixtures" / "oracle" / "seeds" / "dcgan.py", 192),
    "word_lm": (ROOT / "fixtures" / "oracle" / "seeds" / "word_lm.py", 160),
    "vae": (ROOT / "fixtures" / "oracle" / "seeds" / "vae.py", 160),
}
OPTIMIZERS = ("SGD", "Adam", "AdamW", "RMSprop", "Adagrad", "Adadelta", "Adamax")
Body = Sequence[cst.BaseStatement]
# ``loss.backward()`` and ``scaler.scale(loss).backward()``
BACKWARD = m.Call(
    func=m.Attribute(
        value=m.Name() | m.Call(func=m.Attribute(attr=m.Name("scale")), args=[m.Arg(m.Name())]),
        attr=m.Name("backward"),
    )
)


@dataclass(frozen=True)
class Anchors:
    """Where a seed builds its optimizer and takes its step, found by syntax."""

    model: str  # X in ``optim.SGD(X.parameters(), ...)``: a name or ``self.name``
    optimizer_block: cst.CSTNode  # the block (module or indented body) holding that statement
    optimizer_stmt: cst.BaseStatement
    loss: str  # L in ``L.backward()``
    loop: cst.For  # the innermost ``for`` around the backward


def _dotted(node: cst.BaseExpression) -> str:
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        return f"{_dotted(node.value)}.{node.attr.value}"
    return ""


def _body(block: cst.CSTNode) -> Body:
    return block.body if isinstance(block, cst.Module | cst.IndentedBlock) else ()


class _Finder(cst.CSTVisitor):
    """Walks blocks and loops, remembering the first optimizer and the first backward."""

    def __init__(self) -> None:
        self.blocks: list[cst.CSTNode] = []
        self.loops: list[cst.For] = []
        self.optimizer: tuple[str, cst.CSTNode, cst.BaseStatement] | None = None
        self.backward: tuple[str, cst.For] | None = None

    def visit_Module(self, node: cst.Module) -> None:
        self.blocks.append(node)

    def visit_IndentedBlock(self, node: cst.IndentedBlock) -> None:
        self.blocks.append(node)

    def leave_IndentedBlock(self, node: cst.IndentedBlock) -> None:
        self.blocks.pop()

    def visit_For(self, node: cst.For) -> None:
        self.loops.append(node)

    def leave_For(self, node: cst.For) -> None:
        self.loops.pop()

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        for small in node.body:
            if self.optimizer is None and isinstance(small, cst.Assign):
                model = _model_of_optimizer(small.value)
                if model:
                    self.optimizer = (model, self.blocks[-1], node)
            call = small.value if isinstance(small, cst.Expr) else None
            if self.backward is None and self.loops and m.matches(call, BACKWARD):
                loss = call.func.value  # type: ignore[union-attr]
                loss = loss.args[0].value if isinstance(loss, cst.Call) else loss
                self.backward = (loss.value, self.loops[-1])


def _model_of_optimizer(value: cst.BaseExpression) -> str:
    if not isinstance(value, cst.Call) or not value.args:
        return ""
    if _dotted(value.func).rsplit(".", 1)[-1] not in OPTIMIZERS:
        return ""
    first = value.args[0].value
    model = m.Name() | m.Attribute(value=m.Name("self"), attr=m.Name())
    if m.matches(first, m.Call(func=m.Attribute(value=model, attr=m.Name("parameters")))):
        return _dotted(first.func.value)  # type: ignore[attr-defined]
    return ""


def anchors(module: cst.Module) -> Anchors | None:
    finder = _Finder()
    module.visit(finder)
    if finder.optimizer is None or finder.backward is None:
        return None
    model, block, stmt = finder.optimizer
    loss, loop = finder.backward
    return Anchors(model, block, stmt, loss, loop)


class _Rename(cst.CSTTransformer):
    """Every read of ``old`` (a name or ``self.name``) becomes the expression ``new``; attribute
    names, keywords, parameters and assignment targets stay as they are."""

    def __init__(self, old: str, new: str) -> None:
        self.old, self.new = old, cst.parse_expression(new)

    def leave_Name(self, original: cst.Name, updated: cst.Name) -> cst.BaseExpression:
        return self.new if original.value == self.old else updated

    def leave_Attribute(
        self, original: cst.Attribute, updated: cst.Attribute
    ) -> cst.BaseExpression:
        if _dotted(original) == self.old:
            return self.new
        return updated.with_changes(attr=original.attr)

    def leave_Arg(self, original: cst.Arg, updated: cst.Arg) -> cst.Arg:
        return updated.with_changes(keyword=original.keyword)

    def visit_AssignTarget(self, node: cst.AssignTarget) -> bool:
        return False

    def visit_Param(self, node: cst.Param) -> bool:
        return False


Edit = Callable[[cst.CSTNode], cst.CSTNode | cst.FlattenSentinel]


class _Edits(cst.CSTTransformer):
    """One pass applying ``edits``, keyed by the identity of the original node they replace."""

    def __init__(self, edits: dict[int, Edit]) -> None:
        self.edits = edits

    def on_leave(self, original: cst.CSTNode, updated: cst.CSTNode) -> Any:
        edit = self.edits.get(id(original))
        return edit(updated) if edit else updated


def _statements(code: str) -> list[cst.BaseStatement]:
    return list(cst.parse_module(code).body)


def _edit(module: cst.Module, *edits: tuple[cst.CSTNode, Edit]) -> cst.Module:
    return module.visit(_Edits({id(node): edit for node, edit in edits}))


def _around(before: str = "", after: str = "") -> Edit:
    """Statements put before and after a statement, in its block."""
    return lambda node: cst.FlattenSentinel([*_statements(before), node, *_statements(after)])


def _block_after(a: Anchors, code: str, rename_to: str | None = None) -> tuple[cst.CSTNode, Edit]:
    """Insert ``code`` after the optimizer's statement; with ``rename_to``, every later read of
    the model in that block goes through it instead."""
    index = list(_body(a.optimizer_block)).index(a.optimizer_stmt)

    def edit(block: cst.CSTNode) -> cst.CSTNode:
        body = list(_body(block))
        later = body[index + 1 :]
        if rename_to:
            later = [stmt.visit(_Rename(a.model, rename_to)) for stmt in later]
        return block.with_changes(body=[*body[: index + 1], *_statements(code), *later])

    return a.optimizer_block, edit


def _loop_body(a: Anchors, first: str = "", last: str = "") -> tuple[cst.CSTNode, Edit]:
    def edit(block: cst.CSTNode) -> cst.CSTNode:
        body = [*_statements(first), *_body(block), *_statements(last)]
        return block.with_changes(body=body)

    return a.loop.body, edit


def _with_import(module: cst.Module, line: str) -> cst.Module:
    body = list(module.body)
    docstring = m.SimpleStatementLine([m.Expr(m.SimpleString())])
    first = 1 if body and m.matches(body[0], docstring) else 0
    return module.with_changes(body=[*body[:first], *_statements(line), *body[first:]])


# --- the mutators: each returns the mutated module, or None where the seed lacks the anchor ---


def alias_before_prepare(module: cst.Module, a: Anchors) -> cst.Module:
    """``net = model`` right after the optimizer, and the rest of that block trains ``net``."""
    return _edit(module, _block_after(a, f"net = {a.model}\n", rename_to="net"))


def kept_in_a_list(module: cst.Module, a: Anchors) -> cst.Module:
    """The model also sits in a list the script switches to training mode through."""
    code = f"models = [{a.model}]\nfor each in models:\n    each.train()\n"
    return _edit(module, _block_after(a, code))


def held_by_an_attribute(module: cst.Module, a: Anchors) -> cst.Module:
    """A namespace object holds the model and the rest of the block reads it from there."""
    code = f"import types\nholder = types.SimpleNamespace()\nholder.net = {a.model}\n"
    return _edit(module, _block_after(a, code, rename_to="holder.net"))


def stop_on_own_loss(module: cst.Module, a: Anchors) -> cst.Module:
    """Early stopping with patience on the per-batch training loss (each rank's own batches)."""
    check = (
        f"if {a.loss}.item() < best_loss:\n    best_loss, stale = {a.loss}.item(), 0\n"
        "else:\n    stale += 1\nif stale >= 2:\n    break\n"
    )
    init = 'best_loss, stale = float("inf"), 0\n'
    return _edit(module, _loop_body(a, last=check), (a.loop, _around(before=init)))


def skip_random_batches(module: cst.Module, a: Anchors) -> cst.Module:
    """A quarter of the batches skipped by a seeded ``random.random()`` (the same on every
    process; an unseeded draw makes the original itself irreproducible)."""
    skip = "if random.random() < 0.25:\n    continue\n"
    return _with_import(_edit(module, _loop_body(a, first=skip)), "import random\nrandom.seed(0)\n")


def built_by_a_function(module: cst.Module, a: Anchors) -> cst.Module | None:
    """The optimizer is built by a function defined beside it, which returns it."""
    stmt = a.optimizer_stmt
    assign = stmt.body[0] if isinstance(stmt, cst.SimpleStatementLine) else None
    if not isinstance(assign, cst.Assign) or len(assign.targets) != 1:
        return None
    code = cst.Module([]).code_for_node
    value = code(assign.value.visit(_Rename(a.model, "module")))
    builder = f"def build_optimizer(module):\n    return {value}\n"
    call = f"{code(assign.targets[0].target)} = build_optimizer({a.model})\n"
    return _edit(module, (stmt, lambda _: cst.FlattenSentinel(_statements(builder + call))))


def unused_submodule(module: cst.Module, a: Anchors) -> cst.Module | None:
    """Each model class of the file gains a head its ``forward`` never calls."""
    head = "self.unused_head = torch.nn.Linear(2, 2)\n"
    inits = [
        stmt
        for cls in module.body
        if isinstance(cls, cst.ClassDef)
        and any(_dotted(base.value).endswith("Module") for base in cls.bases)
        for stmt in _body(cls.body)
        if isinstance(stmt, cst.FunctionDef) and stmt.name.value == "__init__"
    ]
    if not inits:
        return None
    return _edit(module, *((init.body, _append(head)) for init in inits))


def _append(code: str) -> Edit:
    return lambda block: block.with_changes(body=[*_body(block), *_statements(code)])


def wrapped_in_data_parallel(module: cst.Module, a: Anchors) -> cst.Module | None:
    """``model = torch.nn.DataParallel(model)`` (a CPU host runs the module itself); not where
    the script calls a method of its own class on the model (``model.init_hidden(...)``), which
    the wrapper does not have: that mutant would fail before any conversion."""
    called = set(re.findall(rf"\b{re.escape(a.model)}\.(\w+)\(", module.code))
    if called - _MODULE_METHODS:
        return None
    wrap = f"{a.model} = torch.nn.DataParallel({a.model})\n"
    return _edit(module, (a.optimizer_stmt, _around(before=wrap)))


_MODULE_METHODS = frozenset(
    {"train", "eval", "parameters", "named_parameters", "state_dict", "load_state_dict", "to",
     "cuda", "cpu", "zero_grad", "modules", "children", "apply", "forward", "requires_grad_"}
)  # fmt: skip


MUTATORS: dict[str, Callable[[cst.Module, Anchors], cst.Module | None]] = {
    f.__name__: f
    for f in (
        alias_before_prepare,
        kept_in_a_list,
        held_by_an_attribute,
        stop_on_own_loss,
        skip_random_batches,
        built_by_a_function,
        unused_submodule,
        wrapped_in_data_parallel,
    )
}


def mutants(seeds: dict[str, tuple[Path, int]] = SEEDS) -> dict[str, str]:
    """``{"seed.mutator": source}`` for every mutator that finds its anchor in every seed."""
    out = {}
    for seed, (path, _) in seeds.items():
        module = cst.parse_module(path.read_text())
        found = anchors(module)
        if found is None:
            continue
        for name, mutate in MUTATORS.items():
            mutated = mutate(module, found)
            if mutated is not None and mutated.code != module.code:
                out[f"{seed}.{name}"] = mutated.code
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--only", nargs="+", metavar="NAME", help="seed.mutator names to judge")
    p.add_argument("--dump", type=Path, metavar="DIR", help="write mutants, conversions, verdicts")
    p.add_argument("--list", action="store_true", help="list the mutants and exit")
    args = p.parse_args(argv)
    scripts = mutants()
    if args.only:
        scripts = {k: v for k, v in scripts.items() if k in args.only}
    if args.list:
        print("\n".join(scripts))
        return 0
    from sweep import log, parallel

    runner = Runner()

    def one(name: str) -> Verdict:
        train_size = SEEDS[name.split(".", maxsplit=1)[0]][1]
        verdict = judge(scripts[name], name.replace(".", "_"), runner, train_size=train_size)
        log(f"[{name}] {verdict.category} {verdict.check}")
        if args.dump:
            dump(args.dump, name, scripts[name], verdict)
        return verdict

    try:
        verdicts = parallel(args.jobs, one, list(scripts))
    finally:
        runner.close()
    print(
        f"\naccelify converter oracle, mutation mode: {len(verdicts)} mutants of {len(SEEDS)} seeds"
    )
    for category, n in Counter(v.category for v in verdicts.values()).most_common():
        print(f"{category:<26}{n:>5}")
    print()
    for name, verdict in verdicts.items():
        reason = verdict.detail.strip().splitlines()[0][:140] if verdict.detail.strip() else ""
        print(f"  {name:<44} {verdict.category:<24} {verdict.check} {reason}")
    # A mutant that does not run as written (GENERATOR-BUG) says nothing about the converter.
    return 1 if any(v.category in (UNEXPLAINED, WRONG) for v in verdicts.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
