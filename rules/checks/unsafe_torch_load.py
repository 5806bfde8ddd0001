"""ACL103 unsafe-torch-load."""

from __future__ import annotations

import libcst as cst

from accelify.rules.build import with_keyword
from accelify.rules.rule import Invalid, Rule, Severity
from accelify.transform.patterns import dotted_name, keyword_arg


class UnsafeTorchLoad(Rule):
    """`torch.load` without `weights_only=True`.

    ## What it does
    Flags `torch.load(...)` calls that do not pass `weights_only=True`. Off by default: it is a
    safety habit, not a multi-process bug (torch 2.6+ already defaults to `True`).

    ## Why is this bad?
    Without it `torch.load` unpickles arbitrary objects, and a checkpoint from an untrusted
    source runs arbitrary code on every process that loads it. torch only made `True` the
    default in 2.6; scripts must say it to be safe on the torch versions clusters still run.

    ## Example
    ```python
    state = torch.load("ckpt.pt", map_location="cpu")
    ```

    ## Use instead
    ```python
    state = torch.load("ckpt.pt", map_location="cpu", weights_only=True)
    ```

    ## Fix safety
    Unsafe: checkpoints that pickle whole objects (not just tensors and containers) stop loading.
    An explicit `weights_only=False` is reported without a fix: it is a decision to review.
    """

    code = "ACL103"
    name = "unsafe-torch-load"
    severity = Severity.WARNING
    enabled_by_default = False

    VALID = (
        "import torch\nstate = torch.load(path, weights_only=True)",
        "import pickle\nstate = pickle.load(f)  # not torch's",
        "import torch\nstate = torch.load(path, **kwargs)  # cannot tell",
    )
    INVALID = (
        Invalid(
            'import torch\nstate = torch.load("ckpt.pt", map_location="cpu")\n',
            'import torch\nstate = torch.load("ckpt.pt", map_location="cpu", weights_only=True)\n',
        ),
        Invalid("import torch\nstate = torch.load(path, weights_only=False)\n"),
    )

    def visit_Call(self, node: cst.Call) -> None:
        if dotted_name(node.func) != "torch.load" or any(a.star for a in node.args):
            return
        given = keyword_arg(node, "weights_only")
        message = (
            "`torch.load` can run arbitrary code from the checkpoint; pass `weights_only=True`"
        )
        if given is not None:
            if not (isinstance(given.value, cst.Name) and given.value.value == "True"):
                self.report(node, message)
            return
        new = with_keyword(node, "weights_only", cst.Name("True"))
        self.report(node, message, new=new, safe=False)
