"""Standard output and error that may become unwritable (`python train.py | head`, a full
disk, `2>&-`) without stopping the work.

Python turns a write to a closed pipe into BrokenPipeError, and to a full disk into OSError;
raised in the middle of training, either would end the run before its next checkpoint. Inside
`output_may_close()`, the first such error silences that stream instead, and the program carries
on unheard. A stream closed outright (`>&-`) is silent from the start.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import os
import signal
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
        self.stream, self.lost, self.error = stream, stream is None, None

    def write(self, text: str) -> int:
        if not self.lost:
            try:
                self.stream.write(text)
            except (OSError, ValueError) as e:  # a closed pipe, a full disk, EINVAL on Windows,
                self._lose(e)                   # a stream closed under us
        return len(text)

    def flush(self) -> None:
        if not self.lost:
            try:
                self.stream.flush()
            except (OSError, ValueError) as e:
                self._lose(e)

    def _lose(self, error: Exception) -> None:
        self.lost, self.error = True, error
        silence(self.stream)

    def isatty(self) -> bool:
        return not self.lost and self.stream.isatty()

    def fileno(self) -> int:            # for tools that write to the descriptor (wandb's capture)
        if self.lost:
            raise io.UnsupportedOperation("the stream is closed")
        return self.stream.fileno()

    @property
    def encoding(self) -> str:
        return getattr(self.stream, "encoding", None) or "utf-8"


def _interrupted_while_loading(signum, frame):
    with contextlib.suppress(OSError):
        os.write(2, b"interrupted\n")     # not print: the import cut short may be inside one
    os._exit(130)       # nothing is open yet; an exception could surface half-way through torch


def interrupt_quietly_while_loading(module_name: str) -> None:
    """Called first by a command (train.py, `python -m gpt.X`): a Ctrl-C while its imports load
    (torch takes seconds) then ends it with the one line interrupt_in_one_line gives later, not a
    traceback from inside torch. loaded() hands Ctrl-C back to Python."""
    # a process started with Ctrl-C ignored (a job in the background of a script) keeps it so
    if module_name == "__main__" and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _interrupted_while_loading)


def loaded() -> None:
    """The imports are done: Ctrl-C raises KeyboardInterrupt again, for the command to handle."""
    if signal.getsignal(signal.SIGINT) is _interrupted_while_loading:
        signal.signal(signal.SIGINT, signal.default_int_handler)


class Terminated(KeyboardInterrupt):
    """A signal other than Ctrl-C (SIGTERM, SIGHUP) that stops a command as Ctrl-C does, reported
    as itself."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _stop(signum, frame):
    raise Terminated(signum)


@contextlib.contextmanager
def interrupt_in_one_line(terminate: bool = False):
    """Ctrl-C ends a command with one line and status 130, as a shell reports it, not a traceback.
    With terminate, SIGTERM and SIGHUP (kill, a closed terminal) do so too, with their own status
    (143, 129), so that the command's own clean-up runs: for one that writes files and holds no
    checkpoint to save."""
    loaded()
    if terminate:
        saved = {s: signal.signal(s, _stop) for s in (signal.SIGTERM, getattr(signal, "SIGHUP", None))
                 if s is not None and signal.getsignal(s) is signal.SIG_DFL}
    try:
        yield
    except KeyboardInterrupt as e:     # the status a shell gives a process the signal ended
        with contextlib.suppress(OSError, ValueError, AttributeError):
            print("interrupted", file=sys.stderr)
        raise SystemExit(128 + getattr(e, "signum", signal.SIGINT)) from None
    finally:
        for s, handler in (saved.items() if terminate else ()):
            signal.signal(s, handler)


@contextlib.contextmanager
def output_may_close(product: bool = False, stdout: bool = True):
    """stderr, and stdout unless stdout=False, that go quiet when they cannot be written. With
    product=True the output is what the command is for: if the command ends well but its output
    could not be written for a reason other than its reader going away (a full disk), it ends
    with status 1 and says so."""
    saved = sys.stdout, sys.stderr
    out = _Quiet(sys.stdout)
    if stdout:
        sys.stdout = out
    err = sys.stderr = _Quiet(sys.stderr)
    ended_well = False
    try:
        yield
        ended_well = True
    except SystemExit as e:     # an error of the command's own keeps its status and message
        ended_well = e.code in (None, 0)
        raise
    finally:
        try:
            out.flush()         # here, where a failure is caught, not at exit
            err.flush()
        finally:
            sys.stdout, sys.stderr = saved
        if product and ended_well and out.error is not None and not isinstance(out.error, BrokenPipeError):
            reason = getattr(out.error, "strerror", None) or str(out.error)
            with contextlib.suppress(OSError, ValueError, AttributeError):
                print(f"error: the output could not be written ({reason})", file=sys.stderr)
            raise SystemExit(1)


NONFINITE = ("nan", "inf", "-inf")     # how our JSON spells them: bare NaN is not JSON


def to_json(data, **kwargs) -> str:
    """Strict JSON, which jq and JavaScript accept: non-finite numbers become the strings
    "nan", "inf" and "-inf"."""
    def safe(value):
        if isinstance(value, float) and not math.isfinite(value):
            return str(value)
        if isinstance(value, dict):
            return {key: safe(v) for key, v in value.items()}
        return [safe(v) for v in value] if isinstance(value, (list, tuple)) else value
    return json.dumps(safe(data), allow_nan=False, **kwargs)


class Parser(argparse.ArgumentParser):
    """argparse with the project's errors: one line, saying where help is, not the usage text."""

    def error(self, message):
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")
