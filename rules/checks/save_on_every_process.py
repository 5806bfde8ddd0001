"""ACL102 save-on-every-process."""

from __future__ import annotations

import libcst as cst

from accelify.rules.build import method_call
from accelify.rules.every_process import EveryProcessRule
from accelify.rules.facts import RANK_NAMES
from accelify.rules.rule import Invalid, Severity
from accelify.transform.patterns import callee_name, dotted_name, keyword_arg

_WRITE_MODES = ("w", "a", "x")
_WRITERS = frozenset({"save_file", "write_text", "write_bytes"})


def _mentions_rank(node: cst.CSTNode) -> bool:
    """A path built from the process index is a per-process file, which is fine."""
    code = cst.Module([]).code_for_node(node)
    return any(name in code for name in RANK_NAMES)


class SaveOnEveryProcess(EveryProcessRule):
    """A file written on every process of a distributed run.

    ## What it does
    In a script that creates an `Accelerator`, flags `torch.save`, `save_pretrained`,
    safetensors' `save_file`, `Path.write_text`/`write_bytes` and `open(..., "w")` that run on
    every process: not under `if accelerator.is_main_process:` (or `is_local_main_process`, a
    rank check, an early `return` on the other processes, `@accelerator.on_main_process`) and not
    through `accelerator.save`.

    ## Why is this bad?
    Every process writes the same path at the same time: on a shared file system the file ends
    up truncated or interleaved, and N copies cost N times the I/O.

    ## Example
    ```python
    torch.save(state, "ckpt.pt")
    ```

    ## Use instead
    ```python
    accelerator.save(state, "ckpt.pt")  # writes on the main process only
    ```

    ## Fix safety
    Unsafe (`torch.save` only): the other processes stop writing, which is the point, but code
    that reads the file back on those processes needs `accelerator.wait_for_everyone()` first.
    """

    code = "ACL102"
    name = "save-on-every-process"
    severity = Severity.WARNING

    VALID = (
        "accelerator = Accelerator()\nif accelerator.is_main_process:\n    torch.save(s, 'a.pt')",
        "accelerator = Accelerator()\naccelerator.save(s, 'a.pt')",
        "accelerator = Accelerator()\n\ndef save(s):\n    if not accelerator.is_main_process:\n"
        "        return\n    torch.save(s, 'a.pt')\n\nsave(1)",
        "accelerator = Accelerator()\nfor s in states:\n"
        "    if not accelerator.is_local_main_process: continue\n    torch.save(s, 'a.pt')",
        "import sys\naccelerator = Accelerator()\nif accelerator.process_index != 0:\n"
        "    sys.exit(0)\ntorch.save(s, 'a.pt')",
        "accelerator = Accelerator()\n\n@accelerator.on_main_process\ndef save(s):\n"
        "    torch.save(s, 'a.pt')\n\nsave(1)",
        "accelerator = Accelerator()\n\ndef save(s):\n    torch.save(s, 'a.pt')\n\n"
        "if accelerator.is_main_process:\n    save(1)",
        "accelerator = Accelerator()\nwith open('cfg.json') as f:\n    pass",
        "accelerator = Accelerator()\nis_main = accelerator.is_main_process\nif is_main:\n"
        "    torch.save(s, 'a.pt')",
        "accelerator = Accelerator()\nif args.push and accelerator.is_local_main_process:\n"
        "    torch.save(s, 'a.pt')",
        "accelerator = Accelerator()\nif accelerator.is_main_process:\n    pass\n"
        "else:\n    torch.save(s, 'others.pt')  # decided per process on purpose",
        "accelerator = Accelerator()\n"
        "with open(f'log_{accelerator.process_index}.txt', 'w') as f:\n    pass",
        "accelerator = Accelerator()\n"
        "model.save_pretrained('out', is_main_process=accelerator.is_main_process)",
        "import torch\ntorch.save(s, 'a.pt')  # no Accelerator: one process",
    )
    INVALID = (
        Invalid(
            "accelerator = Accelerator()\ntorch.save(state, 'a.pt')\n",
            "accelerator = Accelerator()\naccelerator.save(state, 'a.pt')\n",
        ),
        Invalid("accelerator = Accelerator()\nwith open('out.txt', 'w') as f:\n    f.write('x')\n"),
        Invalid(
            "def main():\n    accelerator = Accelerator()\n    if accelerator.is_main_process:\n"
            "        print('hi')\n    tokenizer.save_pretrained('out')\n\nmain()\n"
        ),
    )

    def visit_Call(self, node: cst.Call) -> None:
        name = callee_name(node)
        if dotted_name(node.func) == "torch.save" and node.args:
            self._add(node, fixable=True)
        elif (
            (name == "save_pretrained" and keyword_arg(node, "is_main_process") is None)
            or name in _WRITERS
            or (name == "open" and isinstance(node.func, cst.Name) and self._write_mode(node))
        ):
            self._add(node)

    def _add(self, node: cst.Call, fixable: bool = False) -> None:
        if not (node.args and _mentions_rank(node.args[0].value)):  # per-rank files are fine
            self.candidate(node, fixable=fixable)

    @staticmethod
    def _write_mode(call: cst.Call) -> bool:
        mode = keyword_arg(call, "mode")
        if mode is None and len(call.args) > 1 and call.args[1].keyword is None:
            mode = call.args[1]
        value = mode.value if mode is not None else None
        return isinstance(value, cst.SimpleString) and any(
            m in value.evaluated_value
            for m in _WRITE_MODES  # type: ignore[operator]
        )

    def flag(self, call: cst.Call, accelerator: str | None) -> None:
        message = (
            "every process writes this file; guard it with "
            "`if accelerator.is_main_process:` or use `accelerator.save`"
        )
        new = method_call(accelerator, "save", call.args) if accelerator else None
        self.report(call, message, new=new, safe=False)
