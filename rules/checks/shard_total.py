"""ACL212 shard-total."""

from __future__ import annotations

from collections import Counter

import libcst as cst

from accelify.rules.checks.metric_without_gather import GATHERS
from accelify.rules.facts import Facts, Prepared, Where, prepare_call
from accelify.rules.prepared import is_loader
from accelify.rules.rule import Invalid, Report, Rule, Severity
from accelify.transform.patterns import (
    Role,
    callee_name,
    dotted_name,
    loader_dataset_name,
    target_names,
)


class ShardTotal(Rule):
    """A total over a prepared loader that only counts this process's shard.

    ## What it does
    In a script that creates an `Accelerator`, flags `sum(... for batch in loader)` over a
    prepared `DataLoader`, and a sum accumulated in a loop over a prepared loader
    (`total += ...`) then divided by `len(loader.dataset)` (or `len(ds)`, the dataset the loader
    was built over, when that name is bound once), when neither passes through
    `accelerator.gather`/`gather_for_metrics`/`reduce`.

    ## Why is this bad?
    A prepared loader gives each process 1/N of the data, but `len(loader.dataset)` is the whole
    dataset: the average printed on N processes is 1/N of the truth, and a sum over the loader
    counts one shard. Both look plausible and change with the number of processes.

    ## Example
    ```python
    model, train_loader = accelerator.prepare(model, train_loader)
    total_loss = 0.0
    for x, y in train_loader:
        total_loss += loss.item()
    print(total_loss / len(train_loader.dataset))
    ```

    ## Use instead
    ```python
    model, train_loader = accelerator.prepare(model, train_loader)
    total_loss = 0.0
    for x, y in train_loader:
        total_loss += loss.item()
    total_loss = accelerator.reduce(torch.tensor(total_loss, device=accelerator.device), "sum")
    print(total_loss.item() / len(train_loader.dataset))
    ```
    """

    code = "ACL212"
    name = "shard-total"
    severity = Severity.WARNING

    VALID = (
        "accelerator = Accelerator()\nmodel, dl = accelerator.prepare(model, dl)\ntotal = 0.0\n"
        "for x, y in dl:\n    total += model(x).sum().item()\n"
        "total = accelerator.reduce(torch.tensor(total), 'sum').item()\n"
        "print(total / len(dl.dataset))\n",
        "accelerator = Accelerator()\nmodel, dl = accelerator.prepare(model, dl)\n"
        "correct = sum(accelerator.gather_for_metrics(model(x).argmax(1).eq(y)).sum().item()"
        " for x, y in dl)\n",
        "accelerator = Accelerator()\nmodel = accelerator.prepare(model)\n"
        "correct = sum(model(x).argmax(1).eq(y).sum().item() for x, y in raw_loader)\n",
        "model, dl = prepare(model, dl)\ncorrect = sum(model(x).sum() for x, y in dl)\n",
        # The name is bound twice: which dataset it measures there is not one fact.
        "accelerator = Accelerator()\nds = make()\ndl = DataLoader(ds, batch_size=8)\n"
        "model, dl = accelerator.prepare(model, dl)\nds = other\ntotal = 0.0\n"
        "for x, y in dl:\n    total += model(x).sum().item()\nprint(total / len(ds))\n",
    )
    INVALID = (
        Invalid(
            "accelerator = Accelerator()\nmodel, train_loader = accelerator.prepare(model, "
            "train_loader)\nfor epoch in range(2):\n    train_loss = 0.0\n"
            "    for x, y in train_loader:\n        train_loss += loss_fn(model(x), y).item()\n"
            "    if accelerator.is_main_process:\n"
            "        print(f'{train_loss / len(train_loader.dataset):.4f}')\n"
        ),
        Invalid(
            "def evaluate():\n    with torch.no_grad():\n"
            "        return sum(model(x).argmax(1).eq(y).sum().item() for x, y in loader)\n\n\n"
            "accelerator = Accelerator()\nmodel, loader = accelerator.prepare(model, loader)\n"
            "print(evaluate())\n"
        ),
        # The loader's dataset by its own name.
        Invalid(
            "accelerator = Accelerator()\ntrain_set = make()\n"
            "train_loader = DataLoader(train_set, batch_size=8)\n"
            "model, train_loader = accelerator.prepare(model, train_loader)\nloss_sum = 0.0\n"
            "for x, y in train_loader:\n    loss_sum += loss_fn(model(x), y).item()\n"
            "print(loss_sum / len(train_set))\n"
        ),
        # The function prepares something of its own, and reads the module's loader.
        Invalid(
            "accelerator = Accelerator()\n\n\ndef evaluate():\n"
            "    scorer, = accelerator.prepare(scorer)\n"
            "    return sum(scorer(x).sum().item() for x in loader)\n\n\n"
            "model, loader = accelerator.prepare(model, loader)\n"
        ),
    )

    def __init__(self, facts: Facts, reports: list[Report]) -> None:
        super().__init__(facts, reports)
        self._sums: dict[str, Prepared] = {}  # accumulated in a loop over a prepared loader
        self._gathered: set[str] = set()  # names read inside a gather
        self._in_gather = 0
        self._gathers = 0  # gather calls seen so far
        # ``sum(<comprehension>)`` calls open now, then judged: the call, the iterable, where it
        # is, and the loader it names if known where it is read.
        self._sums_over: list[tuple[cst.Call, cst.BaseExpression, Where, int]] = []
        self._comprehensions: list[tuple[cst.Call, cst.BaseExpression, Where, Prepared | None]] = []
        # node, loader, sum, and the dataset name divided by when it is not ``loader.dataset``
        self._candidates: list[tuple[cst.CSTNode, str, str | None, str | None]] = []
        self._over: dict[str, str] = {}  # loader name -> the dataset name it was built over
        self._bindings: Counter[str] = Counter()  # how often each name is assigned
        # Loaders prepared at module level (``__main__`` blocks included), for the functions
        # defined above that read them.
        self._module_loaders: set[str] = set()

    def visit_Call(self, node: cst.Call) -> None:
        name = callee_name(node)
        if name in GATHERS:
            self._in_gather += 1
            self._gathers += 1
        elif name == "sum" and not self._in_gather and len(node.args) == 1:
            iterable = _comprehended(node.args[0].value)
            if iterable is not None:
                self._sums_over.append((node, iterable, self.facts.where(), self._gathers))

    def leave_Call(self, node: cst.Call) -> None:
        name = callee_name(node)
        if name in GATHERS:
            self._in_gather -= 1
        elif self._sums_over and self._sums_over[-1][0] is node:
            call, iterable, where, gathers = self._sums_over.pop()
            if gathers == self._gathers:  # nothing in it was gathered
                loader = self.facts.prepared(iterable)
                self._comprehensions.append((call, iterable, where, loader))

    def visit_Name(self, node: cst.Name) -> None:
        if self._in_gather:
            self._gathered.add(node.value)

    def visit_Assign(self, node: cst.Assign) -> None:
        for target in node.targets:
            self._bindings.update(target_names(target.target))
        dataset = loader_dataset_name(node.value)
        loader = node.targets[0].target if len(node.targets) == 1 else None
        if dataset is not None and isinstance(loader, cst.Name):
            self._over[loader.value] = dataset

    def leave_Assign(self, node: cst.Assign) -> None:
        call = prepare_call(node.value, self.facts)
        if call is None or self.facts.function() is not None:
            return
        target = node.targets[0].target if len(node.targets) == 1 else None
        names = list(target_names(target)) if target is not None else []
        if len(names) == len(call.args):
            self._module_loaders.update(
                name
                for name, arg in zip(names, call.args, strict=True)
                if is_loader(self.facts, arg.value)
            )

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        loops = self.facts.loader_loops
        name = dotted_name(node.target)
        if loops and name is not None and isinstance(node.operator, cst.AddAssign):
            self._sums[name] = loops[-1][1]

    def visit_BinaryOperation(self, node: cst.BinaryOperation) -> None:
        total = dotted_name(node.left)
        if not isinstance(node.operator, cst.Divide) or total not in self._sums:
            return
        loader = self._sums[total]
        if _dataset_length(node.right) == loader.name:
            self._candidates.append((node, loader.name, total, None))
        elif (dataset := _length_of(node.right)) and self._over.get(loader.name) == dataset:
            self._candidates.append((node, loader.name, total, dataset))

    def leave_Module(self, node: cst.Module) -> None:
        if not self.facts.creates_accelerator:
            return
        for call, iterable, where, known in self._comprehensions:
            if known is not None and known.role is Role.DATALOADER:
                self._candidates.append((call, known.name, None, None))
            elif known is None and self._module_loader(iterable, where):
                self._candidates.append((call, dotted_name(iterable) or "", None, None))
        for found, loader, total, dataset in self._candidates:
            if total is None:
                message = f"sums over this process's shard of `{loader}` only"
            elif total.split(".", 1)[0] in self._gathered:
                continue
            elif dataset is not None and self._bindings[dataset] != 1:
                continue  # which dataset the name holds where it is measured is not one fact
            else:
                counted = f"len({dataset})" if dataset else f"len({loader}.dataset)"
                message = (
                    f"`{total}` sums this process's shard of `{loader}` only, but "
                    f"`{counted}` counts every process's"
                )
            self.report(found, f"{message}; gather or reduce it across processes first")

    def _module_loader(self, iterable: cst.BaseExpression, where: Where) -> bool:
        """A function reading a loader prepared at module level after its ``def``, unless the
        function binds the name itself."""
        name = dotted_name(iterable)
        return (
            where.function is not None
            and name in self._module_loaders
            and name not in _bound_names(where.function)
        )


