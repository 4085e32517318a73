"""Stopping a run cleanly: Ctrl-C, SIGTERM and SIGHUP become a request to stop after the step under way."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import threading

from ..console import Terminated
from ..errors import UserError

# besides Ctrl-C: a kill, and a terminal closing under the run (no SIGHUP on Windows)
STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name))
SWEEP_PID = "GPT_SWEEP_PID"     # set for the runs a sweep starts: the sweep's process id


def end_with_the_sweep() -> None:
    """In a run a sweep started, ask Linux for SIGTERM (a save, then the end) when the sweep
    process dies, even by SIGKILL: an orphaned run would train on unwatched, and the sweep, run
    again, would start a second process on its folder."""
    sweep_pid = os.environ.get(SWEEP_PID)
    if not sweep_pid:
        return
    try:
        ctypes.CDLL("libc.so.6").prctl(1, signal.SIGTERM)     # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if str(os.getppid()) != sweep_pid:      # it died before the request was made
        raise UserError("the sweep that started this run has ended; run the sweep's command again")


def catch_signals(handler) -> dict:
    """Install handler for Ctrl-C and STOP_SIGNALS; returns the handlers it replaced. A signal
    the process was started to ignore (nohup's SIGHUP) stays ignored, and a thread other than
    the main one (training from a notebook's worker) cannot catch any: Python delivers them to
    the main thread alone."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, *STOP_SIGNALS)
            if signal.getsignal(sig) is not signal.SIG_IGN}


def raise_on_signal(signum, frame):
    """A handler for catch_signals where a stop must unwind at once (a sweep waiting on its runs):
    Ctrl-C as KeyboardInterrupt, the others as Terminated."""
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise Terminated(signum)


class StopRequest:
    """Turns the first Ctrl-C, SIGTERM or SIGHUP into a flag the loop checks after each step (under
    DDP, with shared=True, at the next log step). A second Ctrl-C stops at once, except while a
    checkpoint is being written: it then waits for the file. Other signals never escalate: Linux
    may deliver a dying sweep's SIGTERM several times."""

    def __init__(self, shared: bool = False):
        self.shared = shared
        self.signal = None
        self.previous = {}
        self.holding, self.pending = False, False

    def __enter__(self):
        self.previous = catch_signals(self._handle)
        return self

    def _handle(self, signum, frame):
        if self.signal is None:
            self.signal = signal.Signals(signum).name
            if os.environ.get("RANK", "0") == "0":  # said at once: a step can take seconds
                with contextlib.suppress(OSError):  # os.write: a print could land inside tqdm's
                    again = " (a second Ctrl-C stops at once)" if signum == signal.SIGINT else ""
                    when = ("at the next log_interval-th step, where the processes agree on it"
                            if self.shared else "once the step or evaluation under way is done")
                    os.write(2, f"\n{self.signal}: stopping {when}{again}\n".encode())
        elif signum != signal.SIGINT:
            return
        elif self.holding:
            self.pending = True
        else:
            raise KeyboardInterrupt

    @contextlib.contextmanager
    def hold(self):
        """Let no second signal cut the block short; it takes effect when the block ends."""
        self.holding = True
        try:
            yield
        finally:
            self.holding = False
            if self.pending:
                raise KeyboardInterrupt

    def __exit__(self, *exc):
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)



def exit_status(stopped_by: str | None) -> int:
    """0 for a run that ended, else 128 + the signal's number, as a shell reports a stopped job
    (130 for Ctrl-C, 143 for SIGTERM); a stop that came from another DDP rank counts as Ctrl-C."""
    if stopped_by is None:
        return 0
    return 128 + getattr(signal.Signals, stopped_by, signal.SIGINT)

