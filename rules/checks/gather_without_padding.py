"""ACL215 gather-without-padding."""

from __future__ import annotations

from collections.abc import Callable

import libcst as cst

from accelify.rules.bound import Bound
from accelify.rules.facts import Facts
from accelify.rules.rule import Invalid, Report, Rule, Severity
from accelify.transform.patterns import callee_name, dotted_name, keyword_arg

# Calls whose result has a length that differs between processes.
_RAGGED = frozenset({"generate", "nonzero", "masked_select", "unique", "argwhere"})
_GATHERS = frozenset({"gather", "gather_for_metrics"})
# Calls that make a tensor of the items a comprehension keeps: filtered, it is ragged.
_FROM_ITEMS = frozenset({"tensor", "stack", "cat", "as_tensor"})
# Operators that combine boolean masks into a mask.
_MASK_OPERATORS = (cst.BitAnd, cst.BitOr, cst.BitXor)


class GatherWithoutPadding(Rule):
    """Tensors of a different length on each process gathered without padding.

    ## What it does
    Flags `accelerator.gather(x)`/`gather_for_metrics(x)` where `x` was produced (in the same
    function) by `generate(...)`, `nonzero()`, `masked_select(...)`, `unique()`, `argwhere()`,
    indexing with a boolean mask (`preds[labels != -100]`) or a tensor made from a filtered
    comprehension, and not passed through `accelerator.pad_across_processes` first.

    ## Why is this bad?
    A gather concatenates same-shaped tensors: generated sequences stop at different lengths on
    different processes, a mask keeps a different number of items on each, and the collective
    fails on a shape mismatch or hangs, usually on the last batch of a long evaluation.

    ## Example
    ```python
    tokens = accelerator.unwrap_model(model).generate(**batch, pad_token_id=tokenizer.pad_token_id)
    tokens = accelerator.gather_for_metrics(tokens)
    ```

    ## Use instead
    ```python
    tokens = accelerator.unwrap_model(model).generate(**batch, pad_token_id=tokenizer.pad_token_id)
    tokens = accelerator.pad_across_processes(tokens, dim=1, pad_index=tokenizer.pad_token_id)
    tokens = accelerator.gather_for_metrics(tokens)
    ```
    """

    code = "ACL215"
    name = "gather-without-padding"
    severity = Severity.ERROR

    VALID = (
        "accelerator = Accelerator()\ntokens = model.generate(**batch)\n"
        "tokens = accelerator.pad_across_processes(tokens, dim=1)\n"
        "tokens = accelerator.gather_for_metrics(tokens)\n",
        "accelerator = Accelerator()\nlogits = model(**batch).logits\n"
        "preds = accelerator.gather_for_metrics(logits.argmax(-1))\n",
        "accelerator = Accelerator()\ntokens = model.generate(**batch)\n"
        "texts = accelerator.gather_for_metrics(tokens, use_gather_object=True)\n",
        "accelerator = Accelerator()\n\n\ndef a():\n    out = model.generate(x)\n\n\n"
        "def b(out):\n    return accelerator.gather(out)\n",
        # Masked after the gather, where every process holds the same whole.
        "accelerator = Accelerator()\npreds, labels = accelerator.gather_for_metrics((p, l))\n"
        "keep = labels != -100\nacc = (preds[keep] == labels[keep]).float().mean()\n",
        "accelerator = Accelerator()\nmask = labels != -100\n"
        "loss = accelerator.gather(per_token[mask].mean())\n",
    )
    INVALID = (
        Invalid(
            "accelerator = Accelerator()\n\n\ndef evaluate(model, loader):\n"
            "    for batch in loader:\n        with torch.no_grad():\n"
            "            generated = accelerator.unwrap_model(model).generate(\n"
            "                batch['input_ids'], max_new_tokens=32\n            )\n"
            "        generated, labels = accelerator.gather_for_metrics((generated, "
            "batch['labels']))\n"
        ),
        Invalid(
            "acc = Accelerator()\nhits = (preds == labels).nonzero()\nall_hits = acc.gather(hits)\n"
        ),
        Invalid(
            "accelerator = Accelerator()\nfor batch in loader:\n"
            "    preds = model(**batch).logits.argmax(-1)\n    keep = batch['labels'] != -100\n"
            "    preds = accelerator.gather_for_metrics(preds[keep])\n"
        ),
        Invalid(
            "import torch\n\n\nclass Evaluator:\n    def run(self, scores):\n"
            "        found = torch.tensor([s for s in scores if s > self.threshold])\n"
            "        return self.accelerator.gather(found)\n"
        ),
    )

    def __init__(self, facts: Facts, reports: list[Report]) -> None:
        super().__init__(facts, reports)
        self._masks = Bound(facts, _is_mask)
        self._ragged = Bound(facts, lambda value, named: _is_ragged(value, named, self._masks))

    def leave_Assign(self, node: cst.Assign) -> None:
        self._masks.assign(node)
        self._ragged.assign(node)

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if not (
            isinstance(func, cst.Attribute)
            and func.attr.value in _GATHERS
            and self.facts.is_accelerator(func.value)
            and node.args
            and keyword_arg(node, "use_gather_object") is None
        ):
            return
        value = node.args[0].value
        parts = [e.value for e in value.elements] if isinstance(value, cst.Tuple) else [value]
        for part in parts:
            if self._ragged.holds(part):
                what = f"`{dotted_name(part)}`" if dotted_name(part) else "this tensor"
                self.report(
                    part,
                    f"{what} has a different length on each process: the gather fails or "
                    "hangs; pad it first with `accelerator.pad_across_processes` along the "
                    "dimension that varies",
                )


def _is_mask(value: cst.BaseExpression, named: Callable[[str], bool]) -> bool:
    """A boolean tensor: a comparison, ``.bool()``, ``~m``, ``m & n``, or a name bound to one."""
    if isinstance(value, cst.Comparison):
        return True
    if isinstance(value, cst.Call):
        return isinstance(value.func, cst.Attribute) and value.func.attr.value == "bool"
    if isinstance(value, cst.UnaryOperation) and isinstance(value.operator, cst.BitInvert):
        return _is_mask(value.expression, named)
    if isinstance(value, cst.BinaryOperation) and isinstance(value.operator, _MASK_OPERATORS):
        return _is_mask(value.left, named) or _is_mask(value.right, named)
    name = dotted_name(value)
    return name is not None and named(name)


def _is_ragged(value: cst.BaseExpression, named: Callable[[str], bool], masks: Bound) -> bool:
    """A tensor whose length differs between processes."""
    if isinstance(value, cst.Call):
        if callee_name(value) in _RAGGED:
            return True
        first = value.args[0].value if value.args else None
        return (
            callee_name(value) in _FROM_ITEMS
            and isinstance(first, cst.ListComp | cst.GeneratorExp)
            and any(c.ifs for c in _comprehensions(first.for_in))
        )
    if isinstance(value, cst.BinaryOperation):  # ragged on either side: ragged
        return _is_ragged(value.left, named, masks) or _is_ragged(value.right, named, masks)
    if isinstance(value, cst.Comparison):
        sides = [value.left, *(c.comparator for c in value.comparisons)]
        return any(_is_ragged(side, named, masks) for side in sides)
    if isinstance(value, cst.Subscript) and len(value.slice) == 1:
        index = value.slice[0].slice
        return isinstance(index, cst.Index) and masks.holds(index.value)
    name = dotted_name(value)
    return name is not None and named(name)


def _comprehensions(clause: cst.CompFor | None) -> list[cst.CompFor]:
    found = []
    while clause is not None:
        found.append(clause)
        clause = clause.inner_for_in
    return found
