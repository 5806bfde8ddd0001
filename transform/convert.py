"""The driver: parse once, analyse once, let every step plan its edits, apply them, re-check.

Steps never edit the tree themselves. Each one reads the shared :class:`Analysis` of the *original*
module and records edits keyed by original nodes, so line numbers in the report always refer to
the file the user wrote, and steps cannot trip over each other's rewrites.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import libcst as cst

from accelify.transform.analysis import (
    Analysis,
    Binding,
    Scope,
    analyse,
    key_of,
    optimized_models,
    unwrap_moves,
)
from accelify.transform.depth import deep_enough
from accelify.transform.distributed import Dedistributed, dedistribute
from accelify.transform.edits import apply
from accelify.transform.gate import file_verdict
from accelify.transform.lines import start_lines
from accelify.transform.loss_scaler import method_trains, trains_beside
from accelify.transform.neighbours import (
    class_beside,
    distributing_functions,
    fetching_imports,
    writing_functions,
)
from accelify.transform.patterns import (
    OPTIMIZERS,
    PREFIX,
    Role,
    callee_name,
    constructor_role,
    dotted_name,
    method_call,
)
from accelify.transform.plan import Note, Options, Plan, Step, run_step
from accelify.transform.refusals import (
    DDP_LAUNCH,
    DDP_RANK,
    NO_TRAINING,
    OBJECTS_NOT_FOLLOWED,
    STEP_OUTSIDE_SETUP,
    TRAINING_ELSEWHERE,
    UNPRINTABLE,
)
from accelify.transform.setup import Refused, reachable, setups, unfollowed
from accelify.transform.sources import SourceError, python_ast, python_syntax_error, too_deep
from accelify.transform.steps import STEPS
from accelify.transform.steps.accelerator import accelerator as write_accelerator
from accelify.transform.steps.uses import READERS
from accelify.transform.walk import nodes

__all__ = ["Note", "Options", "Result", "convert", "parse", "plan_conversion"]


@dataclass(frozen=True)
class Result:
    code: str
    notes: tuple[Note, ...] = field(default=())
    original: str = ""

    @property
    def changed(self) -> bool:
        return self.code != self.original

    @property
    def manual(self) -> tuple[Note, ...]:
        return tuple(n for n in self.notes if n.manual)

    @property
    def reasons(self) -> tuple[Note, ...]:
        """The notes that say why something was left as it was (every note that is not a change)."""
        return tuple(n for n in self.notes if n.manual or n.info)


def parse(source: str, path: str) -> cst.Module:
    """Parse or raise a one-line :class:`SourceError` at the offending line.

    Python's own parser goes first: it words syntax errors best, and it refuses nesting that
    libcst's native parser would crash on (a few thousand brackets). Its other refusals go to
    libcst, which also reads syntax newer than this interpreter."""
    try:
        python_error = python_syntax_error(source, path)
    except SyntaxError as err:
        raise _syntax(err, path) from None
    try:
        return cst.parse_module(source)
    except cst.ParserSyntaxError as err:
        if python_error is not None:
            raise _syntax(python_error, path) from None
        first = err.message.splitlines()[0] if err.message else "unsupported syntax"
        raise SourceError(path, err.raw_line, f"cannot parse: {first}") from None


def _syntax(err: SyntaxError, path: str) -> SourceError:
    return SourceError(path, err.lineno or 1, f"syntax error: {err.msg}")


def _check_valid(code: str, path: str) -> None:
    """Refuse output that does not parse: a bug in a step, never the user's fault.

    CPython's parser answers in a sixth of the time of a second libcst parse; libcst is asked only
    when it says no, so syntax newer than this interpreter (which libcst reads) is not refused.
    """
    try:
        python_ast(code, path)
        return
    except SyntaxError:
        pass
    try:
        cst.parse_module(code)
    except cst.ParserSyntaxError as err:
        raise SourceError(
            path, err.raw_line, "conversion produced invalid code; file left unchanged"
        ) from None


def _refuse_training_elsewhere(plan: Plan) -> None:
    """Convert all of a setup or none of it: a training step that does not run from the setup
    (objects built in a factory, trained in a class) would be left half-converted and wrong."""
    setup = plan.setup
    if setup is None:
        return
    for call, scope, _loop in plan.analysis.backward_calls:
        if scope not in setup.reach:
            raise Refused(
                call,
                STEP_OUTSIDE_SETUP,
                unfollowed(plan.analysis, scope)
                or f"this training step in {scope.name}() is not reached from "
                f"{setup.scope.name}(), where the objects accel-convert would prepare are built, "
                "by calls it follows: a step outside their setup would stay unconverted; convert "
                "by hand",
            )


def _refuse_distribution_elsewhere(plan: Plan, path: str) -> None:
    """A call of the script's own helper that starts the process group (research code's
    ``utils.init_distributed_mode(args)``) sets up distribution in a file this conversion does
    not change: prepare() on top of it would run two set-ups, and the switches it sets
    (``args.distributed``) would keep choosing the hand-written path."""
    if plan.setup is None:
        return
    a = plan.analysis
    called = {q: call for call, _scope in a.calls if (q := a.names.qualify(call.func))}
    for qualified in sorted(distributing_functions(path, called)):
        module = qualified.lstrip(".").rpartition(".")[0]
        raise Refused(
            called[qualified],
            DDP_LAUNCH,
            f"{a.module.code_for_node(called[qualified].func)}() starts the process group in "
            f"{module.replace('.', '/')}.py, which accel-convert does not rewrite: drop the "
            "call and the switches it sets, then convert again; or convert by hand",
        )


def convert(source: str, options: Options | None = None, path: str = "<string>") -> Result:
    """Convert one script's source text; raise :class:`SourceError` on input we cannot parse."""
    module = parse(source, path)
    try:
        return _convert(module, source, options or Options(), path)
    except RecursionError:
        raise too_deep(path, source) from None


