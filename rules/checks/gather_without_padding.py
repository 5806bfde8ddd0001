"""ACL215 gather-without-padding."""

from __future__ import annotations

import libcst as cst

from accelify.rules.facts import Facts
from accelify.rules.rule import Invalid, Report, Rule, Severity
from accelify.transform.patterns import callee_name, dotted_name, keyword_arg, target_names

# Calls whose result has a length that differs between processes.
_RAGGED = frozenset({"generate", "nonzero", "masked_select"})
_GATHERS = frozenset({"gather", "gather_for_metrics"})


class GatherWithoutPadding(Rule):
    """Tensors of a different length on each process gathered without padding.

    ## What it does
    Flags `accelerator.gather(x)`/`gather_for_metrics(x)` where `x` was produced by
    `generate(...)`, `nonzero()` or `masked_select(...)` (in the same function) and not passed
    through `accelerator.pad_across_processes` first.

    ## Why is this bad?
    A gather concatenates same-shaped tensors: generated sequences stop at different lengths on
    different processes, and the collective fails on a shape mismatch or hangs, usually on the
    last batch of a long evaluation.

    ## Example
    ```python
    tokens = accelerator.unwrap_model(model).generate(**batch)
    tokens = accelerator.gather_for_metrics(tokens)
    ```

    ## Use instead
    ```python
    tokens = accelerator.unwrap_model(model).generate(**batch)
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
    )

    def __init__(self, facts: Facts, reports: list[Report]) -> None:
        super().__init__(facts, reports)
        # (function, name) bound to a ragged result there (None: module level)
        self._ragged: set[tuple[cst.FunctionDef | None, str]] = set()

    def leave_Assign(self, node: cst.Assign) -> None:
        value = node.value
        ragged = isinstance(value, cst.Call) and callee_name(value) in _RAGGED
        if not ragged and not self._ragged:
            return
        function = self.facts.where().function
        for name in (n for t in node.targets for n in target_names(t.target)):
            if ragged:
                self._ragged.add((function, name))
            else:
                self._ragged.discard((function, name))

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if not (
            self._ragged
            and isinstance(func, cst.Attribute)
            and func.attr.value in _GATHERS
            and self.facts.is_accelerator(func.value)
            and node.args
            and keyword_arg(node, "use_gather_object") is None
        ):
            return
        function = self.facts.where().function
        value = node.args[0].value
        parts = [e.value for e in value.elements] if isinstance(value, cst.Tuple) else [value]
        for part in parts:
            name = dotted_name(part)
            if name is not None and (function, name) in self._ragged:
                self.report(
                    part,
                    f"`{name}` has a different length on each process: the gather fails or "
                    "hangs; pad it first with `accelerator.pad_across_processes` along the "
                    "dimension that varies",
                )
