"""accel-run and notebook_launcher, built on torch.distributed's elastic agent."""

from accelify.runtime.launch import backends  # noqa: F401 (registers the sharded sections)
from accelify.runtime.launch.notebook import notebook_launcher

__all__ = ["notebook_launcher"]
