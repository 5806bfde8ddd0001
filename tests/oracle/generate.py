"""Compose training scripts from the idiom catalogue: choice, constraints, rendering, shrinking.

``generate(seed, index)`` is a pure function of its arguments (``random.Random`` seeded with a
string is stable across runs and platforms), so script N of seed S is always the same text and a
failure can be reproduced from the two numbers, or from the variant names in its first lines.

Choices are made axis by axis in catalogue order; a variant is a candidate only if every rule
whose axes are all chosen holds. The same procedure, with "keep what it was, else the simplest"
instead of a random pick, repairs a combination the shrinker simplified.
"""

from __future__ import annotations

import ast
import builtins
import random
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

# The oracle's modules import each other as siblings: sweep.py and test_oracle.py put this folder
# on sys.path (tests/ is not a package).
from idioms import (
    AXES,
    BATCH_LOOPS,
    LOOP_INDEX,
    SHARED_ORDER,
    Ctx,
    Lines,
    block,
    evaluation,
    indent,
)

from accelify.transform.sources import python_ast

Choice = dict[str, str]


@dataclass(frozen=True)
class Rule:
    """A compatibility constraint between the variants of ``axes``."""

    axes: tuple[str, ...]
    holds: Callable[[Mapping[str, str]], bool]
    why: str


def _needs_argparse(c: Mapping[str, str]) -> bool:
    return (
        c["device"] == "use_cuda_flag"
        or c["seed"] == "args_seed"
        or c["banner"] == "print_args"
        or c["accum_n"] == "args"
        or c["arch"] == "arch_branch"
    )


RULES: tuple[Rule, ...] = (
    Rule(
        ("data", "loop"),
        lambda c: (c["data"] == "manual") == (c["loop"] == "slices"),
        "scripts without a DataLoader slice their tensors, and only they do",
    ),
    Rule(
        ("data", "loop"),
        lambda c: c["data"] != "dict" or c["loop"] in BATCH_LOOPS,
        "dict batches are bound as `batch` and unpacked by key",
    ),
    Rule(
        ("move", "loop"),
        lambda c: c["move"] != "list_comp" or c["loop"] in BATCH_LOOPS,
        "the list comprehension unpacks `batch`",
    ),
    Rule(
        ("data", "move"),
        lambda c: (c["move"] == "dict_comp") <= (c["data"] == "dict"),
        "a dict comprehension needs dict batches",
    ),
    Rule(
        ("data", "move"),
        lambda c: c["data"] != "dict" or c["move"] in ("none", "dict_comp"),
        "dict batches are moved by the comprehension or not at all",
    ),
    Rule(
        ("data", "move"),
        lambda c: c["data"] != "manual" or c["move"] != "list_comp",
        "sliced tensors are not a batch to unpack",
    ),
    Rule(
        ("loss", "arch"),
        lambda c: c["loss"] != "model_returns" or c["arch"] not in ("enc_dec", "sequential"),
        "only the custom modules can return their loss",
    ),
    Rule(
        ("model_extra", "arch"),
        lambda c: c["model_extra"] == "none" or c["arch"] not in ("enc_dec", "sequential"),
        "only the custom modules have extra methods",
    ),
    Rule(
        ("model_extra", "loss"),
        lambda c: c["loss"] != "mse" or c["model_extra"] in ("none", "encode", "start_logits"),
        "a regression has no classes to predict or count",
    ),
    Rule(
        ("model_extra", "loss"),
        lambda c: (
            c["model_extra"] not in ("start_logits", "sample_in_step")
            or c["loss"] != "model_returns"
        ),
        "a model that returns its loss computes its logits itself",
    ),
    Rule(
        ("extra_tensor", "loss"),
        lambda c: c["extra_tensor"] != "class_weights" or c["loss"] == "ce_module",
        "class weights go to nn.CrossEntropyLoss",
    ),
    Rule(
        ("accum", "loss"),
        lambda c: c["accum"] != "inline_div" or c["loss"] != "model_returns",
        "the inline division divides a criterion call",
    ),
    Rule(
        ("accum", "loop"),
        lambda c: c["accum"] == "none" or c["loop"] in LOOP_INDEX,
        "accumulation counts batches with the loop's index",
    ),
    Rule(
        ("accum", "accum_n"),
        lambda c: c["accum"] != "none" or c["accum_n"] == "name",
        "without accumulation there is no step count",
    ),
    Rule(
        ("accum", "accum_guard"),
        lambda c: c["accum"] != "none" or c["accum_guard"] == "modulo",
        "without accumulation there is no guard",
    ),
    Rule(
        ("accum", "zero_grad"),
        lambda c: c["accum"] == "none" or c["zero_grad"] != "before_forward",
        "accumulating scripts zero the gradients after the step",
    ),
    Rule(
        ("zero_grad", "arch"),
        lambda c: c["zero_grad"] != "model_zero_grad" or c["arch"] != "enc_dec",
        "model.zero_grad() needs one model",
    ),
    Rule(
        ("scheduler", "data"),
        lambda c: c["data"] != "manual" or c["scheduler"] in ("none", "steplr_epoch"),
        "per-batch schedules are sized from len(train_loader)",
    ),
    Rule(
        ("progress", "loop"),
        lambda c: (
            c["progress"] == "none" or c["loop"] in ("for_xy", "enumerate_xy", "enumerate_batch")
        ),
        "tqdm wraps the iterable of a for loop",
    ),
    Rule(
        ("log", "loop"),
        lambda c: c["log"] != "step_print" or c["loop"] in LOOP_INDEX,
        "printing every few steps needs a step index",
    ),
    Rule(
        ("loader", "data"),
        lambda c: c["data"] != "manual" or c["loader"] == "plain",
        "shuffling needs a DataLoader",
    ),
    Rule(
        ("model_extra", "eval"),
        lambda c: (
            c["model_extra"] in ("none", "start_logits", "sample_in_step") or c["eval"] != "none"
        ),
        "the extra model methods are used by the evaluation",
    ),
    Rule(
        ("device", "seed", "banner", "accum_n", "arch", "argparse"),
        lambda c: c["argparse"] == "argparse" or not _needs_argparse(c),
        "args.* needs the argparse block",
    ),
)


