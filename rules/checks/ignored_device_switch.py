"""ACL213 ignored-device-switch."""

from __future__ import annotations

import re
from collections import Counter

import libcst as cst

from accelify.rules.facts import Facts
from accelify.rules.rule import Invalid, Report, Rule, Severity
from accelify.transform.patterns import asks_availability, callee_name, dotted_name
from accelify.transform.walk import nodes

# ``use_cuda``, ``no_cuda``, ``use_gpu``, ``cpu``, ``use_mps``: a variable that picks the device.
_SWITCH = re.compile(r"^(?:(?:use|no|with|on)_)?(?:cuda|gpu|cpu|mps)$", re.IGNORECASE)


class IgnoredDeviceSwitch(Rule):
    """A device switch (`use_cuda = ...`) the accelerator ignores: it picks the device itself.

    ## What it does
    In a script that takes its device from `accelerator.device`, flags that binding when the
    script also sets a variable named like a device switch (`use_cuda`, `no_cuda`, `use_gpu`,
    `cpu`, `use_mps`) and never reads it. In a script whose `Accelerator(...)` is given no
    `cpu=`, flags `if args.cuda:` blocks that move things with `.cuda()` (pygcn's shape): the
    switch still decides those moves, not where the model is. A switch that only asks
    `torch.cuda.is_available()` is left alone: the accelerator decides alike.

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
        Invalid(
            "accelerator = Accelerator()\nargs.cuda = not args.no_cuda\n"
            "model = accelerator.prepare(model)\nif args.cuda:\n    features = features.cuda()\n"
        ),
    )

    def __init__(self, facts: Facts, reports: list[Report]) -> None:
        super().__init__(facts, reports)
        self._set: Counter[str] = Counter()  # assignments of switch-like names
        self._devices: list[cst.Assign] = []  # ``device = accelerator.device``
        self._switched: list[tuple[cst.If, str]] = []  # ``if args.cuda: x = x.cuda()``
        self._asked: set[str] = set()  # switches set only from ``is_available()``
        self._chooses_cpu = False  # an ``Accelerator(cpu=...)`` in the file

    def visit_Assign(self, node: cst.Assign) -> None:
        asked = asks_availability(node.value)
        for target in node.targets:
            name = target.target
            if isinstance(name, cst.Name) and _SWITCH.match(name.value) and not asked:
                self._set[name.value] += 1
            switch = _switch(name)
            if switch is not None and asked:
                self._asked.add(switch)
        value = node.value
        if isinstance(value, cst.Attribute) and value.attr.value == "type":
            value = value.value  # ``accelerator.device.type``
        if (
            isinstance(value, cst.Attribute)
            and value.attr.value == "device"
            and self.facts.is_accelerator(value.value)
        ):
            self._devices.append(node)

    def visit_If(self, node: cst.If) -> None:
        switch = _switch(node.test)
        if switch is not None and any(
            callee_name(call) == "cuda"
            for call in nodes(node.body, cst.Call)  # type: ignore[arg-type]
        ):
            self._switched.append((node, switch))

    def visit_Call(self, node: cst.Call) -> None:
        if callee_name(node) == "Accelerator" and any(
            arg.keyword is not None and arg.keyword.value == "cpu" for arg in node.args
        ):
            self._chooses_cpu = True

    def leave_Module(self, node: cst.Module) -> None:
        if self.facts.creates_accelerator and not self._chooses_cpu:
            for block, switch in self._switched:
                if switch not in self._asked:
                    self.report(
                        block,
                        f"`{switch}` decides the .cuda() moves here, but the accelerator picks "
                        f"the device itself: pass it as `Accelerator(cpu=not {switch})`",
                    )
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


def _switch(node: cst.BaseExpression) -> str | None:
    """``use_cuda`` or ``args.cuda``: a name or attribute named like a device switch."""
    if isinstance(node, cst.Name) and _SWITCH.match(node.value):
        return node.value
    if isinstance(node, cst.Attribute) and _SWITCH.match(node.attr.value):
        return dotted_name(node)
    return None


class _Occurrences(cst.CSTVisitor):
    def __init__(self, names: set[str]) -> None:
        super().__init__()
        self.names = names
        self.counts: Counter[str] = Counter()

    def visit_Name(self, node: cst.Name) -> None:
        if node.value in self.names:
            self.counts[node.value] += 1
