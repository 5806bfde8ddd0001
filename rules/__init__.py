"""accel-lint: rules that catch distributed-training bugs in Accelerate-style scripts.

Codes use the ``ACL`` prefix (no popular flake8 plugin or Ruff rule uses it; ``ACC`` was avoided):

- ``ACL0xx`` hangs and crashes that appear only on many processes (CUDA before fork,
  collectives on one process, ``prepare`` arity/order);
- ``ACL1xx`` checkpoints and files (unwrapped saves, every process writing, unsafe ``torch.load``);
- ``ACL2xx`` training-loop correctness (backward/clip bypassing the Accelerator, accumulation,
  schedule length, metrics on one shard, redundant device moves, fp16 clipping, stale optimizer
  parameters);
- ``ACL3xx`` noise, off by default (``print``/``tqdm`` on every process).

Layout: ``engine`` (one parse, one traversal, suppressions, fixes), ``facts`` (what rules share),
``checks/`` (one module per rule: docs, cases, logic), ``config``, ``notebook``, ``runner``,
``formats``/``sarif``, ``cli``. Nothing here imports torch.
"""
