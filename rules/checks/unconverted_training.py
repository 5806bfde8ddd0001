"""ACL210 unconverted-training."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import libcst as cst

from accelify.rules.facts import Facts
from accelify.rules.rule import Invalid, Report, Rule, Severity

if TYPE_CHECKING:
    from accelify.transform.analysis import Scope

_CODE = "ACL210"


class UnconvertedTraining(Rule):
    """Training that no `Accelerator` runs, for a reason accel-convert cannot fix by itself.

    ## What it does
    Runs accel-convert's own analysis on a script whose training calls `loss.backward()` itself,
    and reports every place it would leave unchanged, with its reason: distribution it does not
    rewrite (FSDP, tensor parallel, RPC, `ZeroRedundancyOptimizer`), an optimizer built only on
    some paths, a model that comes in as a parameter, ... In a script that has an `Accelerator`,
    only a training function that never sees one is reported (a second, forgotten setup).

    Off by default: a plain single-process script is not wrong, and this rule is the linter's
    side of `accel-convert`'s "needs a human" notes (enable it with `--select ACL210` where such
    scripts are meant to run on many processes).

    ## Why is this bad?
    Launched on N processes, training that no `Accelerator` prepares runs N times, each process
    alone on all the data with its own unsynchronised copy of the model.

    ## Example
    ```python
    model = Net()
    if args.sgd:  # no optimizer on the other path: nothing to prepare there
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in loader:
        loss_fn(model(x), y).backward()
        optimizer.step()
    ```

    ## Use instead
    Restructure as the message says and convert it, or port it to `Accelerator` by hand: one
    `accelerator.prepare(...)` for the models, optimizers and loaders, and
    `accelerator.backward(loss)`.
    """

    code = _CODE
    name = "unconverted-training"
    severity = Severity.WARNING
    enabled_by_default = False

    VALID = (
        "import torch\nmodel = Net()\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "loader = torch.utils.data.DataLoader(data)\nfor x, y in loader:\n"
        "    opt.zero_grad()\n    loss_fn(model(x), y).backward()\n    opt.step()\n",
        # Several optimizers refuse conversion, but this training has the accelerator.
        "import torch\nfrom accelerate import Accelerator\n\n\ndef train_gan(accelerator, g, d):\n"
        "    g_opt = torch.optim.Adam(g.parameters())\n"
        "    d_opt = torch.optim.Adam(d.parameters())\n"
        "    g, d, g_opt, d_opt = accelerator.prepare(g, d, g_opt, d_opt)\n"
        "    for x in loader:\n        d(x).mean().backward()\n        d_opt.step()\n"
        "        (-d(g(x)).mean()).backward()\n        g_opt.step()\n\n\n"
        "train_gan(Accelerator(), G(), D())\n",
        # A closure handed to a library for gradient estimation, reached from the trained setup.
        "import torch\nfrom accelerate import Accelerator\n\n\ndef main():\n"
        "    accelerator = Accelerator()\n    model = Net()\n"
        "    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "    model, opt, dl = accelerator.prepare(model, opt, dl)\n    for x in dl:\n"
        "        accelerator.backward(model(x).mean())\n        opt.step()\n"
        "    curvature(model, x)\n\n\ndef curvature(net, x):\n    def closure():\n"
        "        loss = net(x).pow(2).mean()\n        loss.backward()\n        return loss\n\n"
        "    return hessian_trace(net, closure)\n\n\nmain()\n",
    )
    INVALID = (
        Invalid(
            "import torch\nfrom torch.distributed.fsdp import FullyShardedDataParallel as FSDP\n"
            "model = FSDP(Net())\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
            "for x, y in loader:\n    loss_fn(model(x), y).backward()\n    opt.step()\n"
        ),
        Invalid(
            "import torch\n\n\ndef main():\n    model = Net()\n    if args.sgd:\n"
            "        opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
            "    for x, y in torch.utils.data.DataLoader(data):\n"
            "        loss_fn(model(x), y).backward()\n        opt.step()\n",
        ),
        Invalid(
            "import torch\nfrom accelify.runtime import Accelerator\n\n\ndef classify():\n"
            "    accelerator = Accelerator()\n    model = Net()\n"
            "    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
            "    model, opt, dl = accelerator.prepare(model, opt, dl)\n    for x, y in dl:\n"
            "        accelerator.backward(loss_fn(model(x), y))\n        opt.step()\n\n\n"
            "def train_gan():\n    g, d = G(), D()\n    g_opt = torch.optim.Adam(g.parameters())\n"
            "    d_opt = torch.optim.Adam(d.parameters())\n    for (real,) in loader:\n"
            "        d(real).mean().backward()\n        d_opt.step()\n"
            "        (-d(g(real)).mean()).backward()\n        g_opt.step()\n",
        ),
    )

    def __init__(self, facts: Facts, reports: list[Report]) -> None:
        super().__init__(facts, reports)
        self._plain_backward = False  # the cheap gate in front of the converter's analysis

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if (
            isinstance(func, cst.Attribute)
            and func.attr.value == "backward"
            and not self.facts.is_accelerator(func.value)
        ):
            self._plain_backward = True

    def leave_Module(self, node: cst.Module) -> None:
        if not self._plain_backward:
            return
        if self.facts.creates_accelerator:
            self._forgotten_setups(node)
            return
        # The converter loads only for files that get this far (start-up of every lint run).
        from accelify.transform.convert import refusals

        for note in refusals(node, self.facts.source):
            if note.code == _CODE and note.node is not None:
                self._report(note.node, note.message)

    def _forgotten_setups(self, module: cst.Module) -> None:
        """Setups the converter would refuse, in functions that never see an accelerator and that
        no function seeing one reaches (a closure handed to a library for gradient estimation):
        the others are Accelerate code it was never meant to convert."""
        from accelify.transform.analysis import analyse
        from accelify.transform.setup import find_setup, reachable

        analysis = analyse(module)
        _setup, refusals = find_setup(analysis)
        if not refusals:
            return
        names = re.compile(
            rf"\b({'|'.join(map(re.escape, {*self.facts.accelerators, 'accelerator'}))})\b"
        )
        with_accelerator: set[Scope] = set()
        for scope in analysis.scopes:
            function = scope.node
            if isinstance(function, cst.FunctionDef) and (
                self.facts.called_with_accelerator(function)
                or names.search(module.code_for_node(function))
            ):
                with_accelerator |= reachable(analysis, scope)
        for refused, reason in refusals:
            scope = analysis.scope_of[id(refused)]
            if isinstance(scope.node, cst.FunctionDef) and scope not in with_accelerator:
                self._report(refused, reason)

    def _report(self, node: cst.CSTNode, reason: str) -> None:
        why = reason.removeprefix("left unchanged: ")
        self.report(node, f"no Accelerator runs this training, and accel-convert cannot: {why}")
