"""python -m gpt.sweep status|cancel DIR: where a submitted sweep's runs stand, and stopping its jobs."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

from .. import checkpoint
from ..config import user_path
from ..errors import UserError, say_error
from . import submitted
from .grid import ended, status_of
from .results import collect


def last_line(folder: Path) -> str:
    try:
        lines = [line for line in (folder / "log.txt").read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return "no log.txt"
    return lines[-1].strip()[:200] if lines else "log.txt is empty"


def held(folder: Path) -> bool:
    """Whether a process is at work in folder: a sweep holds its folder's lock while it runs its runs
    or waits on its jobs, and a run its own while it trains, however it was started."""
    if not folder.is_dir():
        return False
    try:
        with checkpoint.hold_folder(folder, wait=False):
            return False
    except UserError:
        return True


# shown only where some run is in them: stopped runs, and runs whose job ended before they began
SOMETIMES = ("stopped", "not started")


def standing(out_dir: Path) -> tuple[dict[str, list[str]], list]:
    """Run folder names by where they stand: done, running (its job runs, or a process trains in
    its folder: a local sweep's run, or one whose sweep was killed), queued (a job waiting, or the
    sweep at work here will start it), stopped (a ckpt.pt to resume from, nothing at work on it),
    not started (its job ended before the run began), failed, not submitted; and a tuned sweep's
    tunings (none for another)."""
    _, _, current = collect(out_dir)
    found = submitted.states(submitted.read(out_dir))
    at_work = held(out_dir)
    groups = {key: [] for key in ("done", "running", "queued", *SOMETIMES, "failed", "not submitted")}
    for r in current.tuning_runs + current.confirm_runs:
        status = status_of(r.folder)
        job = found.get(r.name)
        key = ("done" if ended(r, status) else "failed" if status not in (None, "paused")
               else job if job in ("running", "queued")
               else "running" if held(r.folder) else "queued" if at_work and not job
               else "stopped" if (r.folder / "ckpt.pt").exists()
               else "not started" if job and not (r.folder / "log.txt").exists()
               else "failed" if job else "not submitted")
        groups[key].append(r.name)
    return groups, current.tunings


def tuning_line(tunings: list) -> str | None:
    """For a tuned sweep: how many settings have their value chosen, and what starts the rest."""
    if not tunings:
        return None
    chosen = sum(t.chosen is not None for t in tunings)
    if chosen == len(tunings):
        return f"tuning: every setting's value is chosen ({chosen})"
    return (f"tuning: {chosen} of {len(tunings)} settings have their value chosen; once the tuning runs "
            "below end, the sweep's command starts the next ones (more grid points, or the runs at the "
            "chosen values)")


def status(out_dir: Path) -> int:
    """Print the runs by where they stand; 0 while some are queued or running, 1 once none is."""
    groups, tunings = standing(out_dir)
    line = tuning_line(tunings)
    if line:
        print(line)
    print(", ".join(f"{len(names)} {key}" for key, names in groups.items() if names or key not in SOMETIMES))
    for key in ("running", "queued", "not started", "not submitted"):
        for name in groups[key]:
            print(f"  {key}: {name}")
    for name in groups["stopped"]:
        print(f"  stopped (resumable): {name}: {last_line(out_dir / name)}")
    for name in groups["failed"]:
        print(f"  failed: {name}: {last_line(out_dir / name)}")
    orphans = orphaned(out_dir)
    if orphans:
        print(f"{len(orphans)} of the running runs are jobs of a submitit_local sweep that no longer runs "
              f"(killed outright): python -m gpt.sweep cancel {out_dir} stops them, each saving its checkpoint")
    return 0 if groups["running"] or groups["queued"] else 1


def orphaned(out_dir: Path) -> list[str]:
    """The local jobs still running whose sweep process has gone: nothing waits for them."""
    record = submitted.read(out_dir)
    if record.get("launcher") != "submitit_local" or submitted.submitter_alive(record):
        return []
    return [name for name, state in submitted.states(record).items() if state == "running"]


def cancel(out_dir: Path) -> int:
    """Cancel the queued and running jobs; a running run saves its checkpoint as its job ends."""
    collect(out_dir)        # a sweep folder, or one line saying it is not
    record = submitted.read(out_dir)
    if record.get("launcher") != "slurm" and record.get("submitter") and not submitted.submitter_alive(record):
        # killed outright, or its machine restarted: the id may be another process's by now
        print(f"the sweep process recorded in {submitted.RECORD} (pid {record['submitter']}) is no longer "
              "running; its record is cleared, and no process was signalled for it")
        record = {**record, "submitter": None, "submitter_start": None}
        submitted.write(out_dir, record)
    found = submitted.states(record)
    live = [name for name, state in found.items() if state in ("queued", "running")]
    if not live:
        print("no job of this sweep is queued or running")
        return 0
    if record.get("launcher") == "slurm":
        submitted.slurm_tool(["scancel", *sorted({record["jobs"][name]["id"] for name in live})])
    else:
        if submitted.submitter_alive(record):
            os.kill(record["submitter"], signal.SIGTERM)    # the waiting sweep stops its own jobs
        for name in live:
            if record["jobs"][name].get("id"):
                with contextlib.suppress(ProcessLookupError):   # it ended meanwhile
                    os.kill(int(record["jobs"][name]["id"]), signal.SIGINT)
    print(f"cancelled {len(live)} run{'s' * (len(live) != 1)}: {', '.join(live)}; the sweep's command "
          "submits them again, and each resumes from its checkpoint")
    return 0


def main(command: str, folder: str) -> int:
    try:
        out_dir = Path(user_path(folder, "DIR"))
        return status(out_dir) if command == "status" else cancel(out_dir)
    except UserError as e:
        say_error(e)
        return 2
