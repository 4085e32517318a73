"""Float32 matmul precision, the `matmul_precision` training option.

The levels are torch's (torch.set_float32_matmul_precision), with two changes for a CPU: `high`
is exact, as a CPU run's arithmetic always was here, and `medium` rounds only where it can:

    highest  exact float32
    high     a CUDA GPU may use TF32 (nanoGPT's GPU setting); a CPU stays exact
    medium   a CPU with AMX rounds matmul inputs to bfloat16, summing in float32 (CUDA: TF32);
             another CPU stays exact

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
    torch.set_float32_matmul_precision(torch_level(level, device_type))
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)
        torch.backends.cuda.matmul.fp32_precision, torch.backends.mkldnn.matmul.fp32_precision = backends


def torch_level(level: str, device_type: str) -> str:
    """The level torch is set to for a run at `level`: a CPU stays exact at high, and at medium
    where it cannot round."""
    if device_type == "cpu" and (level == "high" or level == "medium" and not cpu_can_round()):
        return "highest"
    return level


def cpu_rounds_matmuls() -> bool:
    return torch.backends.mkldnn.matmul.fp32_precision == "bf16"


@functools.cache
def cpu_can_round() -> bool:
    """Whether this CPU rounds float32 matmul inputs to bfloat16 when asked: oneDNN does on AMX.
    Elsewhere (an AMD EPYC with AVX-512 BF16 included) torch leaves linear layers exact but slows
    SDPA's kernel down, so `medium` is not asked for there."""
    with exact_cpu_matmuls(), torch.autocast("cpu", enabled=False):     # the answer is cached
        torch.backends.mkldnn.matmul.fp32_precision = "bf16"
        x = torch.full((64, 128), 1 + 2**-9)        # exact in float32, 1.0 in bfloat16
        return bool((F.linear(x, torch.ones(256, 128)) != 128 * (1 + 2**-9)).any())


@functools.cache
def cpu_computes_bfloat16() -> bool:
    """Whether this CPU has bfloat16 dot products (x86 AVX-512 BF16, which CPUs with AMX have too),
    read from Linux's /proc/cpuinfo, and torch uses AVX-512 (ATEN_CPU_CAPABILITY may hold it to
    AVX2); False where the file cannot be read."""
    if not torch.backends.cpu.get_cpu_capability().startswith("AVX512"):
        return False
    try:
        with open("/proc/cpuinfo") as f:
            return lists_bfloat16(f.read())
    except OSError:
        return False


def computes_bfloat16(device: torch.device) -> bool:
    """Whether `device` has bfloat16 products in hardware: a CUDA GPU from Ampere on, Apple's GPU, a
    CPU with bfloat16 dot products. Elsewhere they are emulated, many times slower than float32."""
    if device.type == "cuda":
        return torch.cuda.get_device_capability(device)[0] >= 8
    return device.type == "mps" or (device.type == "cpu" and cpu_computes_bfloat16())


def muon_dtype(choice: str, device: torch.device) -> torch.dtype:
    """The dtype of Muon's Newton-Schulz iteration for the muon_dtype option: auto takes bfloat16
    where the device computes it, else float32."""
    if choice != "auto":
        return getattr(torch, choice)
    return torch.bfloat16 if computes_bfloat16(device) else torch.float32


def lists_bfloat16(cpuinfo: str) -> bool:
    """Whether the flags of a /proc/cpuinfo text name bfloat16 dot products."""
    flags = {word for line in cpuinfo.splitlines() if line.startswith("flags") for word in line.split()}
    return bool(flags & {"avx512_bf16", "amx_bf16"})


@contextlib.contextmanager
def exact_cpu_matmuls():
    before = torch.backends.mkldnn.matmul.fp32_precision
    torch.backends.mkldnn.matmul.fp32_precision = "ieee"
    try:
        yield
    finally:
        torch.backends.mkldnn.matmul.fp32_precision = before
