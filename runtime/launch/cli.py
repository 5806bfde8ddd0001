"""accel-run command line (placeholder until the runtime lands)."""

import sys


def main() -> None:
    print("accel-run is not yet available", file=sys.stderr)
    sys.exit(2)
