"""The bundled runtime: an Accelerate-compatible ``Accelerator`` and the ``accel-run`` launcher."""
