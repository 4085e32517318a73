"""A sweep's runs as processes forked from one server that imported torch and the trainer once.

Each run still gets a process of its own (its own seed state, folder, exit status, signals), as
`python train.py` would give it, but without the interpreter's start and the imports, which cost
a short run seconds. The server is multiprocessing's forkserver: a fresh process that imports and
never computes, since a process forked after torch's CPU threads have run can hang in its first
parallel op. Linux only by default: on macOS a process that loaded Apple's frameworks must not fork.
"""

from __future__ import annotations

import atexit
import multiprocessing
import os
import signal
import sys
from typing import Callable

from ..config import REPO_ROOT
from ..train.signals import SWEEP_PID


def forking(run_start: str) -> bool:
    """Whether run_start (SweepConfig's) starts runs forked here."""
    return run_start == "fork" or (run_start == "auto" and sys.platform.startswith("linux"))


def _context(entry: Callable[[list[str]], int]):
    """The forkserver, with torch and the trainer imported before it forks. A script's __main__
    is not among what it imports first; each run imports that itself, finding the rest loaded."""
    if str(REPO_ROOT) not in sys.path:      # where the server finds train.py
        sys.path.insert(0, str(REPO_ROOT))
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["gpt.train.loop", "gpt.sweep.runner",
                                    *([entry.__module__] if entry.__module__ != "__main__" else [])])
    return context


class ForkedRun:
    """One run in a forked process, with the part of subprocess.Popen's interface the sweep uses.
    entry: what trains one run from its arguments in this process (train.py's main)."""

    def __init__(self, entry: Callable[[list[str]], int], argv: list[str], log_path: str):
        # the sweep's environment now, as Popen would pass it: the server's is from when it started
        self.process = _context(entry).Process(target=train_run, args=(entry, argv, log_path, dict(os.environ)),
                                               daemon=False)
        self.process.start()
        self.pid = self.process.pid

    @property
    def returncode(self) -> int | None:
        return self.process.exitcode

    def poll(self) -> int | None:
        return self.process.exitcode

    def wait(self) -> int:
        self.process.join()
        return self.process.exitcode

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def send_signal(self, signum: int) -> None:
        if self.process.exitcode is None:
            try:
                os.kill(self.pid, signum)
            except ProcessLookupError:      # ended just now
                pass


def train_run(entry: Callable[[list[str]], int], argv: list[str], log_path: str, environ: dict) -> None:
    """In the forked process: what `python train.py ARGV > log 2>&1` in a session of its own, in the
    environment `environ`, would do. Its parent is the server, which ends when the sweep does
    (however the sweep ends): the run ends with its parent, as a run started fresh ends with the
    sweep. Exits with train.py's status."""
    os.setsid()     # Ctrl-C reaches the sweep alone, which then stops each run once
    log = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    for fd in (1, 2):
        os.dup2(log, fd)
    os.closerange(3, os.sysconf("SC_OPEN_MAX") if hasattr(os, "sysconf") else 1024)    # as Popen's close_fds
    os.chdir(REPO_ROOT)
    os.environ.clear()
    os.environ.update(environ)
    os.environ[SWEEP_PID] = str(os.getppid())
    sys.argv = [str(REPO_ROOT / "train.py"), *argv]
    code = 1
    try:
        code = entry(argv)
        signal.signal(signal.SIGINT, signal.SIG_IGN)    # as train.py does once the run has said it is over
    finally:
        atexit._run_exitfuncs()     # what a process's exit runs; multiprocessing's own exit skips them
        sys.stdout.flush()
        sys.stderr.flush()
    sys.exit(code)
