"""ACL008 hand-written-distribution."""

from __future__ import annotations

import libcst as cst

from accelify.rules.facts import Facts
from accelify.rules.imports import WRAPPERS, ImportsRule
from accelify.rules.rule import Invalid, Report, Severity
from accelify.transform.patterns import Role, callee_name

_SPAWNS = ("spawn", "start_processes")
_CALLS = frozenset({"init_process_group", *_SPAWNS, *WRAPPERS})


class HandWrittenDistribution(ImportsRule):
    """Hand-written distribution where an `Accelerator` already distributes the script.

    ## What it does
    Where an accelerator is in sight, flags `torch.distributed.init_process_group(...)` (unless
    under `if not dist.is_initialized():`), `torch.multiprocessing.spawn`/`start_processes`,
    and a `DistributedDataParallel`/FSDP/`DataParallel` wrapped around a prepared model.

    ## Why is this bad?
    The launcher and the `Accelerator` already started the processes, joined them in a process
    group and wrapped the prepared model. A second `init_process_group` raises "trying to
    initialize the default process group twice" on the cluster; spawning starts N processes in
    each of the N launched ones; a second wrapper reduces gradients twice or fails.

    ## Example
    ```python
    accelerator = Accelerator()
    dist.init_process_group("nccl")
    model = DDP(accelerator.prepare(model))
    ```

    ## Use instead
    ```python
    accelerator = Accelerator()
    model = accelerator.prepare(model)
    ```
    """

    code = "ACL008"
    name = "hand-written-distribution"
    severity = Severity.ERROR

    VALID = (
        "import torch.distributed as dist\naccelerator = Accelerator()\n"
        "if not dist.is_initialized():\n    dist.init_process_group('gloo')\n",
        "import torch.distributed as dist\ndist.init_process_group('nccl')  # no accelerator\n",
        "import torch.multiprocessing as mp\n\n\ndef worker(rank):\n    pass\n\n\n"
        "mp.spawn(worker, nprocs=2)\n",
        "from torch.nn.parallel import DistributedDataParallel as DDP\n"
        "accelerator = Accelerator()\nteacher = DDP(Teacher())\n",
    )
    INVALID = (
        Invalid(
            "import torch.distributed as dist\n\n\ndef main():\n    accelerator = Accelerator()\n"
            "    if args.distributed:\n        dist.init_process_group(backend='nccl')\n"
        ),
        Invalid(
            "from torch.nn.parallel import DistributedDataParallel as DDP\n"
            "accelerator = Accelerator()\nmodel, opt = accelerator.prepare(model, opt)\n"
            "model = DDP(model, device_ids=[accelerator.local_process_index])\n"
        ),
        Invalid(
            "import torch.multiprocessing as mp\n\n\ndef run(accelerator):\n"
            "    mp.spawn(train, args=(accelerator,), nprocs=4)\n"
        ),
    )

    def __init__(self, facts: Facts, reports: list[Report]) -> None:
        super().__init__(facts, reports)
        self._checked = 0  # open ``if`` blocks that test ``is_initialized()``

    def visit_If(self, node: cst.If) -> None:
        self._checked += _tests_initialized(node.test)

    def leave_If(self, node: cst.If) -> None:
        self._checked -= _tests_initialized(node.test)

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        name = callee_name(node)
        if name not in _CALLS and name not in self.names.imports:  # cheap: most calls stop here
            return
        last = self.names.last_part(func)
        if last not in _CALLS or not self.facts.where().accelerator:
            return
        if self.builds(node, "init_process_group") and not self._checked:
            message = (
                "the accelerator already joined the processes in a process group: a second "
                "`init_process_group` fails on the cluster; drop it"
            )
        elif last in _SPAWNS and self.names.from_package(func, "torch.multiprocessing"):
            message = (
                "the launcher already started every process: spawning here starts N more in "
                "each; launch with `accel-run`/`accelerate launch` instead"
            )
        elif (wrapper := self.wrapper(node)) is not None and self._wraps_prepared(node):
            message = (
                f"this model came out of `prepare`, which already wrapped it: {wrapper} around "
                "it synchronises twice; drop the wrapper"
            )
        else:
            return
        self.report(node, message)

    def _wraps_prepared(self, call: cst.Call) -> bool:
        if not call.args:
            return False
        prepared = self.facts.prepared(call.args[0].value)
        return prepared is not None and prepared.role is Role.MODEL


def _tests_initialized(test: cst.BaseExpression) -> int:
    inner = test.expression if isinstance(test, cst.UnaryOperation) else test
    return int(isinstance(inner, cst.Call) and callee_name(inner) == "is_initialized")
