"""What every process would do to the disk at once: done by the main process, or first by it.

Every process runs the script, so ``save_image(...)``, ``plt.savefig(...)``, ``np.save(...)`` or a
``with open(path, "w")`` block would write the same file N times at once, interleaved, and
``os.remove``/``os.makedirs`` would race (one process removes what another just removed). Each goes
under ``if accelerator.is_main_process:``. A dataset built with ``download=True``, a function of
the script that downloads, an imported one named for it (``snapshot_download(...)``,
``nltk.download(...)``) or a torchtext dataset (which downloads when absent) goes under
``with accelerator.main_process_first():``: the main process downloads, the others then read
what it wrote.

Files the main process alone writes before training are followed by ``wait_for_everyone()``:
the script may read them back on every process.

A write that also runs the prepared model (``save_image(model(x), ...)``) is reported instead:
every process has to run the model's forward together. So are loggers every process would open
(a ``SummaryWriter`` per process, a wandb run per process): where their calls go is the script's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import libcst as cst

from accelify.transform.analysis import Analysis, Scope, key_of
from accelify.transform.neighbours import FETCHES, ProjectRuns
from accelify.transform.patterns import (
    callee_name,
    disk_writer,
    dotted_name,
    keyword_arg,
    memory_file,
    placeholder_of,
)
from accelify.transform.plan import Plan
from accelify.transform.setup import origins
from accelify.transform.steps.save import rank_safe
from accelify.transform.trackers import opens_a_run
from accelify.transform.walk import nodes

_WRITE_MODES = frozenset("wax")
_DISK_TESTS = frozenset(
    {"exists", "isdir", "isfile", "is_dir", "is_file", "listdir", "scandir", "iterdir", "glob"}
)


def writes(plan: Plan) -> None:
    if plan.setup is None:
        return
    first: list[cst.BaseStatement] = []  # the statements already going to the main process first
    guarded: list[cst.Call] = []
    enclosed: set[int] = set()  # statements already under the guard (``with open(a), open(b):``)
    effects = list(side_effects(plan))
    fetches = [call for call, _statement, how in effects if how == "fetches"]
    for call, statement, how in effects:
        if how == "fetches" or (how != "downloads" and on_main_only(plan.analysis, statement)):
            continue  # a write under the script's own rank-0 guard already runs once
        if _runs_model(plan, statement):
            plan.needs_human(
                call,
                "every process does this, and it also runs the prepared model: compute first, "
                "then do it on the main process only",
            )
            continue
        accelerator = plan.accelerator(call, optional=True)
        if accelerator is None:
            plan.needs_human(
                call,
                f"every process {'writes' if how == 'shares its line' else how} here at once "
                "(before the accelerator exists)",
            )
            continue
        if how == "downloads":
            _first(plan, call, statement, accelerator, first)
        elif how != "writes":
            plan.needs_human(
                call,
                f"every process runs {_what(call)} here at once, on a line with other "
                "statements: put it on a line of its own, under if "
                f"{plan.analysis.module.code_for_node(accelerator)}.is_main_process:",
            )
        else:
            if id(statement) not in enclosed:
                _guard(plan, statement, accelerator)
                enclosed.add(id(statement))
            plan.changed(call, f"{_what(call)} runs on the main process only")
            guarded.append(call)
    _report_fetches(plan, fetches, first)
    names = plan.analysis.names
    files = [c for c in guarded if disk_writer(c, names) not in _ON_SCREEN]
    _wait_after_data_writes(plan, files)
    _wait_before_reads_back(plan, files)
    _report_loggers(plan)


def _report_fetches(plan: Plan, fetches: list[cst.Call], first: list[cst.BaseStatement]) -> None:
    """Download code written out (``requests.get``, ``extractall``) is the script's to move; in a
    function every call of which now runs on the main process first, it already does."""
    a = plan.analysis
    for call in fetches:
        function = a.scope_of[id(call)]
        callers = [c for c, _where in a.calls if a.callee(c) is function]
        if callers and all(any(a.contains(s, c) for s in first) for c in callers):
            continue
        plan.needs_human(
            call,
            "every process downloads or extracts here at once: do it on the main process "
            "(if accelerator.is_main_process:), then accelerator.wait_for_everyone()",
        )


def _wait_after_data_writes(plan: Plan, guarded: list[cst.Call]) -> None:
    """Files the main process alone now writes before training (a split written to CSV, a
    vocabulary) are often read back by every process right after: each run of statements of
    the setup that writes them is followed by ``accelerator.wait_for_everyone()``. The wait
    goes in the setup's own block, which every process runs (not inside an ``if`` that tests
    whether the file exists, where a late process would skip it and leave the others waiting)."""
    setup = plan.setup
    assert setup is not None
    at = setup.prepare_at
    if at is None:
        return
    timeline = setup.timeline
    writing = {}  # position in the setup's block -> (statement, the first write it holds)
    for call in guarded:
        for anchor in timeline.anchors(call) or ():
            top = timeline.top_in(at.block, anchor)
            if top is not None and (index := timeline.index(at.block, top)) < at.index:
                writing.setdefault(index, (top, call))
    for index, (statement, call) in sorted(writing.items()):
        if index + 1 in writing:
            continue  # the wait goes after the last of consecutive writing statements
        accelerator = plan.accelerator(call)
        wait = plan.statement(
            f"{plan.analysis.module.code_for_node(accelerator)}.wait_for_everyone()\n"
        )
        plan.edits.insert_after(statement, wait)
        plan.changed(
            statement,
            "the other processes wait here for the files the main process wrote, before "
            "they read them",
        )


# Reads of files from disk (function -> packages it comes from), by what they are called; a
# test of what is there reads it too (``os.path.isdir(out)`` after a main-only ``makedirs``).
_DISK_READERS = {
    "imread": ("imageio", "matplotlib", "cv2", "skimage"),
    "listdir": ("os",),
    "exists": ("os",),
    "isdir": ("os",),
    "isfile": ("os",),
    "glob": ("glob",),
    "read_csv": ("pandas",),
    "open": ("PIL",),
}


def _wait_before_reads_back(plan: Plan, written: list[cst.Call]) -> None:
    """Files the main process alone now writes while training (a figure per epoch) may be read
    back after it by every process (the frames of a GIF): the statement of the setup's block
    that first reads from disk after them waits for the main process to have written them. A
    read that only some processes reach, or in the same statement as a write, is left alone."""
    setup = plan.setup
    at = setup.prepare_at if setup is not None else None
    if at is None or not written:
        return
    a = plan.analysis
    timeline = setup.timeline  # type: ignore[union-attr]
    tops = {
        id(t)
        for c in written
        for n in timeline.anchors(c) or ()
        if (t := timeline.top_in(at.block, n))
    }
    first = min(a.line(c) for c in written)
    for call, _scope in plan.training_calls():
        name = a.names.last_part(call.func)
        if name not in _DISK_READERS or not a.names.from_package(call.func, *_DISK_READERS[name]):
            continue
        anchors = timeline.anchors(call) or ()
        top = next((t for n in anchors if (t := timeline.top_in(at.block, n))), None)
        if top is None or id(top) in tops or a.line(top) < first:
            continue
        if timeline.index(at.block, top) <= at.index or not rank_safe(plan, top):
            continue
        accelerator = plan.accelerator(call, optional=True)
        if accelerator is None:
            continue
        wait = plan.statement(f"{a.module.code_for_node(accelerator)}.wait_for_everyone()\n")
        plan.edits.insert_before(top, wait)
        plan.changed(
            call,
            "waits for the files the main process wrote, before reading them back",
        )
        return


def side_effects(plan: Plan) -> Iterator[tuple[cst.Call, cst.BaseStatement, str]]:
    """(call, its statement, how) for each disk effect in training code: "writes" (guarded),
    "downloads" (main process first), "fetches" (download code written out: reported) or
    "shares its line" (a write on a line with other statements: reported)."""
    a = plan.analysis
    for call, _scope in plan.training_calls():
        statement = _written_by(plan, call)
        if statement is not None:
            yield call, statement, "writes"
            continue
        if _writes_a_file(plan, call):  # ``x = 1; os.remove(p)``: no guard can take it alone
            yield call, a.statement_of(call), "shares its line"  # type: ignore[misc]
            continue
        statement = _downloaded_by(plan, call)
        if statement is not None:
            yield call, statement, "downloads"
        elif _fetch(plan, call) and (line := a.statement_of(call)) is not None:
            yield call, line, "fetches"


def first_statement(plan: Plan, statement: cst.BaseStatement, how: str) -> cst.BaseStatement:
    """Where a disk effect starts once moved: a download's disk test may come before it, and
    the accelerator has to exist there."""
    span = _deciding_span(plan, statement) if how == "downloads" else None
    return span[0] if span is not None else statement


def _guard(plan: Plan, statement: cst.BaseStatement, accelerator: cst.BaseExpression) -> None:
    test = cst.Attribute(accelerator, cst.Name("is_main_process"))
    _enclose(plan, statement, lambda body: cst.If(test=test, body=body))


def _first(
    plan: Plan,
    call: cst.Call,
    statement: cst.BaseStatement,
    accelerator: cst.BaseExpression,
    done: list[cst.BaseStatement],
) -> None:
    """Put the download, with the disk test that decides it, under ``main_process_first()``."""
    a = plan.analysis
    span = _deciding_span(plan, statement)
    if span is None:
        plan.needs_human(
            call,
            "every process downloads here at once: the test of the disk that decides it is "
            "made apart from its if, and a wait there would hang (a process testing after the "
            "main one wrote the files skips it); test and download together under "
            "accelerator.main_process_first()",
        )
        return
    first, last = span
    if not any(a.contains(d, last) for d in done):  # a second download under one ``if``
        done.append(last)
        item = cst.WithItem(cst.Call(cst.Attribute(accelerator, cst.Name("main_process_first"))))
        if first is last:
            _enclose(plan, last, lambda body: cst.With(items=[item], body=body))
        else:
            plan.edits.wrap(first, last, cst.With(items=[item], body=cst.IndentedBlock(body=[])))
    plan.changed(call, "downloads on the main process first (main_process_first)")


def _deciding_span(
    plan: Plan, statement: cst.BaseStatement
) -> tuple[cst.BaseStatement, cst.BaseStatement] | None:
    """The statements to run on the main process first for a download: itself, or the ``if``
    that tests the disk before it with the ``try`` or ``with`` blocks between them; None when
    that test is made apart (a name bound away from the ``if``).

    ``main_process_first()`` waits for every process: under ``if not os.path.exists(path):`` a
    process testing after the main one started writing would skip the wait and leave the others
    waiting for it, so that test goes inside too, and so does ``ready = all(p.exists() ...)``
    right before ``if not ready:`` (the other processes then test again, once the files are
    there). An ``if`` on anything else (a flag, the ``__main__`` guard) is the same on every
    process and stays outside, and so does one that also loops (it may train: every process
    must run that together)."""
    a = plan.analysis
    owner: cst.CSTNode | None = statement
    while True:
        block = a.parent(owner)  # type: ignore[arg-type]
        owner = a.parent(block) if isinstance(block, cst.IndentedBlock) else None
        if isinstance(owner, cst.Else | cst.ExceptHandler | cst.Finally):
            owner = a.parent(owner)
        if not isinstance(owner, cst.Try | cst.With):
            break
    while isinstance(a.parent(owner), cst.If) and a.parent(owner).orelse is owner:  # type: ignore[union-attr, arg-type]
        owner = a.parent(owner)  # type: ignore[arg-type]  # an ``elif``: the chain's first ``if``
    if not isinstance(owner, cst.If) or any(nodes(owner, cst.For)) or any(nodes(owner, cst.While)):
        return statement, statement
    tests = []
    current: cst.CSTNode | None = owner
    while isinstance(current, cst.If):
        tests.append(current.test)
        current = current.orelse
    if any(_tests_disk(plan, test) for test in tests):
        return owner, owner
    scope = a.scope_of.get(id(owner))
    read = {n.value for test in tests for n in nodes(test, cst.Name)}  # type: ignore[attr-defined]
    bound = [
        a.statement_of(b.node)
        for b in a.bindings
        if b.scope is scope and b.key in read and b.value is not None and _tests_disk(plan, b.value)
    ]
    if not bound:
        return statement, statement
    before = _previous(a, owner)
    return (before, owner) if before is not None and all(s is before for s in bound) else None


def _previous(a: Analysis, statement: cst.CSTNode) -> cst.BaseStatement | None:
    block = a.parent(statement)
    body = list(block.body) if isinstance(block, cst.IndentedBlock | cst.Module) else []
    at = next((i for i, s in enumerate(body) if s is statement), 0)
    return body[at - 1] if at > 0 else None


def _tests_disk(plan: Plan, expression: cst.CSTNode) -> bool:
    """Whether ``expression`` asks the disk what is there (``os.path.exists(p)``,
    ``(root / name).exists()``)."""
    return any(
        (plan.analysis.names.last_part(call.func) or callee_name(call)) in _DISK_TESTS  # type: ignore[attr-defined]
        for call in nodes(expression, cst.Call)
    )


def _enclose(
    plan: Plan,
    statement: cst.BaseStatement,
    compound: Callable[[cst.IndentedBlock], cst.BaseCompoundStatement],
) -> None:
    """Make ``statement`` the body of the compound statement ``compound`` builds around it; the
    blank lines and comments above it stay above the new header."""
    plan.edits.replace(
        statement,
        lambda node: compound(
            cst.IndentedBlock(body=[node.with_changes(leading_lines=())])
        ).with_changes(leading_lines=node.leading_lines),
    )


def _what(call: cst.Call) -> str:
    if callee_name(call) == "open":
        return "writing with open()"
    name = dotted_name(call.func)
    if name is None and isinstance(call.func, cst.Attribute):
        return f"...{call.func.attr.value}()"  # ``pd.DataFrame(log).to_csv(path)``
    return name or "this"


def _alone(plan: Plan, call: cst.Call) -> cst.BaseStatement | None:
    """The line holding ``call`` when it holds nothing else (``x = f(g(...))``, ``f(...)``): the
    form that can move under a guard or into a ``with`` block whole. Written on the line of an
    ``if`` or a ``for`` (``if os.path.exists(p): os.remove(p)``), that is the whole statement,
    when its header only asks the disk or reads values: it then decides nothing but the call."""
    a = plan.analysis
    statement = a.statement_of(call)
    if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1:
        return statement
    if not isinstance(statement, cst.If | cst.For) or statement.orelse is not None:
        return None
    header = statement.test if isinstance(statement, cst.If) else statement.iter
    if (
        isinstance(statement.body, cst.SimpleStatementSuite)
        and len(statement.body.body) == 1
        and a.contains(statement.body, call)
        and all(
            _tests_disk(plan, c) or a.names.from_package(c.func, "os")  # type: ignore[attr-defined]
            for c in nodes(header, cst.Call)
        )
    ):
        return statement
    return None


def _written_by(plan: Plan, call: cst.Call) -> cst.BaseStatement | None:
    """The statement that writes a file through ``call``: the call's own line, or the ``with``
    block that opens the file for writing."""
    a = plan.analysis
    name = a.names.last_part(call.func)
    if name == "open" and isinstance(call.func, cst.Name):
        item = a.parent(call)
        with_ = a.parent(item) if isinstance(item, cst.WithItem) else None
        return with_ if isinstance(with_, cst.With) and _writing_mode(call) else None  # type: ignore[return-value]
    return _alone(plan, call) if _writes_a_file(plan, call) else None


def _writes_a_file(plan: Plan, call: cst.Call) -> bool:
    """Whether ``call`` is a statement of its own that writes to disk (not ``open``)."""
    a = plan.analysis
    writer = disk_writer(call, a.names) is not None or (
        a.names.qualify(call.func) in plan.writing_functions  # ``utils.save_checkpoint(...)``
    )
    if not writer or not isinstance(a.parent(call), cst.Expr):
        return False  # a write inside a bigger expression is not the line's only effect
    # ``plt.savefig(buf)``: each process fills its own buffer and reads it back
    return not any(_in_memory(a, call, arg.value) for arg in call.args)


def _in_memory(a: Analysis, call: cst.Call, expr: cst.BaseExpression) -> bool:
    """Whether ``expr`` is an in-memory file: made right there, or a name its function binds
    to one and nothing else."""
    if not isinstance(expr, cst.Name):
        return memory_file(expr, a.names)
    scope = a.scope_of.get(id(call))
    values = [b.value for b in a.bindings if b.scope is scope and b.key == expr.value]
    return bool(values) and all(memory_file(v, a.names) for v in values)


def _downloaded_by(plan: Plan, call: cst.Call) -> cst.BaseStatement | None:
    """The line that downloads through ``call``: ``Dataset(..., download=True)``, a function of
    the script, or of a module beside it, that fetches files, or an imported downloader."""
    a = plan.analysis
    name = dotted_name(call.func)
    local = a.functions.get(name) if name else None
    qualified = a.names.qualify(call.func)
    downloads = (
        _download_flag(call)
        or (local is not None and _fetches(plan, local))
        or qualified in plan.fetching_imports
        or (qualified is not None and (_named_download(qualified) or _fetching_dataset(qualified)))
    )
    return _alone(plan, call) if downloads else None


def _named_download(qualified: str) -> bool:
    """An imported function whose name says it downloads (``huggingface_hub.snapshot_download``,
    ``nltk.download``, ``gdown.download``); the fetches written out in the script are reported
    instead (see ``FETCHES``)."""
    last = qualified.rsplit(".", 1)[-1]
    return "download" in last.lower() and last not in FETCHES


def _fetching_dataset(qualified: str) -> bool:
    """A dataset of a package that downloads it when it is not on disk, with no flag to say so:
    torchtext's (``IMDB.splits(text, label)``, ``IMDB(root, split)``), Keras's ``load_data()``."""
    return qualified.startswith(_FETCHING_DATASETS)


_FETCHING_DATASETS = ("torchtext.datasets.", "torchtext.legacy.datasets.", "keras.datasets.")


def _fetches(plan: Plan, function: Scope) -> bool:
    return any(
        where is function and (_fetch(plan, call) or _download_flag(call))
        for call, where in plan.analysis.calls
    )


def _fetch(plan: Plan, call: cst.Call) -> bool:
    """``urlretrieve(...)``, ``requests.get(...)``, ``tar.extractall()``, ..."""
    names = plan.analysis.names
    return names.last_part(call.func) in FETCHES or (
        names.last_part(call.func) == "get" and names.from_package(call.func, "requests")
    )


def _download_flag(call: cst.Call) -> bool:
    flag = keyword_arg(call, "download")
    return flag is not None and isinstance(flag.value, cst.Name) and flag.value.value == "True"


def _writing_mode(call: cst.Call) -> bool:
    mode = next(
        (arg.value for arg in call.args if arg.keyword and arg.keyword.value == "mode"),
        call.args[1].value if len(call.args) > 1 and call.args[1].keyword is None else None,
    )
    return (
        isinstance(mode, cst.SimpleString)
        and isinstance(mode.evaluated_value, str)
        and bool(_WRITE_MODES & set(mode.evaluated_value))
    )


def _report_loggers(plan: Plan) -> None:
    """A logger every process opens writes N event files or runs: say so where it is built (in
    the training code, or at the top of the script, which every process runs too)."""
    a = plan.analysis
    project = ProjectRuns(a.path)
    for call, scope in a.calls:
        if scope not in plan.training and not scope.is_module:
            continue
        if not isinstance(a.parent(call), cst.Assign | cst.Expr):
            continue
        what = opens_a_run(a.names, call) or project.opened(a.names.qualify(call.func))
        if what is not None and not on_main_only(a, call):
            plan.needs_human(
                call,
                f"every process opens its own {what} here: open it, and log, on the main "
                "process only (if accelerator.is_main_process:)",
            )


_MAIN_FLAGS = frozenset({"is_main_process", "is_local_main_process"})
# Effects the main process alone now has that write no file: nothing for the others to wait on.
_ON_SCREEN = frozenset({"show"})


def on_main_only(a: Analysis, node: cst.CSTNode) -> bool:
    """Whether ``node`` runs under ``if <main process> [and ...]:`` in its function: the
    accelerator's flags, or the DDP rewrite's placeholders for them (a ``rank == 0`` guard)."""
    child, current = node, a.parent(node)
    while current is not None and not isinstance(current, cst.FunctionDef | cst.Module):
        if (
            isinstance(current, cst.If)
            and a.contains(current.body, child)
            and _main_test(current.test)
        ):
            return True
        child, current = current, a.parent(current)
    return False


def _main_test(test: cst.BaseExpression) -> bool:
    if isinstance(test, cst.BooleanOperation) and isinstance(test.operator, cst.And):
        return _main_test(test.left) or _main_test(test.right)
    flag = placeholder_of(test) or (test.attr.value if isinstance(test, cst.Attribute) else None)
    return flag in _MAIN_FLAGS


def _runs_model(plan: Plan, statement: cst.CSTNode) -> bool:
    """Whether ``statement`` calls a prepared model, or hands it to a call (a helper that
    samples from it): each forward of the wrapper may be a collective. Reading its weights
    (``model.state_dict()``) is not."""
    a = plan.analysis
    setup = plan.setup
    models = set(setup.models(a))  # type: ignore[union-attr]

    def prepared(expr: cst.BaseExpression, scope: Scope | None) -> bool:
        key = key_of(expr)
        if key is None or scope is None:
            return False
        return bool(origins(a, setup.scope, scope, key) & models)  # type: ignore[union-attr]

    for node in nodes(statement, cst.Call):
        scope = a.scope_of.get(id(node))
        func = node.func
        if prepared(func, scope) or any(prepared(arg.value, scope) for arg in node.args):
            return True
        method = isinstance(func, cst.Attribute) and func.attr.value not in _WEIGHT_READS
        if method and prepared(func.value, scope):  # type: ignore[attr-defined]
            return True
    return False


_WEIGHT_READS = frozenset({"state_dict", "parameters", "named_parameters", "buffers"})
