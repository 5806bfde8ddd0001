"""ACL002 collective-in-main-only."""

from __future__ import annotations

import libcst as cst

from accelify.rules.facts import SHARDED_COLLECTIVES, Facts, Where, collective
from accelify.rules.rule import Invalid, Report, Rule, Severity


class CollectiveInMainOnly(Rule):
    """A collective called on the main process only: a hang.

    ## What it does
    Flags `accelerator.gather`/`gather_for_metrics`/`reduce`/`wait_for_everyone`/`save_state`/
    `save_model`/`get_state_dict` and `torch.distributed` collectives that run only under
    `if accelerator.is_main_process:` (directly, or in a function called only from there).

    ## Why is this bad?
    A collective returns only when every process has entered it. The other processes never get
    there, so the main process waits forever (until the NCCL timeout kills the job, 30 minutes
    of idle GPUs later). `save_state`/`load_state`/`save_model`/`get_state_dict` are collectives
    under DeepSpeed/FSDP, where they gather or scatter shards; with DDP they run alone, so for
    them the hang comes with those backends (the message says so).

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
        # diffusers' newer scripts: DeepSpeed's processes all enter the branch.
        "def main():\n    accelerator = Accelerator()\n    for step in range(10):\n"
        "        if accelerator.is_main_process or accelerator.distributed_type == "
        "DistributedType.DEEPSPEED:\n"
        "            accelerator.save_state(f'checkpoint-{step}')",
        # transformers' old main-process-first idiom: the others wait, then the main releases them.
        "import torch\n\n\nclass Features(Dataset):\n    def __init__(self, args):\n"
        "        if args.local_rank not in [-1, 0] and mode == 'train':\n"
        "            torch.distributed.barrier()\n"
        "        self.features = load_or_build(args)\n"
        "        if args.local_rank == 0 and mode == 'train':\n"
        "            torch.distributed.barrier()\n",
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
        Invalid(  # diffusers' checkpointing shape: in the update loop, under two conditions
            "def main(args):\n    accelerator = Accelerator()\n"
            "    for step, batch in enumerate(train_dataloader):\n"
            "        if accelerator.sync_gradients:\n"
            "            if accelerator.is_main_process:\n"
            "                if step % args.checkpointing_steps == 0:\n"
            "                    accelerator.save_state(f'checkpoint-{step}')\n"
        ),
        Invalid(
            "from accelerate import Accelerator\n\n\nclass Trainer:\n"
            "    def evaluate(self, preds):\n"
            "        is_main = self.accelerator.is_main_process\n        if is_main:\n"
            "            return [self.accelerator.gather(p) for p in preds]\n"
        ),
    )

    def __init__(self, facts: Facts, reports: list[Report]) -> None:
        super().__init__(facts, reports)
        self._candidates: list[tuple[cst.Call, Where, str]] = []

    def visit_Call(self, node: cst.Call) -> None:
        method = collective(node, self.facts)
        if method is not None:
            self._candidates.append((node, self.facts.where(), method))

    def leave_Module(self, node: cst.Module) -> None:
        # ``if main: dist.broadcast(x, src=0) else: dist.broadcast(y, src=0)`` pairs up: fine.
        sides = {(w.branch[0], w.branch[1], m) for _, w, m in self._candidates if w.branch}
        # ``if rank not in [-1, 0]: barrier()`` ... ``if rank == 0: barrier()``: the others wait
        # while the main process works, then it releases them (the main-process-first idiom).
        runs = [
            (call, where, method, self.facts.runs_on(where))
            for call, where, method in self._candidates
        ]
        split = {(w.function, m, r) for _, w, m, r in runs if r in ("main", "others")}
        for call, where, method, runs_on in runs:
            if where.branch and (where.branch[0], -where.branch[1], method) in sides:
                continue
            other = "others" if runs_on == "main" else "main"
            if (where.function, method, other) in split:
                continue
            if runs_on in ("main", "others"):
                who = "the main process only" if runs_on == "main" else "all but the main process"
                self.report(call, _message(method, who))


def _message(method: str, who: str) -> str:
    """Say when the hang happens: always, or with the backends that shard the model."""
    if method not in SHARDED_COLLECTIVES:
        return (
            f"`{method}` is a collective but runs on {who}: the job hangs; call it on every process"
        )
    return (
        f"`{method}` runs on {who}, but under DeepSpeed/FSDP it gathers shards from every "
        "process: the job hangs there; call it on every process (it writes on the main one)"
    )
