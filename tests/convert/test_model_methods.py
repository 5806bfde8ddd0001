"""Which model methods the training step may call through ``accelerator.unwrap_model``: the
flow from the call's result to the backward pass, over the variants real scripts write around
``model.generate(...)`` (the golden fixtures in fixtures/convert/model_methods show whole files).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from accelify.transform.convert import Options, convert

BASE = (
    Path(__file__).resolve().parents[2]
    / "fixtures"
    / "convert"
    / "model_methods"
    / "generate_sample_in_training_loop.in.py"
).read_text()
SAMPLED = """        if step % 4 == 0:
            sample = model.generate(inputs[:1, :2], 6)
            print(step, loss.item(), sample.tolist())"""


@pytest.mark.parametrize(
    ("drawn", "converts"),
    [
        # Printed beside the batch, through a torch function: nothing reaches the loss.
        ("sample = model.generate(inputs[:1, :2], 6)\nprint(inputs, torch.argmax(sample))", True),
        # Written into the targets by a function of another module, or through out=.
        ("sample = model.generate(inputs[:, :2], 6)\nnp.copyto(targets, sample[:, 2:])", False),
        ("sample = model.generate(inputs[:, :2], 6)\ntorch.add(sample, 0, out=inputs)", False),
        # Kept in a list the next step's loss reads.
        ("kept.append(model.generate(inputs[:1, :2], 6))", False),
        # Called for what it does: every process would do it.
        ("model.generate(inputs[:1, :2], 6)", False),
    ],
    ids=["printed", "copied", "out", "kept", "statement"],
)
def test_a_generated_sample_converts_only_when_none_of_it_reaches_the_loss(
    drawn: str, converts: bool
) -> None:
    body = "\n".join("            " + line for line in drawn.splitlines())
    source = (
        BASE.replace(SAMPLED, "        if step % 4 == 0:\n" + body)
        .replace("import torch\n", "import numpy as np\nimport torch\n", 1)
        .replace("    for step,", "    kept = [torch.zeros(1)]\n    for step,", 1)
        .replace("loss.backward()", "(loss + 0 * kept[-1].float().sum()).backward()")
    )
    assert source != BASE
    result = convert(source, Options())
    assert (result.code != source) is converts, [n.message for n in result.manual]
    if converts:
        assert "accelerator.unwrap_model(model).generate(" in result.code
    else:
        (note,) = result.manual
        assert "model.generate(...), which the prepared (wrapped) model does not have" in (
            note.message
        )
