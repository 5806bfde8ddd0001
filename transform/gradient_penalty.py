"""Whether a backward runs through a gradient penalty alone, which DDP cannot reduce.

A WGAN-GP penalty takes ``torch.autograd.grad(out, x, create_graph=True)`` and backpropagates
through it. DistributedDataParallel reduces each parameter's gradient as it accumulates into
``.grad``, and expects every parameter of the forward it prepared to get one: the penalty's graph
does not reach some of them (a last layer's bias does not change the gradient with respect to the
input), so their reduction never finishes and the next forward fails on every process.

In one backward with the model's own outputs (``-D(real).mean() + D(fake).mean() + 10 * gp``,
or StyleGAN2's ``r1_loss + 0 * real_pred[0]``) every parameter gets its gradient, and DDP
reduces them as usual: only a backward whose loss reaches no forward of a prepared model but
through the penalty is refused.
"""

from __future__ import annotations

from collections.abc import Collection

import libcst as cst

from accelify.transform.analysis import Analysis, Scope, key_of
from accelify.transform.patterns import keyword_arg, method_call
from accelify.transform.setup import Setup, origins
from accelify.transform.walk import nodes

_GRAD = "torch.autograd.grad"


def penalty_alone(a: Analysis, setup: Setup, training: Collection[Scope]) -> cst.Call | None:
    """The first ``loss.backward()`` in ``training`` whose loss comes from a gradient penalty
    and from no forward of the models ``setup`` prepares besides the penalty's own."""
    calls = [call for call, scope in a.calls if scope in training and _builds_graph(a, call)]
    if not calls:
        return None
    # Functions of the file that return a penalty (``compute_gradient_penalty(D, real, fake)``).
    makers = {id(a.scope_of[id(call)].node) for call in calls}
    for call, scope, _loop in a.backward_calls:
        backward = method_call(call, "backward")
        if scope not in training or backward is None:
            continue
        walk = _Sources(a, setup, scope, makers)
        walk.read(backward.func.value, a.line(call))  # type: ignore[union-attr]
        if walk.penalty and not walk.forward:
            return call
    return None


def _builds_graph(a: Analysis, call: cst.Call) -> bool:
    """``torch.autograd.grad(..., create_graph=True)`` (its fifth positional argument too)."""
    if a.names.qualify(call.func) != _GRAD:
        return False
    flag = keyword_arg(call, "create_graph")
    positional = [arg for arg in call.args if arg.keyword is None and not arg.star]
    if flag is None and len(positional) > 4:
        flag = positional[4]
    value = flag.value if flag is not None else None
    return value is not None and not (
        isinstance(value, cst.Name) and value.value in {"False", "None"}
    )


class _Sources:
    """What an expression is computed from, through the names of its function, each read at
    its last binding above the line that reads it."""

    def __init__(self, a: Analysis, setup: Setup, scope: Scope, makers: set[int]) -> None:
        self.a, self.setup, self.scope, self.makers = a, setup, scope, makers
        self.models = set(setup.models(a))
        self.penalty = self.forward = False
        self._seen: set[int] = set()

    def read(self, expr: cst.CSTNode, line: int) -> None:
        a = self.a
        for call in nodes(expr, cst.Call):
            callee = a.callee(call)
            if _builds_graph(a, call) or (callee is not None and id(callee.node) in self.makers):
                self.penalty = True
            elif self._model(call.func):
                self.forward = True
        for name in nodes(expr, cst.Name):
            if not self._inside_penalty(expr, name):
                self._follow(name.value, line)

    def _inside_penalty(self, expr: cst.CSTNode, name: cst.Name) -> bool:
        """A name handed to the penalty (its ``outputs=D(x)``) is the penalty's own."""
        a = self.a
        node: cst.CSTNode | None = a.parent(name)
        while node is not None and node is not expr:
            if isinstance(node, cst.Call):
                callee = a.callee(node)
                if _builds_graph(a, node) or (
                    callee is not None and id(callee.node) in self.makers
                ):
                    return True
            node = a.parent(node)
        return False

    def _follow(self, key: str, line: int) -> None:
        a = self.a
        above = [
            b
            for b in a.bindings
            if b.scope is self.scope and b.key == key and 0 < a.line(b.node) < line
        ]
        if not above:
            return
        last = max(above, key=lambda b: a.line(b.node))
        if id(last.node) in self._seen or last.value is None:
            return
        self._seen.add(id(last.node))
        self.read(last.value, a.line(last.node))

    def _model(self, func: cst.BaseExpression) -> bool:
        key = key_of(func)
        return key is not None and bool(
            origins(self.a, self.setup.scope, self.scope, key) & self.models
        )