def refusals(module: cst.Module, source: str) -> tuple[Note, ...]:
    """The notes a default conversion of ``module`` (parsed from ``source``) gives, each with its
    node in ``module`` where it has one: what accel-lint reads to report the training the
    converter leaves alone."""
    distributed = dedistribute(module, source)
    if distributed is None:
        return tuple(plan_conversion(module, Options()).notes)
    if distributed.module is None:
        return distributed.notes
    plan = plan_conversion(distributed.module, Options(), extra=_extra(distributed))
    return _whole_file_refusals(module, distributed, plan)


@deep_enough
def _convert(module: cst.Module, source: str, options: Options, path: str) -> Result:
    distributed = dedistribute(module, source, path)
    if distributed is not None:
        return _convert_distributed(module, distributed, source, options, path)
    plan = plan_conversion(module, options, path)
    if not plan.edits:  # nothing to change: the source as it came, not libcst's print of it
        return Result(code=source, notes=tuple(sorted(set(plan.notes))), original=source)
    if (unprinted := _unprinted(module, source)) is not None:
        return unprinted
    code = apply(module, plan.edits, plan.analysis.parents).code
    if code != source:
        _check_valid(code, path)
    return Result(code=code, notes=tuple(sorted(set(plan.notes))), original=source)


def _convert_distributed(
    module: cst.Module, d: Dedistributed, source: str, options: Options, path: str
) -> Result:
    """A hand-distributed script: convert its single-process form, or leave it all unchanged."""
    if d.module is None:
        return Result(code=source, notes=d.notes, original=source)
    if (unprinted := _unprinted(module, source)) is not None:
        return unprinted
    plan = plan_conversion(d.module, options, path, _extra(d))
    notes = [
        replace(n, line=d.original_line(n.line), message=_original_lines(n.message, d))
        for n in plan.notes
    ]
    refused = _whole_file_refusals(module, d, plan)
    if plan.setup is None or not plan.edits or refused:
        why = (
            refused
            or [n for n in notes if n.manual or n.info]
            or [
                Note(
                    1,
                    "left unchanged: no training to convert once DDP is removed",
                    manual=True,
                    refusal=NO_TRAINING.code,
                )
            ]
        )
        return Result(code=source, notes=tuple(sorted(set(why))), original=source)
    code = apply(d.module, plan.edits, plan.analysis.parents).code
    _check_valid(code, path)
    if PREFIX in code:  # a rank value the conversion could not place: never half-converted
        line = d.original_line(code[: code.index(PREFIX)].count("\n") + 1)
        why = "left unchanged: this rank value has no place to read it from"
        note = Note(line, why, manual=True, refusal=DDP_RANK.code)
        return Result(code=source, notes=(note,), original=source)
    return Result(code=code, notes=tuple(sorted({*d.notes, *notes})), original=source)


