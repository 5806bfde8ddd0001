"""ACL208 stale-optimizer-params."""

from __future__ import annotations

import libcst as cst

from accelify.rules.facts import Facts, prepare_call
from accelify.rules.rule import Invalid, Report, Rule, Severity
from accelify.transform.patterns import Role, constructor_role, dotted_name, target_names


class StaleOptimizerParams(Rule):
    """An optimizer built from a model's parameters, then the model prepared without it.

    ## What it does
    Flags an optimizer created from `model.parameters()` before `model` is prepared, when the
    `prepare` call that wraps `model` does not also take the optimizer.

    ## Why is this bad?
    FSDP and DeepSpeed replace the model's parameters with flattened, sharded ones when they wrap
    it. `prepare` can rebind an optimizer's parameters only when it sees model and optimizer in
    the same call; otherwise the optimizer keeps updating the old tensors and the model never
    learns (no error, a flat loss curve). Under DDP it happens to work, which is how it ships.

    ## Example
    ```python
    optimizer = AdamW(model.parameters(), lr=1e-4)
    model = accelerator.prepare(model)
    optimizer = accelerator.prepare(optimizer)
    ```

    ## Use instead
    ```python
    optimizer = AdamW(model.parameters(), lr=1e-4)
    model, optimizer = accelerator.prepare(model, optimizer)
    ```
    """

    code = "ACL208"
    name = "stale-optimizer-params"
    severity = Severity.WARNING

    VALID = (
        "accelerator = Accelerator()\noptimizer = AdamW(model.parameters())\n"
        "model, optimizer = accelerator.prepare(model, optimizer)",
        "accelerator = Accelerator()\nmodel = accelerator.prepare(model)\n"
        "optimizer = AdamW(model.parameters())\noptimizer = accelerator.prepare(optimizer)",
        "accelerator = Accelerator()\n\ndef setup():\n    model = accelerator.prepare(model)\n\n"
        "def train():\n    optimizer = SGD(model.parameters())\n"
        "    model, optimizer = accelerator.prepare(model, optimizer)",
    )
    INVALID = (
        Invalid(
            "accelerator = Accelerator()\noptimizer = AdamW(model.parameters(), lr=1e-4)\n"
            "model = accelerator.prepare(model)\noptimizer = accelerator.prepare(optimizer)\n"
        ),
    )

    def __init__(self, facts: Facts, reports: list[Report]) -> None:
        super().__init__(facts, reports)
        self._models: set[str] | None = None  # while inside an optimizer's constructor
        # Optimizers not yet seen in a prepare call, per function: (name, constructor, models).
        self._open: dict[cst.FunctionDef | None, list[tuple[str, cst.Call, set[str]]]] = {}

    def visit_Assign_value(self, node: cst.Assign) -> None:
        if constructor_role(node.value) is Role.OPTIMIZER:
            self._models = set()

    def leave_Assign_value(self, node: cst.Assign) -> None:
        names = [n for t in node.targets for n in target_names(t.target)]
        if self._models and len(names) == 1 and isinstance(node.value, cst.Call):
            entry = (names[0], node.value, self._models)
            self._open.setdefault(self.facts.function(), []).append(entry)
        self._models = None

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if (
            self._models is not None
            and isinstance(func, cst.Attribute)
            and func.attr.value in {"parameters", "named_parameters"}
            and self.facts.prepared(func.value) is None
        ):
            name = dotted_name(func.value)
            if name is not None:
                self._models.add(name)
        elif prepare_call(node, self.facts) is not None:
            self._prepared(node)

    def _prepared(self, call: cst.Call) -> None:
        """The first prepare call (same function) that takes an optimizer's model decides."""
        args = {dotted_name(a.value) for a in call.args}
        still_open = []
        for optimizer, constructor, models in self._open.get(self.facts.function(), []):
            if not models & args:
                still_open.append((optimizer, constructor, models))
            elif optimizer not in args:
                model = sorted(models & args)[0]  # type: ignore[type-var]
                self.report(
                    constructor,
                    f"built from `{model}`'s parameters, but `{model}` is prepared without "
                    "this optimizer: under FSDP/DeepSpeed it updates stale tensors; prepare "
                    "them in one call",
                )
        self._open[self.facts.function()] = still_open
