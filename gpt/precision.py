"""Float32 matmul precision, the `matmul_precision` training option.

The levels are torch's (torch.set_float32_matmul_precision), but set per backend, so that the
default leaves a CPU's arithmetic exact as it always was:

    highest  exact float32 everywhere
    high     a CUDA GPU may use TF32 (nanoGPT's GPU setting); a CPU stays exact
    medium   also a CPU with AMX rounds matmul inputs to bfloat16, summing in float32

Only the per-backend settings of torch >= 2.9 are used: reading torch's legacy getter after
they are set raises, so code here never calls it.
"""

from __future__ import annotations

import contextlib

import torch

LEVELS = {"highest": ("ieee", "ieee"), "high": ("tf32", "ieee"), "medium": ("tf32", "bf16")}  # (CUDA, CPU)


def _settings() -> tuple[str, str]:
    return torch.backends.cuda.matmul.fp32_precision, torch.backends.mkldnn.matmul.fp32_precision


def _apply(cuda: str, cpu: str) -> None:
    torch.backends.cuda.matmul.fp32_precision = cuda
    torch.backends.mkldnn.matmul.fp32_precision = cpu


@contextlib.contextmanager
def matmul_precision(level: str):
    """Float32 matmuls at `level` inside the block, as they were after it."""
    before = _settings()
    _apply(*LEVELS[level])
    try:
        yield
    finally:
        _apply(*before)


def cpu_rounds_matmuls() -> bool:
    return torch.backends.mkldnn.matmul.fp32_precision == "bf16"


@contextlib.contextmanager
def exact_cpu_matmuls():
    before = torch.backends.mkldnn.matmul.fp32_precision
    torch.backends.mkldnn.matmul.fp32_precision = "ieee"
    try:
        yield
    finally:
        torch.backends.mkldnn.matmul.fp32_precision = before
