"""accel-run and notebook_launcher, built on torch.distributed's elastic agent."""

# Imported for what they register: the sharded sections and parallelism_config.
from accelify.runtime.launch import backends, parallelism  # noqa: F401
from accelify.runtime.launch.notebook import notebook_launcher

__all__ = ["notebook_launcher"]
