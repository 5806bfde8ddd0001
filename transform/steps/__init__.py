"""One module per conversion step; :mod:`accelify.transform.convert` runs them in this order."""

from accelify.transform.plan import Step

STEPS: list[Step] = []
