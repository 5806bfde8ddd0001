"""What ``accelerator.prepare`` is given, for rules that need to know which argument is a loader."""

from __future__ import annotations

import libcst as cst

from accelify.rules.facts import Facts, name_role
from accelify.transform.patterns import Role, constructor_role, dotted_name


def is_loader(facts: Facts, arg: cst.BaseExpression) -> bool:
    """Whether a ``prepare`` argument is a DataLoader: built there, or a name known (or named)
    as one."""
    if constructor_role(arg) is Role.DATALOADER:
        return True
    name = dotted_name(arg)
    return name is not None and Role.DATALOADER in (facts.roles.get(name), name_role(name))
