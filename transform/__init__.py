"""accel-convert: rewrite a plain PyTorch training script into an Accelerate-style one.

Never imports torch: the converter and the linter that reuses its analysis must start fast.
"""
