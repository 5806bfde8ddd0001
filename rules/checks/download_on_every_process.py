"""ACL104 download-on-every-process."""

from __future__ import annotations

import libcst as cst

from accelify.rules.every_process import EveryProcessRule
from accelify.rules.facts import Facts
from accelify.rules.rule import Invalid, Report, Severity
from accelify.transform.neighbours import FETCHES
from accelify.transform.patterns import callee_name, keyword_arg

# Fetching a URL into memory (``urlopen``) is N requests, not N writers of one file.
_WRITING_FETCHES = FETCHES - {"urlopen"}
_FIRST = frozenset({"main_process_first", "local_main_process_first"})


class DownloadOnEveryProcess(EveryProcessRule):
    """A download or archive extraction that every process runs at once.

    ## What it does
    In a script that creates an `Accelerator`, flags `urlretrieve`, `download_url`,
    `download_and_extract_archive`, `extractall` and `download=True` datasets that run on every
    process: outside a main-process guard and outside `with accelerator.main_process_first():`.

    ## Why is this bad?
    N processes write the same files at the same time: a process can read a half-written
    archive, or one process's extraction overwrites what another is reading. It works on one
    process and fails, now and then, on eight.

    ## Example
    ```python
    train_set = datasets.MNIST("data", download=True)
    ```

    ## Use instead
    ```python
    with accelerator.main_process_first():
        train_set = datasets.MNIST("data", download=True)
    ```
    """

    code = "ACL104"
    name = "download-on-every-process"
    severity = Severity.WARNING

    VALID = (
        "accelerator = Accelerator()\nwith accelerator.main_process_first():\n"
        "    train_set = datasets.MNIST('data', download=True)\n",
        "accelerator = Accelerator()\nif accelerator.is_main_process:\n"
        "    urllib.request.urlretrieve(URL, 'data.tgz')\naccelerator.wait_for_everyone()\n",
        "accelerator = Accelerator()\nconfig = json.load(urllib.request.urlopen(URL))\n",
        "train_set = datasets.MNIST('data', download=True)  # no Accelerator\n",
    )
    INVALID = (
        Invalid(
            "def main():\n    accelerator = Accelerator()\n"
            "    train_set = datasets.MNIST('data', train=True, download=True)\n"
            "\n\nif __name__ == '__main__':\n    main()\n"
        ),
        Invalid(
            "def fetch():\n    with tarfile.open('extra.tgz') as archive:\n"
            "        archive.extractall('data')\n\n\n"
            "accelerator = Accelerator()\nif args.extra:\n    fetch()\n"
        ),
    )

    def __init__(self, facts: Facts, reports: list[Report]) -> None:
        super().__init__(facts, reports)
        self._first = 0  # open ``with accelerator.main_process_first():`` blocks

    def visit_With(self, node: cst.With) -> None:
        self._first += _main_first(node)

    def leave_With(self, node: cst.With) -> None:
        self._first -= _main_first(node)

    def visit_Call(self, node: cst.Call) -> None:
        if self._first:
            return
        download = keyword_arg(node, "download")
        flagged = isinstance(download, cst.Arg) and _is_true(download.value)
        if flagged or callee_name(node) in _WRITING_FETCHES:
            self.candidate(node, fixable=False)

    def flag(self, call: cst.Call, accelerator: str | None) -> None:
        self.report(
            call,
            "every process downloads or extracts here at once; do it under "
            "`with accelerator.main_process_first():` (or on the main process, then "
            "`accelerator.wait_for_everyone()`)",
        )


def _main_first(node: cst.With) -> int:
    return int(
        any(isinstance(i.item, cst.Call) and callee_name(i.item) in _FIRST for i in node.items)
    )


def _is_true(value: cst.BaseExpression) -> bool:
    return isinstance(value, cst.Name) and value.value == "True"
