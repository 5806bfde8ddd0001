"""ACL104 download-on-every-process."""

from __future__ import annotations

import libcst as cst

from accelify.rules.every_process import EveryProcessRule, Reach
from accelify.rules.facts import Facts, Where
from accelify.rules.rule import Invalid, Report, Severity
from accelify.transform.neighbours import FETCHES
from accelify.transform.patterns import callee_name, keyword_arg, target_names
from accelify.transform.walk import nodes

# Fetches that skip a file already there: after ``main_process_first()`` the others find it.
_SKIP_FILES = frozenset({"download_url"})
# Fetches that write their files each time they run. Fetching a URL into memory (``urlopen``)
# is N requests, not N writers of one file.
_WRITING_FETCHES = FETCHES - {"urlopen"} - _SKIP_FILES
# Calls in an ``if`` test that look for the files first: the fetch under it runs once.
_FILE_TESTS = frozenset({"exists", "isfile", "isdir", "is_file", "is_dir", "check_integrity"})


class DownloadOnEveryProcess(EveryProcessRule):
    """A download or archive extraction that every process runs at once.

    ## What it does
    In a script that creates an `Accelerator`, flags `urlretrieve`, `download_url`,
    `download_and_extract_archive`, `extractall` and `download=True` datasets that run on every
    process: outside a main-process guard, and (for a fetch that skips files already there)
    outside `with accelerator.main_process_first():`, itself or every call of the function it
    sits in.

    ## Why is this bad?
    N processes write the same files at the same time: a process can read a half-written
    archive, or one process's extraction overwrites what another is reading. It works on one
    process and fails, now and then, on eight.

    `main_process_first()` only orders the processes: the others run the same call once the main
    one is done. A dataset with `download=True` (or `download_url`) then finds the files and
    skips them; `urlretrieve` and extractions write them again, while the main process may
    already be reading them. Those run on the main process only, and the others wait.

    ## Example
    ```python
    train_set = datasets.MNIST("data", download=True)
    urllib.request.urlretrieve(URL, "data.tgz")
    ```

    ## Use instead
    ```python
    with accelerator.main_process_first():
        train_set = datasets.MNIST("data", download=True)
    if accelerator.is_main_process:
        urllib.request.urlretrieve(URL, "data.tgz")
    accelerator.wait_for_everyone()
    ```
    """

    code = "ACL104"
    name = "download-on-every-process"
    severity = Severity.WARNING

    VALID = (
        # The disk test is at the call, through a name: the others find the files and skip.
        "def fetch():\n    urllib.request.urlretrieve(URL, 'data.tgz')\n\n\n"
        "accelerator = Accelerator()\nwith accelerator.main_process_first():\n"
        "    ready = os.path.exists('data.tgz')\n    if not ready:\n        fetch()\n",
        "accelerator = Accelerator()\nwith accelerator.main_process_first():\n"
        "    train_set = datasets.MNIST('data', download=True)\n",
        "accelerator = Accelerator()\nif accelerator.is_main_process:\n"
        "    urllib.request.urlretrieve(URL, 'data.tgz')\naccelerator.wait_for_everyone()\n",
        "accelerator = Accelerator()\nconfig = json.load(urllib.request.urlopen(URL))\n",
        "train_set = datasets.MNIST('data', download=True)  # no Accelerator\n",
        "def fetch():\n    download_url(URL, 'data')\n\n\n"
        "accelerator = Accelerator()\nwith accelerator.main_process_first():\n    fetch()\n",
        # The others find the file the main process wrote, and skip the download.
        "accelerator = Accelerator()\nwith accelerator.main_process_first():\n"
        "    if not os.path.exists('data.tgz'):\n"
        "        urllib.request.urlretrieve(URL, 'data.tgz')\n",
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
        Invalid(  # the others download again, over the file the main process reads
            "accelerator = Accelerator()\nwith accelerator.main_process_first():\n"
            "    urllib.request.urlretrieve(URL, 'data.tgz')\n"
        ),
    )

    def __init__(self, facts: Facts, reports: list[Report]) -> None:
        super().__init__(facts, reports)
        # fetches that write their files again each time they run -> where they are
        self._fetches: dict[cst.Call, Where] = {}
        # Disk tests, followed only in files that name one (most do not):
        self._disk_words = any(word in facts.source for word in _FILE_TESTS)
        self._check_disk: set[cst.FunctionDef | None] = set()  # scopes that test for files
        self._disk_names: set[tuple[cst.FunctionDef | None, str]] = set()  # ready = p.exists()
        self._tested: list[cst.If] = []  # the disk-test ifs around this point
        self._called = {True: set[str](), False: set[str]()}  # names called under a test or not

    def _tests_disk(self, test: cst.BaseExpression) -> bool:
        function = self.facts.function()
        return any(
            (isinstance(n, cst.Call) and callee_name(n) in _FILE_TESTS)
            or (isinstance(n, cst.Name) and (function, n.value) in self._disk_names)
            for n in nodes(test, (cst.Call, cst.Name))
        )

    def leave_Assign(self, node: cst.Assign) -> None:
        """``ready = all(p.exists() for p in files)``: a name that holds a disk test."""
        if self._disk_words and self._tests_disk(node.value):
            function = self.facts.function()
            for target in node.targets:
                self._disk_names.update((function, n) for n in target_names(target.target))

    def visit_If(self, node: cst.If) -> None:
        if self._disk_words and self._tests_disk(node.test):
            self._check_disk.add(self.facts.function())
            self._tested.append(node)

    def leave_If(self, node: cst.If) -> None:
        if self._tested and self._tested[-1] is node:
            self._tested.pop()

    def visit_Call(self, node: cst.Call) -> None:
        download = keyword_arg(node, "download")
        name = callee_name(node)
        if self._disk_words and name is not None:
            self._called[bool(self._tested)].add(name)
        if (isinstance(download, cst.Arg) and _is_true(download.value)) or name in _SKIP_FILES:
            self.candidate(node, fixable=False)
        elif name in _WRITING_FETCHES:
            self._fetches[node] = self.facts.where()
            self.candidate(node, fixable=False)

    def _rewrites(self, call: cst.Call) -> bool:
        """Whether ``call`` writes its files again when run after the main process: no disk
        test in its function, nor around every call of that function in this file."""
        if call not in self._fetches:
            return False
        function = self._fetches[call].function
        if function in self._check_disk:
            return False
        name = function.name.value if function is not None else None
        return not (name in self._called[True] and name not in self._called[False])

    def excused(self, call: cst.Call, where: Where) -> bool:
        return not self._rewrites(call) and self.facts.runs_first(where)

    def flag(self, call: cst.Call, reach: Reach) -> None:
        accelerator = reach.name or "PartialState()"
        if not self._rewrites(call):
            self.report(
                call,
                "every process downloads here at once; wrap it in "
                f"`with {accelerator}.main_process_first():` (the main process downloads, the "
                "others then find its files)",
            )
            return
        again = (
            "`main_process_first()` lets the other processes download or extract again once "
            "the main one is done, over the files it is reading"
            if self.facts.runs_first(self._fetches[call])
            else "every process downloads or extracts here at once"
        )
        self.report(
            call,
            f"{again}; do it on the main process only (`if {reach.test()}:`), then call "
            f"`{accelerator}.wait_for_everyone()` on every process",
        )


def _is_true(value: cst.BaseExpression) -> bool:
    return isinstance(value, cst.Name) and value.value == "True"