def _extra(d: Dedistributed) -> tuple[Step, ...]:
    return (d.step,) if d.step else ()


def _whole_file_refusals(module: cst.Module, d: Dedistributed, plan: Plan) -> tuple[Note, ...]:
    """The setups the conversion of a hand-distributed file leaves as they are, at their lines
    (and statements) of ``module``, the original. Any one keeps the whole file unchanged: DDP,
    its process group and its spawn go for the whole file, and a setup left as it was would
    then train alone on each process."""
    refused = [n for n in plan.notes if n.manual and n.refusal is not None]
    if not refused:
        return ()
    lines = start_lines(module)
    starts: dict[int, cst.CSTNode] = {}
    for node in nodes(module, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
        starts.setdefault(lines[id(node)], node)  # source order: the outermost comes first
    return tuple(
        replace(
            n,
            line=(line := d.original_line(n.line)),
            node=starts.get(line),
            message=_original_lines(n.message, d),
        )
        for n in refused
    )


def _original_lines(message: str, d: Dedistributed) -> str:
    """A message that names a line of the single-process form (``the optimizer built in
    _select_optimizer() (line 104)``) names it in the file as written."""
    return re.sub(r"\bline (\d+)", lambda m: f"line {d.original_line(int(m[1]))}", message)


def _unprinted(module: cst.Module, source: str) -> Result | None:
    """The file unchanged, if libcst does not print it back exactly (every edit would lose it)."""
    if (lost := _first_unprinted_line(module, source)) is None:
        return None
    why = "libcst does not print this file back exactly from here, so any edit would change it"
    note = Note(
        lost, f"left unchanged: {why}; convert by hand", manual=True, refusal=UNPRINTABLE.code
    )
    return Result(code=source, notes=(note,), original=source)


def _first_unprinted_line(module: cst.Module, source: str) -> int | None:
    """The line from which libcst's print of the unedited tree differs from the source, if any:
    a few inputs do not round-trip, and every edit would silently drop the difference."""
    printed = module.code
    if printed == source:
        return None
    pairs = enumerate(zip(printed, source, strict=False))
    same = next((i for i, (a, b) in pairs if a != b), len(printed))
    return source.count("\n", 0, same) + 1


def plan_conversion(
    module: cst.Module, options: Options, path: str = "<string>", extra: Sequence[Step] = ()
) -> Plan:
    """Analyse ``module`` and plan every step, without applying anything: the converter applies
    the plan, and accel-lint reads the manual notes (each has its node in ``module``). ``extra``
    steps run just before the accelerator is written (they may still ask for it)."""
    analysis = analyse(module, path)
    verdict = file_verdict(analysis, analysis.names)
    if verdict is not None:
        plan = Plan(analysis, options, None)
        (plan.info if verdict.skip else plan.needs_human)(
            verdict.node, verdict.reason, verdict.family
        )
        return plan
    setup, refusals = setups(analysis)
    plan = Plan(analysis, options, setup)
    if setup is not None:  # reads the modules beside the script: only when it will be converted
        plan.fetching_imports = fetching_imports(path, analysis.names.imports)
        called = {analysis.names.qualify(call.func) for call, _scope in analysis.calls}
        plan.writing_functions = writing_functions(path, {q for q in called if q and "." in q})
    try:
        _refuse_training_elsewhere(plan)
        _refuse_distribution_elsewhere(plan, path)
        last = STEPS.index(write_accelerator)
        for step in (*STEPS[:last], *extra, *STEPS[last:]):
            run_step(step, plan, plan.notes)
    except Refused as refused:
        plan = Plan(analysis, plan.options, None)
        plan.refused(refused)
    for refused in refusals:
        plan.refused(refused)
    if not plan.edits and not plan.notes:
        _explain_no_setup(plan)
    return plan


def _explain_no_setup(plan: Plan) -> None:
    """A file with training code that was left alone always says why."""
    a: Analysis = plan.analysis
    if not a.backward_calls:
        _explain_hidden_step(plan)
        return
    call, scope, _loop = a.backward_calls[0]
    here = "at module level" if scope.is_module else f"in {scope.name}()"
    optimizers = [b for b in a.bindings if a.role(b.scope, b.key) is Role.OPTIMIZER]
    made = [b for b in optimizers if isinstance(b.value, cst.Call)]
    if not optimizers:
        why = _no_optimizer(a)
    elif made and all(constructor_role(b.value, a.names) is None for b in made):
        # ``self.optimizer = self.faster_rcnn.get_optimizer()``: a method or a function of
        # another file builds it, from parameters this file does not show
        b = made[0]
        why = (
            f"its optimizer comes from {a.module.code_for_node(b.value.func)}(...) (line "  # type: ignore[union-attr]
            f"{a.line(b.node)}), which this file does not show: which model's parameters it "
            "holds cannot be checked, so prepare() has nothing to pair it with; convert by hand"
        )
    elif not any(_takes_parameters(a, b) for b in optimizers):
        why = "its optimizer trains tensors, not a model's parameters"
    elif built := next((b for b in optimizers if isinstance(b.value, cst.Call)), None):
        there = "at module level" if built.scope.is_module else f"in {built.scope.name}()"
        why = (
            f"the optimizer built {there} (line {a.line(built.node)}) trains a model that scope "
            "neither builds nor is handed (a global, or built elsewhere): prepare() needs the "
            "model and its optimizer in one place; convert by hand"
            if scope in reachable(a, built.scope)
            else f"the training step {here} is not reached from where its optimizer is built "
            f"({there}, line {a.line(built.node)}) by calls accel-convert follows: it goes "
            "through an object or a return value; convert by hand"
        )
    else:
        why = (
            f"the model and optimizer of the training step {here} come from outside this "
            "file; "
            + (
                "convert the script that builds them"
                if a.path.endswith(".ipynb")
                else "give it with the script that builds them (both paths, or their folder) "
                "to convert them together"
            )
        )
    if why == _GRADIENTS_ONLY:  # no training: nothing for a human to finish
        plan.info(call, f"left unchanged: {why}", NO_TRAINING)
        return
    plan.needs_human(call, f"left unchanged: {why}", OBJECTS_NOT_FOLLOWED)


def _join_advice(a: Analysis, call: cst.Call) -> str:
    """What to do about training in another file: give both files, where project mode can join
    them; it joins a script's ``from train import train``, never a module's function
    (``train.train(...)`` after ``import train`` or ``from pkg import train``) nor a notebook."""
    if a.path.endswith(".ipynb"):
        return (
            "project mode joins scripts, not notebooks: convert by hand, or move the setup into "
            "a script that imports the training function (from module import function)"
        )
    func = call.func
    if isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name):
        statement = a.names.statements.get(func.value.value)
        if isinstance(statement, (cst.Import, cst.ImportFrom)):
            return (
                "the files of one program are converted together where the script imports the "
                "training function itself (from module import function), not the module: "
                "convert by hand, or import it that way"
            )
    return (
        "give it this file with the one that trains (both paths, or their folder) to convert "
        "them together"
    )