_ONE_SCOPE = ("module", "main_func", "if_main")
RULES += (
    Rule(
        ("alias", "arch", "scope"),
        lambda c: c["alias"] == "none" or (c["arch"] != "enc_dec" and c["scope"] in _ONE_SCOPE),
        "the aliases name the one model, in the scope that trains it",
    ),
    Rule(
        ("alias", "loss"),
        lambda c: c["alias"] != "forward_alias" or c["loss"] != "model_returns",
        "the alias runs the plain forward",
    ),
    Rule(
        ("stop", "scope"),
        lambda c: c["stop"] == "none" or c["scope"] in (*_ONE_SCOPE, "helpers"),
        "the stop test sits in the epoch loop of the script's own scope",
    ),
    Rule(
        ("stop", "scope"),
        lambda c: c["stop"] != "loss_break" or c["scope"] in _ONE_SCOPE,
        "the last loss is read where the batch loop ran",
    ),
    Rule(
        ("device_at", "scope", "device"),
        lambda c: (
            c["device_at"] == "setup"
            or (c["scope"] in ("main_func", "helpers") and c["device"] != "use_cuda_flag")
        ),
        "a module-level device is read as a global by the functions of a script with main(), "
        "and chosen before the command line is parsed",
    ),
    Rule(
        ("wrap", "model_extra"),
        lambda c: c["wrap"] != "data_parallel" or c["model_extra"] == "none",
        "a model always wrapped in DataParallel is only called (the wrapper has no methods of "
        "the model's class)",
    ),
)


RULES_BY_AXIS = {axis: [r for r in RULES if axis in r.axes] for axis in AXES}


def consistent(choice: Mapping[str, str], axis: str | None = None) -> bool:
    """Whether every rule over axes already chosen in ``choice`` (and involving ``axis``) holds."""
    rules = RULES if axis is None else RULES_BY_AXIS[axis]
    return all(r.holds(choice) for r in rules if all(a in choice for a in r.axes))


