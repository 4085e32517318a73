"""Ablation sweeps: run a grid of settings over several seeds, then report what changed.

    python train.py --config shakespeare_char_cpu --sweep residual=true,false --seeds=3 --out_dir=DIR
    python -m gpt.sweep report DIR

Each run is its own `python train.py` process writing to DIR/<setting>__seed=<n>/, so runs are
isolated, can go side by side (--jobs), and a sweep started again skips finished runs and
resumes interrupted ones. The report reads only DIR/sweep.json and the run folders' config.json,
metrics.jsonl and result.json.
"""

from __future__ import annotations

from .console import interrupt_quietly_while_loading

interrupt_quietly_while_loading(__name__)      # before torch loads

import csv
import itertools
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, fields
from pathlib import Path

import torch

from . import checkpoint
from .cli import shown
from .config import (NAME_MAX, READ_BY_SCHEDULES, REPO_ROOT, GPTConfig, SweepConfig, TrainConfig, build, read_by,
                     user_path)
from .errors import UserError
from .console import Terminated, interrupt_in_one_line, output_may_close
from .data import ensure_prepared
from .inspect import pyplot
from .cpu.split import split_plan
from .trainer import (DIVERGED_EXIT, SWEEP_PID, catch_signals, check_compile, check_threads, listed_in,
                      read_jsonl, resolve_device, run_record, write_json)


@dataclass
class Run:
    setting: dict         # axis name -> value
    seed: int
    folder: Path


DONE = ("finished", "diverged")     # a run with either status is not run again; "failed" is


def _text(value) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def setting_label(setting: dict) -> str:
    return "__".join(f"{k}={_text(v)}" for k, v in setting.items()) or "base"


# more runs than anyone trains on one machine: a grid past it is a typo (seeds=10000000), which
# would otherwise fill the memory before saying anything
MAX_RUNS = 100_000


def expand(axes: dict[str, list], seeds: int, base_seed: int, out_dir: Path) -> list[Run]:
    """Every combination of axis values (first axis slowest), each with `seeds` seeds."""
    names = list(axes)
    count = math.prod(len(axes[n]) for n in names) * seeds
    if count > MAX_RUNS:
        each = f"{seeds} seed{'s' * (seeds != 1)} of each setting"
        raise UserError(f"the sweep would make {count:,} runs ({each}), more than {MAX_RUNS:,}; give "
                        "fewer seeds or axis values")
    runs = []
    for values in itertools.product(*(axes[n] for n in names)):
        setting = dict(zip(names, values))
        for i in range(seeds):
            seed = base_seed + i
            runs.append(Run(setting, seed, out_dir / f"{setting_label(setting)}__seed={seed}"))
    return runs


def _setting(run: Run) -> dict:
    """The run's axis values as its process gets them: a data_dir from where the sweep starts,
    since each run's process starts in the repository root (the folder name keeps it as typed)."""
    if "data_dir" not in run.setting:
        return run.setting
    return {**run.setting, "data_dir": str(Path(user_path(run.setting["data_dir"], "data_dir")).resolve())}


def _command(values: dict, run: Run, threads: int) -> list[str]:
    args = {k: v for k, v in values.items() if k not in SweepConfig.__dataclass_fields__}
    args.update(_setting(run), seed=run.seed, out_dir=str(run.folder))
    args.setdefault("threads", threads)
    if (run.folder / "ckpt.pt").exists():
        args["resume"] = True
    elif not (run.folder / "ckpt_best.pt").exists():    # that one the run refuses to replace
        args["overwrite"] = True    # a run that never saved a checkpoint starts again, whatever it left
    return [sys.executable, str(REPO_ROOT / "train.py"), *(f"--{k}={_text(v)}" for k, v in args.items())]


