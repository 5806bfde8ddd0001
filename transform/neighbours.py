"""Which functions the script calls from its own modules download something, or start the
process group.

``from data import get_training_set`` in ``train.py``, with ``data.py`` beside it, may fetch a
dataset that every process would then download into the same folder at once; research code's
``utils.init_distributed_mode(args)`` (``import util.misc as utils``) calls
``dist.init_process_group`` in ``util/misc.py``. Only the files beside the script are read (with
:mod:`ast`, nothing is run): their top-level functions that make such a call directly or
through another function of the same file.
"""

from __future__ import annotations

import ast
import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from accelify.transform.patterns import DISK_WRITER_METHODS, DISK_WRITERS
from accelify.transform.sources import SourceError, python_ast, read
from accelify.transform.trackers import tracked_run

FETCHES = frozenset(
    {"urlretrieve", "urlopen", "download_url", "download_and_extract_archive", "extractall"}
)
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)
PROCESS_GROUP = frozenset({"init_process_group"})
# torch.distributed calls whose answer depends on the process group having started.
PROCESS_GROUP_READS = frozenset(
    {"get_rank", "get_world_size", "is_initialized", "barrier", "all_reduce", "all_gather",
     "broadcast", "reduce", "all_gather_object", "broadcast_object_list"}
)  # fmt: skip


def fetching_imports(path: str, imports: Mapping[str, str]) -> frozenset[str]:
    """The qualified names (``data.get_training_set``) among ``imports`` whose function, in a
    module next to ``path``, downloads or extracts files."""
    return neighbour_functions(path, imports.values(), lambda call, _imported: _fetches(call))


def writing_functions(path: str, qualified: Iterable[str]) -> frozenset[str]:
    """The names (``utils.save_checkpoint``) among ``qualified`` whose function, in a
    module next to ``path``, writes files (``torch.save``, ``plt.savefig``, ``open(p, "w")``)
    and keeps to itself: no ``global``, nothing stored into what it is handed, no rank asked
    nor collective run (``save_on_master`` already writes on one process, and a barrier in it
    would wait for the others). On the main process alone it does all it did on each."""
    qualified = set(qualified)
    writing = neighbour_functions(path, qualified, _writes, _keeps_to_itself)
    return writing - process_group_readers(path, qualified)


def distributing_functions(path: str, qualified: Iterable[str]) -> frozenset[str]:
    """The qualified names (``util.misc.init_distributed_mode``) among ``qualified`` whose
    function, in a module next to ``path``, starts the process group."""
    return neighbour_functions(path, qualified, lambda call, _: callee(call) in PROCESS_GROUP)


def assigned_attributes(path: str, qualified: str) -> frozenset[str] | None:
    """The attributes the function ``qualified`` (``util.misc.init_distributed_mode``), in a
    module beside ``path``, sets on its first parameter (``args.rank = ...``); None when it
    cannot be read."""
    tree, function = beside(path, qualified)
    found = defined_in(tree, function, ast.FunctionDef | ast.AsyncFunctionDef)
    if found is None or not found.args.args:
        return None
    first = found.args.args[0].arg
    return frozenset(
        target.attr
        for node in ast.walk(found)
        for target in _targets(node)
        if isinstance(target, ast.Attribute)
        and isinstance(target.value, ast.Name)
        and target.value.id == first
    )


# torch.distributed's own queries, and what each answers without a process group.
_QUERIES = {"get_world_size": 1, "get_rank": 0}
_STARTED = frozenset({"is_available", "is_initialized"})


