"""SARIF 2.1.0, the format GitHub code scanning and most review tools ingest."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from accelify.rules.rule import Rule, Severity
from accelify.rules.runner import FileResult
from accelify.transform.console import package_version

SCHEMA = (
    "https://raw.githubusercontent.com/oasis-tcs/sarif-spec/master/Schemata/sarif-schema-2.1.0.json"
)
_LEVEL = {Severity.ERROR: "error", Severity.WARNING: "warning", Severity.INFO: "note"}


def _uri(path: str) -> str:
    """Relative to the working folder when inside it (what code scanning wants), else a file URI."""
    p = Path(path)
    try:
        return p.resolve().relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return p.resolve().as_uri()


def render(results: Sequence[FileResult], rules: Sequence[type[Rule]]) -> str:
    index = {rule.code: i for i, rule in enumerate(rules)}
    descriptors = [
        {
            "id": rule.code,
            "name": rule.name,
            "shortDescription": {"text": rule.summary()},
            "help": {"text": rule.docs(), "markdown": rule.docs()},
            "defaultConfiguration": {
                "level": _LEVEL[rule.severity],
                "enabled": rule.enabled_by_default,
            },
        }
        for rule in rules
    ]
    findings = []
    for result in results:
        for f in result.findings:
            entry = {
                "ruleId": f.code,
                "level": _LEVEL[f.severity],
                "message": {"text": f.message},
                "locations": [
                    {
                        "physicalLocation": {
                            "artifactLocation": {"uri": _uri(result.path)},
                            "region": {
                                "startLine": f.line,
                                "startColumn": f.column,
                                "endLine": f.end_line,
                                "endColumn": f.end_column,
                            },
                        }
                    }
                ],
            }
            if f.code in index:
                entry["ruleIndex"] = index[f.code]
            if f.cell is not None:
                entry["properties"] = {"cell": f.cell}
            findings.append(entry)
    log = {
        "$schema": SCHEMA,
        "version": "2.1.0",
        "runs": [
            {
                "tool": {
                    "driver": {
                        "name": "accel-lint",
                        "version": package_version(),
                        "rules": descriptors,
                    }
                },
                "results": findings,
            }
        ],
    }
    return json.dumps(log, indent=2)
