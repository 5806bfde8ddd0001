"""accel-lint command line (placeholder until the linter lands)."""

import sys


def main() -> None:
    print("accel-lint is not yet available", file=sys.stderr)
    sys.exit(2)
