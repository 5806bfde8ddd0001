"""ACL001 cuda-before-fork."""

from __future__ import annotations

import libcst as cst

from accelify.rules.facts import Facts
from accelify.rules.rule import Invalid, Report, Rule, Severity
from accelify.transform.patterns import callee_name, dotted_name, keyword_arg

# ``torch.cuda`` functions that do not create a CUDA context (they query NVML or queue lazily).
_LAZY = frozenset(
    {
        "is_available", "device_count", "is_initialized", "manual_seed", "manual_seed_all",
        "seed", "seed_all", "get_arch_list", "is_bf16_supported",
    }
)  # fmt: skip


def _is_cuda(expr: cst.BaseExpression | None) -> bool:
    """A literal CUDA device: ``"cuda"``, ``"cuda:0"``, ``torch.device("cuda")``."""
    if isinstance(expr, cst.SimpleString):
        value = expr.evaluated_value
        return isinstance(value, str) and value.startswith("cuda")
    if isinstance(expr, cst.Call) and callee_name(expr) == "device" and expr.args:
        return _is_cuda(expr.args[0].value)
    return False


def initialises_cuda(call: cst.Call) -> bool:
    """Whether ``call`` creates the CUDA context in the process that runs it."""
    name = dotted_name(call.func) or ""
    if name.startswith("torch.cuda.") and name.rsplit(".", 1)[-1] not in _LAZY:
        return True
    method = callee_name(call)
    if method == "cuda" and isinstance(call.func, cst.Attribute):
        return True
    if method == "Accelerator":  # picks and sets the CUDA device on construction
        return True
    if method == "to" and call.args and _is_cuda(call.args[0].value):
        return True
    device = keyword_arg(call, "device")
    return device is not None and _is_cuda(device.value)


def fork_launch(call: cst.Call) -> bool:
    """A call that starts worker processes with ``fork``."""
    name = callee_name(call)
    if name == "notebook_launcher":
        return True
    if name in {"spawn", "start_processes", "Process"}:
        method = keyword_arg(call, "start_method")
        if method is not None and isinstance(method.value, cst.SimpleString):
            return method.value.evaluated_value == "fork"
    if name == "Process" and isinstance(call.func, cst.Attribute):
        context = call.func.value
        return (
            isinstance(context, cst.Call)
            and callee_name(context) == "get_context"
            and bool(context.args)
            and isinstance(context.args[0].value, cst.SimpleString)
            and context.args[0].value.evaluated_value == "fork"
        )
    return False


class CudaBeforeFork(Rule):
    """CUDA initialised before worker processes are forked.

    ## What it does
    Flags calls that create the CUDA context (`torch.cuda.*` other than `is_available`/
    `device_count`/seeding, `.cuda()`, `.to("cuda")`, `device="cuda"`, `Accelerator()`) that run
    before `notebook_launcher(...)`, `start_processes(..., start_method="fork")` or a
    fork-context `Process`: at module level (or an earlier notebook cell) above the launch, or
    earlier in the function that launches.

    ## Why is this bad?
    A forked child inherits a CUDA context it cannot use: the first CUDA call in the workers
    fails with "Cannot re-initialize CUDA in forked subprocess", after the launch already took
    the GPUs.

    ## Example
    ```python
    model = Net().cuda()
    notebook_launcher(train, num_processes=2)
    ```

    ## Use instead
    ```python
    def train():
        accelerator = Accelerator()
        model = accelerator.prepare(Net())

    notebook_launcher(train, num_processes=2)
    ```
    """

    code = "ACL001"
    name = "cuda-before-fork"
    severity = Severity.ERROR

    VALID = (
        "import torch\nif torch.cuda.is_available():\n    n = torch.cuda.device_count()\n"
        "notebook_launcher(train, num_processes=n)",
        "def train():\n    model = Net().cuda()\n\nnotebook_launcher(train, num_processes=2)",
        "import torch\nx = torch.ones(2).cuda()\n"
        "torch.multiprocessing.spawn(train, nprocs=2)  # spawn starts clean interpreters",
        "notebook_launcher(train, num_processes=2)\nx = torch.ones(2).cuda()",
    )
    INVALID = (
        Invalid("model = Net().to('cuda')\nnotebook_launcher(train, num_processes=2)\n"),
        Invalid("accelerator = Accelerator()\nnotebook_launcher(train, num_processes=2)\n"),
        Invalid(
            "import torch\n\ndef main():\n    torch.cuda.set_device(0)\n"
            "    mp.start_processes(train, nprocs=2, start_method='fork')\n"
        ),
        Invalid(
            "import torch\nx = torch.zeros(3, device='cuda:0')\n\ndef main():\n"
            "    p = mp.get_context('fork').Process(target=work)\n"
        ),
    )

    def __init__(self, facts: Facts, reports: list[Report]) -> None:
        super().__init__(facts, reports)
        # CUDA calls not yet followed by a launch: per function (None for module level).
        self._pending: dict[cst.FunctionDef | None, list[cst.Call]] = {}

    def visit_Call(self, node: cst.Call) -> None:
        function = self.facts.function()
        if fork_launch(node):
            reached = [*self._pending.pop(None, []), *self._pending.pop(function, [])]
            for call in reached:
                self.report(
                    call,
                    "initialises CUDA before worker processes are forked: they fail with "
                    "'Cannot re-initialize CUDA in forked subprocess'; move it into the "
                    "launched function",
                )
        elif initialises_cuda(node):
            self._pending.setdefault(function, []).append(node)
