"""One module per rule; every ``Rule`` subclass defined here is found by :func:`all_rules`.

Only classes defined in a rule's own module count, so shared bases it imports are not rules.
"""

from __future__ import annotations

import importlib
import pkgutil

from accelify.rules.rule import Rule


def all_rules() -> list[type[Rule]]:
    """Every rule, sorted by code."""
    found: dict[str, type[Rule]] = {}
    for info in pkgutil.iter_modules(__path__):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        for value in vars(module).values():
            if (
                isinstance(value, type)
                and issubclass(value, Rule)
                and value.__module__ == module.__name__
            ):
                found[value.code] = value
    return sorted(found.values(), key=lambda rule: rule.code)
