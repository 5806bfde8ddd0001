"""One module per conversion step; :mod:`accelify.transform.convert` runs them in order."""
