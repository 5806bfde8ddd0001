"""ACL214 sampler-under-prepare."""

from __future__ import annotations

import libcst as cst

from accelify.rules.facts import Facts, prepare_call
from accelify.rules.imports import ImportsRule
from accelify.rules.rule import Invalid, Report, Severity
from accelify.transform.patterns import dotted_name, keyword_arg, target_names

_SAMPLER = "DistributedSampler"


class SamplerUnderPrepare(ImportsRule):
    """A `DataLoader` with a `DistributedSampler` passed to `accelerator.prepare`.

    ## What it does
    Flags the `sampler=` of a torch `DataLoader` that is a `DistributedSampler` (built there or
    bound to a name before), when that loader goes through `accelerator.prepare` or
    `prepare_data_loader`.

    ## Why is this bad?
    The sampler already gives each process 1/N of the dataset, and `prepare` shards the loader's
    batches again: each process trains on 1/N of its 1/N, an epoch covers 1/N of the data, and
    nothing fails.

    ## Example
    ```python
    loader = DataLoader(dataset, batch_size=32, sampler=DistributedSampler(dataset))
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    ```

    ## Use instead
    ```python
    loader = DataLoader(dataset, batch_size=32, shuffle=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    ```
    """

    code = "ACL214"
    name = "sampler-under-prepare"
    severity = Severity.WARNING

    VALID = (
        "from torch.utils.data import DataLoader, DistributedSampler\n"
        "accelerator = Accelerator()\n"
        "loader = DataLoader(ds, sampler=DistributedSampler(ds))  # sharded by hand, not prepared\n"
        "model = accelerator.prepare(model)\n",
        "from torch.utils.data import DataLoader, RandomSampler\naccelerator = Accelerator()\n"
        "loader = DataLoader(ds, sampler=RandomSampler(ds))\n"
        "model, loader = accelerator.prepare(model, loader)\n",
        "from mylib import DistributedSampler\nfrom torch.utils.data import DataLoader\n"
        "accelerator = Accelerator()\nloader = DataLoader(ds, sampler=DistributedSampler(ds))\n"
        "loader = accelerator.prepare(loader)\n",
    )
    INVALID = (
        Invalid(
            "from torch.utils.data import DataLoader\n"
            "from torch.utils.data.distributed import DistributedSampler as DS\n\n\n"
            "def main():\n    accelerator = Accelerator()\n    train_sampler = DS(train_set)\n"
            "    train_loader = DataLoader(train_set, batch_size=32, sampler=train_sampler)\n"
            "    model, opt, train_loader = accelerator.prepare(model, opt, train_loader)\n"
        ),
        Invalid(
            "import torch\naccelerator = Accelerator()\n"
            "dl = accelerator.prepare_data_loader(torch.utils.data.DataLoader(ds, "
            "sampler=torch.utils.data.DistributedSampler(ds)))\n"
        ),
        Invalid(
            "from torch.utils.data import DataLoader, DistributedSampler\n\n\n"
            "def main(args):\n    accelerator = Accelerator()\n"
            "    sampler = DistributedSampler(train_set) if args.distributed else None\n"
            "    loader = DataLoader(train_set, sampler=sampler, shuffle=sampler is None)\n"
            "    model, loader = accelerator.prepare(model, loader)\n"
        ),
    )

    def __init__(self, facts: Facts, reports: list[Report]) -> None:
        super().__init__(facts, reports)
        # Per (function, name): the DistributedSampler argument of the DataLoader bound to it,
        # and the names bound to a DistributedSampler (None: module level).
        self._loaders: dict[tuple[cst.FunctionDef | None, str], cst.Arg] = {}
        self._samplers: set[tuple[cst.FunctionDef | None, str]] = set()

    def leave_Assign(self, node: cst.Assign) -> None:
        value = node.value
        found = self._distributed_sampler(value) if self._loader(value) else None
        sampler = self._is_sampler(value)
        if found is None and not sampler and not self._loaders and not self._samplers:
            return
        function = self.facts.function()
        for target in node.targets:
            for name in target_names(target.target):
                key = (function, name)
                if found is not None:
                    self._loaders[key] = found
                else:
                    self._loaders.pop(key, None)
                if sampler:
                    self._samplers.add(key)
                else:
                    self._samplers.discard(key)

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        single = (
            isinstance(func, cst.Attribute)
            and func.attr.value == "prepare_data_loader"
            and self.facts.is_accelerator(func.value)
        )
        if not single and prepare_call(node, self.facts) is None:
            return
        function = self.facts.function()
        for arg in node.args[:1] if single else node.args:
            value = arg.value
            if self._loader(value):
                sampler = self._distributed_sampler(value)
            else:
                sampler = self._loaders.get((function, dotted_name(value) or ""))
            if sampler is not None:
                self.report(
                    sampler,
                    "this DataLoader is passed to `accelerator.prepare`, which shards it again: "
                    "each process reads 1/N of its 1/N; drop the DistributedSampler",
                )

    def _loader(self, value: cst.BaseExpression) -> bool:
        return self.builds(value, "DataLoader")

    def _is_sampler(self, value: cst.BaseExpression) -> bool:
        """A DistributedSampler, also on one side of ``... if distributed else None``."""
        if isinstance(value, cst.IfExp):
            return self._is_sampler(value.body) or self._is_sampler(value.orelse)
        return self.builds(value, _SAMPLER)

    def _distributed_sampler(self, loader: cst.BaseExpression) -> cst.Arg | None:
        """The ``sampler=`` argument of a ``DataLoader(...)`` call, if a DistributedSampler."""
        arg = keyword_arg(loader, "sampler")  # type: ignore[arg-type]
        if arg is None:
            return None
        if self._is_sampler(arg.value):
            return arg
        function = self.facts.function()
        name = dotted_name(arg.value)
        return arg if name and (function, name) in self._samplers else None
