"""``dist.all_reduce(t)`` -> ``t = accelerator.reduce(t, "sum")``; ``dist.barrier()`` ->
``accelerator.wait_for_everyone()``.

``all_reduce`` sums in place and ``reduce`` returns the sum, so the name is assigned again; only a
sum or a mean (``ReduceOp.SUM``/``AVG``) of a named tensor on the default group carries over. Any
other collective is left to the file's verdict (it is refused, with its line).
"""

from __future__ import annotations

import libcst as cst

from accelify.transform.analysis import key_of
from accelify.transform.distributed.context import Rewrite
from accelify.transform.patterns import placeholder
from accelify.transform.refusals import DDP_COLLECTIVE

_OPS = {"SUM": "sum", "AVG": "mean"}


def collectives(r: Rewrite) -> None:
    a = r.analysis
    names = a.names
    for call, _scope in a.calls:
        if not names.from_package(call.func, "torch.distributed"):
            continue
        last = names.last_part(call.func)
        if last == "barrier" and not call.args:
            r.edits.replace(call.func, placeholder("wait_for_everyone"))
            r.changed(call, "dist.barrier() -> accelerator.wait_for_everyone()")
        elif last == "all_reduce":
            _all_reduce(r, call)


def _all_reduce(r: Rewrite, call: cst.Call) -> None:
    statement = r.bare_statement(call, DDP_COLLECTIVE)
    tensor = call.args[0].value if call.args and call.args[0].keyword is None else None
    if tensor is None or key_of(tensor) is None:
        raise r.refuse(
            call, DDP_COLLECTIVE, "all_reduce of an expression: reduce it into a name by hand"
        )
    reduction = "sum"
    for arg in call.args[1:]:
        op = r.analysis.names.last_part(arg.value)
        keyword = arg.keyword.value if arg.keyword is not None else "op"
        if keyword != "op" or op not in _OPS:
            raise r.refuse(
                call,
                DDP_COLLECTIVE,
                f"all_reduce with {r.analysis.module.code_for_node(arg)} has no "
                "accelerator.reduce equivalent",
            )
        reduction = _OPS[op]
    code = r.analysis.module.code_for_node(tensor)
    new = cst.parse_statement(f'{code} = {placeholder("reduce").value}({code}, "{reduction}")\n')
    r.edits.replace(statement, lambda node: node.with_changes(body=new.body))  # type: ignore[attr-defined]
    r.changed(
        call, f'dist.all_reduce({code}) -> {code} = accelerator.reduce({code}, "{reduction}")'
    )
