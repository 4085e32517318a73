"""Allocator settings for CPU training: glibc keeps freed memory for the next step."""

from __future__ import annotations

import ctypes


def keep_freed_memory() -> None:
    """Ask glibc to keep freed memory for reuse. By default it returns large blocks to the OS as
    soon as they are freed, and every CPU training step then pays page faults to get its
    activation buffers back (glibc adapts by itself for blocks under 32 MB, so small models gain
    little). Elsewhere this does nothing."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, 256 << 20)         # M_MMAP_THRESHOLD: serve blocks up to 256 MB from the heap
        libc.mallopt(-1, 512 << 20)         # M_TRIM_THRESHOLD: keep up to 512 MB of freed heap
    except (OSError, AttributeError):
        pass
