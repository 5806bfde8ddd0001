"""``--notebook-launcher N``: a converted notebook's training moved into ``training_function``,
run on N processes by ``notebook_launcher`` (the flow of the Accelerate notebook guides).

The launcher forks, so nothing may initialise CUDA in the notebook's own process: every top-level
statement from ``accelerator = Accelerator(...)`` to the last one using ``accelerator`` moves into
the function, in the cell where training ends, and a CUDA touch left outside refuses the move.
Names the moved code binds are declared ``global``, so it runs as it did at top level (in each
launched process); a later statement reading one would not see it, and refuses the move too.
"""

from __future__ import annotations

import ast
import symtable
from collections.abc import Callable
from itertools import accumulate

import libcst as cst

from accelify.transform.plan import Target
from accelify.transform.sources import python_ast

FUNCTION = "training_function"
_LAUNCHER_MODULE = {"accelify": "accelify.runtime", "accelerate": "accelerate"}


class NotLaunched(Exception):
    """Why the training cannot be moved, at a line of the converted program."""

    def __init__(self, line: int, why: str) -> None:
        super().__init__(why)
        self.line, self.why = line, why


def launch(
    code: str, processes: int, target: Target, is_marker: Callable[[cst.BaseStatement], bool]
) -> str:
    """``code`` (the converted program, whose cell markers are the top-level statements
    ``is_marker`` picks) with its training launched; raise :class:`NotLaunched`."""
    module = cst.parse_module(code)
    body = list(module.body)
    texts = [module.code_for_node(s) for s in body]
    # The line of each statement's own code: past the module's header comments and its own.
    tops = accumulate((t.count("\n") for t in texts[:-1]), initial=1 + len(module.header))
    lines = [top + len(s.leading_lines) for top, s in zip(tops, body, strict=True)]
    names = [_names(text) for text in texts]
    starts = [i for i, s in enumerate(body) if _creates_accelerator(s)]
    if len(starts) != 1:
        raise NotLaunched(1, "no one top-level accelerator = Accelerator(...) to start from")
    start = starts[0]
    end = max(i for i, used in enumerate(names) if "accelerator" in used)
    if any(FUNCTION in used for used in names):
        raise NotLaunched(lines[start], f"the notebook already has a {FUNCTION}")
    inside = range(start, end + 1)
    for index, text in enumerate(texts):
        if index not in inside and _touches_cuda(text):
            raise NotLaunched(lines[index], "initialises CUDA outside the launched function")
    moved = [_flush_blank_lines(body[i]) for i in inside if not is_marker(body[i])]
    bound = _bound_names("".join(texts[i] for i in inside if not is_marker(body[i])))
    for index in range(end + 1, len(body)):
        if read := sorted(names[index] & bound):
            why = f"reads {', '.join(read)}, which only the launched processes set"
            raise NotLaunched(lines[index], why)

    def statement(text: str) -> cst.BaseStatement:
        return cst.parse_statement(text, config=module.config_for_parsing)

    globals_ = [statement(f"global {', '.join(sorted(bound))}\n")] if bound else []
    function = cst.FunctionDef(
        name=cst.Name(FUNCTION),
        params=cst.Parameters(),
        body=cst.IndentedBlock(body=[*globals_, *moved]),
    )
    call = statement(f"notebook_launcher({FUNCTION}, (), num_processes={processes})\n")
    importing = statement(f"from {_LAUNCHER_MODULE[target]} import notebook_launcher\n")
    at = next((i + 1 for i in range(start) if "Accelerator" in names[i] and _imports(body[i])), 0)
    markers = [body[i] for i in inside if is_marker(body[i])]
    new = [*body[:at], importing, *body[at:start], *markers, function, call, *body[end + 1 :]]
    return module.with_changes(body=new).code


def _flush_blank_lines(statement: cst.BaseStatement) -> cst.BaseStatement:
    """``statement`` with its blank leading lines unindented: indented inside the function they
    would end in whitespace."""
    lines = [
        line if line.comment else cst.EmptyLine(indent=False) for line in statement.leading_lines
    ]
    return statement.with_changes(leading_lines=lines)


def _creates_accelerator(statement: cst.BaseStatement) -> bool:
    """``accelerator = Accelerator(...)``, the statement the conversion's setup starts with."""
    match statement:
        case cst.SimpleStatementLine(
            body=[
                cst.Assign(
                    targets=[cst.AssignTarget(target=cst.Name("accelerator"))],
                    value=cst.Call(func=cst.Name("Accelerator")),
                )
            ]
        ):
            return True
    return False


def _imports(statement: cst.BaseStatement) -> bool:
    return isinstance(statement, cst.SimpleStatementLine) and isinstance(
        statement.body[0], cst.Import | cst.ImportFrom
    )


def _names(text: str) -> set[str]:
    """Every name a top-level statement reads, binds or imports."""
    names = set()
    for node in ast.walk(python_ast(text)):
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.alias):
            names.add(node.asname or node.name.split(".")[0])
    return names


def _touches_cuda(text: str) -> bool:
    """``torch.cuda...``, ``.cuda()``, or a ``"cuda..."`` device string: each may initialise
    CUDA (or is a sign the code expects it)."""
    return any(
        (isinstance(node, ast.Attribute) and node.attr == "cuda")
        or (isinstance(node, ast.Constant) and str(node.value).startswith("cuda"))
        for node in ast.walk(python_ast(text))
    )


def _bound_names(text: str) -> set[str]:
    """The names ``text`` binds at its top level: locals once it is a function's body."""
    source = "def _f():\n" + "".join(f"    {line}\n" for line in text.splitlines())
    table = symtable.symtable(source, "<training>", "exec").get_children()[0]
    return {s.get_name() for s in table.get_symbols() if s.is_assigned() or s.is_imported()}
