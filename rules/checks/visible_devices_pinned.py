"""ACL012 visible-devices-pinned."""

from __future__ import annotations

import libcst as cst

from accelify.rules.facts import Facts
from accelify.rules.rule import Invalid, Report, Rule, Severity
from accelify.transform.patterns import callee_name, pins_visible_devices

# Calls that start the script's processes itself: what it sets before them configures them.
_LAUNCHES = frozenset({"notebook_launcher", "spawn", "start_processes", "Process"})


class VisibleDevicesPinned(Rule):
    """`CUDA_VISIBLE_DEVICES` set inside a script that every process runs.

    ## What it does
    In a script that creates an `Accelerator`, flags `os.environ["CUDA_VISIBLE_DEVICES"] = ...`,
    `os.environ.setdefault("CUDA_VISIBLE_DEVICES", ...)` and `os.putenv(...)` of it. A script
    that starts its processes itself (`notebook_launcher`, `mp.spawn`, `start_processes`,
    `Process`) is left alone: there the setting is the launch's, made once before it.

    ## Why is this bad?
    The launcher starts one process per GPU it sees and gives process *i* the GPU *i*. Each
    process then runs the script, which narrows what it sees to the listed GPUs: with
    `"1"`, every process sees one GPU, and every process but the first fails in
    `torch.cuda.set_device` (`invalid device ordinal`). On one process nothing shows.

    ## Example
    ```python
    os.environ["CUDA_VISIBLE_DEVICES"] = "1"
    accelerator = Accelerator()
    ```

    ## Use instead
    Choose the GPUs on the launch, for every process at once:
    `accel-run --gpu-ids 1 train.py` (or `CUDA_VISIBLE_DEVICES=1 accel-run train.py`).
    ```python
    accelerator = Accelerator()
    ```
    """

    code = "ACL012"
    name = "visible-devices-pinned"
    severity = Severity.ERROR

    VALID = (
        'os.environ["TOKENIZERS_PARALLELISM"] = "false"\naccelerator = Accelerator()\n',
        'gpus = os.environ["CUDA_VISIBLE_DEVICES"]\naccelerator = Accelerator()\n',
        # No accelerator: a one-process script choosing its GPU.
        'os.environ["CUDA_VISIBLE_DEVICES"] = "1"\nmodel = Net().cuda()\n',
        # The script launches its processes: they inherit what it sets.
        'os.environ["CUDA_VISIBLE_DEVICES"] = "0,1"\n'
        "def main():\n    accelerator = Accelerator()\n"
        "notebook_launcher(main, num_processes=2)\n",
    )
    INVALID = (
        Invalid('os.environ["CUDA_VISIBLE_DEVICES"] = "1"\naccelerator = Accelerator()\n'),
        Invalid(
            "def main(args):\n"
            '    os.environ.setdefault("CUDA_VISIBLE_DEVICES", args.gpus)\n'
            "    accelerator = Accelerator()\n"
        ),
    )

    def __init__(self, facts: Facts, reports: list[Report]) -> None:
        super().__init__(facts, reports)
        self._pins: list[cst.CSTNode] = []
        self._launches = False

    def visit_Assign(self, node: cst.Assign) -> None:
        if pins_visible_devices(node):
            self._pins.append(node)

    def visit_Expr(self, node: cst.Expr) -> None:
        if pins_visible_devices(node):
            self._pins.append(node)

    def visit_Call(self, node: cst.Call) -> None:
        self._launches = self._launches or callee_name(node) in _LAUNCHES

    def leave_Module(self, node: cst.Module) -> None:
        if self._launches or not self.facts.creates_accelerator:
            return
        for pin in self._pins:
            self.report(
                pin,
                "every process sets `CUDA_VISIBLE_DEVICES` here and sees only the GPUs it lists, "
                "so processes past that count find no GPU of their own; choose the GPUs on the "
                "launch: `accel-run --gpu-ids ...` or `CUDA_VISIBLE_DEVICES=... accel-run`",
            )
