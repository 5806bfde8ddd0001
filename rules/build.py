"""Small builders for the code that fixes put in: ``accelerator.method(args)`` and friends."""

from __future__ import annotations

from collections.abc import Sequence

import libcst as cst


def name_expr(dotted: str) -> cst.BaseExpression:
    """``a.b.c`` as an expression node."""
    return cst.parse_expression(dotted)


def method_call(receiver: str, method: str, args: Sequence[cst.Arg]) -> cst.Call:
    """``receiver.method(*args)``, keeping the arguments' own spacing and comments."""
    return cst.Call(cst.Attribute(name_expr(receiver), cst.Name(method)), args=list(args))


def unwrapped(accelerator: str, model: cst.BaseExpression) -> cst.Call:
    """``accelerator.unwrap_model(model)``."""
    return method_call(accelerator, "unwrap_model", [cst.Arg(model)])


def with_keyword(call: cst.Call, keyword: str, value: cst.BaseExpression) -> cst.Call:
    """``call`` with ``keyword=value`` appended to its arguments."""
    arg = cst.Arg(
        value,
        keyword=cst.Name(keyword),
        equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace("")),
    )
    args = list(call.args)
    if args:
        args[-1] = args[-1].with_changes(
            comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
        )
    return call.with_changes(args=[*args, arg])
