"""One run of a sweep as a submitit job: `python train.py` for it, stopped, saved and requeued on Slurm's signal."""

from __future__ import annotations

import os
import signal
import subprocess
import time

from ..config import REPO_ROOT
from ..train.outcome import run_status
from ..train.rundir import write_json
from ..train.signals import SWEEP_PID
from .grid import SweepRun, finished_by_checkpoint, train_argv


class Stopped(RuntimeError):
    """The run saved and ended on a stop (scancel, a preemption's SIGTERM): not a result."""


def _ignore_usr2() -> None:
    # Slurm signals every process of the job; the job process alone decides what SIGUSR2 means
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)


class RunJob:
    """The callable submitit runs for each run: runs the same command the local launcher does,
    with --resume when the run has a ckpt.pt, and writes the run's result.json."""

    def __init__(self, values: dict, threads: int):
        self.values, self.threads = values, threads
        self._proc: subprocess.Popen | None = None
        self._code: int | None = None       # the run's exit status, once reaped

    def __getstate__(self):
        return {"values": self.values, "threads": self.threads, "_proc": None, "_code": None}

    def __call__(self, run: SweepRun, max_iters: int) -> str:
        run.folder.mkdir(parents=True, exist_ok=True)
        (run.folder / "result.json").unlink(missing_ok=True)     # a failed run, tried again
        if finished_by_checkpoint(run, max_iters):     # it ended as the job was stopped
            write_json(run.folder / "result.json", {"status": "finished", "returncode": 0, "wall_s": None})
            return "finished"
        started = time.time()
        signal.signal(signal.SIGTERM, self._forward)    # scancel: the run saves before it ends
        with open(run.folder / "log.txt", "a") as log:
            # SWEEP_PID: the run saves and ends should this job process die
            self._proc = subprocess.Popen(train_argv(self.values, run, self.threads), stdout=log,
                                          stderr=subprocess.STDOUT, cwd=REPO_ROOT, preexec_fn=_ignore_usr2,
                                          env={**os.environ, SWEEP_PID: str(os.getpid())})
            while self._reap(block=False) is None:
                time.sleep(0.2)
        code = self._code
        if code < 0 or code > 128:
            raise Stopped(f"{run.name} was stopped (exit status {code}) and saved its checkpoint; "
                          "the sweep's command resumes it")
        status = run_status(code)
        write_json(run.folder / "result.json",
                   {"status": status, "returncode": code, "wall_s": time.time() - started, "started": started})
        return status

    def _reap(self, block: bool) -> int | None:
        """The run's exit status, or None while it runs. os.waitpid, not Popen's wait: Popen's
        lock, held where the signal came, would never be let go by checkpoint() waiting in it."""
        if self._code is None:
            try:
                pid, status = os.waitpid(self._proc.pid, 0 if block else os.WNOHANG)
            except ChildProcessError:   # reaped just as the signal came: it has ended
                return -1
            if pid:
                self._code = self._proc.returncode = os.waitstatus_to_exitcode(status)
        return self._code

    def _forward(self, signum, frame) -> None:
        if self._proc is not None and self._code is None:
            self._proc.send_signal(signum)

    def checkpoint(self, run: SweepRun, max_iters: int):
        """submitit's call on SIGUSR2 (a time limit or a preemption near): the run saves its
        checkpoint and ends, and the job is requeued with the same run, which resumes from it."""
        from submitit.helpers import DelayedSubmission
        if self._proc is not None and self._code is None:
            self._proc.terminate()
            self._reap(block=True)
        return DelayedSubmission(RunJob(self.values, self.threads), run, max_iters)
