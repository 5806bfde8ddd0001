"""Section 3: conversion time grows linearly with the file, measured against libcst's own parse.

A script with many module-level assignments above its training code once cost quadratic time (a
scan per statement while placing the accelerator: 2.5k / 5k / 10k lines took 6 / 24 / 98 s).
Both tools run in this process, alternating, and are timed in CPU time so that another process
on the machine does not blur the comparison. The target is on the growth: the ratio of convert
time to parse time at the large size over the same ratio at the small size (1.0 is linear).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable

from report import Section, Target
from timing import Stat

_TRAINING = """\
device = "cuda" if torch.cuda.is_available() else "cpu"
model = torch.nn.Linear(4, 2).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loader = DataLoader(TensorDataset(torch.randn(16, 4), torch.randn(16, 2)), batch_size=4)
for x, y in loader:
    x, y = x.to(device), y.to(device)
    loss = torch.nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(loss.item())
"""


def script(assignments: int) -> str:
    """``assignments`` module-level constants, then a training setup that uses none of them."""
    head = "import torch\nfrom torch.utils.data import DataLoader, TensorDataset\n\n"
    constants = "".join(f"c{i} = {i} * 2\n" for i in range(assignments))
    return head + constants + _TRAINING


def _cpu_seconds(work: Callable[[], object]) -> float:
    gc.collect()
    start = time.process_time()
    work()
    return time.process_time() - start


def scaling(sizes: tuple[int, int], repeats: int) -> Section:
    import libcst

    from accelify.transform.convert import convert

    section = Section(
        "scaling",
        "3. Conversion time against file size (module-level assignments + training code)",
        ["Lines", "libcst.parse_module ms", "accel-convert ms", "convert / parse"],
    )
    ratios = []
    for size in sizes:
        source = script(size)
        parse, conv = [], []
        for _ in range(repeats):
            parse.append(_cpu_seconds(lambda s=source: libcst.parse_module(s)))
            conv.append(_cpu_seconds(lambda s=source: convert(s)))
        p, c = Stat.of(parse).scaled(1000), Stat.of(conv).scaled(1000)
        ratio = c.median / p.median
        ratios.append(ratio)
        lines = source.count("\n")
        section.rows.append([f"{lines:,}", f"{p.median:,.0f}", f"{c.median:,.0f}", f"{ratio:.2f}"])
        section.data[str(lines)] = {"parse_ms": p.as_dict(), "convert_ms": c.as_dict()}
    section.targets = [
        Target(
            f"convert/parse at {sizes[1]:,} over {sizes[0]:,} assignments (1.0 = linear)",
            ratios[1] / ratios[0],
            1.25,
            False,
        )
    ]
    return section
