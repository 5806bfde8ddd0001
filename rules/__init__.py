"""accel-lint: rules that catch distributed-training bugs in Accelerate-style scripts."""
