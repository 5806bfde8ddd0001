"""ACL107 disk-write-on-every-process."""

from __future__ import annotations

import builtins

import libcst as cst

from accelify.rules.build import with_keyword
from accelify.rules.every_process import EveryProcessRule, Reach
from accelify.rules.facts import Facts, first_shared_call, mentions_rank, name_role
from accelify.rules.imports import ImportsRule
from accelify.rules.rule import Invalid, Report, Severity
from accelify.transform.names import Names
from accelify.transform.patterns import (
    Role,
    callee_name,
    disk_writer,
    dotted_name,
    keyword_arg,
    memory_file,
)

# Writers (accel-convert's list, shared) that race rather than write: the first process wins and
# the others fail. ``plt.show()`` writes nothing: N windows, or none on a headless node.
_REMOVERS = frozenset({"remove", "unlink", "rmtree"})
_FOLDER_MAKERS = frozenset({"makedirs", "mkdir"})
_NOT_WRITES = frozenset({"show"})
_BUILTINS = frozenset(dir(builtins))


class DiskWriteOnEveryProcess(EveryProcessRule, ImportsRule):
    """An image, array or plot written, or a file or folder removed or made, on every process.

    ## What it does
    In a script that creates an `Accelerator`, flags the disk writes accel-convert puts on the
    main process (`save_image`, `np.save`/`savez`/`savetxt`, `imsave`, `os.remove`/`unlink`,
    `shutil.rmtree`, `shutil.copyfile`/`copy`/`copy2`/`copytree`/`move`, `os.makedirs`/`mkdir`,
    each checked against its import, and the methods
    `.savefig` and `.to_csv`) when every process runs them: outside a main-process guard and on
    a path that does not name the process. A write into an in-memory file (`io.BytesIO()`), which
    each process fills for itself, a removal inside `try:` or `suppress(...)`, `rmtree(...,
    ignore_errors=True)` and `makedirs(..., exist_ok=True)` are fine on every process. The
    checkpoint writers (`torch.save`, `save_pretrained`, `open(..., "w")`) are ACL102's.

    These are also what accel-convert leaves for a human: a write that runs the prepared model
    (every process has to run the model's forward together, so the write cannot simply go under
    a guard), and a write that runs before the accelerator exists.

    ## Why is this bad?
    N processes write the same file at once: an image or array ends up truncated or
    interleaved, and N copies cost N times the I/O. Removing a file, or making a folder without
    `exist_ok=True`, races: one process wins and the others crash with `FileNotFoundError` or
    `FileExistsError`, on some runs only. The advice never puts a forward pass of the prepared
    model, or a collective, under a main-process guard: under DeepSpeed/FSDP (and DDP with
    buffers) every process must run it, and the guarded one would wait forever.

    ## Example
    ```python
    from torchvision.utils import save_image

    model = accelerator.prepare(model)
    for epoch in range(epochs):
        train(model, loader, optimizer)
        save_image(model(fixed_noise), f"samples/{epoch}.png")
    ```

    ## Use instead
    ```python
    from torchvision.utils import save_image

    model = accelerator.prepare(model)
    for epoch in range(epochs):
        train(model, loader, optimizer)
        samples = model(fixed_noise)  # every process runs the model
        if accelerator.is_main_process:
            save_image(samples, f"samples/{epoch}.png")
    ```

    ## Fix safety
    Unsafe (`os.makedirs` only, which gets `exist_ok=True`): a folder left by an earlier run no
    longer stops the script.
    """

    code = "ACL107"
    name = "disk-write-on-every-process"
    severity = Severity.WARNING

    VALID = (
        "from torchvision.utils import save_image\naccelerator = Accelerator()\n"
        "if accelerator.is_main_process:\n    save_image(images, 'samples.png')\n",
        "import os\naccelerator = Accelerator()\nos.makedirs(args.output_dir, exist_ok=True)\n",
        "import numpy as np\naccelerator = Accelerator()\n"
        "np.save(f'preds_{accelerator.process_index}.npy', preds)\n",
        "import numpy as np\nnp.save('preds.npy', preds)  # no Accelerator\n",
        "import torch\naccelerator = Accelerator()\ntorch.save(state, 'a.pt')  # ACL102's\n",
        "import os\naccelerator = Accelerator()\ntry:\n    os.remove('train.lock')\n"
        "except FileNotFoundError:\n    pass\n",
        "import shutil\naccelerator = Accelerator()\nshutil.rmtree('tmp', ignore_errors=True)\n",
        "import matplotlib.pyplot as plt\naccelerator = Accelerator()\nplt.show()\n",
        "import matplotlib.pyplot as plt\naccelerator = Accelerator()\n\n\n"
        "@accelerator.on_main_process\ndef plot(history):\n    plt.plot(history)\n"
        "    plt.savefig('loss.png')\n\n\nplot(losses)\n",
        "accelerator = Accelerator()\n\n\ndef save(path):  # the script's own, not numpy's\n"
        "    pass\n\n\nsave('x.npy')\n",
        "import io\nimport matplotlib.pyplot as plt\naccelerator = Accelerator()\n\n\n"
        "def to_image():  # each process fills and reads its own buffer\n"
        "    buf = io.BytesIO()\n    plt.savefig(buf)\n    buf.seek(0)\n    return buf\n",
    )
    INVALID = (
        Invalid(
            "from torchvision.utils import save_image\n\naccelerator = Accelerator()\n"
            "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\n"
            "for epoch in range(3):\n    train(model, loader, optimizer)\n"
            "    save_image(model(fixed_noise), f'samples/{epoch}.png')\n"
        ),
        Invalid(
            "import matplotlib.pyplot as plt\n\n\ndef plot(history):\n    plt.plot(history)\n"
            "    plt.savefig('loss.png')\n\n\ndef main():\n    accelerator = Accelerator()\n"
            "    history = train(accelerator)\n    plot(history)\n\n\n"
            "if __name__ == '__main__':\n    main()\n"
        ),
        Invalid(
            "from numpy import savetxt as dump\n\naccelerator = Accelerator()\n"
            "if args.dump_embeddings:\n    dump('embeddings.txt', embeddings)\n"
        ),
        Invalid(
            "import os\n\naccelerator = Accelerator()\nif not os.path.exists(args.out):\n"
            "    os.makedirs(args.out)\n",
            "import os\n\naccelerator = Accelerator()\nif not os.path.exists(args.out):\n"
            "    os.makedirs(args.out, exist_ok=True)\n",
        ),
        Invalid(
            "import os\n\n\ndef main():\n    if os.path.exists('last.ckpt'):\n"
            "        os.remove('last.ckpt')\n    accelerator = Accelerator()\n\n\nmain()\n"
        ),
        Invalid(
            "import shutil\n\naccelerator = Accelerator()\nfor run in runs:\n"
            "    shutil.rmtree(run.output_dir)\n"
        ),
    )

    def __init__(self, facts: Facts, reports: list[Report]) -> None:
        super().__init__(facts, reports)
        self._tolerant = 0  # open ``try:`` bodies and ``with suppress(...)`` blocks
        self._found: dict[cst.Call, tuple[str, bool]] = {}  # call -> message, exist_ok fix
        self._memory: set[tuple[int, str]] = set()  # (function, name) bound to ``io.BytesIO()``

    def visit_Try_body(self, node: cst.Try) -> None:
        self._tolerant += 1

    def leave_Try_body(self, node: cst.Try) -> None:
        self._tolerant -= 1

    def visit_With(self, node: cst.With) -> None:
        self._tolerant += _suppresses(node)

    def leave_With(self, node: cst.With) -> None:
        self._tolerant -= _suppresses(node)

    def visit_Assign(self, node: cst.Assign) -> None:
        if memory_file(node.value, self.names):
            where = id(self.facts.function())
            self._memory |= {
                (where, t.target.value) for t in node.targets if isinstance(t.target, cst.Name)
            }

    def visit_Expr(self, node: cst.Expr) -> None:
        """A writer called as a statement of its own, the form accel-convert guards."""
        call = node.value
        if not isinstance(call, cst.Call):
            return
        writer = disk_writer(call, self.names)
        if writer is None or writer in _NOT_WRITES or any(mentions_rank(a) for a in call.args):
            return
        if any(self._in_memory(arg.value) for arg in call.args):
            return  # ``plt.savefig(buf)``: each process fills its own buffer
        message = self._message(call, writer, f"`if {self.reach().test()}:`")
        if message is not None:
            fixable = writer == "makedirs" and _argument(call, "exist_ok", 2) is None
            self._found[call] = message, fixable
            self.candidate(call, fixable=False)

    def _in_memory(self, expr: cst.BaseExpression) -> bool:
        if isinstance(expr, cst.Name):
            return (id(self.facts.function()), expr.value) in self._memory
        return memory_file(expr, self.names)

    def _message(self, call: cst.Call, writer: str, guard: str) -> str | None:
        """What goes wrong and what to do (under ``guard``), or None for a form that is fine on
        every process."""
        if writer in _REMOVERS:
            if self._tolerant or _given(call, "ignore_errors", 1):
                return None
            return (
                "every process removes this at once: all but the first can fail with "
                f"FileNotFoundError; remove it on the main process only ({guard})"
            )
        if writer in _FOLDER_MAKERS:
            if self._tolerant or _given(call, "exist_ok", 2):
                return None
            instead = "pass" if writer == "makedirs" else "use `os.makedirs(...)` with"
            return (  # the advice needs no accelerator
                "every process makes this folder at once: all but the first can fail with "
                f"FileExistsError; {instead} `exist_ok=True`"
            )
        if (shared := first_shared_call(call, self.facts)) is not None:
            return (
                f"every process writes this file at once, and it also runs `{shared}`, which "
                "every process must run together: run it on every process first, then write "
                f"on the main process only ({guard})"
            )
        if _may_run_model(call, self.names):
            return (
                "every process writes this file at once; compute what it writes on every "
                "process first (it may run a model), then write on the main process only "
                f"({guard})"
            )
        return (
            f"every process writes this file at once; write it on the main process only ({guard})"
        )

    def flag(self, call: cst.Call, reach: Reach) -> None:
        message, fixable = self._found[call]
        new = with_keyword(call, "exist_ok", cst.Name("True")) if fixable else None
        self.report(call, message, new=new, safe=False)


