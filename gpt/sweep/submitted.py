"""A sweep's submitted jobs: their record (jobs.json) and their states, from Slurm's sacct or the local processes."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

from ..errors import UserError
from ..train.rundir import write_json
from .grid import read_json

# {"launcher", "logs", "submitter", "submitter_start", "jobs": {run folder name: {"id", "at", "start"}}}:
# a process id with the time its process started, so that one used again by another process is not taken for it
RECORD = "jobs.json"
QUEUED = {"PENDING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "RESV_DEL_HOLD", "SUSPENDED", "CONFIGURING",
          "RESIZING"}
RUNNING = {"RUNNING", "COMPLETING", "STAGE_OUT", "SIGNALING"}
LAG_S = 300     # sacct may not list a job in its first minutes: taken as queued meanwhile


def read(out_dir: Path) -> dict:
    path = Path(out_dir) / RECORD
    record = read_json(path) if path.exists() else {}
    record.setdefault("jobs", {})
    return record


def write(out_dir: Path, record: dict) -> None:
    write_json(Path(out_dir) / RECORD, record)


def states(record: dict) -> dict[str, str]:
    """Each recorded run's job: "queued", "running", or the state it ended in."""
    jobs = record.get("jobs", {})
    if record.get("launcher") == "slurm":
        return _slurm_states(jobs)
    # a submitit_local sweep, waiting, starts the rest itself
    submitter = submitter_alive(record)
    return {name: ("running" if job.get("id") and _alive(job["id"], job.get("start")) else
                   "queued" if submitter and not job.get("id") else "ended")
            for name, job in jobs.items()}


def started_at(pid) -> int | None:
    """When process pid started, in clock ticks since boot (field 22 of /proc/PID/stat); None where
    there is no such process, or no /proc to ask."""
    try:
        stat = Path(f"/proc/{int(pid)}/stat").read_text()
    except (OSError, TypeError, ValueError):
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])     # after the command's name, which may hold spaces


def is_ours(pid, start) -> bool:
    """Whether pid is still the process recorded with this start time: after a kill -9, an OOM kill or
    a reboot, its id may belong to another process, which must never be signalled. A record without
    a start time (older ones) is never taken as ours. Where there is no /proc to ask (macOS), a
    process of that id is taken as ours, as no more can be known."""
    if pid is None:
        return False
    if not Path("/proc/self/stat").exists():
        try:
            os.kill(int(pid), 0)
        except (OSError, ValueError):
            return False
        return True
    return start is not None and started_at(pid) == start


def submitter_alive(record: dict) -> bool:
    """Whether the sweep process that submitted these local jobs is still the one at work."""
    return is_ours(record.get("submitter"), record.get("submitter_start"))


def _alive(pid, start) -> bool:
    """A local job's controller, still running: the process recorded, and submitit's."""
    if not is_ours(pid, start):
        return False
    try:
        return b"submitit" in Path(f"/proc/{int(pid)}/cmdline").read_bytes()
    except FileNotFoundError:       # no /proc at all: is_ours could tell no more
        return not Path("/proc/self").exists()
    except (OSError, TypeError, ValueError):
        return False


def _slurm_states(jobs: dict) -> dict[str, str]:
    if not jobs:
        return {}
    from submitit.slurm.slurm import SlurmInfoWatcher
    command = ["sacct", "-o", "JobID,State", "--parsable2"]
    for main in sorted({job["id"].split("_")[0] for job in jobs.values()}):
        command += ["-j", main]
    info = SlurmInfoWatcher().read_info(slurm_tool(command))
    found = {}
    for name, job in jobs.items():
        state = info.get(job["id"], {}).get("State", "").split(" ")[0]  # "CANCELLED by 42"
        if not state:
            state = "PENDING" if time.time() - job.get("at", 0) < LAG_S else "UNKNOWN"
        found[name] = "queued" if state in QUEUED else "running" if state in RUNNING else state.lower()
    return found


def slurm_tool(command: list[str]) -> str:
    """A Slurm command's output; its error, shortened, as one line."""
    if shutil.which(command[0]) is None:
        raise UserError(f"{command[0]} not found: this sweep's jobs are Slurm's; run this on the cluster")
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode:
        raise UserError(f"{command[0]} failed: {short_error(done.stderr or done.stdout)}")
    return done.stdout


def short_error(text: str, limit: int = 200) -> str:
    """Slurm's message in one line: its last error line, without the tool's prefix."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()] or ["no message"]
    line = next((line for line in reversed(lines) if "error" in line.lower()), lines[-1])
    for prefix in ("sbatch: error: ", "sacct: error: ", "scancel: error: ", "error: "):
        line = line.removeprefix(prefix)
    return line if len(line) <= limit else line[:limit - 3] + "..."


def pending(out_dir: Path, names: list[str]) -> set[str]:
    """Of these runs, those whose job is queued or running: not to be submitted again."""
    record = read(out_dir)
    if not record["jobs"]:
        return set()
    found = states(record)
    return {name for name in names if found.get(name) in ("queued", "running")}


def note(out_dir: Path, launcher: str, logs: Path, ids: dict[str, str | None], submitter: int | None = None) -> None:
    """Record the jobs just submitted, over those of earlier starts."""
    record = read(out_dir)
    if record.get("launcher") not in (None, launcher):
        record["jobs"] = {}     # another launcher's jobs: checked as ended before this start
    record.update(launcher=launcher, logs=str(logs), submitter=submitter,
                  submitter_start=started_at(submitter) if submitter else None)
    record["jobs"].update({name: {"id": job_id, "at": time.time(),
                                  **({"start": started_at(job_id)} if launcher != "slurm" and job_id else {})}
                           for name, job_id in ids.items()})
    write(out_dir, record)


