"""ACL206 redundant-device-move."""

from __future__ import annotations

import libcst as cst

from accelify.rules.facts import Facts, Prepared
from accelify.rules.rule import Invalid, Report, Rule, Severity
from accelify.transform import patterns
from accelify.transform.patterns import (
    Role,
    callee_name,
    dotted_name,
    keyword_arg,
    target_names,
)


def device_move(call: cst.Call) -> bool:
    """``x.to(<device>)`` (maybe ``non_blocking=``) or ``x.cuda()``: a move and nothing else."""
    if patterns.device_move(call) is None:
        return False
    extra = {a.keyword.value if a.keyword else "" for a in call.args[1:]}
    first = call.args[0].keyword.value if call.args and call.args[0].keyword else ""
    return extra <= {"non_blocking"} and first in {"", "device"}


class RedundantDeviceMove(Rule):
    """`.to(device)`/`.cuda()` on a prepared model or on batches of a prepared loader.

    ## What it does
    Flags device moves of objects `accelerator.prepare` already placed: the prepared model, and
    batches (or parts of batches) taken from a prepared `DataLoader`, also when a comprehension
    moves them one by one (`{k: v.to(device) for k, v in batch.items()}`,
    `tuple(t.to(device) for t in batch)`).

    Off by default: on the HF Accelerate and diffusers examples every move it found was a
    no-op, right but cosmetic (`--select ACL206`, or `--fix` with it, to tidy them away).

    ## Why is this bad?
    Accelerate puts them on the right device already. On DDP the move is a no-op; under
    DeepSpeed/FSDP (sharded or offloaded parameters) moving the wrapped model is wrong, and
    hard-coded `"cuda"` breaks CPU, MPS and multi-GPU runs alike.

    ## Example
    ```python
    train_dataloader = accelerator.prepare(train_dataloader)
    for batch in train_dataloader:
        batch = batch.to(device)
    ```

    ## Use instead
    ```python
    train_dataloader = accelerator.prepare(train_dataloader)
    for batch in train_dataloader:
        ...  # already on accelerator.device
    ```

    ## Fix safety
    Safe: the move is replaced by the object itself (or the statement is dropped), and the rule
    stays silent when `Accelerator(device_placement=False)` asks for manual placement.
    """

    code = "ACL206"
    name = "redundant-device-move"
    severity = Severity.WARNING
    enabled_by_default = False

    VALID = (
        "accelerator = Accelerator()\nmodel = Net().to(device)\nmodel = accelerator.prepare(model)",
        "accelerator = Accelerator()\ndl = accelerator.prepare(dl)\nfor x, y in dl:\n"
        "    x = x.to(torch.float16)",
        "accelerator = Accelerator(device_placement=False)\ndl = accelerator.prepare(dl)\n"
        "for batch in dl:\n    batch = batch.to(accelerator.device)",
        "accelerator = Accelerator()\nfor batch in raw_loader:\n    batch = batch.to(device)",
        "accelerator = Accelerator()\ndl = accelerator.prepare(dl)\nfor batch in dl:\n"
        "    extra = {k: v.to(device) for k, v in cache.items()}\n"
        "    moved = [b.to(device) for b in batch.values() for b in buffers]",
    )
    INVALID = (
        Invalid(
            "accelerator = Accelerator()\nmodel, dl = accelerator.prepare(model, dl)\n"
            "for step, (x, y) in enumerate(dl):\n    x = x.to(device)\n    out = model(x)\n",
            "accelerator = Accelerator()\nmodel, dl = accelerator.prepare(model, dl)\n"
            "for step, (x, y) in enumerate(dl):\n    x = x\n    out = model(x)\n",
        ),
        Invalid(
            "accelerator = Accelerator()\ntrain_loader = accelerator.prepare(train_loader)\n"
            "for batch in train_loader:\n    ids = batch['input_ids'].cuda()\n",
            "accelerator = Accelerator()\ntrain_loader = accelerator.prepare(train_loader)\n"
            "for batch in train_loader:\n    ids = batch['input_ids']\n",
        ),
        Invalid(
            "accelerator = Accelerator()\ntrain_dl = accelerator.prepare(train_dl)\n"
            "def train():\n    for batch in train_dl:\n"
            "        batch = {k: v.to(device) for k, v in batch.items()}\n",
            "accelerator = Accelerator()\ntrain_dl = accelerator.prepare(train_dl)\n"
            "def train():\n    for batch in train_dl:\n"
            "        batch = {k: v for k, v in batch.items()}\n",
        ),
        Invalid(
            "accelerator = Accelerator()\ndl = accelerator.prepare(dl)\nfor batch in dl:\n"
            "    if accelerator.is_main_process:\n"
            "        inputs, labels = tuple(t.to(device) for t in batch)\n",
            "accelerator = Accelerator()\ndl = accelerator.prepare(dl)\nfor batch in dl:\n"
            "    if accelerator.is_main_process:\n"
            "        inputs, labels = tuple(t for t in batch)\n",
        ),
        Invalid(
            "accelerator = Accelerator()\nmodel = accelerator.prepare(model)\n"
            "model.to(accelerator.device)\nmodel.train()\n",
            "accelerator = Accelerator()\nmodel = accelerator.prepare(model)\nmodel.train()\n",
        ),
    )

    def __init__(self, facts: Facts, reports: list[Report]) -> None:
        super().__init__(facts, reports)
        self._manual = False  # Accelerator(device_placement=...) given: placement is the user's
        self._statement_call: cst.Call | None = None
        # Per open comprehension: the names its ``for`` binds to parts of a prepared batch.
        self._comprehensions: list[dict[str, Prepared]] = []

    def _enter_comprehension(
        self, node: cst.ListComp | cst.SetComp | cst.GeneratorExp | cst.DictComp
    ) -> None:
        self._comprehensions.append(self._batch_parts(node.for_in))

    def _leave_comprehension(
        self, node: cst.ListComp | cst.SetComp | cst.GeneratorExp | cst.DictComp
    ) -> None:
        self._comprehensions.pop()

    # The element comes before its ``for`` in the walk, so the names are bound on entering.
    visit_ListComp = visit_SetComp = visit_GeneratorExp = visit_DictComp = _enter_comprehension
    leave_ListComp = leave_SetComp = leave_GeneratorExp = leave_DictComp = _leave_comprehension

    def _batch_parts(self, comp: cst.CompFor | None) -> dict[str, Prepared]:
        """Names each ``for`` of a comprehension binds to a batch's parts: ``for t in batch``,
        ``for v in batch.values()``, ``for k, v in batch.items()``; a later ``for`` rebinding a
        name takes it back."""
        parts: dict[str, Prepared] = {}
        while comp is not None:
            iterable, target = comp.iter, comp.target
            items = _method(iterable, "items")
            if items is not None:
                iterable = items
                pair = target.elements if isinstance(target, cst.Tuple) else ()
                target = pair[1].value if len(pair) == 2 else None
            else:
                iterable = _method(iterable, "values") or iterable
            batch = self._batch(iterable)
            for name in target_names(comp.target):
                parts.pop(name, None)
            if batch is not None and target is not None:
                parts.update(dict.fromkeys(target_names(target), batch))
            comp = comp.inner_for_in
        return parts

    def _batch(self, expr: cst.BaseExpression) -> Prepared | None:
        """The prepared loader whose batch ``expr`` names, in a comprehension or outside."""
        name = dotted_name(expr)
        for parts in reversed(self._comprehensions):
            if name in parts:
                return parts[name]
        return self.facts.batch_of(expr)

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        """A bare ``model.to(device)`` statement: the fix drops the whole line."""
        if len(node.body) == 1 and isinstance(node.body[0], cst.Expr):
            call = node.body[0].value
            if isinstance(call, cst.Call):
                self._statement_call = call
                self._check(call, statement=node)

    def visit_Call(self, node: cst.Call) -> None:
        if callee_name(node) == "Accelerator" and keyword_arg(node, "device_placement"):
            self._manual = True
        if node is not self._statement_call:
            self._check(node)

    def _moved(self, call: cst.Call) -> Prepared | None:
        """The prepared object ``call`` moves, if it is a device move of one."""
        if not device_move(call):
            return None
        receiver = call.func.value  # type: ignore[attr-defined]
        base = receiver.value if isinstance(receiver, cst.Subscript) else receiver
        batch = self._batch(base)
        if batch is not None:
            return batch
        model = self.facts.prepared(receiver)
        return model if model is not None and model.role is Role.MODEL else None

    def _check(self, call: cst.Call, statement: cst.SimpleStatementLine | None = None) -> None:
        prepared = None if self._manual else self._moved(call)
        if prepared is None:
            return
        what = (
            "the prepared model"
            if prepared.role is Role.MODEL and prepared.name == dotted_name(call.func.value)  # type: ignore[attr-defined]
            else f"a batch of `{prepared.name}`"
        )
        message = f"{what} is already on the accelerator's device; drop the move"
        if statement is not None:
            self.report(call, message, replace=statement, new=cst.RemovalSentinel.REMOVE)
        else:
            self.report(call, message, new=call.func.value)  # type: ignore[attr-defined]


def _method(expr: cst.BaseExpression, method: str) -> cst.BaseExpression | None:
    """The receiver of ``expr`` when it is ``receiver.<method>()``."""
    if (
        isinstance(expr, cst.Call)
        and not expr.args
        and isinstance(expr.func, cst.Attribute)
        and expr.func.attr.value == method
    ):
        return expr.func.value
    return None
