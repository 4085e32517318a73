"""Standard output that may become unwritable (`python train.py | head`, a full disk) without
stopping the work.

Python turns a write to a closed pipe into BrokenPipeError, and to a full disk into OSError;
raised in the middle of training, either would end the run before its next checkpoint. Inside
`stdout_may_close()`, the first such error silences standard output instead, and the program
carries on unheard. A stdout closed outright (`>&-`) is silent from the start.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys


def silence(stream) -> None:
    """Point the stream's file descriptor at /dev/null, so what it still buffers, flushed at exit,
    goes nowhere instead of failing again."""
    with contextlib.suppress(OSError, ValueError, AttributeError, io.UnsupportedOperation):
        null = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(null, stream.fileno())
        finally:
            os.close(null)


class _Quiet(io.TextIOBase):
    def __init__(self, stream):
        self.stream, self.lost = stream, stream is None

    def write(self, text: str) -> int:
        if not self.lost:
            try:
                self.stream.write(text)
            except OSError:             # BrokenPipeError, a full disk, EINVAL on Windows
                self._lose()
        return len(text)

    def flush(self) -> None:
        if not self.lost:
            try:
                self.stream.flush()
            except OSError:
                self._lose()

    def _lose(self) -> None:
        self.lost = True
        silence(self.stream)

    def isatty(self) -> bool:
        return not self.lost and self.stream.isatty()

    def fileno(self) -> int:            # for tools that write to the descriptor (wandb's capture)
        if self.lost:
            raise io.UnsupportedOperation("standard output is closed")
        return self.stream.fileno()

    @property
    def encoding(self) -> str:
        return getattr(self.stream, "encoding", None) or "utf-8"


@contextlib.contextmanager
def stdout_may_close():
    saved = sys.stdout
    sys.stdout = _Quiet(saved)
    try:
        yield
    finally:
        sys.stdout = saved