def assign(
    pick: Callable[[str, list[str]], str], pinned: Mapping[str, str] | None = None
) -> Choice:
    """Choose every axis in order; ``pinned`` axes are fixed and chosen first."""
    choice: Choice = dict(pinned or {})
    if not consistent(choice):
        raise ValueError(f"pinned variants conflict: {choice}")
    for axis, variants in AXES.items():
        if axis in choice:
            continue
        candidates = [v for v in variants if consistent({**choice, axis: v}, axis)]
        if not candidates:
            raise ValueError(f"no variant of {axis} fits {choice}")
        choice[axis] = pick(axis, candidates)
    return {axis: choice[axis] for axis in AXES}


# How much likelier than its siblings a variant is drawn (1 when not listed): most real scripts
# do not accumulate, so scripts without accumulation should not be the rare ones.
WEIGHTS = {("accum", "none"): 3, ("amp", "none"): 2}


def choose(seed: int, index: int) -> Choice:
    rng = random.Random(f"accelify-oracle:{seed}:{index}")

    def pick(axis: str, candidates: list[str]) -> str:
        weights = [WEIGHTS.get((axis, v), 1) for v in candidates]
        return rng.choices(candidates, weights)[0]

    return assign(pick)


def simplest(axis: str) -> str:
    return next(iter(AXES[axis]))


def repair(choice: Mapping[str, str], pinned: Mapping[str, str]) -> Choice:
    """``choice`` with ``pinned`` applied, other axes kept where they fit, else the simplest."""
    return assign(lambda axis, cands: choice[axis] if choice[axis] in cands else cands[0], pinned)


# ----------------------------------------------------------------------------------------------
# Rendering.

STDLIB_IMPORTS = ("import argparse", "import random")
THIRD_PARTY_IMPORTS = (
    "import numpy as np",
    "import torch",
    "import torch.nn as nn",
    "import torch.nn.functional as F",
    "from torch.optim.lr_scheduler import LambdaLR",
    "from torch.optim.lr_scheduler import StepLR",
    "from torch.utils.data import DataLoader, Dataset",
    "from torch.utils.data import DataLoader, TensorDataset",
    "from tqdm import tqdm",
)
BASE_IMPORTS = {"import torch", "import torch.nn as nn", "import torch.nn.functional as F"}
# Globals a helper function reads without being handed them, and the order of its parameters.
_GLOBALS = """torch nn F np random argparse tqdm DataLoader Dataset TensorDataset StepLR LambdaLR
Net MLPNet LinearNet Encoder Decoder PairDataset evaluate train"""
MODULE_NAMES = frozenset(dir(builtins)) | frozenset(_GLOBALS.split())
_PARAMS = """args model enc dec device use_cuda device_type offset train_loader test_loader x_train
y_train x_test y_test optimizer criterion scheduler accum_steps epoch"""
PARAM_ORDER = tuple(_PARAMS.split())


def free_names(body: Lines) -> list[str]:
    """Names ``body`` reads that it does not bind: the parameters a function around it needs."""
    tree = python_ast("\n".join(["def f():", *indent(body)]))
    stored, loaded = set(), []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            if isinstance(node.ctx, ast.Store):
                stored.add(node.id)
            elif node.id not in loaded:
                loaded.append(node.id)
        elif isinstance(node, ast.arg):
            stored.add(node.arg)
    free = [n for n in loaded if n not in stored and n not in MODULE_NAMES]
    rank = {name: i for i, name in enumerate(PARAM_ORDER)}
    return sorted(free, key=lambda n: (rank.get(n, len(rank)), n))


