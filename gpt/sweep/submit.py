"""Running a sweep's runs as submitit jobs: a Slurm job array that is left to run, or submitit's local processes, waited for."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import shutil
import signal
import sys
import time
from dataclasses import fields
from pathlib import Path

from ..config import REPO_ROOT, SweepConfig
from ..console import Terminated
from ..errors import UserError
from ..train.signals import catch_signals, raise_on_signal
from . import submitted
from .grid import SweepRun, ended, final_eval, read_json, run_threads
from .job import RunJob
from .report import report

SLURM_OPTIONS = tuple(f.name for f in fields(SweepConfig) if f.name.startswith("slurm_"))
INSTALL = 'pip install -e ".[slurm]"'


def check_options(args, launcher: str) -> None:
    """Slurm options on the command line need the slurm launcher (slurm_time: submitit_local's too);
    a config file's [sweep] table may hold them for whichever launcher runs it."""
    given = [n for n in SLURM_OPTIONS if n in args.values and n not in args.from_file
             and not (launcher == "submitit_local" and n == "slurm_time")]
    if given and launcher != "slurm":
        raise UserError(f"--{given[0]} is an option of --launcher=slurm, and the launcher is {launcher}; "
                        "give --launcher=slurm, or leave it out")


def launch(values: dict, cfg: SweepConfig, todo: list[tuple[SweepRun, int]], total: int, out_dir: Path,
           final: bool = True) -> int:
    """Submit the runs in todo (with their max_iters) that no job holds yet. Slurm: return at once;
    submitit_local: wait for them, --jobs at a time, then write the report if they are the sweep's
    last (not: a tuned sweep whose settings are not all chosen yet)."""
    waiting = submitted.pending(out_dir, [r.name for r, _ in todo])
    todo = [(r, n) for r, n in todo if r.name not in waiting]
    print(f"sweep: {total} run{'s' * (total != 1)} ({total - len(todo) - len(waiting)} already finished, "
          f"{len(waiting)} queued or running), {len(todo)} to submit ({cfg.launcher}), in {out_dir}")
    executor = make_executor(cfg, out_dir)
    if cfg.launcher == "submitit_local":
        return _wait_locally(executor, values, cfg.jobs, todo, out_dir, final)
    if todo:
        _submit_array(executor, values, cfg, todo, out_dir)
    if not final:
        print("tuning: once these runs end, run the same command again: it chooses each setting's value, "
              "and submits the grid's next points or the runs at the chosen values (status says when)")
    _say_how_to_follow(out_dir)
    return 0


def make_executor(cfg: SweepConfig, out_dir: Path):
    try:
        import submitit
    except ImportError:
        raise UserError(f"--launcher={cfg.launcher} needs submitit: {INSTALL}") from None
    if importlib.util.find_spec("pkg_resources") is None:     # else every job fails as it starts
        raise UserError("submitit's jobs import pkg_resources, which setuptools 81 and later lack: "
                        f"{INSTALL}, or pip install \"setuptools<81\"")
    logs = out_dir / "slurm"
    if cfg.launcher == "submitit_local":
        executor = submitit.LocalExecutor(folder=logs)
        executor.update_parameters(timeout_min=cfg.slurm_time)
        return executor
    for tool in ("sbatch", "srun"):     # submitit looks for srun, sbatch submits
        if shutil.which(tool) is None:
            raise UserError(f"{tool} not found: --launcher=slurm submits from a Slurm cluster's login "
                            "node (--launcher=submitit_local tries the sweep on this machine)")
    executor = submitit.SlurmExecutor(folder=logs)
    executor.update_parameters(**slurm_parameters(cfg, out_dir.name))
    return executor


def slurm_parameters(cfg: SweepConfig, name: str) -> dict:
    """submitit's SlurmExecutor parameters for the options given (an option left empty or 0 is Slurm's default)."""
    extra = {"mem": cfg.slurm_mem} if cfg.slurm_mem else {}
    for item in filter(None, (part.strip() for part in cfg.slurm_extra.split(";"))):
        key, eq, value = item.removeprefix("--").partition("=")
        if not item.startswith("--") or not key:
            raise UserError(f"slurm_extra: {item!r} is not an #SBATCH option; write --name=value or --flag, "
                            "separated by ';'")
        extra[key] = value if eq else True
    given = {"partition": cfg.slurm_partition, "gpus_per_node": cfg.slurm_gpus, "cpus_per_task": cfg.slurm_cpus,
             "account": cfg.slurm_account, "qos": cfg.slurm_qos}
    return {"job_name": name, "time": cfg.slurm_time, "array_parallelism": cfg.jobs, "stderr_to_stdout": True,
            **{k: v for k, v in given.items() if v}, **({"additional_parameters": extra} if extra else {})}


@contextlib.contextmanager
def _job_environment():
    """The jobs get the submitting shell's environment, with this repository importable from anywhere."""
    before = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, (str(REPO_ROOT), before)))
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("PYTHONPATH")
        else:
            os.environ["PYTHONPATH"] = before


