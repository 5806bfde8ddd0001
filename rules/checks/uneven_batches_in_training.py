"""ACL011 uneven-batches-in-training."""

from __future__ import annotations

import libcst as cst

from accelify.rules.facts import Facts, Loop
from accelify.rules.rule import Invalid, Report, Rule, Severity
from accelify.transform.patterns import callee_name, dotted_name, keyword_arg

# Where ``even_batches`` is set for every prepared loader of the script.
_CONFIGURES = frozenset({"Accelerator", "DataLoaderConfiguration"})


class UnevenBatchesInTraining(Rule):
    """`even_batches=False` in a script that trains on a prepared loader.

    ## What it does
    Flags `even_batches=False` given to `Accelerator(...)` or `DataLoaderConfiguration(...)`, or
    set as `accelerator.even_batches = False`, when a loop over a prepared loader runs a backward
    pass or an optimizer step outside `with accelerator.join_uneven_inputs(...):`.

    ## Why is this bad?
    By default Accelerate repeats a few samples so that every process gets the same number of
    batches. With `even_batches=False`, when the data does not divide evenly, some processes
    get one batch fewer: they leave the training loop while the others wait for them in the
    next gradient all-reduce. On 2 CPU processes, 10 samples in batches of 2: one process
    trained 2 steps and the other hung in its third. On one process nothing shows.

    ## Example
    ```python
    accelerator = Accelerator(dataloader_config=DataLoaderConfiguration(even_batches=False))
    model, optimizer, train_dataloader = accelerator.prepare(model, optimizer, train_dataloader)
    for batch in train_dataloader:
        accelerator.backward(model(**batch).loss)
        optimizer.step()
    ```

    ## Use instead
    ```python
    accelerator = Accelerator()  # even batches: every process runs the same steps
    model, optimizer, train_dataloader = accelerator.prepare(model, optimizer, train_dataloader)
    for batch in train_dataloader:
        accelerator.backward(model(**batch).loss)
        optimizer.step()
    ```
    or train inside `with accelerator.join_uneven_inputs([model]):` (DDP on GPUs), and keep
    uneven batches for evaluation only (`join_uneven_inputs([], even_batches=False)`).
    """

    code = "ACL011"
    name = "uneven-batches-in-training"
    severity = Severity.ERROR

    VALID = (
        "accelerator = Accelerator()\nmodel, opt, dl = accelerator.prepare(model, opt, dl)\n"
        "for batch in dl:\n    accelerator.backward(model(batch).mean())\n    opt.step()\n",
        # Evaluation only: no process waits for another in a backward pass.
        "config = DataLoaderConfiguration(even_batches=False)\n"
        "accelerator = Accelerator(dataloader_config=config)\n"
        "model, eval_dl = accelerator.prepare(model, eval_dl)\nfor batch in eval_dl:\n"
        "    preds = accelerator.gather_for_metrics(model(batch))\n",
        "accelerator = Accelerator(even_batches=False)\n"
        "model, opt, dl = accelerator.prepare(model, opt, dl)\n"
        "with accelerator.join_uneven_inputs([model]):\n    for batch in dl:\n"
        "        accelerator.backward(model(batch).mean())\n        opt.step()\n",
    )
    INVALID = (
        Invalid(
            "config = DataLoaderConfiguration(even_batches=False)\n"
            "accelerator = Accelerator(dataloader_config=config)\n"
            "model, opt, dl = accelerator.prepare(model, opt, dl)\nfor epoch in range(3):\n"
            "    for batch in dl:\n        accelerator.backward(model(batch).mean())\n"
            "        opt.step()\n"
        ),
        Invalid(
            "def main():\n    accelerator = Accelerator(even_batches=False)\n"
            "    model, opt, loader = accelerator.prepare(model, opt, loader)\n"
            "    for x, y in loader:\n        accelerator.backward(loss_fn(model(x), y))\n"
            "        opt.step()\n"
        ),
        Invalid(
            "accelerator = Accelerator()\naccelerator.even_batches = False\n"
            "model, opt, dl = accelerator.prepare(model, opt, dl)\nfor batch in dl:\n"
            "    accelerator.backward(model(batch).mean())\n    opt.step()\n"
        ),
    )

    def __init__(self, facts: Facts, reports: list[Report]) -> None:
        super().__init__(facts, reports)
        self._asked = "even_batches" in facts.source  # most files never say it: nothing to do
        self._uneven: list[cst.CSTNode] = []  # where even_batches=False is set
        self._loader_loops: list[Loop] = []  # loops over loaders, outside join_uneven_inputs
        self._joined = 0  # depth of join_uneven_inputs blocks around this point

    def visit_Call(self, node: cst.Call) -> None:
        if not self._asked or callee_name(node) not in _CONFIGURES:
            return
        even = keyword_arg(node, "even_batches")
        if even is not None and dotted_name(even.value) == "False":
            self._uneven.append(even)

    def visit_Assign(self, node: cst.Assign) -> None:
        if self._asked and dotted_name(node.value) == "False":
            for target in node.targets:
                attribute = target.target
                if (
                    isinstance(attribute, cst.Attribute)
                    and attribute.attr.value == "even_batches"
                    and self.facts.is_accelerator(attribute.value)
                ):
                    self._uneven.append(node)

    def visit_With(self, node: cst.With) -> None:
        if self._asked and _joins(node):
            self._joined += 1

    def leave_With(self, node: cst.With) -> None:
        if self._asked and _joins(node):
            self._joined -= 1

    def visit_For_body(self, node: cst.For) -> None:
        if not self._asked or self._joined:
            return
        loop = self.facts.innermost_loop()  # the facts open this loop's record first
        if loop is not None and loop.node is node:
            self._loader_loops.append(loop)

    def leave_Module(self, node: cst.Module) -> None:
        if not any(loop.passes and loop.trains for loop in self._loader_loops):
            return
        for where in self._uneven:
            self.report(
                where,
                "`even_batches=False` while training on a prepared loader: where the data does "
                "not divide evenly some processes get a batch fewer and leave the loop, and the "
                "others wait for them in the next gradient all-reduce (a hang); keep even "
                "batches for training, or train inside `join_uneven_inputs([model])`",
            )


def _joins(node: cst.With) -> bool:
    return any(
        isinstance(item.item, cst.Call) and callee_name(item.item) == "join_uneven_inputs"
        for item in node.items
    )