def _explain_hidden_step(plan: Plan) -> None:
    """No ``.backward()`` in the file, but a loop hands an optimizer to a call this file does not
    show (timm's ``loss_scaler(loss, optimizer, ...)``), or a class extends another package's
    trainer (detectron2's ``DefaultTrainer``): the training step runs in there."""
    a: Analysis = plan.analysis
    classes = {id(s.cls): s.cls for s in a.scopes if s.cls is not None}
    for cls in classes.values():
        for base in cls.bases:
            qualified = a.names.qualify(base.value)
            if qualified and qualified.rsplit(".", 1)[-1].endswith("Trainer"):
                plan.info(
                    cls,
                    f"left unchanged: {cls.name.value} trains through {qualified}, whose "
                    "training step this file does not show; distribute it the way that "
                    "library does",
                    TRAINING_ELSEWHERE,
                )
                return
    if _explain_an_agent(plan):  # ``trainer.train(...)`` of a class beside: its file is named
        return
    # A call handed an optimizer first: open-reid's ``metric.train(model, train_loader)`` fits
    # a distance metric, ``trainer.train(epoch, train_loader, optimizer)`` below it trains.
    steps_an_optimizer = {
        id(call)
        for call, scope in a.calls
        for arg in call.args
        if (key := key_of(arg.value)) is not None and a.role(scope, key) is Role.OPTIMIZER
    }
    for call, scope in sorted(a.calls, key=lambda found: id(found[0]) not in steps_an_optimizer):
        name = callee_name(call) or ""
        launcher = name.startswith(("train", "fit"))  # train_model_simple, d2l.train_ch3
        if not (launcher or "TrainLoop" in name or name == "run_loop") or not call.args:
            continue
        if a.callee(call) is not None or _a_models_method(a, scope, call):
            continue  # model.train(mode) switches a mode
        func = a.module.code_for_node(call.func)
        handed = _training_objects_handed(a, scope, call)
        beside = trains_beside(a.path, a.names.qualify(call.func) or func) if handed else None
        if launcher and beside is not None and not beside[1]:
            plan.info(
                call,
                f"left unchanged: training runs inside {func}(...), on the {', '.join(handed)} "
                f"built here, and {beside[0]} runs no .backward() either: its step is inside a "
                "call accel-convert does not follow (a loss scaler's, a library's); convert by "
                "hand",
                TRAINING_ELSEWHERE,
            )
            return
        if launcher and handed:  # nothing here for the linter: the step is in the other file
            advice = _join_advice(a, call)
            plan.info(
                call,
                f"left unchanged: training runs inside {func}(...), which this file does not "
                f"show, on the {', '.join(handed)} built here; accel-convert converts a setup "
                f"where one file shows both its objects and its training step: {advice}",
                TRAINING_ELSEWHERE,
            )
            return
        builds_optimizer = any(_optimizer_class(a, arg) for arg in call.args)
        if (
            name in {"train", "fit", "run_loop"}
            or "TrainLoop" in name
            or (launcher and builds_optimizer)
        ):
            plan.info(
                call,
                f"left unchanged: training runs inside {func}(...), which this file does not "
                "show; convert the code that trains",
                TRAINING_ELSEWHERE,
            )
            return
    for call, scope in a.calls:
        if a.callee(call) is not None or callee_name(call) in READERS or not _in_loop(a, call):
            continue
        keys = [key_of(arg.value) or "" for arg in call.args]
        handed = [key for key in keys if a.role(scope, key) is Role.OPTIMIZER]
        # ``loss_scaler(loss, optimizer, ...)``: handed the loss too, so it runs the backward.
        with_loss = any("loss" in key for key in keys)
        if handed and with_loss and method_call(call, "step") is None:
            name = a.module.code_for_node(call.func)
            plan.info(  # nothing here for the linter to flag: the step itself is not here
                call,
                f"left unchanged: the training step runs inside {name}(...), which this file "
                f"does not show (it is handed {handed[0]}); convert by hand",
                TRAINING_ELSEWHERE,
            )
            return
    _explain_an_update(plan)


