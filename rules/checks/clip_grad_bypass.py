"""ACL202 clip-grad-bypass."""

from __future__ import annotations

import libcst as cst

from accelify.rules.build import method_call
from accelify.rules.rule import Invalid, Rule, Severity

_CLIPS = frozenset({"clip_grad_norm_", "clip_grad_value_"})
# Keywords torch's clip functions take and Accelerator's do not.
_TORCH_ONLY = frozenset({"error_if_nonfinite", "foreach"})


class ClipGradBypass(Rule):
    """`torch.nn.utils.clip_grad_norm_` on the parameters of a prepared model.

    ## What it does
    Flags `clip_grad_norm_`/`clip_grad_value_` from `torch.nn.utils` applied to
    `model.parameters()` where `model` came out of `accelerator.prepare`.

    ## Why is this bad?
    With fp16 the gradients are still scaled at that point, so the clip threshold is meaningless;
    under FSDP each process holds only a shard and the norm must be computed across processes;
    DeepSpeed clips in its own engine. `accelerator.clip_grad_norm_` handles all three.

    ## Example
    ```python
    model, optimizer = accelerator.prepare(model, optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    ```

    ## Use instead
    ```python
    model, optimizer = accelerator.prepare(model, optimizer)
    accelerator.clip_grad_norm_(model.parameters(), 1.0)
    ```

    ## Fix safety
    Safe: same arguments, same meaning. Calls passing `foreach=` or `error_if_nonfinite=` are
    reported without a fix.
    """

    code = "ACL202"
    name = "clip-grad-bypass"
    severity = Severity.ERROR

    VALID = (
        "accelerator = Accelerator()\nmodel = accelerator.prepare(model)\n"
        "accelerator.clip_grad_norm_(model.parameters(), 1.0)",
        "model = Net()\ntorch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # not prepared",
    )
    INVALID = (
        Invalid(
            "accelerator = Accelerator()\nmodel, opt = accelerator.prepare(model, opt)\n"
            "torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)\n",
            "accelerator = Accelerator()\nmodel, opt = accelerator.prepare(model, opt)\n"
            "accelerator.clip_grad_norm_(model.parameters(), max_norm=1.0)\n",
        ),
        Invalid(
            "from torch.nn.utils import clip_grad_value_\nacc = Accelerator()\n"
            "net = acc.prepare(net)\nclip_grad_value_(net.parameters(), 0.5)\n",
            "from torch.nn.utils import clip_grad_value_\nacc = Accelerator()\n"
            "net = acc.prepare(net)\nacc.clip_grad_value_(net.parameters(), 0.5)\n",
        ),
        Invalid(
            "accelerator = Accelerator()\nmodel = accelerator.prepare(model)\n"
            "nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)\n"
        ),
    )

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        name = func.attr.value if isinstance(func, cst.Attribute) else getattr(func, "value", "")
        if name not in _CLIPS or not node.args:
            return
        if isinstance(func, cst.Attribute) and self.facts.is_accelerator(func.value):
            return
        params = node.args[0].value
        if not (
            isinstance(params, cst.Call)
            and isinstance(params.func, cst.Attribute)
            and params.func.attr.value == "parameters"
        ):
            return
        prepared = self.facts.prepared(params.func.value)
        if prepared is None:
            return
        message = f"`{name}` on a prepared model's gradients; use `accelerator.{name}`"
        if any(a.keyword is not None and a.keyword.value in _TORCH_ONLY for a in node.args):
            self.report(node, message)
            return
        self.report(node, message, new=method_call(prepared.accelerator, name, node.args))
