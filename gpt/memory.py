"""Memory: how much a device has, and running out of it said in one line."""

from __future__ import annotations

import contextlib
import os
import re

import torch

from .errors import UserError


def device_memory(device: str) -> int | None:
    """Bytes of memory the device has: the GPU's, or the whole machine's; None where unknown."""
    if torch.device(device).type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):     # Windows has no sysconf
        return None


@contextlib.contextmanager
def out_of_memory_in_one_line(fix: str):
    """A failed allocation (numpy's, the CPU allocator's or CUDA's) becomes a UserError that
    says fix."""
    try:
        yield
    except (MemoryError, RuntimeError) as e:       # torch.OutOfMemoryError is a RuntimeError
        text = str(e)
        if not (isinstance(e, (MemoryError, torch.OutOfMemoryError)) or "can't allocate memory" in text):
            raise
        raise UserError(out_of_memory_message(text, fix)) from None


def out_of_memory_message(text: str, fix: str) -> str:
    """'out of memory', the size of the allocation that failed where text gives it, and fix."""
    found = re.search(r"allocate (\d+(?:\.\d*)?) ?(bytes|[KMGT]iB)", text, re.IGNORECASE)
    size = ""
    if found:
        scale = {"bytes": 1, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}[found[2].lower()]
        size = f" (an allocation of {float(found[1]) * scale / 2**30:,.2f} GiB failed)"
    return f"out of memory{size}; {fix}"
