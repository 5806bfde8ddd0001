"""What every conversion step gets: the analysis, the user's options, and places to put its work."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Literal, TypeVar

import libcst as cst

from accelify.transform.analysis import Analysis, Scope, name_nodes
from accelify.transform.codes import conversion_code
from accelify.transform.edits import Edits
from accelify.transform.refusals import ACCELERATOR_UNREACHABLE, Refusal
from accelify.transform.setup import ACCELERATOR, Refused, Setup

Target = Literal["accelify", "accelerate"]

MixedPrecision = Literal["no", "fp16", "bf16"]

# Each kind of "needs a human" note (told apart by a phrase every message of the kind has) and the
# accel-lint rule that finds what it leaves behind in the converted file, at the note's line: the
# linter is where such code is tracked, silenced with noqa comments and reported to CI.
NOTE_RULES: tuple[tuple[str, str | None], ...] = (
    # The one kind without a rule: the converter's own limit, not a bug of the script. libcst
    # cannot print some odd whitespace back, so the file is left as it is, still right on one
    # process, with nothing in it for a rule to flag.
    ("libcst does not print this file back exactly", None),
    ("left unchanged: ", "ACL210"),
    ("so every process trains on all the data", "ACL211"),
    ("computes over this process's shard", "ACL212"),
    ("sums this process's shard only", "ACL205"),
    ("divides this process's sum by the whole dataset's length", "ACL212"),
    ("downloads or extracts here at once", "ACL104"),
    ("downloads here at once", "ACL104"),
    ("opens its own", "ACL105"),
    ("other processes may read this file before the main process wrote it", "ACL106"),
    ("the accelerator now picks the device", "ACL213"),
    ("sets CUDA_VISIBLE_DEVICES in every process", "ACL012"),
    ("it also runs the prepared model", "ACL107"),
    ("writes here at once", "ACL107"),
    ("draws from each process's own random stream", "ACL216"),
    ("and the training steps read it", "ACL216"),
)


@dataclass(frozen=True)
class Options:
    """What the user asked for on the command line."""

    target: Target = "accelify"
    mixed_precision: MixedPrecision | None = None
    gradient_accumulation_steps: int | None = None
    # Project mode: the top-level functions and classes that another file of the program
    # defines (see project.py). They cannot read this file's globals, so they are handed the
    # accelerator even when it is created at module level.
    elsewhere: frozenset[str] = frozenset()


@dataclass(frozen=True, order=True)
class Note:
    """One line of the report: a change made, code left alone that needs a human (``manual``),
    or why something was left as it is with nothing to do about it (``info``)."""

    line: int
    message: str
    manual: bool = False
    info: bool = False
    # The accel-lint rule that flags what a manual note leaves behind (see ``NOTE_RULES``).
    code: str | None = field(default=None, compare=False)
    # The code of the step that wrote the note (codes.py), and of the family of a reason to
    # leave code unchanged (refusals.py): with ``code``, what the report prints (``shown``).
    step: str | None = field(default=None, compare=False)
    refusal: str | None = field(default=None, compare=False)
    # The start of a line the change wrote: where a report on the written file points (the
    # inserted line, not the input line it went next to).
    shows: str | None = field(default=None, compare=False)
    node: cst.CSTNode | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.manual and self.code is None:  # however the note was made, its kind has a rule
            object.__setattr__(self, "code", note_rule(self.message))

    @property
    def shown(self) -> str | None:
        """The code the report prints and links: a refusal's family says most about it, a
        manual note's rule is what accel-lint reports, and else the step that wrote it."""
        return self.refusal or (self.code if self.manual else None) or self.step


def refused_note(line: int, refused: Refused) -> Note:
    """The "needs a human" note of a setup or file left unchanged, with its family's code."""
    why = f"left unchanged: {refused.reason}"
    return Note(line, why, manual=True, refusal=refused.family.code, node=refused.node)


def note_rule(message: str) -> str | None:
    """The lint rule for a "needs a human" note's kind, or None for a kind no rule covers yet."""
    return next((code for phrase, code in NOTE_RULES if phrase in message), None)