def run_threads(jobs: int) -> int:
    """CPU threads each run gets, unless --threads gives them."""
    return max(1, (os.cpu_count() or 1) // jobs)


def _check_grid(values: dict, runs: list[Run], threads: int) -> list[tuple[GPTConfig, TrainConfig]]:
    """Fail before anything runs: on --resume, on two settings that would share a run folder, and
    on any grid point that is not a valid config. Returns each run's configs."""
    for name in ("resume", "overwrite"):
        if values.get(name):
            raise UserError(f"--{name}: a sweep resumes its stopped runs and restarts its failed ones "
                            f"by itself; run the same command again without --{name}")
    longest = max((r.folder.name for r in runs), key=lambda name: len(os.fsencode(name)))
    if len(os.fsencode(longest)) > NAME_MAX:    # the run folders are named by their settings
        raise UserError(f"a run's folder would be named {longest[:60]}..., {len(os.fsencode(longest))} "
                        f"bytes, more than the {NAME_MAX} a file system allows; sweep fewer axes at "
                        "once, and set the others with --name=value")
    # values that differ only in path spelling (./data, .//data) or in case (one folder on macOS)
    seen = {}
    for r in runs:
        key = os.path.normpath(r.folder).lower()
        if key in seen:
            raise UserError(f"two settings would share one run folder ({setting_label(seen[key].setting)} "
                            f"and {setting_label(r.setting)}); give values that differ by more than case "
                            "or path spelling")
        seen[key] = r
    for r in runs:      # after the names' length: a name too long makes exists() fail
        if r.folder.exists() and not r.folder.is_dir():
            raise UserError(f"{r.folder} is a file, where the sweep keeps that run; move it away")
    # threads as _command gives them: a count given, 0 included, goes to the run as it is
    configs = [(build(GPTConfig, {**values, **_setting(r)}),
                build(TrainConfig, {"threads": threads, **values, **_setting(r), "seed": r.seed,
                                    "out_dir": str(r.folder)}))
               for r in runs]
    for model_cfg, train_cfg in configs:
        check_threads(train_cfg)
        check_compile(train_cfg)
        split_plan(model_cfg, train_cfg, resolve_device(train_cfg.device), 1,
                   train_cfg.threads or torch.get_num_threads())
    for name in runs[0].setting:
        if not any(read_by(train_cfg.lr_schedule, name) for _, train_cfg in configs):
            schedules = sorted({train_cfg.lr_schedule for _, train_cfg in configs})
            readers = READ_BY_SCHEDULES[name]
            fix = ("add one to the lr_schedule axis" if "lr_schedule" in runs[0].setting
                   else "set --lr_schedule to one, or sweep lr_schedule too")
            raise UserError(f"the axis {name}: lr_schedule={','.join(schedules)} does not read it, so the "
                            f"runs would train alike; only {', '.join(readers)} read{'s' * (len(readers) == 1)} "
                            f"it: {fix}")
    return configs


# what may differ between a run's starts without changing what is compared: where and how fast it
# runs (flush_denormal changes only values below float32's smallest normal, and thread_split the order
# of sums, yet after many steps the losses drift within seed noise; runs older than these fields never
# flushed or split); the folder is the run's own
NOT_COMPARED = {"out_dir", "vocab_size", "threads", "flush_denormal", "thread_split", "resume",
                "overwrite", "wandb", "wandb_project", "wandb_run_name"}
# those of them that set a run's speed: tokens/s compares runs alike only where they agree (a sweep
# run again with another --jobs gives its new runs other threads)
SPEED = ("flush_denormal", "threads", "thread_split")


def changed_settings(run: Run, model_cfg: GPTConfig, train_cfg: TrainConfig) -> list[str]:
    """How the run already in run.folder (its config.json, one line per setting) differs from the
    configs the sweep would give it now: reusing it would report old results as new ones."""
    path = run.folder / "config.json"
    if not path.exists():
        return []
    record = _read_json(path, RUN_RECORD)
    changed = []
    for section, cfg in (("model", model_cfg), ("train", train_cfg)):
        try:    # a field newer than the run takes its default, as the run did
            before = build(type(cfg), dict(record.get(section, {})))
        except (UserError, TypeError, ValueError):
            raise UserError(f"{path} is not a run config of this project; move that run folder "
                            "away, or use another --out_dir") from None
        for f in fields(cfg):
            old = getattr(before, f.name)
            if f.name == "data_dir":    # older runs recorded it as given, from the repository root
                old = str((REPO_ROOT / old).resolve())
            if section == "train" and not (read_by(before.lr_schedule, f.name)
                                           or read_by(cfg.lr_schedule, f.name)):
                continue
            if f.name == "eval_batch_size":     # 0 means batch_size: the windows are what counts
                old, new = old or before.batch_size, cfg.eval_batch_size or cfg.batch_size
                if old != new:
                    changed.append(f"eval_batch_size={old} in the run, {new} now")
                continue
            if f.name not in NOT_COMPARED and old != getattr(cfg, f.name):
                changed.append(f"{f.name}={shown(old)} in the run, {shown(getattr(cfg, f.name))} now")
    return changed


def _finished_by_checkpoint(run: Run, max_iters: int) -> bool:
    """A run whose result was never recorded (the sweep was stopped as it ended, or a copy of
    ckpt_best.pt failed at its last save) but whose checkpoint is complete; its ckpt_best.pt is
    made good on the way."""
    path = run.folder / "ckpt.pt"
    if not path.exists():
        return False
    try:
        with checkpoint.hold_folder(run.folder):    # not while a run started by hand trains there
            ckpt = checkpoint.load(path, mmap=True, needs=("iter",))
            if ckpt["iter"] < max_iters:
                return False
            try:    # as a resume would, had there been steps left
                mended = checkpoint.make_best_good(run.folder, ckpt)
            except UserError as e:      # its resume tries again, and says so in its log.txt
                print(f"{run.folder.name}: {e}")
                return False
    except UserError:
        return False
    if mended is not None:
        print(f"{run.folder.name}: ckpt_best.pt did not hold the best iteration, {mended}: copied it "
              "from ckpt.pt")
    return True


def run(args, argv: list[str]) -> int:
    """Run the grid described by parsed args (axes in args.sweep), then write the report."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:   # each rank would run the whole grid
        raise UserError("a sweep runs its own processes; start it with python train.py, not "
                        "torchrun (use --jobs=N to run N at once)")
    values = dict(args.values)
    for name in ("out_dir", "data_dir"):    # else the sweep would fill the current folder
        if name in values and not values[name].strip():
            raise UserError(f"{name} is empty; give a folder name")
    sweep_cfg = build(SweepConfig, values)
    # absolute, because each run's process starts in the repository root
    out_dir = Path(values.get("out_dir", "runs/sweep")).resolve()
    values["out_dir"] = str(out_dir)
    values["data_dir"] = str(Path(values.get("data_dir", TrainConfig.data_dir)).resolve())
    base_seed = values.get("seed", TrainConfig.seed)
    if base_seed + sweep_cfg.seeds > 2 ** 32:
        raise UserError(f"seed={base_seed} with seeds={sweep_cfg.seeds}: the seeds would run to "
                        f"{base_seed + sweep_cfg.seeds - 1}, past 2**32 - 1; lower seed")
    held = checkpoint.saved_in(out_dir)
    if held:    # the run could no longer be resumed once it is a sweep's folder
        raise UserError(f"out_dir={str(out_dir)!r} holds a run ({' and '.join(held)}); its sweep "
                        "folders would mix with it; choose another --out_dir")
    record = _read_json(out_dir / "sweep.json") if (out_dir / "sweep.json").exists() else None
    axes = args.sweep
    if record and isinstance(record.get("axes"), dict) and set(record["axes"]) == set(axes):
        axes = {name: axes[name] for name in record["axes"]}  # their old order keeps the runs' names
    if "batch_size" in axes and "eval_batch_size" not in {*values, *axes}:
        # else each batch size would be scored on its own windows, and the evaluation would differ
        # with the axis: 0.04 in val loss for one model, more than the seed spread of a study. The
        # sweep's first choice stays, so that the axis may gain a value in front
        old_axes = (record or {}).get("axes")
        old_axis = old_axes.get("batch_size") if isinstance(old_axes, dict) else None
        pinned = (record["eval_batch_size"] if record and "eval_batch_size" in record
                  else old_axis[0] if isinstance(old_axis, list) and old_axis else None)    # older records
        values["eval_batch_size"] = (pinned if type(pinned) is int and pinned >= 0
                                     else axes["batch_size"][0])
        if values["eval_batch_size"]:
            print(f"batch_size is an axis: every run is evaluated alike, on eval_iters batches of "
                  f"{values['eval_batch_size']} windows (--eval_batch_size=0 gives each run its own "
                  "batch_size)")
    runs = expand(axes, sweep_cfg.seeds, base_seed, out_dir)
    run_cfgs = _check_grid(values, runs, run_threads(sweep_cfg.jobs))
    ended = [_done(r.folder) for r in runs]         # finished or diverged: read once
    for r, (model_cfg, train_cfg), end in zip(runs, run_cfgs, ended):
        kept = end or (r.folder / "ckpt.pt").exists()   # else it starts afresh, keeping nothing
        changed = changed_settings(r, model_cfg, train_cfg) if kept else []
        if changed:
            raise UserError(f"{out_dir} holds runs trained with other settings ({r.folder.name}: "
                            f"{'; '.join(changed)}); use another --out_dir, or the same settings "
                            "to continue it")
    older = [r for r, end in zip(runs, ended) if (end or (r.folder / "ckpt.pt").exists())
             and listed_in(run_record(r.folder / "config.json")) != [checkpoint.code_version()]]
    if older:
        print(f"{len(older)} of the runs kept were trained, in whole or in part, by other code than "
              "this (gpt/ has changed since, or they predate the record): sweep.csv's code column "
              "marks them; delete a run's folder to train it again")
    for cfg in {(t.data_dir, t.dataset) for _, t in run_cfgs}:
        ensure_prepared(*cfg)               # once, not by every run at once; and before the folder
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"out_dir={str(out_dir)!r} cannot be written ({e.strerror})") from None
    with checkpoint.hold_folder(out_dir):
        write_json(out_dir / "sweep.json",
                   {"axes": axes, "seeds": sweep_cfg.seeds, "base_seed": base_seed,
                    "command": " ".join(["python", "train.py", *argv]),
                    **({"eval_batch_size": values["eval_batch_size"]} if "eval_batch_size" in values else {})})
        return _run_grid(values, sweep_cfg.jobs, runs, run_cfgs, ended, out_dir)


def _run_grid(values: dict, jobs: int, runs: list[Run], run_cfgs, ended: list[bool], out_dir: Path) -> int:
    todo = []                                        # failed runs are tried again
    for r, (_, cfg), end in zip(runs, run_cfgs, ended):
        if end:
            continue
        if _finished_by_checkpoint(r, cfg.max_iters):
            write_json(r.folder / "result.json", {"status": "finished", "returncode": 0, "wall_s": None})
        else:
            todo.append(r)
    print(f"sweep: {len(runs)} run{'s' * (len(runs) != 1)} ({len(runs) - len(todo)} already finished), "
          f"{jobs} at a time, in {out_dir}")
    threads = run_threads(jobs)
    running: dict[subprocess.Popen, tuple[Run, float, object]] = {}
    done = len(runs) - len(todo)
    # SIGTERM, and SIGHUP from a closed terminal, stop the runs as Ctrl-C does
    previous = catch_signals(_interrupt)
    env = {**os.environ, SWEEP_PID: str(os.getpid())}      # so each run ends with the sweep
    try:
        while todo or running:
            while todo and len(running) < jobs:
                r = todo.pop(0)
                try:
                    r.folder.mkdir(parents=True, exist_ok=True)
                    (r.folder / "result.json").unlink(missing_ok=True)     # a failed run, tried again
                    log = open(r.folder / "log.txt", "a")
                except OSError as e:    # a full disk, a file put where the folder goes meanwhile
                    stopped = "; the runs under way were stopped and saved" if running else ""
                    _stop(running, done, len(runs))
                    raise UserError(f"cannot start the run in {r.folder} ({e.strerror or e}){stopped}: fix "
                                    "it, and run the same command again to continue") from None
                # a session of its own: Ctrl-C reaches the sweep alone, which then stops each
                # run once, so that it saves its checkpoint
                proc = subprocess.Popen(_command(values, r, threads), stdout=log,
                                        stderr=subprocess.STDOUT, cwd=REPO_ROOT,
                                        start_new_session=True, env=env)
                running[proc] = (r, time.time(), log)
                print(f"[{done}/{len(runs)} done] started {r.folder.name} "
                      f"({len(running)} running, {len(todo)} waiting)", flush=True)
            time.sleep(0.2)
            for proc in [p for p in running if p.poll() is not None]:
                done += 1
                _record(running.pop(proc), proc.returncode, done, len(runs))
    except KeyboardInterrupt as stop:
        _stop(running, done, len(runs))
        print("sweep interrupted; run the same command again to continue", file=sys.stderr)
        return 128 + (stop.signum if isinstance(stop, Terminated) else signal.SIGINT)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    report(out_dir)
    failed = [r for r in runs if not _done(r.folder)]
    if failed:
        print(f"{len(failed)} of {len(runs)} runs failed (see log.txt in their folders, e.g. "
              f"{failed[0].folder / 'log.txt'}); run the same command again to retry them",
              file=sys.stderr)
        return 1
    return 0


def _stop(running: dict, done: int, total: int) -> None:
    for proc in running:
        proc.terminate()          # each run saves a checkpoint; the next start resumes it
    for proc, entry in running.items():
        code = proc.wait()
        if code in (0, DIVERGED_EXIT):      # it had ended just before the stop
            _record(entry, code, done, total)


def _interrupt(signum, frame):
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise Terminated(signum)


def _done(folder: Path) -> bool:
    """Finished or diverged: a failed run (a crash, a bad grid point) is worth another try."""
    path = folder / "result.json"
    return path.exists() and _read_json(path).get("status") in DONE


def _record(entry, returncode: int, done: int, total: int) -> None:
    run, started, log = entry
    log.close()
    status = {0: "finished", DIVERGED_EXIT: "diverged"}.get(returncode, "failed")
    result = {"status": status, "returncode": returncode, "wall_s": time.time() - started}
    write_json(run.folder / "result.json", result)
    final = _final_eval(run.folder)
    val = f"val {final['val_loss']:.4f} at iteration {final['iter']}" if final else "no evaluation"
    where = f" (see {run.folder / 'log.txt'})" if status == "failed" else ""
    print(f"[{done}/{total} done] {run.folder.name}: {status}, {val}, {result['wall_s']:.0f} s{where}",
          flush=True)


# ---------------------------------------------------------------- report

# what to do about a damaged file: the sweep writes its sweep.json and a run's result.json again;
# a run's config.json is written by the run as it starts
REWRITTEN = "remove it, and the sweep's command writes it again"
RUN_RECORD = "move the run's folder away, and the sweep's command trains it again"


def _read_json(path: Path, fix: str = REWRITTEN) -> dict:
    try:
        data = json.loads(path.read_text())
    except OSError as e:
        raise UserError(f"cannot read {path} ({e.strerror or e})") from None
    except json.JSONDecodeError as e:
        raise UserError(f"{path} is damaged ({e}); {fix}") from None
    if not isinstance(data, dict):
        raise UserError(f"{path} does not hold a JSON object; {fix}")
    return data


def _evals(folder: Path) -> list[dict]:
    path = folder / "metrics.jsonl"
    return [r for r in read_jsonl(path) if r["kind"] == "eval"] if path.exists() else []


def _final_eval(folder: Path) -> dict | None:
    evals = _evals(folder)
    return evals[-1] if evals else None


def collect(out_dir: Path) -> tuple[dict, list[dict]]:
    """The sweep's description and one row per run folder."""
    path = Path(out_dir) / "sweep.json"
    if not path.exists():
        raise UserError(f"{path} does not exist; is {out_dir} a sweep folder?")
    sweep = _read_json(path)
    if not ({"axes", "seeds", "base_seed", "command"} <= sweep.keys() and isinstance(sweep["axes"], dict)
            and all(isinstance(v, list) for v in sweep["axes"].values())
            and all(type(sweep[k]) is int for k in ("seeds", "base_seed"))):
        raise UserError(f"{path} is not a sweep description; run the sweep again to rewrite it")
    rows = []
    for r in expand(sweep["axes"], sweep["seeds"], sweep["base_seed"], Path(out_dir)):
        evals = _evals(r.folder)
        config_path = r.folder / "config.json"
        record = _read_json(config_path, RUN_RECORD) if config_path.exists() else {}
        result_path = r.folder / "result.json"
        result = _read_json(result_path) if result_path.exists() else {}
        final = evals[-1] if evals else {}
        speeds = [e["tokens_per_sec"] for e in evals if e.get("tokens_per_sec")]
        val = final.get("val_loss", math.nan)
        row = {**{k: _text(v) for k, v in r.setting.items()}, "seed": r.seed,
               "final_train_loss": final.get("train_loss", math.nan), "final_val_loss": val,
               "best_val_loss": min((e["val_loss"] for e in evals if math.isfinite(e["val_loss"])),
                                    default=math.nan),
               "tokens_per_sec": statistics.median(speeds) if speeds else math.nan,
               "elapsed_s": final.get("elapsed_s", math.nan),   # training time, across resumes
               "diverged": result.get("status") == "diverged" or (bool(evals) and not math.isfinite(val)),
               "status": result.get("status", "not run"),
               "code": " ".join(listed_in(record)) or "unknown",
               "ran_as": "; ".join(listed_in(record, "ran_as")),
               "_config": {k: v for section in ("model", "train") if isinstance(record.get(section), dict)
                           for k, v in record[section].items()},       # the run's settings, in one table
               "_setting": setting_label(r.setting), "_evals": evals, "_folder": r.folder,
               "_short": ", ".join(_text(v) for v in r.setting.values()) or "base",
               "_axes": ", ".join(r.setting) or "setting"}
        rows.append(row)
    return sweep, rows


# settings whose 0 stands for another's value, as the run resolves it
STANDS_FOR = {"n_kv_head": "n_head", "eval_batch_size": "batch_size"}


def odd_runs(rows: list[dict], axes, names: tuple[str, ...] | None = None) -> list[str]:
    """Runs whose settings, beyond the axes and the seed, differ from those most runs of the sweep
    have: one resumed by hand with more steps, say. The tables would average two experiments.
    `names`: look at these settings alone (SPEED's, which the tables leave aside)."""
    skip = {*axes, "seed", "data_dir", *NOT_COMPARED}

    def readings(config: dict, name: str) -> set[str]:
        """What the run's value may mean, as text: a setting whose 0 stands for another's value
        may follow that setting."""
        v = config[name]
        if name not in STANDS_FOR:
            return {json.dumps(v)}
        source = config.get(STANDS_FOR[name])
        # runs of older code recorded n_kv_head resolved, as n_head's value
        follows = v == 0 or (name == "n_kv_head" and v == source)
        if not follows:
            return {json.dumps(v)}
        if STANDS_FOR[name] in axes:    # across that axis, following it is one same setting
            return {json.dumps(f"as {STANDS_FOR[name]}"), json.dumps(source)}
        return {json.dumps(source)}
    def follows(option: str) -> bool:
        return option.startswith('"as ')

    def shown_as(options: set[str]) -> str:     # one reading per run: following, if it may
        return min(options, key=lambda o: (not follows(o), o))
    odd, split = {}, []
    for name in (sorted({k for r in rows for k in r["_config"]} - skip) if names is None
                 else [n for n in names if n not in axes]):
        have = [r for r in rows if name in r["_config"]
                and read_by(r["_config"].get("lr_schedule", TrainConfig.lr_schedule), name)]
        read = [readings(r["_config"], name) for r in have]
        counts = {}
        for options in read:
            for option in options:
                counts[option] = counts.get(option, 0) + 1
        if not counts or max(counts.values()) == len(have):
            continue
        # most runs first; on a tie, following the axis (the default) before a value given
        ranked = sorted(counts.items(), key=lambda kv: (-kv[1], not follows(kv[0]), kv[0]))
        (usual, most), (_, next_most) = ranked[:2]
        if most == next_most and not follows(usual):
            runs = {}
            for r, options in zip(have, read):
                runs.setdefault(shown_as(options), []).append(f"{r['_setting']}__seed={r['seed']}")
            split.append(f"{name} is split: " + ", ".join(    # a few runs named, so one can look
                f"{shown(json.loads(v))} in {len(names)}" + (f" ({', '.join(names)})" if len(names) <= 3 else "")
                for v, names in sorted(runs.items())))
            continue
        for r, options in zip(have, read):
            if usual not in options:
                mine = shown_as(options)
                odd.setdefault(f"{r['_setting']}__seed={r['seed']}", []).append(
                    f"{name}={shown(json.loads(mine))} (the others {shown(json.loads(usual))})")
    return [f"{run}: {', '.join(diffs)}" for run, diffs in odd.items()] + split


# settings a run resolves on its machine (`auto`, `fast`; `high` is exact on a CPU)
RESOLVED = ("device", "dtype", "matmul_precision")


def ran_alike(rows: list[dict], axes) -> list[str]:
    """Settings that differ only on RESOLVED axes and whose runs all ran the same way: a sweep over
    dtype=float32,fast on a CPU without bfloat16 compares float32 with float32."""
    alike = {}
    for label, group in by_setting(rows).items():
        ways = {r["ran_as"] for r in group if r["status"] in DONE}
        # one way for all its runs; a run resumed on another machine lists two, older runs none
        if len(ways) == 1 and (way := ways.pop()) and "; " not in way:
            rest = tuple(group[0][name] for name in axes if name not in RESOLVED)
            alike.setdefault((rest, way), []).append(label)
    return [f"{' and '.join(labels)} ({way})" for (_, way), labels in alike.items() if len(labels) > 1]


def by_setting(rows: list[dict]) -> dict[str, list[dict]]:
    groups = {}
    for row in rows:
        groups.setdefault(row["_setting"], []).append(row)
    return groups


def counted(group: list[dict]) -> list[dict]:
    """The runs whose final results the tables average: finished and not diverged. Diverged runs
    are counted apart, since their last finite figures are not final ones."""
    return [r for r in group if r["status"] == "finished" and not r["diverged"]]


def drawn(group: list[dict]) -> list[dict]:
    """The runs the pictures show: the counted ones, and those under way (no result yet), so a
    report taken while a sweep runs shows its progress."""
    return [r for r in group if r["status"] in ("finished", "not run") and not r["diverged"]]


def t_quantile(p: float, df: float) -> float:
    """The p quantile (p >= 0.5) of Student's t distribution with df >= 1 degrees of freedom,
    fractional ones included (Welch's test makes them): bisection on its CDF, the density
    integrated by Simpson's rule, which is exact to about 1e-9 here and needs no SciPy."""
    log_norm = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)

    def cdf(x: float, steps: int = 2000) -> float:
        h = x / steps
        density = [math.exp(log_norm - (df + 1) / 2 * math.log1p((i * h) ** 2 / df))
                   for i in range(steps + 1)]
        return 0.5 + h / 3 * (density[0] + density[-1] + 4 * sum(density[1:-1:2])
                              + 2 * sum(density[2:-1:2]))

    low, high = 0.0, 1.0
    while cdf(high) < p:
        low, high = high, 2 * high
    for _ in range(50):
        mid = (low + high) / 2
        low, high = (mid, high) if cdf(mid) < p else (low, mid)
    return (low + high) / 2


