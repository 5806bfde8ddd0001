"""ACL104 download-on-every-process."""

from __future__ import annotations

import libcst as cst

from accelify.rules.every_process import EveryProcessRule
from accelify.rules.facts import Where
from accelify.rules.rule import Invalid, Severity
from accelify.transform.neighbours import FETCHES
from accelify.transform.patterns import callee_name, keyword_arg

# Fetching a URL into memory (``urlopen``) is N requests, not N writers of one file.
_WRITING_FETCHES = FETCHES - {"urlopen"}


class DownloadOnEveryProcess(EveryProcessRule):
    """A download or archive extraction that every process runs at once.

    ## What it does
    In a script that creates an `Accelerator`, flags `urlretrieve`, `download_url`,
    `download_and_extract_archive`, `extractall` and `download=True` datasets that run on every
    process: outside a main-process guard and outside `with accelerator.main_process_first():`
    (itself, or every call of the function it sits in).

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
        "def fetch():\n    urllib.request.urlretrieve(URL, 'data.tgz')\n\n\n"
        "accelerator = Accelerator()\nwith accelerator.main_process_first():\n    fetch()\n",
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

    def visit_Call(self, node: cst.Call) -> None:
        download = keyword_arg(node, "download")
        flagged = isinstance(download, cst.Arg) and _is_true(download.value)
        if flagged or callee_name(node) in _WRITING_FETCHES:
            self.candidate(node, fixable=False)

    def excused(self, where: Where) -> bool:
        return self.facts.runs_first(where)

    def flag(self, call: cst.Call, accelerator: str | None) -> None:
        self.report(
            call,
            "every process downloads or extracts here at once; do it under "
            "`with accelerator.main_process_first():` (or on the main process, then "
            "`accelerator.wait_for_everyone()`)",
        )


def _is_true(value: cst.BaseExpression) -> bool:
    return isinstance(value, cst.Name) and value.value == "True"
