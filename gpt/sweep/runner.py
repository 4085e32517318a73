"""Running a sweep's runs as local `python train.py` processes, --jobs at a time, and stopping them together."""

from __future__ import annotations

import contextlib
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from .. import checkpoint
from ..config import (READ_BY_OPTIMIZERS, READ_BY_SCHEDULES, REPO_ROOT, SweepConfig, TrainConfig, build, read_by,
                      read_by_optimizer)
from ..console import Terminated
from ..datasets import ensure_prepared
from ..errors import UserError
from ..train.outcome import DIVERGED_EXIT, PAUSED_EXIT, PRUNED_EXIT, loss_text, run_status
from ..train.rundir import listed_in, run_record, write_json
from ..train.signals import SWEEP_PID, catch_signals, raise_on_signal
from .grid import (SweepRun, axis_names, changed_settings, check_grid, count_runs, final_eval,
                   ended, finished_by_checkpoint, paused_starts, read_json, run_threads, settings_of, status_of,
                   train_argv)
from . import submit, tune
from .eta import Clock
from .forked import ForkedRun, forking
from .report import report


def run(args, argv: list[str], entry: Callable[[list[str]], int] | None = None) -> int:
    """Run the grid described by parsed args (axes in args.sweep), then write the report. entry:
    what trains one run in-process from its arguments (train.py's main), for runs forked from a
    server (run_start); without it each run starts as a fresh process."""
    values, sweep_cfg, out_dir, base_seed = _checked_values(args)
    record = read_json(out_dir / "sweep.json") if (out_dir / "sweep.json").exists() else None
    axes, grids = _in_recorded_order(args.sweep, record, "axes"), _in_recorded_order(args.tune, record, "tune")
    pin_eval_batch(values, axes, args.tune, record)
    sweep = _sweep_record(values, sweep_cfg, base_seed, axes, grids, argv)
    _check_plan(values, sweep_cfg, sweep, axes, grids)
    _settle_halving(sweep, record, out_dir, "tune_halving" in values)
    runs, final = _stage(tune.plan(sweep, out_dir))
    run_cfgs = _checked(values, sweep_cfg, runs, out_dir)
    _prepare_data_and_folder(run_cfgs, out_dir)
    with checkpoint.hold_folder(out_dir):
        write_json(out_dir / "sweep.json", sweep)
        if sweep_cfg.launcher == "local":
            forked = entry if entry and forking(sweep_cfg.run_start) else None
            return _run_here(values, sweep_cfg, sweep, out_dir, runs, run_cfgs, forked)
        return _submit(values, sweep_cfg, sweep, out_dir, runs, run_cfgs, final)


def _checked_values(args) -> tuple[dict, SweepConfig, Path, int]:
    """The sweep's values (out_dir, data_dir made absolute), SweepConfig, out_dir and first seed, once valid."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:   # each rank would run the whole grid
        raise UserError("a sweep runs its own processes; start it with python train.py, not "
                        "torchrun (use --jobs=N to run N at once)")
    values = dict(args.values)
    if values.get("init_from"):     # each run would shape its model apart from the grid's records
        raise UserError("--init_from starts one run from other weights; a sweep of fine-tuning runs is "
                        "not supported yet: start each run with python train.py --init_from=... --out_dir=...")
    for name in ("out_dir", "data_dir"):    # else the sweep would fill the current folder
        if name in values and not values[name].strip():
            raise UserError(f"{name} is empty; give a folder name")
    sweep_cfg = build(SweepConfig, values)
    submit.check_options(args, sweep_cfg.launcher)
    out_dir = Path(values.get("out_dir", "runs/sweep")).resolve()   # absolute: each run starts in the repository root
    if out_dir.is_file():
        raise UserError(f"out_dir={str(out_dir)!r} is a file; give a folder for the sweep's runs")
    values["out_dir"] = str(out_dir)
    values["data_dir"] = str(Path(values.get("data_dir", TrainConfig.data_dir)).resolve())
    base_seed = values.get("seed", TrainConfig.seed)
    if base_seed + sweep_cfg.seeds > 2 ** 32:
        raise UserError(f"seed={base_seed} with seeds={sweep_cfg.seeds}: the seeds would run to "
                        f"{base_seed + sweep_cfg.seeds - 1}, past 2**32 - 1; lower seed")
    if held := checkpoint.saved_in(out_dir):    # the run could no longer be resumed once it is a sweep's folder
        raise UserError(f"out_dir={str(out_dir)!r} holds a run ({' and '.join(held)}); its sweep "
                        "folders would mix with it; choose another --out_dir")
    return values, sweep_cfg, out_dir, base_seed


def _in_recorded_order(given: dict, record: dict | None, key: str) -> dict:
    """The axes or tune grids (key) in the order sweep.json lists them, where it lists the same names."""
    old = (record or {}).get(key)     # its order keeps the runs' names
    return {name: given[name] for name in old} if isinstance(old, dict) and set(old) == set(given) else given


def _sweep_record(values: dict, sweep_cfg: SweepConfig, base_seed: int, axes: dict, grids: dict,
                  argv: list[str]) -> dict:
    """What sweep.json holds: the axes, seeds, command, pinned eval batch and a tuned sweep's grids."""
    return {"axes": axes, "seeds": sweep_cfg.seeds, "base_seed": base_seed,
            "command": " ".join(["python", "train.py", *argv]),
            **({"eval_batch_size": values["eval_batch_size"]} if "eval_batch_size" in values else {}),
            **({"tune": grids, "tune_seeds": sweep_cfg.tune_seeds, "tune_seed": sweep_cfg.tune_seed,
                "tune_extend": sweep_cfg.tune_extend, "tune_prune": sweep_cfg.tune_prune,
                "tune_evals": sweep_cfg.tune_evals, "tune_halving": sweep_cfg.tune_halving,
                # what a grid's next step is checked against, wherever the plan is made again
                "values": {k: v for k, v in values.items() if k not in SweepConfig.__dataclass_fields__}}
               if grids else {})}