@dataclass
class Plan:
    """Shared by the steps of one conversion: they read ``analysis`` and write ``edits``/notes."""

    analysis: Analysis
    options: Options
    setup: Setup | None
    edits: Edits = field(default_factory=Edits)
    notes: list[Note] = field(default_factory=list)
    # Arguments the created Accelerator(...) gets, filled by the steps before ``place`` (and by it).
    accelerator_kwargs: dict[str, cst.BaseExpression] = field(default_factory=dict)
    # Functions imported from the script's own modules that download, or write files and keep to
    # themselves (see neighbours.py).
    fetching_imports: frozenset[str] = frozenset()
    writing_functions: frozenset[str] = frozenset()
    # Where the script chooses the CPU, and the ``cpu=`` argument that keeps that choice.
    cpu_choice: tuple[cst.CSTNode, cst.BaseExpression] | None = None
    imports: set[str] = field(default_factory=set)  # names to import from the runtime
    # Functions other than the setup scope that use the accelerator and must be handed it.
    borrowers: set[Scope] = field(default_factory=set)
    accumulating: set[int] = field(default_factory=set)  # ids of loops given an accumulate block
    unwrapped: set[int] = field(default_factory=set)  # ids of step ``if``s dissolved into it
    shadowed: set[str] = field(default_factory=set)  # module devices given a local in the setup

    def changed(self, node: cst.CSTNode, message: str, shows: str | None = None) -> None:
        """A change next to ``node``; ``shows``: the start of the line it wrote, if it wrote one."""
        self.notes.append(Note(self.analysis.line(node), message, shows=shows))

    def needs_human(self, node: cst.CSTNode, message: str, refusal: Refusal | None = None) -> None:
        """Code left for a human; ``refusal``: the family of a reason it was left unchanged."""
        code = refusal.code if refusal is not None else None
        line = self.analysis.line(node)
        self.notes.append(Note(line, message, manual=True, refusal=code, node=node))

    def info(self, node: cst.CSTNode, message: str, refusal: Refusal | None = None) -> None:
        """Code left as it is with nothing to do; ``refusal`` as for :meth:`needs_human`."""
        code = refusal.code if refusal is not None else None
        self.notes.append(Note(self.analysis.line(node), message, info=True, refusal=code))

    def refused(self, refused: Refused) -> None:
        """A setup left unchanged as a whole."""
        self.notes.append(refused_note(self.analysis.line(refused.node), refused))

    def remove(self, statement: cst.CSTNode | None) -> None:
        """Remove a statement; an ``if`` left with nothing but removed statements goes too."""
        if statement is not None:
            self.edits.remove_emptying(statement, self.analysis.parent)

    def accelerator(
        self, node: cst.CSTNode, *, optional: bool = False, borrow: bool = True
    ) -> cst.BaseExpression | None:
        """How code at ``node`` reaches the accelerator.

        Code that runs before the accelerator exists, or where it cannot be handed over (a
        method of another class, a nested function, a function also called from elsewhere),
        cannot. Then an ``optional`` edit (a print) is skipped (None); any other raises
        :class:`Refused` and the whole setup stays as it is. With ``borrow``, a function that
        has to be handed the accelerator is recorded so that the thread step adds the parameter.
        """
        setup = self.setup
        if setup is None:
            return None
        a = self.analysis
        scope = a.scope_of[id(node)]
        point = setup.create_at or setup.prepare_at
        if point is not None and not setup.timeline.after(point, node):
            before_init = scope.name == "__init__" and scope.cls is setup.scope.cls
            if setup.timeline.anchors(node) is None and not before_init:
                where = "at module level" if setup.scope.is_module else f"in {setup.scope.name}()"
                why = f"does not run from where the accelerator is created ({where})"
                return self._unreachable(node, optional, why)
            if before_init or setup.timeline.before(point, node):
                return self._unreachable(node, optional, "runs before the accelerator exists")
            why = "can also run when the block that creates the accelerator has not run"
            return self._unreachable(node, optional, why)
        if setup.on_self and scope.cls is setup.scope.cls:
            return cst.parse_expression(setup.accelerator)
        if scope is setup.scope or (setup.scope.is_module and not self._elsewhere(scope)):
            return cst.Name(ACCELERATOR)
        if scope.cls is not None:
            return self._through_instance(node, scope, optional, borrow)
        if setup.on_self:
            return self._unreachable(node, optional, f"is outside {setup.scope.name}()'s class")
        if scope.parent is not a.scopes[0]:
            return self._unreachable(node, optional, f"cannot be handed to {scope.name}()")
        if borrow and ACCELERATOR not in scope.params:
            self.borrowers.add(scope)
        return cst.Name(ACCELERATOR)

    def _elsewhere(self, scope: Scope) -> bool:
        """Whether ``scope`` is code of another file of the program (``Options.elsewhere``)."""
        while scope.parent is not None and not scope.parent.is_module:
            scope = scope.parent
        name = scope.cls.name.value if scope.cls is not None else scope.name
        return name in self.options.elsewhere

    def _through_instance(
        self, node: cst.CSTNode, scope: Scope, optional: bool, borrow: bool
    ) -> cst.BaseExpression | None:
        """A method of a class the setup builds (a ``Trainer`` handed the prepared objects)
        reaches it as ``self.accelerator``, which ``__init__`` is given (see steps/thread.py)."""
        cls = scope.cls
        assert cls is not None
        init = self.analysis.methods[cls.name.value].get("__init__")
        if (
            init is None
            or cls.name.value in self.analysis.model_classes
            or not scope.params
            or scope.params[0] != "self"
            or scope.node.decorators  # type: ignore[union-attr]
        ):
            why = f"cannot be handed to {cls.name.value}.{scope.name}()"
            return self._unreachable(node, optional, why)
        if optional and not self._built_only_in_setup(init):
            return None  # a print is not worth a refusal when the thread step could not hand it
        if borrow:
            self.borrowers.add(init)
        return cst.parse_expression(f"self.{ACCELERATOR}")

    def _built_only_in_setup(self, init: Scope) -> bool:
        """Whether the class of ``init`` is only ever named to be built, in the setup scope,
        once the accelerator exists: then handing it over cannot fail."""
        a, setup = self.analysis, self.setup
        assert setup is not None and init.cls is not None
        point = setup.create_at or setup.prepare_at
        builds = {
            id(call.func): call
            for call, scope in a.calls
            if scope is setup.scope and a.callee(call) is init
        }
        mentions = [n for n in name_nodes(a.module, init.cls.name.value) if n is not init.cls.name]
        return all(
            id(n) in builds and (point is None or setup.timeline.after(point, builds[id(n)]))
            for n in mentions
        )

    def _unreachable(self, node: cst.CSTNode, optional: bool, why: str) -> None:
        if optional:
            return None
        scope = self.analysis.scope_of[id(node)]
        where = "this code" if scope.is_module else f"this code in {scope.name}()"
        raise Refused(node, ACCELERATOR_UNREACHABLE, f"{where} needs the accelerator but {why}")

    @property
    def training(self) -> set[Scope]:
        """The setup scope and the functions and methods its training runs through."""
        return self.setup.reach if self.setup is not None else set()

    def training_calls(self) -> Iterator[tuple[cst.Call, Scope]]:
        """Every call made in training code, with its scope."""
        return ((call, scope) for call, scope in self.analysis.calls if scope in self.training)

    def statement(self, code: str) -> cst.BaseStatement:
        """Parse one statement with the module's own newline and indentation."""
        return cst.parse_statement(code, config=self.analysis.module.config_for_parsing)


Step = Callable[[Plan], None]
_Work = TypeVar("_Work")


def run_step(step: Callable[[_Work], None], work: _Work, notes: list[Note]) -> None:
    """Run one step on ``work``; the notes it adds to ``notes`` get its code (codes.py), so the
    steps themselves never name one and a new step cannot report without."""
    start = len(notes)
    step(work)
    code = conversion_code(step.__module__)
    notes[start:] = [replace(note, step=code) for note in notes[start:]]
