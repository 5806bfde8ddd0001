"""ACL002 collective-in-main-only."""

from __future__ import annotations

import libcst as cst

from accelify.rules.facts import Facts, Where
from accelify.rules.rule import Invalid, Report, Rule, Severity
from accelify.transform.patterns import dotted_name

# Accelerator methods every process must call together.
ACCELERATOR_COLLECTIVES = frozenset(
    {
        "gather", "gather_for_metrics", "reduce", "pad_across_processes", "wait_for_everyone",
        "save_state", "load_state", "save_model", "get_state_dict", "broadcast",
    }
)  # fmt: skip
DIST_COLLECTIVES = frozenset(
    {
        "barrier", "all_reduce", "all_gather", "all_gather_object", "broadcast",
        "broadcast_object_list", "reduce", "gather", "scatter", "all_to_all", "reduce_scatter",
    }
)  # fmt: skip
_DIST_MODULES = frozenset({"dist", "torch.distributed"})


class CollectiveInMainOnly(Rule):
    """A collective called on the main process only: a guaranteed hang.

    ## What it does
    Flags `accelerator.gather`/`gather_for_metrics`/`reduce`/`wait_for_everyone`/`save_state`/
    `save_model`/`get_state_dict` and `torch.distributed` collectives that run only under
    `if accelerator.is_main_process:` (directly, or in a function called only from there).

    ## Why is this bad?
    A collective returns only when every process has entered it. The other processes never get
    there, so the main process waits forever (until the NCCL timeout kills the job, 30 minutes
    of idle GPUs later). Under DeepSpeed/FSDP, `save_model`/`get_state_dict` gather shards, so
    they are collectives too.

    ## Example
    ```python
    if accelerator.is_main_process:
        accelerator.wait_for_everyone()
        accelerator.save_model(model, "out")
    ```

    ## Use instead
    ```python
    accelerator.wait_for_everyone()
    accelerator.save_model(model, "out")  # writes on the main process only
    ```
    """

    code = "ACL002"
    name = "collective-in-main-only"
    severity = Severity.ERROR

    VALID = (
        "import torch.distributed as dist\nif accelerator.is_main_process:\n"
        "    dist.broadcast(full, src=0)\nelse:\n    dist.broadcast(empty, src=0)",
        "accelerator = Accelerator()\naccelerator.wait_for_everyone()\n"
        "if accelerator.is_main_process:\n    torch.save(s, 'a.pt')",
        "accelerator = Accelerator()\nif accelerator.is_main_process:\n    print('done')\n"
        "else:\n    pass\naccelerator.wait_for_everyone()",
        "accelerator = Accelerator()\n\ndef evaluate():\n    return accelerator.gather(x)\n\n"
        "evaluate()\nif accelerator.is_main_process:\n    print(1)",
    )
    INVALID = (
        Invalid(
            "accelerator = Accelerator()\nif accelerator.is_main_process:\n"
            "    accelerator.wait_for_everyone()\n"
        ),
        Invalid("import torch.distributed as dist\nif dist.get_rank() == 0:\n    dist.barrier()\n"),
        Invalid(
            "accelerator = Accelerator()\nif accelerator.is_main_process:\n    pass\n"
            "else:\n    accelerator.wait_for_everyone()\n"
        ),
        Invalid(
            "accelerator = Accelerator()\n\ndef finish(model):\n"
            "    accelerator.save_model(model, 'out')\n\n"
            "if accelerator.is_local_main_process:\n    finish(model)\n"
        ),
    )

    def __init__(self, facts: Facts, reports: list[Report]) -> None:
        super().__init__(facts, reports)
        self._candidates: list[tuple[cst.Call, Where, str]] = []

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if not isinstance(func, cst.Attribute):
            return
        method = func.attr.value
        receiver = dotted_name(func.value)
        if (method in ACCELERATOR_COLLECTIVES and self.facts.is_accelerator(func.value)) or (
            method in DIST_COLLECTIVES and receiver in _DIST_MODULES
        ):
            self._candidates.append((node, self.facts.where(), method))

    def leave_Module(self, node: cst.Module) -> None:
        # ``if main: dist.broadcast(x, src=0) else: dist.broadcast(y, src=0)`` pairs up: fine.
        sides = {(w.branch[0], w.branch[1], m) for _, w, m in self._candidates if w.branch}
        for call, where, method in self._candidates:
            if where.branch and (where.branch[0], -where.branch[1], method) in sides:
                continue
            runs_on = self.facts.runs_on(where)
            if runs_on in ("main", "others"):
                who = "the main process only" if runs_on == "main" else "all but the main process"
                self.report(
                    call,
                    f"`{method}` is a collective but runs on {who}: the job hangs; "
                    "call it on every process",
                )
