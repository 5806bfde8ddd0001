"""HF Accelerate's environment queries (``accelerate.utils.is_*_available``), which scripts use to
pick a precision or skip a path: the same answers, from torch and the installed packages."""

from __future__ import annotations

import importlib.util
import os
from unittest import mock

import torch


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def is_cuda_available() -> bool:
    """Whether CUDA can be used, asked through NVML as HF does, so that asking does not create a
    CUDA context (a process that forks workers afterwards would break)."""
    with mock.patch.dict(os.environ, {"PYTORCH_NVML_BASED_CUDA_CHECK": "1"}):
        return torch.cuda.is_available()


def is_mps_available() -> bool:
    return torch.backends.mps.is_available() and torch.backends.mps.is_built()


def is_xpu_available() -> bool:
    return hasattr(torch, "xpu") and torch.xpu.is_available()


def is_hpu_available() -> bool:
    """Habana Gaudi: only through its own torch plug-in."""
    return _installed("habana_frameworks")


def is_rocm_available() -> bool:
    return torch.version.hip is not None


def is_bf16_available() -> bool:
    """bf16 on the device this process would use: CUDA asks the card, the CPU always has it."""
    if is_cuda_available():
        return torch.cuda.is_bf16_supported()
    return True


def is_fp16_available() -> bool:
    """fp16 autocast runs on every device accelify drives (HF says False only on Gaudi 1)."""
    return True


def is_datasets_available() -> bool:
    return _installed("datasets")


def is_pytest_available() -> bool:
    return _installed("pytest")


def is_bnb_available() -> bool:
    return _installed("bitsandbytes")


def is_schedulefree_available() -> bool:
    return _installed("schedulefree")
