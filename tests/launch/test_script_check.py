"""The N-times-training warning: which scripts take part in distributed training, read not run."""

from __future__ import annotations

from pathlib import Path

import pytest

from accelify.runtime.launch.script_check import is_distributed

PLAIN = (
    "import torch\nmodel = torch.nn.Linear(2, 1)\nfor step in range(3):\n    model(torch.ones(2))\n"
)


@pytest.mark.parametrize(
    "text",
    [
        "from accelerate import Accelerator\n",
        "from accelify.runtime import Accelerator as A\n",
        "import torch.distributed as dist\n",
        "from torch.nn.parallel import DistributedDataParallel\n",
        "import torch\ntorch.distributed.init_process_group('gloo')\n",
        "from transformers import Trainer\n",  # Trainer builds its own Accelerator
        "import os\nrank = int(os.environ['RANK'])\n",  # shards by hand
        "import lightning as L\n",
        "def broken(:\n",  # unparsable: never warn about what could not be read
    ],
)
def test_any_sign_of_distribution_counts(tmp_path: Path, text: str) -> None:
    script = tmp_path / "train.py"
    script.write_text(PLAIN + text)
    assert is_distributed(script)


def test_a_plain_script_is_not_distributed(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(PLAIN + "import json, os\nprint(os.getcwd())\n")
    assert not is_distributed(script)


@pytest.mark.parametrize("importer", ["from mylib.loop import train\n", "import helpers\n"])
def test_the_scripts_own_modules_are_read_too(tmp_path: Path, importer: str) -> None:
    (tmp_path / "mylib").mkdir()
    (tmp_path / "mylib" / "__init__.py").write_text("")
    (tmp_path / "mylib" / "loop.py").write_text("from accelerate import Accelerator\n")
    (tmp_path / "helpers.py").write_text("import torch.distributed as dist\n")
    script = tmp_path / "train.py"
    script.write_text(PLAIN + importer)
    assert is_distributed(script)
    script.write_text(PLAIN + "import numpy\n")  # not beside it: a third-party module
    assert not is_distributed(script)
