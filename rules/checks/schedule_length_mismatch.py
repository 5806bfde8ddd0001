"""ACL204 schedule-length-mismatch."""

from __future__ import annotations

import libcst as cst

from accelify.rules.facts import Facts, name_role
from accelify.rules.rule import Invalid, Report, Rule, Severity
from accelify.transform.patterns import Role, constructor_role, dotted_name, target_names

# A length scaled by the process count means the author already did the arithmetic.
_ADJUSTED = ("<num_processes>", False)


class ScheduleLengthMismatch(Rule):
    """A learning-rate schedule sized from the wrong loader length.

    ## What it does
    Follows `len(loader)` into the arguments of a scheduler and flags two mismatches: the length
    taken *before* `prepare` shards the loader while the scheduler itself is not prepared, and
    the length taken *after* `prepare` while the scheduler is prepared too.

    ## Why is this bad?
    A prepared loader yields 1/N of the batches on each of N processes. A prepared scheduler
    steps N times per optimizer step to make up for it. So an unprepared scheduler sized from
    the full length only gets through 1/N of its schedule (warm-up and decay N times too long),
    and a prepared one sized from the sharded length ends N times too early.

    ## Example
    ```python
    scheduler = get_scheduler("linear", optimizer, 0, epochs * len(train_dataloader))
    model, optimizer, train_dataloader = accelerator.prepare(model, optimizer, train_dataloader)
    ```

    ## Use instead
    ```python
    scheduler = get_scheduler("linear", optimizer, 0, epochs * len(train_dataloader))
    model, optimizer, train_dataloader, scheduler = accelerator.prepare(
        model, optimizer, train_dataloader, scheduler
    )
    ```
    """

    code = "ACL204"
    name = "schedule-length-mismatch"
    severity = Severity.WARNING

    VALID = (
        "accelerator = Accelerator()\nsteps = epochs * len(train_dl)\n"
        "sched = get_scheduler('linear', opt, 0, steps)\n"
        "model, opt, train_dl, sched = accelerator.prepare(model, opt, train_dl, sched)",
        "accelerator = Accelerator()\n"
        "model, opt, train_dl = accelerator.prepare(model, opt, train_dl)\n"
        "sched = OneCycleLR(opt, max_lr=1e-3, total_steps=epochs * len(train_dl))",
        "accelerator = Accelerator()\n"
        "sched = OneCycleLR(opt, 1e-3, total_steps=len(train_dl) * accelerator.num_processes)\n"
        "model, train_dl = accelerator.prepare(model, train_dl)",
    )
    INVALID = (
        Invalid(
            "accelerator = Accelerator()\nsteps = math.ceil(len(train_dataloader) / accum)\n"
            "args.max_steps = steps * epochs\n"
            "lr_scheduler = get_scheduler('linear', opt, 0, args.max_steps)\n"
            "model, opt, train_dataloader = accelerator.prepare(model, opt, train_dataloader)\n"
        ),
        Invalid(
            "accelerator = Accelerator()\nmodel, opt, dl = accelerator.prepare(model, opt, dl)\n"
            "sched = get_linear_schedule_with_warmup(opt, 100, len(dl) * epochs)\n"
            "sched = accelerator.prepare(sched)\n"
        ),
    )

    def __init__(self, facts: Facts, reports: list[Report]) -> None:
        super().__init__(facts, reports)
        self._deps: dict[str, frozenset[tuple[str, bool]]] = {}
        self._collecting: set[tuple[str, bool]] | None = None
        self._schedulers: list[tuple[str, cst.BaseExpression, frozenset[tuple[str, bool]]]] = []

    def visit_Assign_value(self, node: cst.Assign) -> None:
        self._collecting = set()

    def leave_Assign_value(self, node: cst.Assign) -> None:
        deps = frozenset(self._collecting or ())
        self._collecting = None
        names = [n for t in node.targets for n in target_names(t.target)]
        for name in names:
            self._deps[name] = deps
        if constructor_role(node.value) is Role.SCHEDULER and len(names) == 1 and deps:
            self._schedulers.append((names[0], node.value, deps))

    def visit_Call(self, node: cst.Call) -> None:
        if self._collecting is None:
            return
        if isinstance(node.func, cst.Name) and node.func.value == "len" and len(node.args) == 1:
            loader = node.args[0].value
            name = dotted_name(loader)
            if name is not None and (self.facts.role(loader) or name_role(name)) is Role.DATALOADER:
                self._collecting.add((name, self.facts.prepared(loader) is not None))

    def visit_Name(self, node: cst.Name) -> None:
        self._use(node.value)

    def visit_Attribute(self, node: cst.Attribute) -> None:
        if node.attr.value == "num_processes":
            self._use(None)
        else:
            self._use(dotted_name(node))

    def _use(self, name: str | None) -> None:
        if self._collecting is None:
            return
        if name is None:
            self._collecting.add(_ADJUSTED)
        elif name in self._deps:
            self._collecting |= self._deps[name]

    def leave_Module(self, node: cst.Module) -> None:
        prepared = self.facts.prepared_anywhere
        for scheduler, call, deps in self._schedulers:
            if _ADJUSTED in deps or len({after for _, after in deps}) != 1:
                continue
            loader, after = next(iter(deps))
            if loader not in prepared:
                continue
            if not after and scheduler not in prepared:
                self.report(
                    call,
                    f"sized from `len({loader})` before `prepare` shards it, but the scheduler "
                    "is not prepared: the schedule runs N times too long on N processes; "
                    "pass the scheduler to `accelerator.prepare`",
                )
            elif after and scheduler in prepared:
                self.report(
                    call,
                    f"sized from `len({loader})` after `prepare` sharded it, and the prepared "
                    "scheduler steps N times per step: the schedule ends N times too early; "
                    "take the length before `prepare`",
                )
