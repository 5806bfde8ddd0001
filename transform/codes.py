"""The codes accel-convert's report prints, and the docs page each one links.

Every report line carries a short code, as Ruff's do: ``ACC1xx`` a conversion step (one module
of ``steps/``, its docstring its documentation), ``ACC2xx`` a rewrite of hand-written
DistributedDataParallel (one module of ``distributed/``), ``ACC3xx`` the notebook launcher;
``ACRxxx`` a family of reasons to leave code unchanged (:mod:`.refusals`); and a "needs a human"
note keeps the ``ACLxxx`` lint rule that flags what it leaves. The registry below is the one place
that gives a step its code: a code, once given, is never reused for another step.
"""

from __future__ import annotations

from dataclasses import dataclass

from accelify.transform.refusals import REFUSALS

# The docs site's root: mkdocs.yml's ``site_url``, which docs/hooks/reference.py checks against
# this (the installed tools cannot read mkdocs.yml).
DOCS_URL = "https://accelify.github.io/accelify/"

_STEPS = "accelify.transform.steps."
_DISTRIBUTED = "accelify.transform.distributed."


@dataclass(frozen=True)
class Conversion:
    """One conversion step: its code and the module that makes it (whose docstring is its page)."""

    code: str
    module: str

    @property
    def name(self) -> str:
        """The module's own name, kebab-case (``cpu-choice``)."""
        return self.module.rsplit(".", 1)[-1].replace("_", "-")


# In the order the conversion runs them (steps/__init__.py, distributed/__init__.py).
CONVERSIONS: tuple[Conversion, ...] = (
    Conversion("ACC101", _STEPS + "amp"),
    Conversion("ACC102", _STEPS + "accumulate"),
    Conversion("ACC103", _STEPS + "cpu_choice"),
    Conversion("ACC104", _STEPS + "device"),
    Conversion("ACC105", _STEPS + "moves"),
    Conversion("ACC106", _STEPS + "prepare"),
    Conversion("ACC107", _STEPS + "unwrap"),
    Conversion("ACC108", _STEPS + "backward"),
    Conversion("ACC109", _STEPS + "clip"),
    Conversion("ACC110", _STEPS + "save"),
    Conversion("ACC111", _STEPS + "writes"),
    Conversion("ACC112", _STEPS + "metrics"),
    Conversion("ACC113", _STEPS + "output"),
    Conversion("ACC114", _STEPS + "seed"),
    Conversion("ACC115", _STEPS + "uses"),
    Conversion("ACC116", _STEPS + "lockstep"),
    Conversion("ACC117", _STEPS + "accelerator"),
    Conversion("ACC118", _STEPS + "thread"),
    Conversion("ACC210", _DISTRIBUTED + "helpers"),
    Conversion("ACC201", _DISTRIBUTED + "switch"),
    Conversion("ACC202", _DISTRIBUTED + "spawn"),
    Conversion("ACC203", _DISTRIBUTED + "ranks"),
    Conversion("ACC204", _DISTRIBUTED + "process_group"),
    Conversion("ACC205", _DISTRIBUTED + "wrapper"),
    Conversion("ACC206", _DISTRIBUTED + "sync"),
    Conversion("ACC207", _DISTRIBUTED + "sampler"),
    Conversion("ACC208", _DISTRIBUTED + "collectives"),
    Conversion("ACC209", _DISTRIBUTED + "resolve"),
    Conversion("ACC301", "accelify.transform.launcher"),
)
_BY_MODULE = {c.module: c.code for c in CONVERSIONS}
_REFUSAL_CODES = frozenset(r.code for r in REFUSALS)


def conversion_code(module: str) -> str:
    """The code of the step that ``module`` (a ``__module__`` or ``__name__``) makes.

    A step missing from the registry is a bug caught by the first conversion it takes part in."""
    return _BY_MODULE[module]


def page(code: str) -> str:
    """The docs page of any report code, relative to the site's root (a directory URL)."""
    if code.startswith("ACL"):
        return f"reference/rules/{code}/"
    if code in _REFUSAL_CODES:
        return f"reference/refusals/{code}/"
    if code in {c.code for c in CONVERSIONS}:
        return f"reference/conversions/{code}/"
    raise KeyError(code)


def url(code: str) -> str:
    """The page of ``code`` on the published site."""
    return DOCS_URL + page(code)