def _comprehended(expr: cst.BaseExpression) -> cst.BaseExpression | None:
    """What a generator or list comprehension's first ``for`` iterates (through ``enumerate``)."""
    if not isinstance(expr, (cst.GeneratorExp, cst.ListComp)):
        return None
    iterable = expr.for_in.iter
    if isinstance(iterable, cst.Call) and callee_name(iterable) == "enumerate" and iterable.args:
        return iterable.args[0].value
    return iterable


class _Bound(cst.CSTVisitor):
    """Collects the names a function binds: parameters, assignment and loop targets."""

    def __init__(self) -> None:
        self.names: set[str] = set()

    def visit_Param(self, node: cst.Param) -> None:
        self.names.add(node.name.value)

    def visit_AssignTarget(self, node: cst.AssignTarget) -> None:
        self.names.update(target_names(node.target))

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        self.names.update(target_names(node.target))

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        self.names.update(target_names(node.target))

    def visit_For(self, node: cst.For) -> None:
        self.names.update(target_names(node.target))

    def visit_AsName(self, node: cst.AsName) -> None:
        self.names.update(target_names(node.name))  # type: ignore[arg-type]


def _bound_names(function: cst.FunctionDef) -> set[str]:
    found = _Bound()
    function.visit(found)
    return found.names


def _length_of(expr: cst.BaseExpression) -> str | None:
    """``X`` when ``expr`` is ``len(X)`` of a plain name."""
    if isinstance(expr, cst.Call) and callee_name(expr) == "len" and len(expr.args) == 1:
        arg = expr.args[0].value
        return arg.value if isinstance(arg, cst.Name) else None
    return None


def _dataset_length(expr: cst.BaseExpression) -> str | None:
    """``X`` when ``expr`` is ``len(X.dataset)``."""
    if isinstance(expr, cst.Call) and callee_name(expr) == "len" and len(expr.args) == 1:
        arg = expr.args[0].value
        if isinstance(arg, cst.Attribute) and arg.attr.value == "dataset":
            return dotted_name(arg.value)
    return None
