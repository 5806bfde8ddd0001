"""ACL102 save-on-every-process."""

from __future__ import annotations

import libcst as cst

from accelify.rules.build import method_call
from accelify.rules.every_process import EveryProcessRule, Reach
from accelify.rules.facts import Facts, first_shared_call, mentions_rank
from accelify.rules.rule import Invalid, Report, Severity
from accelify.transform.patterns import callee_name, dotted_name, keyword_arg

_WRITE_MODES = ("w", "a", "x")
_WRITERS = frozenset({"save_file", "write_text", "write_bytes"})


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

    The advice never wraps a collective in a main-process guard, which would hang: a
    `save_pretrained` call (it may gather shards) gets `is_main_process=...`, and a write whose
    arguments (or `with open(...)` block) call `accelerator.get_state_dict`/`gather` or the
    prepared model is told to compute them first.

    ## Fix safety
    Unsafe (`torch.save` only): the other processes stop writing, which is the point, but code
    that reads the file back on those processes needs `accelerator.wait_for_everyone()` first.
    The arguments still run on every process, so collectives in them stay collective.
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
        # A save-state hook runs where `save_state` runs: here on the main process only.
        "def main():\n    accelerator = Accelerator()\n\n"
        "    def save_model_hook(models, weights, output_dir):\n        for model in models:\n"
        "            model.save_pretrained(output_dir)\n            weights.pop()\n\n"
        "    accelerator.register_save_state_pre_hook(save_model_hook)\n"
        "    for step in range(10):\n        if accelerator.is_main_process:\n"
        "            accelerator.save_state(f'checkpoint-{step}')\n\nmain()",
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
        Invalid(  # the hook runs on every process: `save_state` is called on all of them
            "def main():\n    accelerator = Accelerator()\n\n"
            "    def save_model_hook(models, weights, output_dir):\n"
            "        for model in models:\n"
            "            model.save_pretrained(output_dir)\n\n"
            "    accelerator.register_save_state_pre_hook(save_model_hook)\n"
            "    accelerator.save_state('checkpoint')\n\nmain()\n"
        ),
        Invalid(
            "def save_checkpoint(accelerator, model, path):\n"
            "    with open(path, 'wb') as f:\n"
            "        f.write(serialize(accelerator.get_state_dict(model)))\n\n\n"
            "def main():\n    accelerator = Accelerator()\n    for epoch in range(3):\n"
            "        save_checkpoint(accelerator, model, f'{epoch}.bin')\n\n\nmain()\n"
        ),
    )

    def __init__(self, facts: Facts, reports: list[Report]) -> None:
        super().__init__(facts, reports)
        self._withs: list[cst.With] = []
        self._spans: dict[cst.Call, cst.With] = {}  # an ``open`` call -> the block writing it

    def visit_With(self, node: cst.With) -> None:
        self._withs.append(node)

    def leave_With(self, node: cst.With) -> None:
        self._withs.pop()

    def visit_Call(self, node: cst.Call) -> None:
        name = callee_name(node)
        if dotted_name(node.func) == "torch.save" and node.args:
            self._add(node, fixable=True)
        elif (
            (name == "save_pretrained" and keyword_arg(node, "is_main_process") is None)
            or name in _WRITERS
            or (name == "open" and isinstance(node.func, cst.Name) and self._write_mode(node))
        ):
            if self._withs and any(item.item is node for item in self._withs[-1].items):
                self._spans[node] = self._withs[-1]
            self._add(node)

    def _add(self, node: cst.Call, fixable: bool = False) -> None:
        if not (node.args and mentions_rank(node.args[0].value)):  # per-rank files are fine
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

    def flag(self, call: cst.Call, reach: Reach) -> None:
        new = method_call(reach.fix, "save", call.args) if reach.fix else None
        self.report(call, self._advice(call, reach), new=new, safe=False)

    def _advice(self, call: cst.Call, reach: Reach) -> str:
        """What to write instead, never a guard around code every process must run."""
        if dotted_name(call.func) == "torch.save" and reach.name:
            return (
                f"every process writes this file; use `{reach.name}.save(...)`: it writes on "
                "the main process only and its arguments still run on every process"
            )
        if callee_name(call) == "save_pretrained":
            return (
                f"every process writes these files; pass `is_main_process={reach.test()}` (it "
                "writes on the main process only and keeps the call, which may gather shards, on "
                "every process)"
            )
        shared = first_shared_call(self._spans.get(call, call), self.facts)
        if shared is not None:
            return (
                f"every process writes this file; compute `{shared}(...)` on every process "
                f"first, then write under `if {reach.test()}:`"
            )
        return f"every process writes this file; guard it with `if {reach.test()}:`"