def process_query(path: str, qualified: str) -> str | None:
    """``get_world_size`` or ``get_rank`` when the function ``qualified`` (``utils.get_rank``),
    in a module beside ``path``, answers torch.distributed's query: it takes no argument and
    returns either ``dist.get_rank()`` or, behind a test of whether the process group started
    (``dist.is_initialized()``, or a helper of its module doing only that), what one process
    is (rank 0 of 1). Research code's ``util/misc.py`` defines both so."""
    tree, name = beside(path, qualified)
    function = defined_in(tree, name, ast.FunctionDef)
    if function is None or function.decorator_list:
        return None
    started = {
        helper.name
        for helper in tree.body  # type: ignore[union-attr]  # a function was found in it
        if isinstance(helper, ast.FunctionDef) and _tests_started(helper)
    }
    parts = _tests_and_returns(function)
    if parts is None:
        return None  # an assignment, a loop, a call: more than the query
    answers = set()
    for part in parts:
        if isinstance(part, ast.If) and not _only_asks(part.test, started):
            return None
        if isinstance(part, ast.Return) and isinstance(part.value, ast.IfExp):
            choice = part.value  # ``dist.get_rank() if dist.is_initialized() else 0``
            if not _only_asks(choice.test, started):
                return None
            answers |= {_answer(choice.body), _answer(choice.orelse)}
        elif isinstance(part, ast.Return):
            answers.add(_answer(part.value))
    queries = {a for a in answers if isinstance(a, str)}
    if len(queries) != 1 or not answers <= {*queries, _QUERIES[next(iter(queries))]}:
        return None
    return queries.pop()


def _has_parameters(function: ast.FunctionDef) -> bool:
    a = function.args
    return bool(a.posonlyargs or a.args or a.vararg or a.kwonlyargs or a.kwarg)


def _answer(value: ast.expr | None) -> str | int | None:
    """``get_rank`` for ``dist.get_rank()``, the number of a literal, else None."""
    if isinstance(value, ast.Constant) and type(value.value) is int:
        return value.value
    if isinstance(value, ast.Call) and not value.args and not value.keywords:
        name = callee(value)
        return name if name in _QUERIES and isinstance(value.func, ast.Attribute) else None
    return None


def _only_asks(test: ast.expr | None, started: set[str]) -> bool:
    """Whether ``test`` only asks if the process group started (``not dist.is_initialized()``)."""
    nodes = list(ast.walk(test)) if test is not None else []
    calls = [n for n in nodes if isinstance(n, ast.Call)]
    return bool(calls) and all(
        isinstance(n, _ASKING)
        and (
            not isinstance(n, ast.Call)
            or (not n.args and not n.keywords and callee(n) in _STARTED | started)
        )
        for n in nodes
    )


_ASKING = (
    ast.Call,
    ast.Attribute,
    ast.Name,
    ast.Load,
    ast.UnaryOp,
    ast.Not,
    ast.BoolOp,
    ast.And,
    ast.Or,
)


def _tests_started(function: ast.FunctionDef) -> bool:
    """``is_dist_avail_and_initialized()``: returns only whether the process group started."""
    parts = _tests_and_returns(function)
    return parts is not None and all(
        _only_asks(part.test, set())
        if isinstance(part, ast.If)
        else (isinstance(part.value, ast.Constant) and isinstance(part.value.value, bool))
        or _only_asks(part.value, set())
        for part in parts
    )


def _tests_and_returns(function: ast.FunctionDef) -> list[ast.If | ast.Return] | None:
    """The ``if``s and ``return``s of a function without parameters made of nothing else (but
    its docstring and ``pass``), or None."""
    if _has_parameters(function):
        return None
    parts = []
    for statement in ast.walk(function):
        if isinstance(statement, ast.If | ast.Return):
            parts.append(statement)
        elif isinstance(statement, ast.stmt) and not (
            isinstance(statement, ast.FunctionDef | ast.Pass) or docstring(statement)
        ):
            return None
    return parts


def docstring(statement: ast.stmt) -> bool:
    return isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant)


def _targets(node: ast.AST) -> list[ast.expr]:
    if isinstance(node, ast.Assign):
        return [t for target in node.targets for t in ast.walk(target)]
    if isinstance(node, ast.AugAssign | ast.AnnAssign):
        return [node.target]
    return []