# Methods that name a training step: BasicSR's ``model.optimize_parameters(current_iter)``,
# DomainBed's ``algorithm.update(minibatches)``.
_STEP_METHODS = frozenset(
    {"update", "optimize_parameters", "update_parameters", "train_step", "training_step",
     "learn", "train_on_batch"}
)  # fmt: skip


def _explain_an_update(plan: Plan) -> None:
    """A file with no ``.backward()`` whose loop calls such a method of an object built by
    something it imports (directly, or through a name bound to what an import returns:
    ``algorithm_class = algorithms.get_algorithm_class(name)``): the step may be in there,
    which the file does not show. Said as what it is, a possibility."""
    a: Analysis = plan.analysis
    for call, scope in a.calls:
        func = call.func
        if not isinstance(func, cst.Attribute) or func.attr.value not in _STEP_METHODS:
            continue
        if not _in_loop(a, call):
            continue
        key = key_of(func.value)
        makers = {_maker(a, b.value) for b in a.bindings if b.scope is scope and b.key == key}
        maker = makers.pop() if len(makers) == 1 else None
        if maker is None:
            continue
        plan.info(
            call,
            f"left unchanged: this file runs no .backward() itself; {key}.{func.attr.value}(...) "
            f"calls into an object built by {maker}, which this file does not show: if the "
            "training step is there, convert that code",
            TRAINING_ELSEWHERE,
        )
        return


def _maker(a: Analysis, value: cst.BaseExpression | None) -> str | None:
    """What of the project's own code builds ``value``: ``basicsr.models.create_model(...)``,
    or ``what domainbed.algorithms.get_algorithm_class(...) returns`` for a call of a name
    bound to that; None for anything else."""
    if not isinstance(value, cst.Call):
        return None
    qualified = a.names.qualify(value.func)
    if qualified is not None:
        return f"{qualified}(...)" if _unread(a.path, qualified) else None
    named = key_of(value.func)
    returned = [
        q
        for b in a.bindings
        if b.key == named
        and isinstance(b.value, cst.Call)
        and (q := a.names.qualify(b.value.func)) is not None
        and _own_code(a.path, q)
    ]
    return f"what {returned[-1]}(...) returns" if returned else None


