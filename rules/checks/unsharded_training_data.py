"""ACL211 unsharded-training-data."""

from __future__ import annotations

import libcst as cst

from accelify.rules.facts import Facts, prepare_call
from accelify.rules.prepared import is_loader
from accelify.rules.rule import Invalid, Report, Rule, Severity
from accelify.transform.patterns import RANK_NAMES, Role


class UnshardedTrainingData(Rule):
    """Training with a prepared model on data that no prepared `DataLoader` shards.

    ## What it does
    In a script that trains a prepared model with `accelerator.backward` and prepares no
    `DataLoader` at all, reports the training loop that slices tensors by hand, iterates
    something that is not a `DataLoader` (a torchtext iterator, an environment), or iterates a
    `DataLoader` that was never passed to `accelerator.prepare`. It uses accel-convert's own
    analysis of which loops train; scripts that shard by hand (`process_index`, `rank`,
    `split_between_processes`, a `DistributedSampler`) are left alone.

    ## Why is this bad?
    Only a prepared loader gives each process its own shard. Here every process trains on all
    of the data: N processes do the same epoch N times over, and with a shuffled loader they
    average gradients of different orderings of the same data instead of seeing more of it.

    ## Example
    ```python
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    train_loader = DataLoader(train_set, batch_size=32, shuffle=True)
    model, optimizer = accelerator.prepare(model, optimizer)
    for x, y in train_loader:
        accelerator.backward(loss_fn(model(x), y))
        optimizer.step()
    ```

    ## Use instead
    ```python
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    train_loader = DataLoader(train_set, batch_size=32, shuffle=True)
    model, optimizer, train_loader = accelerator.prepare(model, optimizer, train_loader)
    for x, y in train_loader:
        accelerator.backward(loss_fn(model(x), y))
        optimizer.step()
    ```
    """

    code = "ACL211"
    name = "unsharded-training-data"
    severity = Severity.WARNING

    VALID = (
        "import torch\nfrom accelerate import Accelerator\naccelerator = Accelerator()\n"
        "model = Net()\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "loader = torch.utils.data.DataLoader(data)\n"
        "model, opt, loader = accelerator.prepare(model, opt, loader)\nfor x, y in loader:\n"
        "    accelerator.backward(loss_fn(model(x), y))\n    opt.step()\n",
        "import torch\nfrom accelerate import Accelerator\naccelerator = Accelerator()\n"
        "model = Net()\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "model, opt = accelerator.prepare(model, opt)\n"
        "shard = data[accelerator.process_index :: accelerator.num_processes]\n"
        "for i in range(0, len(shard), 8):\n"
        "    accelerator.backward(model(shard[i : i + 8]).sum())\n    opt.step()\n",
        "import torch\nfrom accelerate import Accelerator\naccelerator = Accelerator()\n"
        "model = Net()\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "model, opt, dl = accelerator.prepare(model, opt, torch.utils.data.DataLoader(data))\n"
        "for x, y in dl:\n    accelerator.backward(loss_fn(model(x), y))\n    opt.step()\n",
    )
    INVALID = (
        Invalid(
            "import torch\nfrom accelerate import Accelerator\n\n\ndef main():\n"
            "    accelerator = Accelerator()\n    model = Net()\n"
            "    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
            "    train_loader = torch.utils.data.DataLoader(data, shuffle=True)\n"
            "    model, opt = accelerator.prepare(model, opt)\n"
            "    for epoch in range(3):\n        for x, y in train_loader:\n"
            "            accelerator.backward(loss_fn(model(x), y))\n            opt.step()\n"
        ),
        Invalid(
            "import torch\nfrom accelerate import Accelerator\naccelerator = Accelerator()\n"
            "model = Net()\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
            "model, opt = accelerator.prepare(model, opt)\n\n\ndef train():\n"
            "    for i in range(0, data.size(0), 8):\n"
            "        accelerator.backward(model(data[i : i + 8]).sum())\n        opt.step()\n\n\n"
            "for epoch in range(2):\n    train()\n"
        ),
    )

    def __init__(self, facts: Facts, reports: list[Report]) -> None:
        super().__init__(facts, reports)
        # The cheap gate in front of the converter's analysis: an accelerator trains, no loader
        # is prepared, and nothing shards by hand.
        self._trains = False
        self._prepares_loader = False
        self._shards = False

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if not isinstance(func, cst.Attribute) or not self.facts.is_accelerator(func.value):
            return
        method = func.attr.value
        if method == "backward":
            self._trains = True
        elif method == "prepare_data_loader":
            self._prepares_loader = True
        elif prepare_call(node, self.facts) is not None:
            self._prepares_loader |= any(is_loader(self.facts, a.value) for a in node.args)

    def visit_Name(self, node: cst.Name) -> None:
        self._shards |= node.value in RANK_NAMES

    def leave_Module(self, node: cst.Module) -> None:
        if not self._trains or self._prepares_loader or self._shards:
            return
        # The converter's analysis loads only for files that get this far (start-up of every run).
        from accelify.transform.analysis import analyse
        from accelify.transform.setup import Refused, find_setup

        analysis = analyse(node)
        try:
            setup, _refusals = find_setup(analysis)
        except Refused:
            return
        if setup is None:
            return
        for loop, reason, _advice in setup.unsharded:
            self.report(loop, f"{reason}, so every process trains on all the data")
        for binding in setup.prepared:
            key = binding.key
            if (
                analysis.role(setup.scope, key) is Role.DATALOADER
                and key not in self.facts.prepared_anywhere
            ):
                self.report(
                    binding.node,
                    f"`{key}` is trained on but never passed to `accelerator.prepare`, "
                    "so every process trains on all of it",
                )