def _check_plan(values: dict, sweep_cfg: SweepConfig, sweep: dict, axes: dict, grids: dict) -> None:
    """Refuse a tuned sweep's invalid seeds or unread options, and a sweep of too many runs."""
    if grids:
        tune.check_seeds(sweep)
        _check_tuned_read(values, axes, grids)
    count_runs(axes, sweep_cfg.seeds, sweep_cfg.tune_seeds * math.prod(len(v) for v in grids.values()) if grids else 0)


def _settle_halving(sweep: dict, record: dict | None, out_dir: Path, given: bool) -> None:
    """A sweep whose tuning has begun keeps the halving it began with (given: whether this start
    names tune_halving): one recorded before halving existed goes on without it, and turning it on
    or off in one is refused, since its runs trained past the rung, or stopped there, under the
    other plan."""
    if "tune" not in sweep or record is None or not (out_dir / tune.TUNE_DIR).is_dir():
        return
    before = record.get("tune_halving")
    if before is None and not given:
        sweep["tune_halving"] = False
        return
    if bool(before) != sweep["tune_halving"]:
        was = str(bool(before)).lower()
        raise UserError(f"{out_dir} was tuned with tune_halving={was}; give --tune_halving={was} to continue "
                        "it, or another --out_dir")


def _prepare_data_and_folder(run_cfgs, out_dir: Path) -> None:
    """Prepare each dataset the runs read, then make the sweep's folder."""
    for cfg in {(t.data_dir, t.dataset, t.data_url) for _, t in run_cfgs}:
        ensure_prepared(*cfg)               # once, not by every run at once; and before the folder
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"out_dir={str(out_dir)!r} cannot be written ({e.strerror})") from None


def _run_here(values: dict, sweep_cfg: SweepConfig, sweep: dict, out_dir: Path, runs: list[SweepRun], run_cfgs,
              forked: Callable[[list[str]], int] | None) -> int:
    """Train the runs left as local processes; a tuned sweep's next runs start as the results come."""
    todo = _unfinished(runs, run_cfgs, [_done(r) for r in runs])
    more = _more_runs(values, sweep_cfg, sweep, out_dir, runs) if "tune" in sweep else None
    confirm_runs = len(settings_of(sweep["axes"])) * sweep_cfg.seeds if "tune" in sweep else 0
    clock = Clock(values, sweep_cfg.jobs, confirm_runs)
    return _run_grid(values, sweep_cfg.jobs, runs, [r for r, _ in todo], out_dir, more=more, forked=forked,
                     clock=clock)