def _unread(path: str, qualified: str) -> bool:
    """Project code (:func:`_own_code`) that is not a class the agent explanation reads beside
    the script: one of those that runs no backward is known not to train."""
    return _own_code(path, qualified) and class_beside(path, qualified) is None


def _own_code(path: str, qualified: str) -> bool:
    """Whether ``qualified`` comes from the script's own project: a module, or a folder of
    modules, of that name beside the script or in a folder above it (``domainbed.algorithms``
    for ``domainbed/scripts/train.py``), not an installed library (``tqdm``'s bar updates too)."""
    top = qualified.lstrip(".").split(".", 1)[0]
    if not Path(path).is_file():
        return False
    folders = list(Path(path).resolve().parents)[:4]
    return bool(top) and any(
        (f / f"{top}.py").is_file() or any((f / top).glob("*.py")) for f in folders
    )


def _explain_an_agent(plan: Plan) -> bool:
    """``agent = SAC(...)`` then ``agent.update_parameters(memory, ...)``, ``gan.train()`` or
    ``compute_loss(...)`` of an instance: a method, of a class from a module beside the script,
    that runs a ``.backward()`` is where the training step is. Says so, and whether it did.
    Each class's method is read from its module once, however often it is called."""
    a: Analysis = plan.analysis
    module = a.scopes[0]
    built: dict[str, list[tuple[Scope, str]]] = {}  # name -> (scope, class it is built from)
    for b in a.bindings:
        value = unwrap_moves(b.value) if b.value is not None else None  # ``Trainer(m).cuda()``
        qualified = a.names.qualify(value.func) if isinstance(value, cst.Call) else None
        if qualified is not None and "." in qualified:
            built.setdefault(b.key, []).append((b.scope, qualified))
    read: dict[tuple[str, str], tuple[str, str] | None] = {}
    for call, scope in a.calls:
        func = call.func
        receiver, method = (
            (func.value, func.attr.value) if isinstance(func, cst.Attribute) else (func, "__call__")
        )
        key = key_of(receiver)
        if key is None or a.callee(call) is not None:
            continue
        for where, qualified in built.get(key, ()):
            if where is not scope and where is not module:
                continue
            if (qualified, method) not in read:
                read[qualified, method] = method_trains(a.path, qualified, method)
            if (found := read[qualified, method]) is not None:
                trains, file, defined = found
                cls = qualified.rpartition(".")[2]
                shown = f"{cls}.{trains} in {file}"
                if trains != method and defined:
                    shown = f"{cls}.{method}, which runs {shown}, where the backward is"
                elif trains != method:  # ``trainer.train()`` inherited from a base class
                    shown = f"{cls}.{method}, inherited; {shown} runs the backward"
                # ``from trainer import BYOLTrainer``: project mode joins the two files
                joined = not a.path.endswith(".ipynb") and isinstance(
                    a.names.statements.get(cls), cst.ImportFrom
                )
                advice = (
                    f"give this file with {file} (both paths, or their folder) to convert them "
                    "together"
                    if joined
                    else "convert the code that trains"
                )
                plan.info(
                    call,
                    f"left unchanged: training runs inside {a.module.code_for_node(func)}(...) "
                    f"({shown}), which this file does not show; {advice}",
                    TRAINING_ELSEWHERE,
                )
                return True
    return False


def _a_models_method(a: Analysis, scope: Scope, call: cst.Call) -> bool:
    """``model.train(mode)`` on a model of this file, or on a parameter annotated as a module
    (deit's ``def train_one_epoch(model: torch.nn.Module, ...)``)."""
    receiver = call.func.value if isinstance(call.func, cst.Attribute) else None
    key = key_of(receiver) if receiver is not None else None
    if key is None:
        return False
    return a.role(scope, key) is Role.MODEL or _annotated_module(a, scope, key)


def _annotated_module(a: Analysis, scope: Scope, key: str) -> bool:
    params = getattr(scope.node, "params", None)
    if params is None:
        return False
    for param in (*params.params, *params.kwonly_params):
        if param.name.value == key and param.annotation is not None:
            annotation = param.annotation.annotation
            named = a.names.qualify(annotation) or dotted_name(annotation) or ""
            return named in ("torch.nn.Module", "nn.Module")
    return False


