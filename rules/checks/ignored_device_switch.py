"""ACL213 ignored-device-switch."""

from __future__ import annotations

import re
from collections import Counter

import libcst as cst

from accelify.rules.facts import Facts
from accelify.rules.rule import Invalid, Report, Rule, Severity
from accelify.transform.patterns import callee_name

# ``use_cuda``, ``no_cuda``, ``use_gpu``, ``cpu``, ``use_mps``: a variable that picks the device.
_SWITCH = re.compile(r"^(?:(?:use|no|with|on)_)?(?:cuda|gpu|cpu|mps)$", re.IGNORECASE)


class IgnoredDeviceSwitch(Rule):
    """A device switch (`use_cuda = ...`) nothing reads, while the accelerator picks the device.

    ## What it does
    In a script that takes its device from `accelerator.device`, flags that binding when the
    script also sets a variable named like a device switch (`use_cuda`, `no_cuda`, `use_gpu`,
    `cpu`, `use_mps`) and never reads it. A switch that only asks `torch.cuda.is_available()`
    is left alone: the accelerator decides alike.

    ## Why is this bad?
    The switch looks like it works (`--no-cuda` is accepted) but does nothing: the accelerator
    puts the model on the GPU whatever it says. It is what is left when a script's
    `torch.device("cuda" if use_cuda else "cpu")` is replaced by `accelerator.device`.

    ## Example
    ```python
    use_cuda = "--no-cuda" not in sys.argv
    accelerator = Accelerator()
    device = accelerator.device
    ```

    ## Use instead
    ```python
    use_cuda = "--no-cuda" not in sys.argv
    accelerator = Accelerator(cpu=not use_cuda)
    device = accelerator.device
    ```
    """

    code = "ACL213"
    name = "ignored-device-switch"
    severity = Severity.WARNING

    VALID = (
        "use_cuda = not args.no_cuda\naccelerator = Accelerator(cpu=not use_cuda)\n"
        "device = accelerator.device\n",
        "use_cuda = torch.cuda.is_available()\naccelerator = Accelerator()\n"
        "device = accelerator.device\n",
        "use_gpu = not args.cpu\naccelerator = Accelerator(cpu=args.cpu)\n"
        "device = accelerator.device\nloader = DataLoader(data, pin_memory=use_gpu)\n",
        "use_cuda = torch.cuda.is_available()\ndevice = torch.device('cuda' if use_cuda else 'cpu')"
        "\n",
    )
    INVALID = (
        Invalid(
            "def main():\n    use_cuda = '--no-cuda' not in sys.argv\n"
            "    accelerator = Accelerator()\n    device = accelerator.device\n"
            "    model = Net().to(device)\n"
        ),
    )

    def __init__(self, facts: Facts, reports: list[Report]) -> None:
        super().__init__(facts, reports)
        self._set: Counter[str] = Counter()  # assignments of switch-like names
        self._devices: list[cst.Assign] = []  # ``device = accelerator.device``

    def visit_Assign(self, node: cst.Assign) -> None:
        for target in node.targets:
            name = target.target
            if isinstance(name, cst.Name) and _SWITCH.match(name.value) and not _asks(node.value):
                self._set[name.value] += 1
        value = node.value
        if isinstance(value, cst.Attribute) and value.attr.value == "type":
            value = value.value  # ``accelerator.device.type``
        if (
            isinstance(value, cst.Attribute)
            and value.attr.value == "device"
            and self.facts.is_accelerator(value.value)
        ):
            self._devices.append(node)

    def leave_Module(self, node: cst.Module) -> None:
        if not self._set or not self._devices:
            return
        # Rare (a switch and the accelerator's device): count every occurrence only now.
        uses = _Occurrences(set(self._set))
        node.visit(uses)
        unread = sorted(name for name, count in self._set.items() if uses.counts[name] == count)
        if not unread:
            return
        self.report(
            self._devices[0],
            f"`{unread[0]}` is set but never read: the accelerator picks the device, so the "
            "switch does nothing; pass it as `Accelerator(cpu=...)`",
        )


class _Occurrences(cst.CSTVisitor):
    def __init__(self, names: set[str]) -> None:
        super().__init__()
        self.names = names
        self.counts: Counter[str] = Counter()

    def visit_Name(self, node: cst.Name) -> None:
        if node.value in self.names:
            self.counts[node.value] += 1


def _asks(value: cst.BaseExpression) -> bool:
    """Whether ``value`` only combines ``is_available()`` calls, as the accelerator does."""
    if isinstance(value, cst.UnaryOperation):
        return _asks(value.expression)
    if isinstance(value, cst.BooleanOperation):
        return _asks(value.left) and _asks(value.right)
    return isinstance(value, cst.Call) and callee_name(value) == "is_available"
