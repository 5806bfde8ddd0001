"""Files every process would write are written by the main process.

Every process runs the script, so ``save_image(...)``, ``plt.savefig(...)``, ``np.save(...)`` or a
``with open(path, "w")`` block would write the same file N times at once, interleaved, and
``os.remove``/``os.makedirs`` would race (one process removes what another just removed). Each goes
under ``if accelerator.is_main_process:``. A write that also runs the prepared model
(``save_image(model(x), ...)``) is reported instead: every process has to run the model's forward
together, so it cannot move under the guard.
"""

from __future__ import annotations

import libcst as cst

from accelify.transform.analysis import key_of
from accelify.transform.patterns import Role, callee_name, dotted_name
from accelify.transform.plan import Plan
from accelify.transform.setup import origins
from accelify.transform.walk import Visitor, walk

# (package, function) writing a file named by its arguments.
_WRITERS = {
    "save_image": ("torchvision",),
    "save": ("numpy",),
    "savez": ("numpy",),
    "savez_compressed": ("numpy",),
    "savetxt": ("numpy",),
    "imsave": ("matplotlib", "imageio", "skimage"),
    "remove": ("os",),
    "unlink": ("os",),
    "rmtree": ("shutil",),
    "makedirs": ("os",),
    "mkdir": ("os",),
}
_WRITER_METHODS = frozenset({"savefig", "to_csv"})
_WRITE_MODES = frozenset("wax")


def writes(plan: Plan) -> None:
    if plan.setup is None:
        return
    for call, _scope in plan.training_calls():
        statement = _written_by(plan, call)
        if statement is None:
            continue
        if _runs_model(plan, statement):
            plan.needs_human(
                call,
                "every process writes this file, and the write also runs the prepared model: "
                "compute first, then write under `if accelerator.is_main_process:`",
            )
            continue
        accelerator = plan.accelerator(call, optional=True)
        if accelerator is None:
            continue
        test = cst.Attribute(accelerator, cst.Name("is_main_process"))
        plan.edits.replace(
            statement,
            lambda node, test=test: cst.If(
                test=test,
                body=cst.IndentedBlock(body=[node.with_changes(leading_lines=())]),
                leading_lines=node.leading_lines,
            ),
        )
        what = dotted_name(call.func) if callee_name(call) != "open" else "open(..., 'w')"
        plan.changed(call, f"{what} runs on the main process only")


def _written_by(plan: Plan, call: cst.Call) -> cst.BaseStatement | None:
    """The statement that writes a file through ``call``: the call's own line, or the ``with``
    block that opens the file for writing."""
    a = plan.analysis
    name = a.names.last_part(call.func)
    if name == "open" and isinstance(call.func, cst.Name):
        item = a.parent(call)
        with_ = a.parent(item) if isinstance(item, cst.WithItem) else None
        return with_ if isinstance(with_, cst.With) and _writing_mode(call) else None  # type: ignore[return-value]
    writes_file = (name in _WRITERS and a.names.from_package(call.func, *_WRITERS[name])) or (
        name in _WRITER_METHODS and isinstance(call.func, cst.Attribute)
    )
    statement = a.statement_of(call)
    if (
        writes_file
        and isinstance(a.parent(call), cst.Expr)
        and isinstance(statement, cst.SimpleStatementLine)
        and len(statement.body) == 1
    ):
        return statement
    return None


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


def _runs_model(plan: Plan, statement: cst.CSTNode) -> bool:
    """Whether ``statement`` calls a prepared model."""
    a = plan.analysis
    setup = plan.setup
    models = {k for k in setup.keys if a.role(setup.scope, k) is Role.MODEL}  # type: ignore[union-attr]
    found = False

    class _Calls(Visitor):
        def visit_Call(self, node: cst.Call) -> None:
            nonlocal found
            key = key_of(node.func)
            if key is None and isinstance(node.func, cst.Attribute):
                key = key_of(node.func.value) if dotted_name(node.func) else None
            scope = a.scope_of.get(id(node))
            if key is not None and scope is not None:
                found = found or bool(origins(a, setup.scope, scope, key) & models)  # type: ignore[union-attr]

    walk(statement, _Calls())
    return found
