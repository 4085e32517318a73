"""Standard output that may lose its reader (`python train.py | head`) without stopping the work.

Python turns a write to a closed pipe into BrokenPipeError; raised in the middle of training it
would end the run before its next checkpoint. Inside `stdout_may_close()`, the first such error
silences standard output instead, and the program carries on unheard. A stdout closed outright
(`>&-`) is silent from the start.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys


class _Quiet(io.TextIOBase):
    def __init__(self, stream):
        self.stream = stream if stream is not None else open(os.devnull, "w")

    def write(self, text: str) -> int:
        try:
            return self.stream.write(text)
        except BrokenPipeError:
            self._silence()
            return len(text)

    def flush(self) -> None:
        try:
            self.stream.flush()
        except BrokenPipeError:
            self._silence()

    def _silence(self) -> None:
        with contextlib.suppress(OSError, ValueError, io.UnsupportedOperation):
            # what the stream still buffers is flushed at exit: let that go nowhere, quietly
            os.dup2(os.open(os.devnull, os.O_WRONLY), self.stream.fileno())
        self.stream = open(os.devnull, "w")

    def isatty(self) -> bool:
        return self.stream.isatty()


@contextlib.contextmanager
def stdout_may_close():
    saved = sys.stdout
    sys.stdout = _Quiet(saved)
    try:
        yield
    finally:
        sys.stdout = saved