class Pieces:
    """The parts of one script; a scope layout (idioms.SCOPE) decides where they go."""

    def prelude(self, c: Ctx) -> Lines:
        """Command line, banner and seeds: before anything is built (in __main__ for a class)."""
        return [
            *c.part("argparse", "prelude"),
            *c.part("banner", "prelude"),
            *c.part("seed", "prelude"),
        ]

    def setup(self, c: Ctx) -> Lines:
        return [
            *c.part("argparse", "setup"),
            *c.part("accum_n", "setup"),
            *([] if c.v("device_at") == "module" else c.part("device", "setup")),
            *c.part("amp", "setup"),
            *c.part("data", "setup"),
            *c.part("arch", "build"),
            *c.part("model_move", "after_build"),
            *c.part("wrap", "after_build"),
            *c.part("alias", "after_build"),
            *c.part("extra_tensor", "setup"),
            *c.part("loss", "setup"),
            *c.part("optimizer", "setup"),
            *c.part("scheduler", "setup"),
        ]

    def step(self, c: Ctx) -> Lines:
        return [
            *c.part("clip", "before_step"),
            f"{c.n('optimizer')}.step()",
            *c.part("scheduler", "optimizer_step"),
            *c.part("zero_grad", "after_step"),
        ]

    def body(self, c: Ctx) -> Lines:
        """One batch of training, seeing the batch as x, y."""
        compute = c.part("loss", "compute")
        if c.has("amp", "header"):
            compute = block(c.part("amp", "header")[0], compute)
        step = self.step(c)
        if c.accum:
            step = block(c.part("accum_guard", "guard")[0], step)
        return [
            *c.part("move", "moves"),
            *c.part("extra_tensor", "use"),
            *c.part("zero_grad", "before_forward"),
            *compute,
            *c.part("accum", "after_loss"),
            *c.part("accum", "backward"),
            *c.part("log", "after_backward"),
            *step,
            *c.part("log", "step_end"),
        ]

    def epoch(self, c: Ctx) -> Lines:
        """One epoch of training (the body of train() / Trainer.train_epoch when there is one)."""
        return [
            *c.part("train_mode", "epoch_start"),
            *c.part("log", "epoch_start"),
            *c.part("loop", "wrap", self.body(c)),
            *c.part("log", "epoch_end"),
        ]

    def _evaluate_call(self, c: Ctx) -> Lines:
        _, metric = evaluation(c)
        if c.in_class:
            call = "self.evaluate()"
        else:
            call = f"evaluate({self.free(c, self._evaluate_body(c))})"
        return [f"{metric} = {call}", f'print(f"epoch {{epoch}} {metric} {{{metric}:.4f}}")']

    def _evaluate_body(self, c: Ctx) -> Lines:
        lines, metric = evaluation(c)
        return [*lines, f"return {metric}"]

    def after_epoch(self, c: Ctx) -> Lines:
        evaluate = self._evaluate_call(c) if c.v("eval") == "function" else []
        return [*c.part("eval", "epoch_after"), *evaluate, *c.part("scheduler", "epoch_after")]

    def finish(self, c: Ctx) -> Lines:
        return [*c.part("eval", "finish"), *c.part("save", "finish")]

    def _train_call(self, c: Ctx) -> Lines:
        if c.in_class:
            return ["self.train_epoch(epoch)"]
        if c.v("scope") == "helpers":
            return [f"train({self.free(c, self.epoch(c))})"]
        return self.epoch(c)

    def main_lines(self, c: Ctx) -> Lines:
        """Everything the script does, in one scope."""
        stop = c.part("stop", "after_epoch")
        loop = c.part("epoch_loop", "wrap", [*self._train_call(c), *self.after_epoch(c), *stop])
        return [*self.prelude(c), *self.setup(c), *loop, *self.finish(c)]

    def module_globals(self, c: Ctx) -> Lines:
        """The device chosen at module level, where device_at says so."""
        if c.v("device_at") != "module":
            return []
        return [*c.part("device", "setup"), "", ""]

    def free(self, c: Ctx, body: Lines) -> str:
        """The parameters a function around ``body`` takes: its free names but the globals."""
        chosen = {c.n("device"), c.n("use_cuda")} if c.v("device_at") == "module" else set()
        return ", ".join(name for name in free_names(body) if name not in chosen)

    def functions(self, c: Ctx) -> Lines:
        """Module-level train()/evaluate() helpers, each handed the names it reads."""
        out: Lines = []
        if c.v("scope") == "helpers":
            body = self.epoch(c)
            out += [*block(f"def train({self.free(c, body)}):", body), "", ""]
        if c.v("eval") == "function":
            body = self._evaluate_body(c)
            out += [*block(f"def evaluate({self.free(c, body)}):", body), "", ""]
        return out

    def trainer_class(self, c: Ctx) -> Lines:
        """A Trainer holding the objects as attributes; __main__ seeds, builds and fits it."""
        s = Ctx(c.choice, in_class=True)
        args = ["args"] if c.argparse else []
        init = ["self.args = args"] if c.argparse else []
        main = [*self.prelude(c), f"Trainer({', '.join(args)}).fit()"]
        return [
            *self._trainer(s, args, [*init, *self.setup(s)]),
            "",
            "",
            *block('if __name__ == "__main__":', main),
        ]

    def trainer_factory(self, c: Ctx) -> Lines:
        """The objects come from a factory function returning a tuple and are handed to a
        Trainer that stores them; main() builds and fits it (pytorch/examples' DDP tutorial)."""
        setup = self.setup(c)
        built = self._read_by_trainer(c, _bound(setup), [])
        reads = ["args"] if c.argparse else []
        factory = block(
            f"def build_objects({', '.join(reads)}):", [*setup, f"return {', '.join(built)}"]
        )
        return [
            *factory,
            "",
            "",
            *self._handed_trainer(c, built, []),
            *self._main(c, [f"{', '.join(built)} = build_objects({', '.join(reads)})"], built),
        ]

    def trainer_optimizer(self, c: Ctx) -> Lines:
        """main() builds the model and the data; the Trainer it hands them to builds its own
        optimizer, loss and schedule (minGPT's Trainer)."""
        outside = [
            *c.part("argparse", "setup"),
            *c.part("device", "setup"),
            *c.part("data", "setup"),
            *c.part("arch", "build"),
            *c.part("model_move", "after_build"),
        ]
        s = Ctx(c.choice, in_class=True)
        inside = [
            *s.part("accum_n", "setup"),
            *s.part("amp", "setup"),
            *s.part("extra_tensor", "setup"),
            *s.part("loss", "setup"),
            *s.part("optimizer", "setup"),
            *s.part("scheduler", "setup"),
        ]
        built = self._read_by_trainer(c, _bound(outside), inside)
        return [*self._handed_trainer(c, built, inside), *self._main(c, outside, built)]

    def _read_by_trainer(self, c: Ctx, names: list[str], init: Lines) -> list[str]:
        """Those of ``names`` that the Trainer's methods (or ``init``) read as ``self.<name>``."""
        text = "\n".join([*init, *self._methods(Ctx(c.choice, in_class=True))])
        return [n for n in names if re.search(rf"\bself\.{n}\b", text)]

    def _handed_trainer(self, c: Ctx, handed: list[str], more: Lines) -> Lines:
        """A Trainer whose __init__ stores what it is handed (and ``args``), then runs ``more``."""
        s = Ctx(c.choice, in_class=True)
        params = [*(["args"] if c.argparse else []), *handed]
        stored = [f"self.{n} = {n}" for n in params]
        return [*self._trainer(s, params, [*stored, *more]), "", ""]

    def _main(self, c: Ctx, builds: Lines, handed: list[str]) -> Lines:
        args = ["args"] if c.argparse else []
        body = [
            *self.prelude(c),
            *builds,
            f"trainer = Trainer({', '.join([*args, *handed])})",
            "trainer.fit()",
        ]
        return [
            *block("def main():", body),
            "",
            "",
            *block('if __name__ == "__main__":', ["main()"]),
        ]

    def _trainer(self, s: Ctx, params: list[str], init: Lines) -> Lines:
        """``class Trainer`` with ``__init__(self, *params)`` running ``init``, then the
        methods."""
        signature = ", ".join(["self", *params])
        return block(
            "class Trainer:", [*block(f"def __init__({signature}):", init), "", *self._methods(s)]
        )

    def _methods(self, s: Ctx) -> Lines:
        """The Trainer's epoch, evaluation and fit()."""
        methods = [*block("def train_epoch(self, epoch):", self.epoch(s)), ""]
        if s.v("eval") == "function":
            methods += [*block("def evaluate(self):", self._evaluate_body(s)), ""]
        fit = [
            *s.part("epoch_loop", "wrap", [*self._train_call(s), *self.after_epoch(s)]),
            *self.finish(s),
        ]
        return [*methods, *block("def fit(self):", fit)]