def versus(base: dict, s: dict) -> str:
    """A setting's mean final loss against the baseline's: better or worse when Welch's t-test
    (unequal variances, two-sided, 5%) finds a difference, else within noise. Each comparison
    alone is at 5%: of ten settings no better than the baseline, one may still be flagged."""
    diff = s["mean"] - base["mean"]
    a, b = s["std"] ** 2 / s["n"], base["std"] ** 2 / base["n"]
    if a + b == 0:      # no spread at all: any difference is beyond it
        real = diff != 0
    else:               # Welch-Satterthwaite degrees of freedom
        df = (a + b) ** 2 / (a ** 2 / (s["n"] - 1) + b ** 2 / (base["n"] - 1))
        real = abs(diff) > t_quantile(0.975, df) * math.sqrt(a + b)
    return f"{'worse' if diff > 0 else 'better'} by {abs(diff):.3f}" if real else f"within noise ({diff:+.3f})"


def summarize(rows: list[dict]) -> list[dict]:
    """One row per setting: final val loss mean and std over seeds, and how it compares with the
    first setting (the baseline)."""
    out = []
    for label, group in by_setting(rows).items():
        ran = [r for r in group if r["status"] in DONE]
        finite = [r["final_val_loss"] for r in counted(group) if math.isfinite(r["final_val_loss"])]
        out.append({"setting": label, "runs": len(ran), "diverged": sum(r["diverged"] for r in group),
                    "failed": sum(r["status"] == "failed" for r in group),
                    "mean": statistics.fmean(finite) if finite else math.nan,
                    "std": statistics.stdev(finite) if len(finite) > 1 else math.nan,
                    "n": len(finite)})
    base = out[0] if out else None
    for s in out:
        if s is base:
            s["vs_baseline"] = "baseline"
        elif not s["n"]:
            s["vs_baseline"] = "no result"
        elif not base["n"]:
            s["vs_baseline"] = "baseline has no result"
        elif s["n"] < 2 or base["n"] < 2:
            s["vs_baseline"] = "needs 2+ seeds"
        else:
            s["vs_baseline"] = versus(base, s)
    return out


