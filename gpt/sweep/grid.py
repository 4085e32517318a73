"""The grid of a sweep: its runs (setting x seed), their folders and records, and the checks before any starts."""

from __future__ import annotations

import itertools
import json
import math
import os
import sys
from dataclasses import dataclass, field, fields
from pathlib import Path

import torch

from .. import checkpoint
from ..config_files import LINK, shown
from ..config import (NAME_MAX, READ_BY_OPTIMIZERS, READ_BY_SCHEDULES, REPO_ROOT, GPTConfig, SweepConfig,
                      TrainConfig, build, read_by, read_by_optimizer, user_path)
from ..optim import check_optimizer
from ..speed.split import split_plan
from ..errors import UserError
from ..train.metrics import read_jsonl
from ..train.runtime import check_compile, check_threads, resolve_device


@dataclass
class SweepRun:
    """One run of a sweep: a grid point's setting, a seed, and the folder it trains in."""
    setting: dict         # axis name -> value
    seed: int
    folder: Path
    tuned: dict = field(default_factory=dict)     # a tuned option -> its value here: in the folder's name,
    stage: str = "confirm"                        # but not in the setting; "tune" for a tuning run
    extra: dict = field(default_factory=dict)     # more values for its process (stop_hopeless)

    @property
    def name(self) -> str:
        """The run's folder within the sweep's: tune/<folder> for a tuning run."""
        return f"{self.folder.parent.name}/{self.folder.name}" if self.stage == "tune" else self.folder.name


# a run with one of these statuses is not run again ("pruned": stopped by stop_hopeless); "failed" is
DONE = ("finished", "diverged", "pruned")


def ended(run: SweepRun, status: str | None) -> bool:
    """Whether the run, whose result.json says status, needs no more training: done, or paused at
    the rung its plan still stops it at (a tuning run that successive halving stopped, or one
    waiting for the rest of its setting's grid to reach the rung)."""
    return status in DONE or (status == "paused" and bool(run.extra.get("pause_at")))


def status_of(folder: Path) -> str | None:
    """The status in a run folder's result.json; None before its run has ended."""
    path = folder / "result.json"
    return read_json(path).get("status") if path.exists() else None


def paused_starts(folder: Path) -> list[list[float]]:
    """The [start time, wall seconds] of each earlier process of a run that paused (halving's
    rung), from its result.json; none for another run."""
    path = folder / "result.json"
    result = read_json(path) if path.exists() else {}
    if result.get("status") != "paused" or not isinstance(result.get("started"), (int, float)):
        return []
    return result.get("starts") or [[result["started"], result["wall_s"]]]


def as_text(value) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def setting_label(setting: dict) -> str:
    return "__".join(f"{k}={as_text(v)}" for k, v in setting.items()) or "base"


# more runs than anyone trains on one machine: a grid past it is a typo (seeds=10000000), which
# would otherwise fill the memory before saying anything
MAX_RUNS = 100_000


def factors(axes: dict[str, list]) -> list[tuple[tuple[str, ...], list[tuple]]]:
    """Each axis as (its option names, its values as tuples): one name and 1-tuples, or a linked
    axis's names and its values' parts."""
    out = []
    for key, values in axes.items():
        names = tuple(key.split(LINK))
        out.append((names, [tuple(v) if len(names) > 1 else (v,) for v in values]))
    return out


def axis_names(axes: dict[str, list]) -> list[str]:
    """The options the axes set, a linked axis's each on its own."""
    return [name for names, _ in factors(axes) for name in names]


def settings_of(axes: dict[str, list]) -> list[dict]:
    """Every combination of axis values (first axis slowest; a linked axis's values together).
    Where the optimizer is an axis, a setting of one that does not read an axis (AdamW and
    muon_lr) is made once, and that axis is left out of its setting."""
    parts = factors(axes)
    first = {name: values[0][i] for names, values in parts for i, name in enumerate(names)}
    out = []
    for combination in itertools.product(*(values for _, values in parts)):
        setting = {name: v for (names, _), value in zip(parts, combination) for name, v in zip(names, value)}
        unread = [n for n in setting if "optimizer" in setting and not read_by_optimizer(setting["optimizer"], n)]
        if any(setting[n] != first[n] for n in unread):
            continue
        out.append({n: v for n, v in setting.items() if n not in unread})
    return out