def _submit(values: dict, sweep_cfg: SweepConfig, sweep: dict, out_dir: Path, runs: list[SweepRun], run_cfgs,
            final: bool) -> int:
    """Launch the runs left as submitit jobs; on submitit_local, a tuned sweep's next stage follows each."""
    while True:
        todo = _unfinished(runs, run_cfgs, [_done(r) for r in runs])
        code = submit.launch(values, sweep_cfg, todo, len(runs), out_dir, final)
        if code or final or sweep_cfg.launcher == "slurm":
            return code
        before = [_planned(r) for r in runs]
        runs, final = _stage(tune.plan(sweep, out_dir))
        if [_planned(r) for r in runs] == before:    # its runs are another start's jobs, still at work
            print("the tuning runs left are jobs of an earlier start, still at work; once they end, run the "
                  "same command again to go on (python -m gpt.sweep status shows them)")
            return 0
        run_cfgs = _checked(values, sweep_cfg, runs, out_dir)


def pin_eval_batch(values: dict, axes: dict, grids: dict, record: dict | None) -> None:
    """With a batch_size axis (or a tuned batch_size), every run is scored on the same windows:
    eval_batch_size is set to the first batch size, or to what the sweep's record kept, unless given."""
    names = axis_names(axes)
    if ("batch_size" not in names and "batch_size" not in grids) or "eval_batch_size" in {*values, *names}:
        return
    first = settings_of(axes)[0].get("batch_size") if "batch_size" in names else grids["batch_size"][0]
    # else each batch size would be scored on its own windows, and the evaluation would differ
    # with the axis: 0.04 in val loss for one model, more than the seed spread of a study. The
    # sweep's first choice stays, so that the axis may gain a value in front
    old_axes = (record or {}).get("axes")
    old_axis = old_axes.get("batch_size") if isinstance(old_axes, dict) else None
    pinned = (record["eval_batch_size"] if record and "eval_batch_size" in record
              else old_axis[0] if isinstance(old_axis, list) and old_axis else None)    # older records
    values["eval_batch_size"] = pinned if type(pinned) is int and pinned >= 0 else first
    if values["eval_batch_size"]:
        print(f"batch_size is an axis: every run is evaluated alike, on eval_iters batches of "
              f"{values['eval_batch_size']} windows (--eval_batch_size=0 gives each run its own "
              "batch_size)")


def _check_tuned_read(values: dict, axes: dict, grids: dict) -> None:
    """Refuse a tuned option that no run's optimizer or schedule reads: its grid points would train alike."""
    optimizers = [s["optimizer"] for s in settings_of(axes) if "optimizer" in s] or \
        [values.get("optimizer", TrainConfig.optimizer)]
    schedules = {s.get("lr_schedule", values.get("lr_schedule", TrainConfig.lr_schedule)) for s in settings_of(axes)}
    for name in grids:
        if not any(read_by(schedule, name) for schedule in schedules):
            raise UserError(f"--tune {name}: lr_schedule={','.join(sorted(schedules))} does not read it, so its "
                            f"grid would train alike; only {', '.join(READ_BY_SCHEDULES[name])} read it")
        if not any(read_by_optimizer(o, name) for o in optimizers):
            raise UserError(f"--tune {name}: optimizer={','.join(sorted(set(optimizers)))} does not read it, so "
                            f"its grid would train alike; only {', '.join(READ_BY_OPTIMIZERS[name])} reads it: "
                            "set --optimizer to it, or sweep optimizer too")


def _more_runs(values: dict, sweep_cfg: SweepConfig, sweep: dict, out_dir: Path, runs: list[SweepRun]):
    """For a tuned sweep run here: a function that, given the folders at work, gives the runs its
    plan holds now and those of them to train: a grid's next point, a setting's runs at its chosen
    value, the tuning runs halving lets train on past the rung. A run that failed here waits for
    the command's next start."""
    known = {r.folder for r in runs}

    def more(busy: set[Path]) -> tuple[list[SweepRun], list[SweepRun]]:
        current, _ = _stage(tune.plan(sweep, out_dir))
        waiting = [r for r in current if r.folder not in busy and not _done(r) and status_of(r.folder) != "failed"]
        fresh = [r for r in current if r.folder not in known]
        if not waiting:
            return current, []
        cfgs = _checked(values, sweep_cfg, waiting, out_dir, quiet=not fresh)
        known.update(r.folder for r in fresh)
        return current, [r for r, _ in _unfinished(waiting, cfgs, [False] * len(waiting))]
    return more


def _stage(current: tune.Plan) -> tuple[list[SweepRun], bool]:
    """The runs to have now, and whether they are the last: a tuned sweep's tuning runs so far with
    the confirmation runs of the settings already chosen, until every setting is."""
    return current.tuning_runs + current.confirm_runs, current.chosen_all