def summary_table(summary: list[dict]) -> str:
    lines = ["| setting | runs | final val loss (mean ± std) | diverged | vs baseline |",
             "|---|---|---|---|---|"]
    for s in summary:
        std = f" ± {s['std']:.3f}" if math.isfinite(s["std"]) else ""
        mean = f"{s['mean']:.3f}{std}" if math.isfinite(s["mean"]) else "—"
        runs = f"{s['runs']} ({s['failed']} failed)" if s["failed"] else str(s["runs"])
        lines.append(f"| {s['setting']} | {runs} | {mean} | {s['diverged']} | {s['vs_baseline']} |")
    return "\n".join(lines)


def diagnostics_table(rows: list[dict]) -> str:
    """Per setting, the final evaluation's diagnostics at the first and last block, mean over seeds."""
    settings = {label: [r["_evals"][-1] for r in counted(group)
                        if r["_evals"] and "block_grad_norm" in r["_evals"][-1]]
                for label, group in by_setting(rows).items()}
    settings = {label: finals for label, finals in settings.items() if finals}
    lines = ["| setting | grad norm block 0 / last | update/weight block 0 / last | residual RMS last "
             "| position similarity last | head entropy (mean, nats) |", "|---|---|---|---|---|---|"]
    for label, finals in settings.items():
        def mean(key, block):
            values = [f[key][block] for f in finals if key in f]
            return statistics.fmean(values) if values else math.nan
        entropy = statistics.fmean(h for f in finals for layer in f["head_entropy"] for h in layer)
        def fmt(value, spec):
            return format(value, spec) if math.isfinite(value) else "—"
        lines.append(f"| {label} | {fmt(mean('block_grad_norm', 0), '.2e')} / "
                     f"{fmt(mean('block_grad_norm', -1), '.2e')} | {fmt(mean('block_update_ratio', 0), '.1e')}"
                     f" / {fmt(mean('block_update_ratio', -1), '.1e')} | {fmt(mean('block_rms', -1), '.2f')} "
                     f"| {fmt(mean('block_pos_sim', -1), '.2f')} | {entropy:.2f} |")
    return "\n".join(lines) if settings else ""