def count_runs(axes: dict[str, list], seeds: int, tuning: int = 0) -> None:
    """Refuse a grid of more than MAX_RUNS runs before making any; tuning: the tuning runs per setting."""
    count = math.prod(len(values) for values in axes.values()) * (seeds + tuning)
    if count > MAX_RUNS:
        each = f"{seeds} seed{'s' * (seeds != 1)} of each setting" + (f" and {tuning:,} tuning runs" if tuning else "")
        raise UserError(f"the sweep would make {count:,} runs ({each}), more than {MAX_RUNS:,}; give "
                        "fewer seeds or axis values")


def run_folder(out_dir: Path, setting: dict, seed: int, tuned: dict | None = None) -> Path:
    return out_dir / f"{setting_label({**setting, **(tuned or {})})}__seed={seed}"


def expand(axes: dict[str, list], seeds: int, base_seed: int, out_dir: Path) -> list[SweepRun]:
    """settings_of's settings, each with `seeds` seeds."""
    count_runs(axes, seeds)
    return [SweepRun(setting, base_seed + i, run_folder(out_dir, setting, base_seed + i))
            for setting in settings_of(axes) for i in range(seeds)]


def setting_of(run: SweepRun) -> dict:
    """The run's axis values as its process gets them: a data_dir from where the sweep starts,
    since each run's process starts in the repository root (the folder name keeps it as typed)."""
    values = {**run.extra, **run.setting, **run.tuned}
    if "data_dir" not in values:
        return values
    return {**values, "data_dir": str(Path(user_path(values["data_dir"], "data_dir")).resolve())}


def train_argv(values: dict, run: SweepRun, threads: int) -> list[str]:
    """The `python train.py` command that trains run in its folder, resuming what it saved."""
    args = {k: v for k, v in values.items() if k not in SweepConfig.__dataclass_fields__}
    args.update(setting_of(run), seed=run.seed, out_dir=str(run.folder))
    args.setdefault("threads", threads)
    args.setdefault("eval_train", False)    # the report reads val and the final train loss alone
    if values.get("wandb"):     # the sweep as one experiment in wandb, each setting its job type
        args.setdefault("wandb_group", Path(values["out_dir"]).name)
        args["wandb_job_type"] = setting_label(run.setting)
        args["wandb_tags"] = ",".join([*(f"{k}={as_text(v)}" for k, v in {**run.setting, **run.tuned}.items()),
                                       f"seed={run.seed}", f"stage={run.stage}"])
    if (run.folder / "ckpt.pt").exists():
        args["resume"] = True
    elif not (run.folder / "ckpt_best.pt").exists():    # that one the run refuses to replace
        args["overwrite"] = True    # a run that never saved a checkpoint starts again, whatever it left
    return [sys.executable, str(REPO_ROOT / "train.py"), *(f"--{k}={as_text(v)}" for k, v in args.items())]