def _bound(lines: Lines) -> list[str]:
    """The shared names ``lines`` bind (the objects a Trainer keeps), in the catalogue's order."""
    tree = python_ast("\n".join(["def f():", *indent(lines)]))
    stored = {
        n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)
    }
    return [name for name in SHARED_ORDER if name in stored]


def _header(choice: Mapping[str, str], seed: int | None, index: int | None) -> Lines:
    words = [f"{axis}={variant}" for axis, variant in choice.items()]
    origin = f"generate(seed={seed}, index={index})" if seed is not None else "a variant list"
    lines, line = [f"# accelify oracle script from {origin}; variants:"], "#"
    for word in words:
        if len(line) + 1 + len(word) > 99:
            lines.append(line)
            line = "#"
        line += " " + word
    return [*lines, line]


def render(choice: Mapping[str, str], seed: int | None = None, index: int | None = None) -> str:
    """The script for one combination of variants."""
    c = Ctx(choice)
    pieces = Pieces()
    imports = set(BASE_IMPORTS)
    for axis in AXES:
        imports.update(c.part(axis, "imports"))
    classes = [c.part("data", "classes"), c.part("arch", "classes")]
    lines = [
        *_header(choice, seed, index),
        '"""A toy training script composed by the oracle."""',
        "",
    ]
    stdlib = [imp for imp in STDLIB_IMPORTS if imp in imports]
    lines += [*stdlib, *([""] if stdlib else []), *(i for i in THIRD_PARTY_IMPORTS if i in imports)]
    for cls in classes:
        if cls:
            lines += ["", "", *cls]
    lines += ["", "", *c.part("scope", "layout", pieces)]
    text = "\n".join(_drop_trailing_blanks(lines)) + "\n"
    return text