def _checked(values: dict, sweep_cfg: SweepConfig, runs: list[SweepRun], out_dir: Path, quiet: bool = False):
    """Each run's configs, once the grid is valid and every run kept was trained as it would be now;
    quiet: without the line on runs trained by other code, said already."""
    run_cfgs = check_grid(values, runs, run_threads(sweep_cfg.jobs))
    ended = [_done(r) for r in runs]         # finished or diverged: read once
    for r, (model_cfg, train_cfg), end in zip(runs, run_cfgs, ended):
        kept = end or (r.folder / "ckpt.pt").exists()   # else it starts afresh, keeping nothing
        changed = changed_settings(r, model_cfg, train_cfg) if kept else []
        if changed:
            raise UserError(f"{out_dir} holds runs trained with other settings ({r.name}: "
                            f"{'; '.join(changed)}); use another --out_dir, or the same settings "
                            "to continue it")
    older = [r for r, end in zip(runs, ended) if (end or (r.folder / "ckpt.pt").exists())
             and listed_in(run_record(r.folder / "config.json")) != [checkpoint.code_version()]]
    if older and not quiet:
        print(f"{len(older)} of the runs kept were trained, in whole or in part, by other code than "
              "this (gpt/ has changed since, or they predate the record): sweep.csv's code column "
              "marks them; delete a run's folder to train it again")
    return run_cfgs


def _unfinished(runs: list[SweepRun], run_cfgs, ended: list[bool]) -> list[tuple[SweepRun, int]]:
    """The runs to start, with their max_iters: failed runs are tried again."""
    todo = []
    for r, (_, cfg), end in zip(runs, run_cfgs, ended):
        if end:
            continue
        if finished_by_checkpoint(r, cfg.max_iters):
            write_json(r.folder / "result.json", {"status": "finished", "returncode": 0, "wall_s": None})
        else:
            todo.append((r, cfg.max_iters))
    return todo


def _run_grid(values: dict, jobs: int, runs: list[SweepRun], todo: list[SweepRun], out_dir: Path,
              more=None, forked: Callable[[list[str]], int] | None = None, clock: Clock | None = None) -> int:
    """Run todo, jobs at a time, then write the report. more(), where given, is asked for runs to add
    (all, and those to train) whenever a run has ended and a place is free: a tuned sweep's next
    runs start as soon as the results that choose them are in. forked: the entry each run's process,
    forked from a server that imported it once (gpt/sweep/forked.py), trains by; else a fresh python.
    clock: what gives the time left (a sweep of equal runs, by default)."""
    tuning = sum(r.stage == "tune" for r in runs)
    stage = f" ({tuning} tuning, {len(runs) - tuning} at each setting's chosen value)" if tuning else ""
    print(f"sweep: {len(runs)} run{'s' * (len(runs) != 1)}{stage} ({len(runs) - len(todo)} already finished), "
          f"{jobs} at a time, in {out_dir}")
    threads = run_threads(jobs)
    running: dict[subprocess.Popen | ForkedRun, tuple[SweepRun, float, object]] = {}
    done = len(runs) - len(todo)
    clock = clock or Clock(values, jobs)
    # SIGTERM, and SIGHUP from a closed terminal, stop the runs as Ctrl-C does
    previous = catch_signals(raise_on_signal)
    env = {**os.environ, SWEEP_PID: str(os.getpid())}      # so each run ends with the sweep
    news = True         # a run has ended since more() was last asked: its answer may have changed
    try:
        while True:
            if more and news and not todo and len(running) < jobs:
                news = False
                try:
                    current, to_train = more({r.folder for r, *_ in running.values()})
                except UserError:       # an extended grid point that is no valid config
                    _stop(running, done, len(runs), "a run the sweep would start next is not valid")
                    raise
                runs[:] = current
                todo.extend(to_train)
                done = len(runs) - len(todo) - len(running)
                if to_train:
                    print(f"[{done}/{len(runs)} done] {len(to_train)} more run{'s' * (len(to_train) != 1)} "
                          "to train, now that tuning results are in", flush=True)
            if not (todo or running):
                break
            while todo and len(running) < jobs:
                r = todo.pop(0)
                try:
                    r.folder.mkdir(parents=True, exist_ok=True)
                    earlier = paused_starts(r.folder)
                    (r.folder / "result.json").unlink(missing_ok=True)     # a failed run, tried again
                    log = open(r.folder / "log.txt", "a")
                except OSError as e:    # a full disk, a file put where the folder goes meanwhile
                    stopped = "; the runs under way were stopped and saved" if running else ""
                    _stop(running, done, len(runs), f"cannot start {r.name} ({e.strerror or e})")
                    raise UserError(f"cannot start the run in {r.folder} ({e.strerror or e}){stopped}: fix "
                                    "it, and run the same command again to continue") from None
                # a session of its own: Ctrl-C reaches the sweep alone, which then stops each
                # run once, so that it saves its checkpoint
                command = train_argv(values, r, threads)
                proc = (ForkedRun(forked, command[2:], log.name) if forked else
                        subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=REPO_ROOT,
                                         start_new_session=True, env=env))
                running[proc] = (r, time.time(), log, earlier)
                clock.start(r)
                print(f"[{done}/{len(runs)} done] started {r.name} "
                      f"({len(running)} running, {len(todo)} waiting)", flush=True)
            time.sleep(0.2)
            for proc in [p for p in running if p.poll() is not None]:
                done += 1
                news = True
                entry = running.pop(proc)
                _record(entry, proc.returncode, done, len(runs), clock.end(entry, runs, todo, running.values()))
    except KeyboardInterrupt as stop:
        signum = stop.signum if isinstance(stop, Terminated) else signal.SIGINT
        _stop(running, done, len(runs), f"stopped by {_signal_named(signum)}")
        print("sweep interrupted; run the same command again to continue", file=sys.stderr)
        return 128 + signum
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    failed = [r for r in runs if not _done(r)]
    report(out_dir)
    if failed:
        print(f"{len(failed)} of {len(runs)} runs failed (see log.txt in their folders, e.g. "
              f"{failed[0].folder / 'log.txt'}); run the same command again to retry them",
              file=sys.stderr)
        return 1
    return 0