def run_threads(jobs: int) -> int:
    """CPU threads each run gets, unless --threads gives them."""
    return max(1, (os.cpu_count() or 1) // jobs)


def check_grid(values: dict, runs: list[SweepRun], threads: int) -> list[tuple[GPTConfig, TrainConfig]]:
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
    # threads as train_argv gives them: a count given, 0 included, goes to the run as it is
    configs = [(build(GPTConfig, {**values, **setting_of(r)}),
                build(TrainConfig, {"threads": threads, **values, **setting_of(r), "seed": r.seed,
                                    "out_dir": str(r.folder)}))
               for r in runs]
    for model_cfg, train_cfg in configs:
        check_threads(train_cfg)
        check_compile(train_cfg)
        split_plan(model_cfg, train_cfg, resolve_device(train_cfg.device), 1,
                   train_cfg.threads or torch.get_num_threads())
        check_optimizer(model_cfg, train_cfg)
    for name in runs[0].setting:
        if not any(read_by(train_cfg.lr_schedule, name) for _, train_cfg in configs):
            schedules = sorted({train_cfg.lr_schedule for _, train_cfg in configs})
            readers = READ_BY_SCHEDULES[name]
            fix = ("add one to the lr_schedule axis" if "lr_schedule" in runs[0].setting
                   else "set --lr_schedule to one, or sweep lr_schedule too")
            raise UserError(f"the axis {name}: lr_schedule={','.join(schedules)} does not read it, so the "
                            f"runs would train alike; only {', '.join(readers)} read{'s' * (len(readers) == 1)} "
                            f"it: {fix}")
        if not any(read_by_optimizer(train_cfg.optimizer, name) for _, train_cfg in configs):
            raise UserError(f"the axis {name}: optimizer={train_cfg.optimizer} does not read it, so the runs "
                            f"would train alike; only {', '.join(READ_BY_OPTIMIZERS[name])} reads it: set "
                            "--optimizer to it, or sweep optimizer too")
    return configs


# what may differ between a run's starts without changing what is compared: where and how fast it
# runs (flush_denormal changes only values below float32's smallest normal, thread_split the order
# of sums and muon_dtype the rounding of Muon's iteration, yet after many steps the losses drift within
# seed noise; runs older than these fields never flushed or split, and iterated in bfloat16); the folder
# is the run's own; stop_hopeless and pause_at only end a run early, which its status records, and
# eval_train only sets which losses an evaluation writes
NOT_COMPARED = {"out_dir", "vocab_size", "threads", "flush_denormal", "thread_split", "muon_dtype", "resume",
                "overwrite", "adopt_checkpoint", "wandb", "wandb_project", "wandb_run_name", "wandb_group",
                "wandb_job_type", "wandb_tags", "stop_hopeless", "pause_at", "eval_train"}
# a tuning run's evaluations (tune_evals) only set which rows it writes: sweeps from before it evaluated more
TUNING_NOT_COMPARED = {"eval_interval", "diagnostics"}
# those of them that set a run's speed: tokens/s compares runs alike only where they agree (a sweep
# run again with another --jobs gives its new runs other threads)
SPEED = ("flush_denormal", "threads", "thread_split", "muon_dtype")


def changed_settings(run: SweepRun, model_cfg: GPTConfig, train_cfg: TrainConfig) -> list[str]:
    """How the run already in run.folder (its config.json, one line per setting) differs from the
    configs the sweep would give it now: reusing it would report old results as new ones."""
    path = run.folder / "config.json"
    if not path.exists():
        return []
    record = read_json(path, RUN_RECORD)
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
            if section == "train" and not (read_by_optimizer(before.optimizer, f.name)
                                           or read_by_optimizer(cfg.optimizer, f.name)):
                continue
            if f.name == "eval_batch_size":     # 0 means batch_size: the windows are what counts
                old, new = old or before.batch_size, cfg.eval_batch_size or cfg.batch_size
                if old != new:
                    changed.append(f"eval_batch_size={old} in the run, {new} now")
                continue
            if run.stage == "tune" and f.name in TUNING_NOT_COMPARED:
                continue
            if f.name not in NOT_COMPARED and old != getattr(cfg, f.name):
                changed.append(f"{f.name}={shown(old)} in the run, {shown(getattr(cfg, f.name))} now")
    return changed


def finished_by_checkpoint(run: SweepRun, max_iters: int) -> bool:
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



# ---------------------------------------------------------------- report

# what to do about a damaged file: the sweep writes its sweep.json and a run's result.json again;
# a run's config.json is written by the run as it starts
REWRITTEN = "remove it, and the sweep's command writes it again"
RUN_RECORD = "move the run's folder away, and the sweep's command trains it again"


def read_json(path: Path, fix: str = REWRITTEN) -> dict:
    try:
        data = json.loads(path.read_text())
    except OSError as e:
        raise UserError(f"cannot read {path} ({e.strerror or e})") from None
    except json.JSONDecodeError as e:
        raise UserError(f"{path} is damaged ({e}); {fix}") from None
    if not isinstance(data, dict):
        raise UserError(f"{path} does not hold a JSON object; {fix}")
    return data


def evals_of(folder: Path) -> list[dict]:
    path = folder / "metrics.jsonl"
    return [r for r in read_jsonl(path) if r["kind"] == "eval"] if path.exists() else []


def final_eval(folder: Path) -> dict | None:
    evals = evals_of(folder)
    return evals[-1] if evals else None


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


