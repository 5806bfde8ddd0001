"""accel-run and notebook_launcher, built on torch.distributed's elastic agent."""