def uses_only(
    path: str,
    qualified: str,
    arg: int | str,
    attributes: frozenset[str] | None,
    objects: Iterable[int | str] = (),
) -> bool:
    """Whether the function ``qualified`` (``util.lr_sched.adjust_learning_rate``), in a module
    beside ``path``, reads the parameter a call hands ``arg`` (a position or a keyword) only as
    ``<it>.<attribute>`` for ``attributes`` (``param_groups``: a learning-rate schedule;
    ``state_dict``/``load_state_dict``: a checkpoint's save or load; None: any attribute, so the
    object itself is never kept, handed on or returned: ``for m in model.modules(): ...``), or
    tests it against ``None``. ``objects``: the arguments the call hands an object, never None,
    so that the branch of ``if <it> is None:`` (or the ``else`` of ``is not None``) never runs
    for it: MAE's ``save_model(..., model=model, loss_scaler=loss_scaler)`` reads ``model``
    only where ``loss_scaler`` is None."""
    tree, name = beside(path, qualified)
    function = defined_in(tree, name, ast.FunctionDef)
    if function is None or function.decorator_list:
        return False
    param = parameter(function, arg)
    if param is None:
        return False
    parents = {
        id(child): node for node in ast.walk(function) for child in ast.iter_child_nodes(node)
    }
    nested = any(
        isinstance(n, (*_SCOPES, ast.Global, ast.Nonlocal))
        for n in ast.walk(function)
        if n is not function
    )
    present = {parameter(function, o) for o in objects} - {None}
    dead = {id(n) for branch in _branches_for_none(function, present) for n in ast.walk(branch)}
    uses = [
        n
        for n in ast.walk(function)
        if isinstance(n, ast.Name) and n.id == param and id(n) not in dead
    ]
    if attributes is None and _hands_on(function, param, dead):
        return False
    return not nested and all(
        isinstance(n.ctx, ast.Load)
        and (
            (
                isinstance(parent := parents.get(id(n)), ast.Attribute)
                and (attributes is None or parent.attr in attributes)
            )
            or _tested_against_none(parent)
        )
        for n in uses
    )


def _hands_on(function: ast.FunctionDef, param: str, dead: set[int]) -> bool:
    """Whether ``param``, or a part of it, leaves ``function``: returned, yielded, or stored into
    anything but itself (``registry.layer = model.layer``)."""

    def mentions(node: ast.AST | None) -> bool:
        return node is not None and any(
            isinstance(n, ast.Name) and n.id == param for n in ast.walk(node)
        )

    def base(target: ast.expr) -> ast.expr:
        while isinstance(target, ast.Attribute | ast.Subscript):
            target = target.value
        return target

    for node in ast.walk(function):
        if id(node) in dead:
            continue
        if isinstance(node, ast.Return | ast.Yield | ast.YieldFrom) and mentions(node.value):
            return True
        if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign) and mentions(node.value):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(not mentions(base(t)) for t in targets):
                return True
    return False


def parameter(function: ast.FunctionDef, arg: int | str) -> str | None:
    """The parameter a call's positional index or keyword lands on."""
    arguments = function.args
    positional = [a.arg for a in (*arguments.posonlyargs, *arguments.args)]
    if isinstance(arg, int):
        return positional[arg] if arg < len(positional) else None
    return arg if arg in [*positional, *(a.arg for a in arguments.kwonlyargs)] else None


def _branches_for_none(function: ast.FunctionDef, present: set[str]) -> Iterable[ast.stmt]:
    """The statements that run only when one of ``present`` is None."""
    for node in ast.walk(function):
        if not isinstance(node, ast.If) or not _tested_against_none(node.test):
            continue
        test = node.test
        if not isinstance(test.left, ast.Name) or test.left.id not in present:  # type: ignore[attr-defined]
            continue
        yield from node.body if isinstance(test.ops[0], ast.Is) else node.orelse  # type: ignore[attr-defined]


