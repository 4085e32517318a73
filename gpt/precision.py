"""Float32 matmul precision, the `matmul_precision` training option.

The levels are torch's (torch.set_float32_matmul_precision), with one change: on a CPU `high`
is exact, as a CPU run's arithmetic always was here, so only `medium` rounds there:

    highest  exact float32
    high     a CUDA GPU may use TF32 (nanoGPT's GPU setting); a CPU stays exact
    medium   a CPU with AMX rounds matmul inputs to bfloat16, summing in float32 (CUDA: TF32)

The level is set through torch's process-wide setter, which torch.compile's own code reads back;
attention's exact CPU matmuls flip only the CPU backend's setting, which keeps that reading valid.
"""

from __future__ import annotations

import contextlib
import functools

import torch
import torch.nn.functional as F


@contextlib.contextmanager
def matmul_precision(level: str, device_type: str):
    """Float32 matmuls at `level` inside the block, and every setting as it was after it: torch
    keeps one level and a setting per backend, which callers may have set apart."""
    try:
        before = torch.get_float32_matmul_precision()
    except RuntimeError:        # the backends' settings contradict the level; they are put back below
        before = "highest"
    backends = torch.backends.cuda.matmul.fp32_precision, torch.backends.mkldnn.matmul.fp32_precision
    torch.set_float32_matmul_precision("highest" if device_type == "cpu" and level == "high" else level)
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)
        torch.backends.cuda.matmul.fp32_precision, torch.backends.mkldnn.matmul.fp32_precision = backends


def cpu_rounds_matmuls() -> bool:
    """Whether float32 matmuls on this CPU are rounded now: the setting asks for it and the CPU
    does it. torch rounds only where oneDNN has bfloat16 matmul units (AMX); elsewhere, an AMD EPYC
    with AVX-512 BF16 included, `medium` leaves them exact."""
    return torch.backends.mkldnn.matmul.fp32_precision == "bf16" and _rounding_takes_effect()


@functools.cache
def _rounding_takes_effect() -> bool:
    # asked only while the setting is bf16; 1 + 2**-9 is exact in float32 and 1.0 in bfloat16
    x = torch.full((64, 128), 1 + 2**-9)
    return bool((F.linear(x, torch.ones(256, 128)) != 128 * (1 + 2**-9)).any())


@contextlib.contextmanager
def exact_cpu_matmuls():
    before = torch.backends.mkldnn.matmul.fp32_precision
    torch.backends.mkldnn.matmul.fp32_precision = "ieee"
    try:
        yield
    finally:
        torch.backends.mkldnn.matmul.fp32_precision = before
