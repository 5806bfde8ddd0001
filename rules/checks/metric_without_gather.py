"""ACL205 metric-without-gather."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import libcst as cst

from accelify.rules.facts import Facts
from accelify.rules.rule import Invalid, Report, Rule, Severity
from accelify.transform.patterns import callee_name, dotted_name, target_names

GATHERS = frozenset(
    {"gather", "gather_for_metrics", "reduce", "all_gather", "all_reduce", "gather_object"}
)
_EVAL_NAME = re.compile(r"eval|val|test|dev", re.IGNORECASE)
_NO_GRAD = frozenset({"no_grad", "inference_mode"})


@dataclass(eq=False)
class _Loop:
    loader: str
    tainted: set[str] = field(default_factory=set)
    assigned: set[str] = field(default_factory=set)


@dataclass(eq=False)
class _Probe:
    """What an expression reads: shard-local values, and whether a gather happens in it."""

    tainted: bool = False
    gathered: bool = False


class MetricWithoutGather(Rule):
    """A metric accumulated from one process's shard of a prepared eval loader.

    ## What it does
    In a loop over a prepared evaluation loader (named `eval`/`val`/`test`, or run under
    `torch.no_grad()`), flags values computed from the batches that reach `metric.add_batch`,
    `total += ...` or `list.append(...)` without passing through `accelerator.gather_for_metrics`
    (or `gather`/`reduce`), neither in the loop nor on the accumulator afterwards.

    ## Why is this bad?
    Each process sees 1/N of the evaluation set. The metric is computed on the main process's
    shard only: a number that looks plausible, is wrong, and changes with the process count.

    ## Example
    ```python
    model, eval_dataloader = accelerator.prepare(model, eval_dataloader)
    for batch in eval_dataloader:
        preds = model(**batch).logits.argmax(-1)
        metric.add_batch(predictions=preds, references=batch["labels"])
    ```

    ## Use instead
    ```python
    model, eval_dataloader = accelerator.prepare(model, eval_dataloader)
    for batch in eval_dataloader:
        preds = model(**batch).logits.argmax(-1)
        preds, refs = accelerator.gather_for_metrics((preds, batch["labels"]))
        metric.add_batch(predictions=preds, references=refs)
    ```
    """

    code = "ACL205"
    name = "metric-without-gather"
    severity = Severity.WARNING

    VALID = (
        "accelerator = Accelerator()\neval_dl = accelerator.prepare(eval_dl)\n"
        "for batch in eval_dl:\n"
        "    preds = model(batch).argmax(-1)\n"
        "    preds, refs = accelerator.gather_for_metrics((preds, batch['labels']))\n"
        "    metric.add_batch(predictions=preds, references=refs)",
        "accelerator = Accelerator()\nval_loader = accelerator.prepare(val_loader)\ntotal = 0\n"
        "for x, y in val_loader:\n    total += model(x).sum()\n"
        "total = accelerator.reduce(total, 'sum')",
        "accelerator = Accelerator()\ntrain_dl = accelerator.prepare(train_dl)\ntotal = 0\n"
        "for batch in train_dl:\n    total += model(batch).item()  # training-loss logging",
        "accelerator = Accelerator()\neval_dl = accelerator.prepare(eval_dl)\nlosses = []\n"
        "for batch in eval_dl:\n    loss = model(batch)\n"
        "    losses.append(accelerator.gather_for_metrics(loss.repeat(8)))",
        # A branch for a backend whose losses are already averaged, beside the gathering one.
        "def evaluate(accelerator, model, eval_dataloader):\n"
        "    eval_dataloader = accelerator.prepare(eval_dataloader)\n    losses = []\n"
        "    for step, batch in enumerate(eval_dataloader):\n"
        "        loss = model(**batch).loss\n"
        "        if accelerator.distributed_type == DistributedType.MEGATRON_LM:\n"
        "            losses.append(loss)\n        else:\n"
        "            losses.append(accelerator.gather_for_metrics(loss.repeat(8)))\n"
        "    return losses\n\naccelerator = Accelerator()",
    )
    INVALID = (
        Invalid(
            "accelerator = Accelerator()\nmodel, eval_dataloader = accelerator.prepare(model, "
            "eval_dataloader)\nmetric = evaluate.load('accuracy')\nfor batch in eval_dataloader:\n"
            "    preds = model(**batch).logits.argmax(-1)\n"
            "    metric.add_batch(predictions=preds, references=batch['labels'])\n"
        ),
        Invalid(
            "accelerator = Accelerator()\nloader = accelerator.prepare(loader)\ncorrect = 0\n"
            "with torch.no_grad():\n    for x, y in loader:\n"
            "        correct += (model(x).argmax(-1) == y).sum().item()\n"
            "print(correct / len(dataset))\n"
        ),
        Invalid(
            "class Evaluator:\n    def run(self, model, test_loader):\n"
            "        accelerator = Accelerator()\n"
            "        model, test_loader = accelerator.prepare(model, test_loader)\n"
            "        active = test_loader\n        scores = []\n"
            "        for step, batch in enumerate(active):\n"
            "            if self.verbose:\n"
            "                scores.append(model(batch).max())\n"
        ),
        Invalid(  # in a function, through a comprehension
            "def evaluate(accelerator, model, val_loader):\n"
            "    val_loader = accelerator.prepare(val_loader)\n    scores = []\n"
            "    with torch.no_grad():\n        for batch in val_loader:\n"
            "            preds = model(batch['x']).argmax(-1)\n"
            "            scores.extend([int(p == y) for p, y in zip(preds, batch['y'])])\n"
            "    return sum(scores) / len(scores)\n\n\naccelerator = Accelerator()\n"
        ),
    )

    def __init__(self, facts: Facts, reports: list[Report]) -> None:
        super().__init__(facts, reports)
        self._no_grad = 0
        self._loops: list[_Loop] = []
        self._probes: list[_Probe] = []
        self._gathered_names: set[str] = set()
        # Accumulators fed gathered values on some path: the script gathers on purpose, and a
        # branch that appends local values (Megatron-LM's already averaged losses) is its choice.
        self._gathered_into: set[str] = set()
        self._in_gather = 0
        self._candidates: list[tuple[cst.CSTNode, str, str | None]] = []

    # -- where we are ---------------------------------------------------------------------------

    def visit_With(self, node: cst.With) -> None:
        self._no_grad += any(_with_call(i.item) in _NO_GRAD for i in node.items)

    def leave_With(self, node: cst.With) -> None:
        self._no_grad -= any(_with_call(i.item) in _NO_GRAD for i in node.items)

    def visit_For(self, node: cst.For) -> None:
        loops = self.facts.loader_loops
        if loops and loops[-1][0] is node:
            loader = loops[-1][1].name
            if self._no_grad or _EVAL_NAME.search(loader):
                self._loops.append(_Loop(loader))

    def leave_For(self, node: cst.For) -> None:
        loops = self.facts.loader_loops
        if self._loops and loops and loops[-1][0] is node:
            self._loops.pop()

    # -- what expressions read ------------------------------------------------------------------

    def visit_Name(self, node: cst.Name) -> None:
        if self._in_gather:
            self._gathered_names.add(node.value)
        if self._probes and self._loops and self._is_tainted(node):
            for probe in self._probes:
                probe.tainted = True

    def _is_tainted(self, node: cst.Name) -> bool:
        return node.value in self._loops[-1].tainted or self.facts.batch_of(node) is not None

    def visit_Call(self, node: cst.Call) -> None:
        name = callee_name(node)
        if name in GATHERS:
            self._in_gather += 1
            for probe in self._probes:
                probe.gathered = True
        if self._loops and self._is_sink(node):
            self._probes.append(_Probe())

    def leave_Call(self, node: cst.Call) -> None:
        if callee_name(node) in GATHERS:
            self._in_gather -= 1
        if self._loops and self._is_sink(node):
            probe = self._probes.pop()
            receiver = dotted_name(node.func.value)  # type: ignore[attr-defined]
            accumulator = receiver if node.func.attr.value in {"append", "extend"} else None  # type: ignore[attr-defined]
            if probe.tainted and not probe.gathered:
                self._candidates.append((node, self._loops[-1].loader, accumulator))
            elif probe.gathered and accumulator is not None:
                self._gathered_into.add(accumulator)

    def _is_sink(self, node: cst.Call) -> bool:
        if not isinstance(node.func, cst.Attribute):
            return False
        method = node.func.attr.value
        receiver = dotted_name(node.func.value) or ""
        if method == "add_batch" or (method == "add" and "metric" in receiver.lower()):
            return True
        return method in {"append", "extend"} and receiver not in self._loops[-1].assigned

    def visit_Assign_value(self, node: cst.Assign) -> None:
        if self._loops:
            self._probes.append(_Probe())

    def leave_Assign_value(self, node: cst.Assign) -> None:
        if not self._loops:
            return
        probe = self._probes.pop()
        loop = self._loops[-1]
        for target in node.targets:
            for name in target_names(target.target):
                loop.assigned.add(name)
                if probe.tainted and not probe.gathered:
                    loop.tainted.add(name)
                else:
                    loop.tainted.discard(name)

    def visit_AugAssign_value(self, node: cst.AugAssign) -> None:
        if self._loops:
            self._probes.append(_Probe())

    def leave_AugAssign_value(self, node: cst.AugAssign) -> None:
        if not self._loops:
            return
        probe = self._probes.pop()
        target = dotted_name(node.target)
        if probe.tainted and not probe.gathered and target not in self._loops[-1].assigned:
            self._candidates.append((node, self._loops[-1].loader, target))

    def leave_Module(self, node: cst.Module) -> None:
        if not self.facts.creates_accelerator:
            return
        for sink, loader, accumulator in self._candidates:
            if accumulator is not None and (
                accumulator.split(".")[0] in self._gathered_names
                or accumulator in self._gathered_into
            ):
                continue
            self.report(
                sink,
                f"accumulates values from this process's shard of `{loader}` only; gather "
                "them with `accelerator.gather_for_metrics` first",
            )


def _with_call(item: cst.BaseExpression) -> str | None:
    return callee_name(item) if isinstance(item, cst.Call) else None