def _styles(n: int):
    """A colour and line style for each of n settings: 10 hues, solid, then dashed, dotted and
    dash-dotted. (tab20 would pair each hue with its light shade, so two settings that share
    nothing would look like one family.)"""
    import matplotlib
    colours = matplotlib.colormaps["tab10"].colors
    lines = ("-", "--", ":", "-.")
    return [(colours[i % 10], lines[i // 10 % 4]) for i in range(n)]


def _legend(ax, rows: list[dict]) -> None:
    if not ax.get_legend_handles_labels()[0]:       # nothing was drawn: no run has results
        return
    ax.legend(fontsize=7, title=rows[0]["_axes"], title_fontsize=7,
              loc="upper left", bbox_to_anchor=(1.01, 1.0))


def plot(rows: list[dict], path: Path) -> None:
    """Val loss against iteration: one line per setting (mean over seeds), the seeds' range as a band."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(10, 5))
    groups = by_setting(rows)
    for (label, group), (colour, style) in zip(groups.items(), _styles(len(groups))):
        by_iter = {}
        for row in drawn(group):
            for e in row["_evals"]:
                by_iter.setdefault(e["iter"], []).append(e["val_loss"])
        if not by_iter:
            continue
        iters = sorted(by_iter)
        mean = [statistics.fmean(by_iter[i]) for i in iters]
        ax.plot(iters, mean, style, color=colour, label=group[0]["_short"])
        if max(len(by_iter[i]) for i in iters) > 1:
            ax.fill_between(iters, [min(by_iter[i]) for i in iters], [max(by_iter[i]) for i in iters],
                            color=colour, alpha=0.2)
    unigram = [e["unigram_loss"] for row in rows for e in row["_evals"][-1:] if "unigram_loss" in e]
    if unigram:
        ax.axhline(unigram[0], color="black", ls=":", label="unigram level")   # no setting's style
    ax.set_xlabel("iteration")
    ax.set_ylabel("val loss")
    ax.set_title("val loss: mean over seeds, band = min..max")
    _legend(ax, rows)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


DIAGNOSTICS = (("block_grad_norm", "gradient norm", True), ("block_update_ratio", "update / weight", True),
               ("block_rms", "residual stream RMS", True), ("block_pos_sim", "position similarity", False))


def plot_diagnostics(rows: list[dict], path: Path) -> None:
    """Per block, each diagnostic at the final evaluation, mean over seeds: one line per setting."""
    plt = pyplot()
    fig, axes = plt.subplots(1, len(DIAGNOSTICS), figsize=(5 * len(DIAGNOSTICS) + 3, 4.5))
    groups = by_setting(rows)
    styles = _styles(len(groups))
    for ax, (key, title, log) in zip(axes, DIAGNOSTICS):
        for group, (colour, style) in zip(groups.values(), styles):
            values = [r["_evals"][-1][key] for r in drawn(group) if r["_evals"] and key in r["_evals"][-1]]
            if values:
                mean = [statistics.fmean(v[b] for v in values) for b in range(len(values[0]))]
                ax.plot(range(len(mean)), mean, "o" + style, color=colour, label=group[0]["_short"])
        ax.set_title(f"{title} (last eval, mean over seeds)", fontsize=9)
        ax.set_xlabel("block")
        ax.xaxis.get_major_locator().set_params(integer=True)   # blocks are whole: no 0.5 tick
        if log:
            ax.set_yscale("log")
        ax.grid(alpha=0.3)
    _legend(axes[-1], rows)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def report(out_dir: Path) -> str:
    """Write sweep.csv, summary.md, curves.png and diagnostics.png into out_dir; print and
    return the summary table."""
    out_dir = Path(out_dir)
    sweep, rows = collect(out_dir)
    columns = [*sweep["axes"], "seed", "final_train_loss", "final_val_loss", "best_val_loss",
               "tokens_per_sec", "elapsed_s", "diverged", "status", "code", "ran_as"]
    table = summary_table(summarize(rows))
    odd = odd_runs(rows, sweep["axes"])
    if odd:
        table += ("\n\nRuns whose settings differ from the rest of the sweep beyond its axes, averaged "
                  "in above: " + "; ".join(odd) + ".")
    slower = odd_runs(rows, sweep["axes"], SPEED)
    if slower:
        table += ("\n\nRuns that ran with other speed settings than the rest, so their tokens/s in "
                  "sweep.csv does not compare alike: " + "; ".join(slower) + ".")
    alike = ran_alike(rows, sweep["axes"])
    if alike:
        table += ("\n\nSettings whose runs all ran the same way (sweep.csv's ran_as), so what tells "
                  "them apart is noise: " + "; ".join(alike) + ".")
    failed = [f"{r['_folder'].name}/log.txt" for r in rows if r["status"] == "failed"]
    if failed:      # named within the sweep's folder, so summary.md reads the same from anywhere
        table += (f"\n\nFailed, so in no mean or curve ({len(failed)}; what went wrong is in each "
                  f"log.txt, and the sweep's command tries them again): " + ", ".join(failed) + ".")
    older = sum(r["status"] in DONE and r["code"] != checkpoint.code_version() for r in rows)
    if older:
        table += (f"\n\n{older} of these runs were trained, in whole or in part, by other code than "
                  f"the present ({checkpoint.code_version()}): see the code column of sweep.csv.")
    try:
        with open(out_dir / "sweep.csv", "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
            writer.writeheader()
            writer.writerows(rows)
        (out_dir / "summary.md").write_text(
            f"# Sweep {out_dir.name}\n\n`{sweep['command']}`\n\n{table}\n\n"
            "Baseline: the first setting. 'worse/better' means Welch's t-test (two-sided, 5%) over the "
            "seeds finds the means differ; with one seed there is no noise estimate. Each setting is "
            "tested alone: of ten settings no better than the baseline, one may still be flagged.\n\n"
            f"## Diagnostics at the final evaluation\n\n{diagnostics_table(rows)}\n", encoding="utf-8")
        plot(rows, out_dir / "curves.png")
        plot_diagnostics(rows, out_dir / "diagnostics.png")
    except OSError as e:    # a read-only copy, a full disk: the table is still worth printing
        print(table)
        where = e.filename or out_dir     # matplotlib's own errors may not name the file
        raise UserError(f"the report cannot be written to {where} ({e.strerror or e}); the table "
                        "is above") from None
    print(table)
    return table


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    usage = "usage: python -m gpt.sweep report DIR"
    if {"-h", "--help"} & set(argv):
        print(f"{usage}\n\nWrites DIR/sweep.csv, summary.md, curves.png and diagnostics.png for the sweep "
              "in DIR.\nSweeps run with: python train.py --config NAME --sweep name=v1,v2 ...")
        return 0
    if len(argv) != 2 or argv[0] != "report":
        print(usage, file=sys.stderr)
        return 2
    try:
        report(Path(user_path(argv[1], "DIR")))
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    # | head: no traceback for the reader going away; Ctrl-C: one line
    with interrupt_in_one_line(), output_may_close(product=True):
        sys.exit(main())
