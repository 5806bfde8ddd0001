"""``[tool.accelify.lint]`` in ``pyproject.toml``: which rules run on which files.

Found like Ruff finds its settings: the nearest ``pyproject.toml`` above the linted file that has
the section wins, unless ``--config`` names one file for all. Selectors are codes, code prefixes
(``ACL1``), rule names (``unwrapped-save``) or ``ALL``; ``per-file-ignores`` globs are relative
to the folder of the file that declares them.
"""

from __future__ import annotations

import difflib
import fnmatch
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from accelify.rules.rule import Rule
from accelify.transform.sources import SourceError

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

_KEYS = frozenset(
    {"select", "extend-select", "ignore", "per-file-ignores", "exclude", "extend-exclude"}
)


@dataclass(frozen=True)
class Config:
    """The settings of one ``[tool.accelify.lint]`` table (empty: the defaults)."""

    root: Path = field(default_factory=Path.cwd)
    source: Path | None = None  # the settings file; None: the defaults
    select: tuple[str, ...] | None = None
    extend_select: tuple[str, ...] = ()
    ignore: tuple[str, ...] = ()
    per_file_ignores: tuple[tuple[str, tuple[str, ...]], ...] = ()
    exclude: tuple[str, ...] = ()  # globs of files and folders a walk skips

    def excludes(self, path: str) -> bool:
        """Whether ``exclude``/``extend-exclude`` skips ``path`` (a glob matching the file, its
        name, or a folder it is in, relative to the settings file's folder)."""
        if not self.exclude:
            return False
        relative = self._relative(path)
        parts = relative.split("/")
        candidates = {relative, Path(path).name}
        candidates |= {"/".join(parts[:i]) for i in range(1, len(parts))}
        return any(
            fnmatch.fnmatch(candidate, pattern.rstrip("/"))
            for pattern in self.exclude
            for candidate in candidates
        )

    def _relative(self, path: str) -> str:
        try:
            return Path(path).resolve().relative_to(self.root.resolve()).as_posix()
        except ValueError:
            return Path(path).as_posix()

    def ignored_for(self, path: str) -> tuple[str, ...]:
        """Selectors ``per-file-ignores`` turns off for ``path``."""
        relative, name = self._relative(path), Path(path).name
        return tuple(
            code
            for pattern, codes in self.per_file_ignores
            if fnmatch.fnmatch(relative, pattern) or fnmatch.fnmatch(name, pattern)
            for code in codes
        )


def _read(path: Path) -> tuple[str, dict]:
    """The file's text (to place mistakes at their line) and its TOML, read and parsed once."""
    try:
        text = path.read_text(encoding="utf-8")
        return text, tomllib.loads(text)
    except OSError as err:
        raise SourceError(str(path), 0, err.strerror or str(err)) from None
    except tomllib.TOMLDecodeError as err:
        raise SourceError(
            str(path), getattr(err, "lineno", 1) or 1, f"invalid TOML: {err}"
        ) from None


def _table(path: Path, text: str, data: dict) -> dict | None:
    """The ``[tool.accelify.lint]`` table; a non-pyproject TOML file may hold it at top level.

    A ``[tool.accel-lint]`` table, named after the command as Ruff's ``[tool.ruff]`` is, would be
    ignored without a word: an error at its line that names the right table."""
    tool = data.get("tool", {})
    if "accel-lint" in tool:
        header = re.search(r"^[ \t]*\[[ \t]*tool[ \t]*\.[ \t]*[\"']?accel-lint\b", text, re.M)
        line = text.count("\n", 0, header.start()) + 1 if header else 1
        message = "unknown table [tool.accel-lint] (did you mean [tool.accelify.lint]?)"
        raise SourceError(str(path), line, message)
    table = tool.get("accelify", {}).get("lint")
    if table is None and path.name != "pyproject.toml":
        table = data
    return table


def load(path: str | Path) -> Config:
    """Read the settings from ``path`` (a ``pyproject.toml`` or a TOML file of its own); a
    mistake is an error at its line, with the key or rule it most likely meant."""
    path = Path(path)
    return _settings(path, *_read(path))


def _settings(path: Path, text: str, data: dict) -> Config:
    table = _table(path, text, data) or {}
    for key in sorted(set(table) - _KEYS):
        raise SourceError(
            str(path),
            _line(text, key, assigned=True),
            f"unknown [tool.accelify.lint] key {key!r}{_did_you_mean(key, _KEYS)}",
        )
    per_file = table.get("per-file-ignores", {})
    if not isinstance(per_file, dict):
        line = _line(text, "per-file-ignores", assigned=True)
        raise SourceError(str(path), line, "per-file-ignores must be a table of glob = [codes]")
    config = Config(
        root=path.parent,
        source=path,
        exclude=(
            *_globs(path, text, "exclude", table.get("exclude", [])),
            *_globs(path, text, "extend-exclude", table.get("extend-exclude", [])),
        ),
        select=_codes(path, text, "select", table["select"]) if "select" in table else None,
        extend_select=_codes(path, text, "extend-select", table.get("extend-select", [])),
        ignore=_codes(path, text, "ignore", table.get("ignore", [])),
        per_file_ignores=tuple(
            (glob, _codes(path, text, glob, codes)) for glob, codes in per_file.items()
        ),
    )
    _refuse_unknown_rules(path, text, config)
    return config