def _tested_against_none(node: ast.AST | None) -> bool:
    """``x is None``, ``x is not None``."""
    return (
        isinstance(node, ast.Compare)
        and len(node.ops) == 1
        and isinstance(node.ops[0], ast.Is | ast.IsNot)
        and isinstance(node.comparators[0], ast.Constant)
        and node.comparators[0].value is None
    )


def passes_through(path: str, qualified: str, method: str) -> bool:
    """Whether ``method`` of the class ``qualified`` (``util.misc.MetricLogger``), in a module
    beside ``path``, hands a loop each item of its first argument, once and in order: research
    code's ``metric_logger.log_every(data_loader, ...)`` is the loader's own batches."""
    tree, name = beside(path, qualified)
    return tree is not None and class_passes_through(tree, name, method)


def class_passes_through(tree: ast.Module, name: str, method: str) -> bool:
    """:func:`passes_through` for the top-level class ``name`` of ``tree``."""
    cls = defined_in(tree, name, ast.ClassDef)
    if cls is None or cls.decorator_list:
        return False
    if [ast.unparse(base) for base in cls.bases] not in ([], ["object"]):
        return False  # an inherited method is not the one read here
    found = [n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == method]
    return len(found) == 1 and _yields_each_item(found[0])


def moves_its_argument(function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """Whether ``function`` returns one of its parameters moved to a device (Beta-VAE's
    ``return tensor.cuda() if uses_cuda else tensor``): whoever calls it picks the device of
    what it hands it there."""
    arguments = function.args
    params = {a.arg for a in arguments.posonlyargs + arguments.args + arguments.kwonlyargs}
    return any(
        isinstance(call.func, ast.Attribute)
        and call.func.attr in {"cuda", "to"}
        and isinstance(call.func.value, ast.Name)
        and call.func.value.id in params
        for node in ast.walk(function)
        if isinstance(node, ast.Return) and node.value is not None
        for call in calls_in(node.value)
    )


def moving_function(path: str, qualified: str) -> bool:
    """:func:`moves_its_argument` for the function ``qualified`` of a module beside ``path``."""
    tree, name = beside(path, qualified)
    function = defined_in(tree, name, (ast.FunctionDef, ast.AsyncFunctionDef))
    return function is not None and moves_its_argument(function)


def class_beside(path: str, qualified: str) -> tuple[ast.ClassDef, str] | None:
    """The top-level class ``qualified`` (``trainer.Trainer``) of a module beside ``path``, and
    that module's path from the script's folder; a package's ``__init__`` that re-exports it
    (``from .trainer import *`` or ``import Trainer``) is followed to its module, once."""
    folder = Path(path).parent
    module, _, name = qualified.lstrip(".").rpartition(".")
    if not module:
        return None
    file = module_file(folder, module)
    tree = _parse(file)
    cls = defined_in(tree, name, ast.ClassDef)
    if cls is None and tree is not None and file.name == "__init__.py":
        for node in tree.body:
            if not isinstance(node, ast.ImportFrom):
                continue
            # ``from .trainer import *``, or the package's own ``from disvae.training import``
            absolute = node.level == 0 and (node.module or "").split(".")[0] == module
            if (
                (node.level == 1 or absolute)
                and node.module
                and any(alias.name in {"*", name} and alias.asname is None for alias in node.names)
            ):
                inner = node.module if absolute else f"{module}.{node.module}"
                file = module_file(folder, inner)
                cls = defined_in(_parse(file), name, ast.ClassDef)
                if cls is not None:
                    break
    if cls is None:
        return None
    return cls, Path(os.path.relpath(file, folder)).as_posix()


def beside(path: str, qualified: str) -> tuple[ast.Module | None, str]:
    """The parsed module beside ``path`` that ``qualified`` (``util.misc.MetricLogger``) names
    a definition of (None when there is none to read), and the definition's name."""
    module, _, name = qualified.lstrip(".").rpartition(".")
    return (_parse(module_file(Path(path).parent, module)) if module else None), name


def defined_in(
    node: ast.Module | ast.ClassDef | None, name: str, kind: type | tuple[type, ...]
) -> Any:
    """The one ``kind`` definition called ``name`` right in ``node``'s body, or None."""
    found = [n for n in (node.body if node is not None else ()) if isinstance(n, kind)]
    found = [n for n in found if n.name == name]
    return found[0] if len(found) == 1 else None


def _yields_each_item(function: ast.FunctionDef) -> bool:
    """``for obj in iterable: ...; yield obj; ...`` as the one loop over the first argument
    (after ``self``), which is otherwise only measured (``len(iterable)``): no other yield, no
    early exit, no rebinding, no torch.distributed call, no decorator."""
    params = function.args.args
    if function.decorator_list or len(params) < 2:
        return False
    iterable = params[1].arg
    inner = [n for n in _own_nodes(function) if n is not function]
    loops = [
        n
        for n in function.body
        if isinstance(n, ast.For) and isinstance(n.iter, ast.Name) and n.iter.id == iterable
    ]
    if len(loops) != 1 or not isinstance(loops[0].target, ast.Name) or loops[0].orelse:
        return False
    loop, item = loops[0], loops[0].target.id
    yields = [n for n in inner if isinstance(n, ast.Yield | ast.YieldFrom | ast.Await)]
    yielded = [
        s.value
        for s in loop.body
        if isinstance(s, ast.Expr) and isinstance(s.value, ast.Yield)
        and isinstance(s.value.value, ast.Name) and s.value.value.id == item
    ]  # fmt: skip
    exits = (ast.Return, ast.Break, ast.Continue, ast.Raise, ast.Try, ast.With)
    measured = {
        id(n.args[0])
        for n in inner
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "len"
        and len(n.args) == 1
    }  # fmt: skip
    return (
        len(yields) == 1
        and yielded == yields
        and not any(isinstance(n, exits) for n in _own_nodes(loop))
        and not any(
            isinstance(n, ast.Name) and n.id in (item, iterable) and not isinstance(n.ctx, ast.Load)
            for n in inner
            if n is not loop.target
        )
        and all(
            n is loop.iter or id(n) in measured
            for n in inner
            if isinstance(n, ast.Name) and n.id == iterable
        )
        and not any(
            callee(n) in PROCESS_GROUP | PROCESS_GROUP_READS
            for n in inner
            if isinstance(n, ast.Call)
        )
    )


def _own_nodes(node: ast.AST) -> list[ast.AST]:
    """``node`` and what it holds, not entering the functions, lambdas and classes inside."""
    found, todo = [], [node]
    while todo:
        current = todo.pop()
        found.append(current)
        if current is not node and isinstance(current, _SCOPES):
            continue
        todo.extend(ast.iter_child_nodes(current))
    return found


def process_group_readers(path: str, qualified: Iterable[str]) -> frozenset[str]:
    """The names among ``qualified`` whose function, beside ``path``, asks torch.distributed
    about the processes (``get_rank()``, ``is_main_process()``)."""
    return neighbour_functions(path, qualified, lambda call, _: callee(call) in PROCESS_GROUP_READS)


def neighbour_functions(
    path: str,
    qualified: Iterable[str],
    does: Callable[[ast.Call, dict[str, str]], bool],
    keeps: Callable[[ast.FunctionDef | ast.AsyncFunctionDef | None, dict[str, str]], bool] = (
        lambda _function, _imported: True
    ),
) -> frozenset[str]:
    """The names among ``qualified`` (``module.function``, relative ones with their dots) whose
    function, in a module beside ``path``, makes a call ``does`` picks (handed the module's
    imports, local name -> qualified), itself or through another function of its file, and
    that ``keeps`` accepts."""
    script = Path(path)
    if not script.is_file():
        return frozenset()
    names = set(qualified)
    by_module: dict[str, set[str]] = {}
    for name in names:
        module, _, function = name.lstrip(".").rpartition(".")
        if module:
            by_module.setdefault(module, set()).add(function)
    found = set()
    for module, functions in by_module.items():
        tree = _parse(module_file(script.parent, module))
        if tree is not None:
            doing, imported = _functions_that(tree, does), _imported(tree)
            found.update(
                f"{module}.{f}"
                for f in functions & doing
                if keeps(defined_in(tree, f, (ast.FunctionDef, ast.AsyncFunctionDef)), imported)
            )
    return frozenset(name for name in names if name.lstrip(".") in found)


def module_file(folder: Path, module: str) -> Path:
    """The file of ``module`` beside a script in ``folder``; a package's own absolute import
    (``from gae.utils import ...`` in ``gae/train.py``, run from the folder above) is looked
    for in the folders above, up to three."""
    found = _in_folder(folder, module)
    first = module.split(".", 1)[0]
    if found.is_file() or "." not in module:
        return found
    for above in list(folder.parents)[:3]:
        if (above / first).is_dir() and (candidate := _in_folder(above, module)).is_file():
            return candidate
    return found


def _in_folder(folder: Path, module: str) -> Path:
    base = folder.joinpath(*module.split("."))
    package = base / "__init__.py"
    return package if package.is_file() else base.with_suffix(".py")


def _parse(file: Path) -> ast.Module | None:
    if not file.is_file():
        return None
    try:
        return python_ast(read(str(file)).text, str(file))
    except (SourceError, SyntaxError, ValueError, OSError, RecursionError, MemoryError):
        return None  # a module we cannot read (or parse: nested too deeply) tells us nothing


def _functions_that(tree: ast.Module, does: Callable[[ast.Call, dict[str, str]], bool]) -> set[str]:
    imported = _imported(tree)
    functions = {
        node.name: node
        for node in tree.body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    }
    calls = {name: list(calls_in(node)) for name, node in functions.items()}
    doing = {name for name, found in calls.items() if any(does(c, imported) for c in found)}
    while True:  # a function calling one that does it does it too
        more = {
            name
            for name, found in calls.items()
            if name not in doing and any(callee(c) in doing for c in found)
        }
        if not more:
            return doing
        doing |= more


def calls_in(node: ast.AST) -> Iterable[ast.Call]:
    return (n for n in ast.walk(node) if isinstance(n, ast.Call))


def callee(call: ast.Call) -> str | None:
    func = call.func
    if isinstance(func, ast.Attribute):
        return func.attr
    return func.id if isinstance(func, ast.Name) else None


def drawing_functions(path: str, qualified: Iterable[str]) -> frozenset[str]:
    """The names (``utils.mask_test_edges``) among ``qualified`` whose function, in a module
    beside ``path``, draws from the process's own random stream as it runs (``np.random.shuffle``,
    ``random.sample``, ``torch.randperm``; not in a function it only defines, such as a dataset's
    per-item transform) and seeds nothing itself."""
    return neighbour_functions(path, qualified, _draws, _draws_itself)


def _draws(call: ast.Call, imported: dict[str, str]) -> bool:
    return _qualified(call, imported).startswith(_DRAWS)


def _draws_itself(
    function: ast.FunctionDef | ast.AsyncFunctionDef | None, imported: dict[str, str]
) -> bool:
    if function is None:
        return False
    own = [n for n in _own_nodes(function) if isinstance(n, ast.Call)]
    seeds = {"seed", "manual_seed", "default_rng", "Generator"}
    return any(_draws(c, imported) for c in own) and not any(
        callee(c) in seeds for c in calls_in(function)
    )


_DRAWS = ("numpy.random.", "random.", "torch.rand", "torch.multinomial", "torch.normal")


def _qualified(call: ast.Call, imported: dict[str, str]) -> str:
    """``np.random.shuffle`` -> ``numpy.random.shuffle``, by the module's own imports."""
    dotted = _dotted(call.func) or ""
    head, _, rest = dotted.partition(".")
    return ".".join(filter(None, (imported.get(head, head), rest)))


def _writes(call: ast.Call, imported: dict[str, str]) -> bool:
    """A call that writes a file: a writer of :data:`DISK_WRITERS` from its package (or
    ``torch.save``), a :data:`DISK_WRITER_METHODS` method, ``open`` in a writing mode."""
    name = callee(call)
    if name == "open" and isinstance(call.func, ast.Name):
        mode = call.args[1] if len(call.args) > 1 else None
        mode = next((k.value for k in call.keywords if k.arg == "mode"), mode)
        return (
            isinstance(mode, ast.Constant)
            and isinstance(mode.value, str)
            and bool(set(mode.value) & set("wax"))
        )
    if name in DISK_WRITER_METHODS:
        return isinstance(call.func, ast.Attribute)
    if name not in DISK_WRITERS:
        return False
    packages = (*DISK_WRITERS[name], "torch")
    return _qualified(call, imported).startswith(tuple(f"{p}." for p in packages))


def _keeps_to_itself(
    function: ast.FunctionDef | ast.AsyncFunctionDef | None, _imported: dict[str, str]
) -> bool:
    """No ``global``/``nonlocal``, and no store into a parameter (``state.best = acc``,
    ``history.append(x)``): what every process needs after the call stays the same."""
    if function is None:
        return False
    arguments = function.args
    params = {a.arg for a in (*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs)}
    for node in ast.walk(function):
        if isinstance(node, ast.Global | ast.Nonlocal):
            return False
        for target in _targets(node):
            if isinstance(target, ast.Attribute | ast.Subscript) and _base(target) in params:
                return False
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and _base(node.func.value) in params
            and node.func.attr in _MUTATORS
        ):
            return False
    return True