def _suppresses(node: cst.With) -> int:
    """1 for ``with contextlib.suppress(...):``, whose errors are ignored, else 0."""
    return int(
        any(isinstance(i.item, cst.Call) and callee_name(i.item) == "suppress" for i in node.items)
    )


def _argument(call: cst.Call, keyword: str, position: int) -> cst.Arg | None:
    """The argument ``keyword``, by name or at ``position`` (counted from 0)."""
    positional = [a for a in call.args if a.keyword is None and not a.star]
    return keyword_arg(call, keyword) or (
        positional[position] if len(positional) > position else None
    )


def _given(call: cst.Call, keyword: str, position: int) -> bool:
    """Whether the flag ``keyword`` is given as anything but a literal ``False``."""
    arg = _argument(call, keyword, position)
    return arg is not None and not (isinstance(arg.value, cst.Name) and arg.value.value == "False")


class _LocalCalls(cst.CSTVisitor):
    """Finds a call that may run a model: of a name the file neither imports nor gets from
    Python (``net(z)``, ``sample(model)``), or a method of a name that reads as a model."""

    def __init__(self, names: Names) -> None:
        super().__init__()
        self.names = names
        self.found = False

    def visit_Call(self, node: cst.Call) -> bool:
        func = node.func
        if isinstance(func, cst.Name):
            self.found |= func.value not in _BUILTINS and self.names.qualify(func) is None
        elif isinstance(func, cst.Attribute) and self.names.qualify(func) is None:
            self.found |= name_role(dotted_name(func.value)) is Role.MODEL
        return not self.found


def _may_run_model(call: cst.Call, names: Names) -> bool:
    """Whether the arguments of ``call`` call something that may be a model."""
    finder = _LocalCalls(names)
    for arg in call.args:
        arg.visit(finder)
    return finder.found
