"""ACL007 prepare-wrapped-model."""

from __future__ import annotations

import libcst as cst

from accelify.rules.facts import Facts, prepare_call
from accelify.rules.imports import ImportsRule
from accelify.rules.rule import Invalid, Report, Severity
from accelify.transform.patterns import dotted_name, target_names


class PrepareWrappedModel(ImportsRule):
    """A model already wrapped in `DistributedDataParallel`/FSDP/`DataParallel` given to `prepare`.

    ## What it does
    Flags an argument of `accelerator.prepare(...)`/`prepare_model(...)` that is a
    `DistributedDataParallel(...)`, `FullyShardedDataParallel(...)` or `DataParallel(...)`,
    built there or bound to a name before (imports followed: `DDP` counts when it was imported
    as `DistributedDataParallel`).

    ## Why is this bad?
    `prepare` wraps the model for the configured backend itself. A wrapper inside a wrapper
    synchronises gradients twice, or fails outright: FSDP and DeepSpeed cannot shard a DDP
    module, and DDP refuses to wrap a module whose parameters another DDP already manages.

    ## Example
    ```python
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = DDP(model, device_ids=[local_rank])
    model, optimizer = accelerator.prepare(model, optimizer)
    ```

    ## Use instead
    ```python
    model, optimizer = accelerator.prepare(model, optimizer)
    ```
    """

    code = "ACL007"
    name = "prepare-wrapped-model"
    severity = Severity.ERROR

    VALID = (
        "from torch.nn.parallel import DistributedDataParallel as DDP\n"
        "accelerator = Accelerator()\nmodel, opt = accelerator.prepare(model, opt)\n",
        "from torch.nn.parallel import DistributedDataParallel as DDP\n"
        "accelerator = Accelerator()\nmodel = DDP(model)\nmodel = Net()\n"
        "model = accelerator.prepare(model)\n",
        "from mylib import DDP\naccelerator = Accelerator()\n"
        "model = accelerator.prepare(DDP(model))  # not torch's\n",
        "from torch.nn.parallel import DistributedDataParallel as DDP\n\n\ndef legacy(model):\n"
        "    model = DDP(model)\n\n\ndef main(model, accelerator):\n"
        "    model = accelerator.prepare(model)\n",
    )
    INVALID = (
        Invalid(
            "from torch.nn.parallel import DistributedDataParallel as DDP\n\n\ndef main():\n"
            "    accelerator = Accelerator()\n    model = Net().to(accelerator.device)\n"
            "    if args.distributed:\n        model = DDP(model, device_ids=[args.local_rank])\n"
            "    model, opt = accelerator.prepare(model, opt)\n"
        ),
        Invalid(
            "import torch\naccelerator = Accelerator()\n"
            "net = accelerator.prepare_model(torch.nn.DataParallel(Net()))\n"
        ),
    )

    def __init__(self, facts: Facts, reports: list[Report]) -> None:
        super().__init__(facts, reports)
        # (function, name) -> the wrapper last bound to the name there (None: module level)
        self._wrapped: dict[tuple[cst.FunctionDef | None, str], str] = {}

    def leave_Assign(self, node: cst.Assign) -> None:
        wrapper = self.wrapper(node.value)
        if wrapper is None and not self._wrapped:
            return
        function = self.facts.function()
        for target in node.targets:
            for name in target_names(target.target):
                if wrapper is not None:
                    self._wrapped[function, name] = wrapper
                else:
                    self._wrapped.pop((function, name), None)

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        single = (
            isinstance(func, cst.Attribute)
            and func.attr.value == "prepare_model"
            and self.facts.is_accelerator(func.value)
        )
        if not single and prepare_call(node, self.facts) is None:
            return
        function = self.facts.function()
        for arg in node.args[:1] if single else node.args:
            name = dotted_name(arg.value)
            wrapper = self.wrapper(arg.value) or self._wrapped.get((function, name or ""))
            if wrapper is not None:
                self.report(
                    arg.value,
                    f"this model is already wrapped in {wrapper}; `prepare` wraps it for the "
                    "backend itself: pass the plain model",
                )
