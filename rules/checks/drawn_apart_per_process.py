"""ACL216 split-after-per-process-seed."""

from __future__ import annotations

import libcst as cst

from accelify.rules.facts import RANK_NAMES, Facts, mentions_rank
from accelify.rules.rule import Invalid, Report, Rule, Severity
from accelify.transform.patterns import callee_name, dotted_name, keyword_arg, unseeded_split

_SEEDS = frozenset({"set_seed", "manual_seed", "seed"})


class SplitAfterPerProcessSeed(Rule):
    """A random train/eval split drawn after each process seeded itself differently.

    ## What it does
    In a script that seeds per process (`set_seed(seed, device_specific=True)`, or a seed that
    adds the process index), flags `random_split(...)` without `generator=`, scikit-learn's
    `train_test_split(...)` without `random_state=` and `datasets`' `.train_test_split(...)`
    without `seed=`.

    ## Why is this bad?
    Each process draws its own split: the items one process trains on are in another's eval
    set, so the evaluation reads training data and the reported scores are too good. Nothing
    fails; on one process the split is fine.

    ## Example
    ```python
    set_seed(args.seed, device_specific=True)
    train_set, val_set = random_split(dataset, [0.9, 0.1])
    ```

    ## Use instead
    ```python
    set_seed(args.seed, device_specific=True)
    split = torch.Generator().manual_seed(args.seed)  # the same split on every process
    train_set, val_set = random_split(dataset, [0.9, 0.1], generator=split)
    ```
    """

    code = "ACL216"
    name = "split-after-per-process-seed"
    severity = Severity.WARNING

    VALID = (
        "set_seed(42)\ntrain, val = random_split(data, [0.9, 0.1])\n",
        "set_seed(42, device_specific=True)\n"
        "train, val = random_split(data, [0.9, 0.1], generator=torch.Generator().manual_seed(0))\n",
        "set_seed(args.seed, device_specific=True)\n"
        "parts = raw['train'].train_test_split(test_size=0.1, seed=args.seed)\n",
    )
    INVALID = (
        Invalid(
            "import torch\nfrom accelerate.utils import set_seed\n\n\ndef main():\n"
            "    set_seed(args.seed, device_specific=True)\n"
            "    train, val = torch.utils.data.random_split(data, [0.9, 0.1])\n"
        ),
        Invalid(
            "import torch\n\naccelerator = Accelerator()\n"
            "torch.manual_seed(args.seed + accelerator.process_index)\n"
            "x_train, x_val, y_train, y_val = train_test_split(x, y, test_size=0.2)\n"
        ),
        Invalid(
            "import torch\n\n\ndef load(seed):\n"
            "    return raw['train'].train_test_split(test_size=0.1)\n\n\n"
            "set_seed(1234, device_specific=True)\n"
        ),
    )

    def __init__(self, facts: Facts, reports: list[Report]) -> None:
        super().__init__(facts, reports)
        self._per_process = False
        self._splits: list[cst.Call] = []

    def visit_Call(self, node: cst.Call) -> None:
        name = callee_name(node)
        if name in _SEEDS and node.args:
            specific = keyword_arg(node, "device_specific")
            if (specific is not None and _true(specific.value)) or any(
                _per_process(arg.value) for arg in node.args
            ):
                self._per_process = True
        elif unseeded_split(node):
            self._splits.append(node)

    def leave_Module(self, node: cst.Module) -> None:
        if not self._per_process:
            return
        for split in self._splits:
            self.report(
                split,
                "each process seeded itself differently, so each draws its own split: one "
                "process trains on another's eval items; give the split its own seed (the same "
                "on every process)",
            )


def _true(value: cst.BaseExpression) -> bool:
    return not (isinstance(value, cst.Name) and value.value in ("False", "None"))


def _per_process(value: cst.BaseExpression) -> bool:
    """A seed that reads the process index (``seed + accelerator.process_index``)."""
    if isinstance(value, cst.Name | cst.Attribute):  # the common forms, without printing code
        name = dotted_name(value) or ""
        return name.rsplit(".", 1)[-1] in RANK_NAMES
    return not isinstance(value, cst.Integer) and mentions_rank(value)
