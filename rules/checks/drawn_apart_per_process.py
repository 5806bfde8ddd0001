"""ACL216 drawn-apart-per-process."""

from __future__ import annotations

import libcst as cst

from accelify.rules.facts import RANK_NAMES, Facts, mentions_rank
from accelify.rules.rule import Invalid, Report, Rule, Severity
from accelify.transform.analysis import analyse
from accelify.transform.draws import drawn_apart, drawn_beside, drawn_for_every_step, unseeded_draw
from accelify.transform.patterns import callee_name, dotted_name, keyword_arg, unseeded_split

_SEEDS = frozenset({"set_seed", "manual_seed", "seed"})


class DrawnApartPerProcess(Rule):
    """A random split, or a value every training step reads, drawn apart on each process.

    ## What it does
    In a script that seeds per process (`set_seed(seed, device_specific=True)`, or a seed that
    adds the process index), flags `random_split(...)` without `generator=`, scikit-learn's
    `train_test_split(...)` without `random_state=` and `datasets`' `.train_test_split(...)`
    without `seed=`. In a script that creates an `Accelerator` and seeds nothing (each process
    then starts from its own random state), flags those splits too, and a result bound from a
    function of a module beside the script that draws from an unseeded random stream
    (`adj_train, ... = mask_test_edges(adj)`, which shuffles with `np.random`): what it draws
    for is not read, so that finding says so. And, in such a script, a name bound once before
    training from a draw of a stream nothing seeds (`np.random.permutation(784)` where only
    torch is seeded) that a training loop reads (accel-convert's note, read by the same
    analysis).

    ## Why is this bad?
    Each process draws its own split: the items one process trains on are in another's eval
    set, so the evaluation reads training data and the reported scores are too good. A value
    every step applies (a pixel permutation, a random projection) differs from one process to
    the next, so the replicas learn different tasks and their averaged gradients mix them.
    Nothing fails; on one process all is fine.

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
    name = "drawn-apart-per-process"
    severity = Severity.WARNING

    VALID = (
        "set_seed(42)\ntrain, val = random_split(data, [0.9, 0.1])\n",
        "set_seed(42, device_specific=True)\n"
        "train, val = random_split(data, [0.9, 0.1], generator=torch.Generator().manual_seed(0))\n",
        "set_seed(args.seed, device_specific=True)\n"
        "parts = raw['train'].train_test_split(test_size=0.1, seed=args.seed)\n",
        # One process: its split is the only one.
        "train, val = random_split(data, [0.9, 0.1])\n",
        # Every stream seeded: each process draws the same permutation; noise drawn per step.
        "import numpy as np\n\naccelerator = Accelerator()\nset_seed(0)\n"
        "permute = np.random.permutation(784)\nfor x, y in loader:\n"
        "    noise = np.random.randn(3)\n    accelerator.backward(model(x[:, permute]).sum())\n",
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
            "import torch\nfrom torch.utils.data import random_split\n\n"
            "accelerator = Accelerator()\ntrain, val = random_split(data, [0.9, 0.1])\n"
        ),
        Invalid(
            "import numpy as np\nimport torch\n\naccelerator = Accelerator()\n"
            "torch.manual_seed(0)\npermute = torch.from_numpy(np.random.permutation(784))\n"
            "for x, y in loader:\n    loss = model(x[:, permute]).sum()\n"
            "    accelerator.backward(loss)\n"
        ),
        Invalid(
            "import torch\n\n\ndef load(seed):\n"
            "    return raw['train'].train_test_split(test_size=0.1)\n\n\n"
            "set_seed(1234, device_specific=True)\n"
        ),
    )

    def __init__(self, facts: Facts, reports: list[Report]) -> None:
        super().__init__(facts, reports)
        self._seeded = self._per_process = False
        self._splits: list[cst.Call] = []

    def visit_Call(self, node: cst.Call) -> None:
        name = callee_name(node)
        if name in _SEEDS and node.args:
            self._seeded = True
            specific = keyword_arg(node, "device_specific")
            if (specific is not None and _true(specific.value)) or any(
                _per_process(arg.value) for arg in node.args
            ):
                self._per_process = True
        elif unseeded_split(node):
            self._splits.append(node)

    def leave_Module(self, node: cst.Module) -> None:
        if self._per_process:
            why = "each process seeded itself differently"
        elif not self.facts.creates_accelerator:
            return
        else:
            why = None if self._seeded else "nothing seeds this script"
        for split in self._splits if why else ():
            self.report(
                split,
                f"{why}, so each draws its own split: one process trains on another's eval "
                "items; give the split its own seed (the same on every process)",
            )
        if self._per_process:
            return
        a = analyse(node, self.facts.path or "<string>")
        for drawn in drawn_for_every_step(a):
            self.report(drawn.node, drawn_apart(a, drawn))
        for call, qualified in drawn_beside(a):
            self.report(call, unseeded_draw(a.module.code_for_node(call.func), qualified))


def _true(value: cst.BaseExpression) -> bool:
    return not (isinstance(value, cst.Name) and value.value in ("False", "None"))


def _per_process(value: cst.BaseExpression) -> bool:
    """A seed that reads the process index (``seed + accelerator.process_index``)."""
    if isinstance(value, cst.Name | cst.Attribute):  # the common forms, without printing code
        name = dotted_name(value) or ""
        return name.rsplit(".", 1)[-1] in RANK_NAMES
    return not isinstance(value, cst.Integer) and mentions_rank(value)