def _codes(path: Path, text: str, key: str, value: object) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise SourceError(
            str(path),
            _line(text, key, assigned=True),
            f"expected a list of rule codes, got {value!r}",
        )
    return tuple(value)


def _globs(path: Path, text: str, key: str, value: object) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        line = _line(text, key, assigned=True)
        raise SourceError(str(path), line, f"{key} must be a list of globs, got {value!r}")
    return tuple(value)


def _refuse_unknown_rules(path: Path, text: str, config: Config) -> None:
    """A code that matches no rule would silently select or ignore nothing (``ignore =
    ["ACL2O1"]`` with a letter O): an error at its line, naming the rule it most likely meant."""
    from accelify.rules.checks import all_rules  # the rules import this module's neighbours

    rules = all_rules()
    used = [*(config.select or ()), *config.extend_select, *config.ignore]
    used += [code for _, codes in config.per_file_ignores for code in codes]
    for selector in unknown_selectors(rules, used):
        known = [rule.code for rule in rules] + [rule.name for rule in rules]
        raise SourceError(
            str(path),
            _line(text, selector, assigned=False),
            f"unknown rule selector {selector!r}{_did_you_mean(selector, known)}",
        )


def _line(text: str, word: str, assigned: bool) -> int:
    """The line of ``text`` that sets key ``word`` (``assigned``) or quotes the string ``word``;
    1 when there is none to find (a key written as a dotted name, say)."""
    quoted = rf"[\"']{re.escape(word)}[\"']"
    # [ \t], not \s: a blank line above the key must not count as the key's line.
    pattern = rf"^[ \t]*(?:{quoted}|{re.escape(word)})[ \t]*=" if assigned else quoted
    match = re.search(pattern, text, re.MULTILINE)
    return text.count("\n", 0, match.start()) + 1 if match else 1


def _did_you_mean(word: str, choices: Iterable[str]) -> str:
    """The closest choice (as difflib measures it); among equally close ones, the one with most
    characters in place (``ACL2O1``, a letter O: ``ACL201``, not ``ACL291``)."""

    def closeness(choice: str) -> tuple[float, int]:
        ratio = difflib.SequenceMatcher(None, word, choice).ratio()
        return ratio, sum(a == b for a, b in zip(word, choice, strict=False))

    best = max(choices, key=closeness, default=None)
    if best is None or closeness(best)[0] < 0.6:
        return ""
    return f" (did you mean {best!r}?)"


@cache
def find(folder: Path) -> Config:
    """The settings for files in ``folder``: the nearest pyproject.toml with the table."""
    candidate = folder / "pyproject.toml"
    if candidate.is_file():
        text, data = _read(candidate)
        if _table(candidate, text, data) is not None:
            return _settings(candidate, text, data)
    if folder.parent == folder:
        return Config()
    return find(folder.parent)


def for_file(path: str, explicit: Config | None) -> Config:
    if explicit is not None:
        return explicit
    return find(Path(path).resolve().parent)


def parse_selectors(text: str | None) -> tuple[str, ...] | None:
    """``"ACL1,unwrapped-save"`` from the command line as a tuple (None when not given)."""
    if text is None:
        return None
    return tuple(s.strip() for s in text.split(",") if s.strip())


def matches(rule: type[Rule], selector: str) -> bool:
    return (
        selector.upper() == "ALL" or rule.code.startswith(selector.upper()) or rule.name == selector
    )


def unknown_selectors(rules: Sequence[type[Rule]], selectors: Iterable[str]) -> list[str]:
    """Selectors that match no rule: a typo must not silently turn everything off."""
    return [s for s in selectors if not any(matches(rule, s) for rule in rules)]


def select_rules(
    rules: Sequence[type[Rule]],
    config: Config,
    path: str,
    select: tuple[str, ...] | None = None,
    ignore: tuple[str, ...] = (),
) -> list[type[Rule]]:
    """The rules to run on ``path``: command line over config over defaults."""
    chosen = select if select is not None else config.select
    on = [
        rule
        for rule in rules
        if (rule.enabled_by_default if chosen is None else any(matches(rule, s) for s in chosen))
        or any(matches(rule, s) for s in config.extend_select)
    ]
    off = (*config.ignore, *ignore, *config.ignored_for(path))
    return [rule for rule in on if not any(matches(rule, s) for s in off)]