def _signal_named(signum: int) -> str:
    """A signal as the user sent it: SIGINT (Ctrl-C), SIGTERM, SIGHUP."""
    return signal.Signals(signum).name + " (Ctrl-C)" * (signum == signal.SIGINT)


def _stop(running: dict, done: int, total: int, why: str) -> None:
    """Stop the runs under way, each with SIGTERM, after a line in its log.txt saying why: the
    run's own lines then name SIGTERM, whatever stopped the sweep."""
    for proc, (_, _, log, _) in running.items():
        if proc.poll() is None:
            with contextlib.suppress(OSError):      # a full disk: the run is stopped all the same
                log.write(f"sweep: {why}; stopping this run with SIGTERM, which saves its checkpoint\n")
                log.flush()
        proc.terminate()          # each run saves a checkpoint; the next start resumes it
    for proc, entry in running.items():
        code = proc.wait()
        if code in (0, DIVERGED_EXIT, PRUNED_EXIT, PAUSED_EXIT):      # it had ended just before the stop
            done += 1
            _record(entry, code, done, total)


def _done(run: SweepRun) -> bool:
    """Finished, diverged, or paused where its plan stops it: a failed run (a crash, a bad grid
    point) is worth another try."""
    return ended(run, status_of(run.folder))


def _planned(run: SweepRun) -> tuple:
    """What the plan asks of a run: its folder, and the rung it stops at (halving), if any."""
    return run.folder, run.extra.get("pause_at")


def _record(entry, returncode: int, done: int, total: int, left: str = "") -> None:
    """Write the run's result.json and print a line on it, with the sweep's time left (", about
    N left", or "")."""
    run, started, log, earlier = entry
    log.close()
    status = run_status(returncode)
    # started: when its process was started, to set against its own records of its loop
    result = {"status": status, "returncode": returncode, "wall_s": time.time() - started, "started": started}
    if earlier:     # each start of a run paused at halving's rung, this one last
        result["starts"] = [*earlier, [started, result["wall_s"]]]
    write_json(run.folder / "result.json", result)
    final = final_eval(run.folder)
    val = (f"val {loss_text(final['val_loss'], 'val_bpc' in final)} at iteration {final['iter']}" if final
           else "no evaluation")
    where = f" (see {run.folder / 'log.txt'})" if status == "failed" else ""
    print(f"[{done}/{total} done{left}] {run.name}: {status}, {val}, {result['wall_s']:.0f} s{where}",
          flush=True)