def _submit(executor, values: dict, threads: int, todo: list[tuple[SweepRun, int]]) -> list:
    from submitit.core.utils import FailedJobError
    try:
        # submitit prints sbatch's error as well: said once, in one line, below
        with _job_environment(), contextlib.redirect_stderr(io.StringIO()), executor.batch():
            jobs = [executor.submit(RunJob(values, threads), r, n) for r, n in todo]
    except (FailedJobError, OSError) as e:
        raise UserError(f"Slurm refused the sweep's jobs: {submitted.short_error(str(e))}") from None
    return jobs


def _submit_array(executor, values: dict, cfg: SweepConfig, todo: list[tuple[SweepRun, int]], out_dir: Path) -> None:
    jobs = _submit(executor, values, cfg.slurm_cpus, todo)
    submitted.note(out_dir, "slurm", executor.folder, {r.name: job.job_id for (r, _), job in zip(todo, jobs)})
    array = jobs[0].job_id.split("_")[0]
    print(f"submitted {len(jobs)} run{'s' * (len(jobs) != 1)} as Slurm job {array} ({cfg.jobs} at a time); "
          f"each run's log is {out_dir}/<run>/log.txt, submitit's {executor.folder}/{array}_*_log.out")


def _say_how_to_follow(out_dir: Path) -> None:
    print(f"watch:  python -m gpt.sweep status {out_dir}\n"
          f"report: python -m gpt.sweep report {out_dir}\n"
          f"cancel: python -m gpt.sweep cancel {out_dir}")


def _wait_locally(executor, values: dict, jobs: int, todo: list[tuple[SweepRun, int]], out_dir: Path,
                  final: bool) -> int:
    """submitit's local jobs, --jobs at a time; Ctrl-C or SIGTERM stops them, and each run saves."""
    submitted.note(out_dir, "submitit_local", executor.folder, {r.name: None for r, _ in todo}, os.getpid())
    running, threads, runs = {}, run_threads(jobs), [r for r, _ in todo]
    previous = catch_signals(raise_on_signal)
    try:
        while todo or running:
            while todo and len(running) < jobs:
                r, n = todo.pop(0)
                running[r.name] = (r, _submit(executor, values, threads, [(r, n)])[0])
                submitted.note(out_dir, "submitit_local", executor.folder,
                               {r.name: running[r.name][1].job_id}, os.getpid())
                print(f"started {r.name} as local job {running[r.name][1].job_id}", flush=True)
            time.sleep(0.5)
            for name in [name for name, (_, job) in running.items() if job.done()]:
                _said_ended(running.pop(name)[0])
    except KeyboardInterrupt as stop:
        for _, job in running.values():
            job.cancel()        # the job's run gets SIGTERM as its job ends, and saves
        print("sweep interrupted; run the same command again to continue", file=sys.stderr)
        return 128 + (stop.signum if isinstance(stop, Terminated) else signal.SIGINT)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        record = submitted.read(out_dir)
        submitted.write(out_dir, {**record, "submitter": None, "submitter_start": None})
    failed = [r for r in runs if not ended(r, _status(r.folder))]
    if final or failed:
        report(out_dir)
    if failed:
        print(f"{len(failed)} of {len(runs)} runs did not finish (see log.txt in their folders, e.g. "
              f"{failed[0].folder / 'log.txt'}); run the same command again to retry them", file=sys.stderr)
    return 1 if failed else 0


def _status(folder: Path) -> str:
    path = folder / "result.json"
    return read_json(path).get("status", "failed") if path.exists() else "not run"


def _said_ended(run: SweepRun) -> None:
    final = final_eval(run.folder)
    val = f"val loss {final['val_loss']:.4f} at iteration {final['iter']}" if final else "no evaluation"
    print(f"{run.name}: {_status(run.folder)}, {val}", flush=True)