def _training_objects_handed(a: Analysis, scope: Scope, call: cst.Call) -> list[str]:
    """The models, optimizers and loaders of this file that ``call`` is handed."""
    handed = []
    for arg in call.args:
        key = key_of(arg.value)
        if key is not None and a.role(scope, key) in _HANDED_ROLES:
            handed.append(key)
    return handed


def _optimizer_class(a: Analysis, arg: cst.Arg) -> bool:
    """``torch.optim.SGD`` handed over to be built in there (d2l's ``train_ch10``)."""
    return not isinstance(arg.value, cst.Call) and a.names.last_part(arg.value) in OPTIMIZERS


_HANDED_ROLES = frozenset({Role.MODEL, Role.OPTIMIZER, Role.DATALOADER})


def _updates_by_hand(node: cst.CSTNode) -> bool:
    """``w -= lr * w.grad``, ``p.data -= ...``, ``w.data = w.data - lr * w.grad`` or
    ``p.data.sub_(lr * p.grad)`` (d2l's ``sgd``): a step computed from a gradient, or written
    into a parameter's ``.data``."""
    if isinstance(node, cst.Assign):
        return _reads_grad(node.value) and any(
            isinstance(t.target, cst.Attribute) and t.target.attr.value == "data"
            for t in node.targets
        )
    if isinstance(node, cst.AugAssign):
        target, value = node.target, node.value
    elif isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute):
        if not node.func.attr.value.endswith("_") or _reads_grad(node.func.value):
            return False  # ``p.grad.zero_()`` clears a gradient, it updates nothing
        target, value = node.func.value, node
    else:
        return False
    return _reads_grad(value) or (isinstance(target, cst.Attribute) and target.attr.value == "data")


def _reads_grad(node: cst.CSTNode) -> bool:
    return any(n.attr.value == "grad" for n in nodes(node, cst.Attribute))  # type: ignore[attr-defined]


def _in_loop(a: Analysis, node: cst.CSTNode) -> bool:
    return a.enclosing(node, (cst.For, cst.While)) is not None


_GRADIENTS_ONLY = (
    "no torch optimizer steps after this backward: the script uses the gradients itself (to "
    "inspect them, or in an optimizer of its own, such as scipy's), which is not converted"
)


def _no_optimizer(a: Analysis) -> str:
    """Why a backward with no optimizer the analysis knows is left alone, in the words of what
    the file does: an optimizer it cannot follow steps, parameters are updated by hand, or
    nothing is updated at all (gradients computed for their own sake)."""
    backward, scope, _loop = a.backward_calls[0]
    # After the backward, or after a call of the helper that runs it (``backward(loss, scaler)``).
    after = [(scope, a.line(backward))]
    after += [(where, a.line(call)) for call, where in a.calls if a.callee(call) is scope]
    for call, where in a.calls:
        stepped = method_call(call, "step")
        receiver = dotted_name(stepped.func.value) if stepped is not None else None  # type: ignore[union-attr]
        if receiver is None or not any(where is s and a.line(call) >= n for s, n in after):
            continue  # the step that follows the backward: not a scheduler's, a sampler's
        if "sched" not in receiver.lower():
            return (
                f"the optimizer that steps here ({a.module.code_for_node(call)}, line "
                f"{a.line(call)}) is not one accel-convert can follow (built in a list or a "
                "comprehension, handed in as a parameter, or built outside this file); convert "
                "by hand"
            )
    updates = nodes(a.module, (cst.Assign, cst.AugAssign, cst.Call))
    if any(_updates_by_hand(update) for update in updates):
        return "no optimizer steps this training (it updates its parameters by hand)"
    return _GRADIENTS_ONLY


def _takes_parameters(a: Analysis, optimizer: Binding) -> bool:
    """Whether an optimizer is built from some module's ``parameters()``, or may be: from
    what a call returns (CSAILVision's ``SGD(group_weight(net_encoder), ...)``)."""
    value = optimizer.value
    if not isinstance(value, cst.Call):
        return True  # built elsewhere: say nothing about it
    if optimized_models(a, optimizer.scope, value):
        return True
    given = value.args[0].value if value.args else None
    return isinstance(given, cst.Call) or "parameters(" in a.module.code_for_node(value)