def _drop_trailing_blanks(lines: Lines) -> Lines:
    while lines and lines[-1] == "":
        lines = lines[:-1]
    return lines


def generate(seed: int, index: int) -> tuple[Choice, str]:
    """Script ``index`` of ``seed``: its variant choices and its source text."""
    choice = choose(seed, index)
    return choice, render(choice, seed, index)


# ----------------------------------------------------------------------------------------------
# Shrinking and sampling.


def shrink(
    variants: Mapping[str, str], still_fails: Callable[[Choice], bool], budget: int = 40
) -> Choice:
    """The simplest combination found that still fails, trying at most ``budget`` candidates.

    Hypothesis-style, on variant choices rather than text: groups of axes are set to their
    simplest variant (halving the group size when a group does not reproduce the failure, as in
    delta debugging), and the other axes are repaired to stay compatible.
    """
    current, tried = dict(variants), 0
    seen: set[tuple[str, ...]] = {tuple(current.values())}
    progress = True
    while progress and tried < budget:
        progress = False
        axes = [a for a in AXES if current[a] != simplest(a)]
        size = len(axes)
        while size >= 1 and not progress and tried < budget:
            for start in range(0, len(axes), size):
                group = axes[start : start + size]
                try:
                    candidate = repair(current, {a: simplest(a) for a in group})
                except ValueError:
                    continue
                key = tuple(candidate.values())
                if key in seen:
                    continue
                seen.add(key)
                tried += 1
                if still_fails(candidate):
                    current, progress = candidate, True
                    break
                if tried >= budget:
                    break
            size //= 2
    return current


def all_variants() -> set[tuple[str, str]]:
    return {(axis, v) for axis, variants in AXES.items() for v in variants}


def covering_sample(seed: int, count: int, pool: int = 3000) -> list[int]:
    """``count`` indices of ``seed`` chosen greedily so that every variant appears at least once
    (then at least twice, and so on, while there is room): a small sample that misses nothing."""
    variants = {i: set(choose(seed, i).items()) for i in range(pool)}
    uncovered, picked = all_variants(), []
    while len(picked) < count:
        if not uncovered:
            uncovered = all_variants()
        gains = {i: len(uncovered & v) for i, v in variants.items() if i not in picked}
        best = max(gains, key=lambda i: (gains[i], -i))
        picked.append(best)
        uncovered -= variants[best]
    return sorted(picked)