_MUTATORS = frozenset(
    {"append", "extend", "insert", "update", "add", "pop", "clear", "setdefault", "remove"}
)


def _base(node: ast.expr) -> str | None:
    while isinstance(node, ast.Attribute | ast.Subscript):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _fetches(call: ast.Call) -> bool:
    download = any(
        k.arg == "download" and isinstance(k.value, ast.Constant) and k.value.value is True
        for k in call.keywords
    )
    return download or callee(call) in FETCHES


class ProjectRuns:
    """The runs that logger classes of the modules beside ``path`` open (:func:`opened_run`),
    each class read once: the converter and the linter ask for every call they look at."""

    def __init__(self, path: str | None) -> None:
        # None, or ``<string>``/``<stdin>``: a text with no file, so nothing beside it to read.
        self._path = path if path and not path.startswith("<") else None
        self._read: dict[str, str | None] = {}

    def opened(self, qualified: str | None) -> str | None:
        if self._path is None or qualified is None or "." not in qualified:
            return None  # only a name imported from a module can be defined beside the file
        if qualified not in self._read:
            self._read[qualified] = opened_run(self._path, qualified)
        return self._read[qualified]


def opened_run(path: str, qualified: str) -> str | None:
    """What run the class ``qualified`` (``logger.Logger``), in a module beside ``path``, opens
    as it is built, named by it (``Logger (a tensorflow.summary.FileWriter)``): a project's own
    logger that wraps TensorBoard's or wandb's (``self.writer = tf.summary.FileWriter(log_dir)``
    in its ``__init__``) opens one per process, as they do."""
    tree, name = beside(path, qualified)
    cls = defined_in(tree, name, ast.ClassDef)
    init = defined_in(cls, "__init__", ast.FunctionDef)
    if init is None:
        return None
    imported = _imported(tree)  # type: ignore[arg-type]  # a class was found in it
    for call in calls_in(init):
        opened = _qualified(call, imported)
        if opened and tracked_run(opened) is not None:
            return f"{name} (a {opened})"
    return None


def _imported(tree: ast.Module) -> dict[str, str]:
    """Top-level ``import a.b as c`` / ``from a import b as c``: local name -> qualified."""
    out: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    out[alias.asname] = alias.name
                else:
                    out[alias.name.split(".")[0]] = alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                out[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return out


def _dotted(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute) and (inner := _dotted(node.value)) is not None:
        return f"{inner}.{node.attr}"
    return None
