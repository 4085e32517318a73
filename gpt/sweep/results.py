"""A sweep's results as read from its run folders: one row per run, and the runs recorded as
finished whose metrics.jsonl does not show it."""

from __future__ import annotations

import math
import statistics
import sys
from pathlib import Path

from ..config import REPO_ROOT
from ..data import bpc, load_meta, per_character
from ..errors import UserError
from ..train.metrics import read_metrics
from ..train.rundir import listed_in
from .compute import compute
from .grid import RUN_RECORD, SweepRun, as_text, axis_names, read_json, setting_label
from .tune import Plan, plan


def per_character_run(evals: list[dict], record: dict) -> bool:
    """Whether a run's losses are per character (or byte): its evaluations say so with val_bpc, or,
    for a run older than that, its dataset's meta.json does, where it can still be read."""
    if any("val_bpc" in e for e in evals):
        return True
    train = record.get("train") if isinstance(record.get("train"), dict) else {}
    if not (evals and isinstance(train.get("data_dir"), str) and isinstance(train.get("dataset"), str)):
        return False
    folder = REPO_ROOT / train["data_dir"] / train["dataset"]     # older records: from the repository root
    try:
        return (folder / "meta.json").is_file() and per_character(load_meta(folder))
    except UserError:
        return False


def evaluations(folder: Path) -> tuple[list[dict], dict[int, str] | None]:
    """A run's evaluations and the lines of its metrics.jsonl left out (None: it has none), each
    of those said on stderr as it is read."""
    path = folder / "metrics.jsonl"
    if not path.exists():
        return [], None
    log = read_metrics(path)
    for problem in log.problems():
        print(problem, file=sys.stderr)
    return [r for r in log.rows if r["kind"] == "eval"], log.skipped


# a run recorded as finished whose metrics.jsonl does not show it: in no mean or curve
LEFT_OUT = "left out"


def unfinished(row: dict, skipped: dict[int, str] | None) -> str | None:
    """Why a run recorded as finished is not one the tables can count: lines of its metrics.jsonl
    were left out, or its last evaluation is not at its max_iters (the file was cut short)."""
    if row["status"] != "finished" or row["diverged"]:    # diverged runs are counted apart already
        return None
    if skipped:
        numbers = [str(n) for n in skipped]
        shown = ", ".join(numbers[:3]) + (f" and {len(numbers) - 3} more" if len(numbers) > 3 else "")
        return f"line{'s' * (len(numbers) > 1)} {shown} of its metrics.jsonl could not be read"
    max_iters = row["_config"].get("max_iters")
    if type(max_iters) is not int:      # no run's config.json to check against
        return None
    if not row["_evals"]:
        return "its metrics.jsonl holds no evaluation" if skipped is not None else "it has no metrics.jsonl"
    last = row["_evals"][-1]["iter"]
    if last == max_iters:
        return None
    return f"its metrics.jsonl ends at iteration {last}, not at its max_iters {max_iters}"


def read_sweep(out_dir: Path) -> dict:
    """The sweep's description, sweep.json, checked."""
    path = Path(out_dir) / "sweep.json"
    if not path.exists():
        raise UserError(f"{path} does not exist; is {out_dir} a sweep folder?")
    sweep = read_json(path)
    if not ({"axes", "seeds", "base_seed", "command"} <= sweep.keys() and isinstance(sweep["axes"], dict)
            and all(isinstance(v, list) for v in sweep["axes"].values())
            and all(type(sweep[k]) is int for k in ("seeds", "base_seed"))
            and isinstance(sweep.get("tune", {}), dict)
            and all(isinstance(v, list) and len(v) > 1 for v in sweep.get("tune", {}).values())):
        raise UserError(f"{path} is not a sweep description; run the sweep again to rewrite it")
    return sweep


def collect(out_dir: Path) -> tuple[dict, list[dict], Plan]:
    """The sweep's description, one row per run (the runs the tables compare: for a tuned sweep,
    those at each setting's chosen value; then a tuned sweep's tuning runs, their _stage "tune"),
    and the plan they were read by, whose tunings the report and status read too."""
    sweep = read_sweep(out_dir)
    current = plan(sweep, Path(out_dir))
    names = axis_names(sweep["axes"])
    rows = [run_row(r, names, list(sweep.get("tune", {}))) for r in current.confirm_runs + current.tuning_runs]
    return sweep, rows, current


def run_row(r: SweepRun, names: list[str], tuned: list[str]) -> dict:
    """A run's row: its settings and seed, its final and best losses, speed and status, and (keys
    with _) what the report reads beyond the table."""
    evals, skipped = evaluations(r.folder)
    config_path = r.folder / "config.json"
    record = read_json(config_path, RUN_RECORD) if config_path.exists() else {}
    result_path = r.folder / "result.json"
    result = read_json(result_path) if result_path.exists() else {}
    final = evals[-1] if evals else {}
    speeds = [e["tokens_per_sec"] for e in evals if e.get("tokens_per_sec")]
    shares = [e["cpu_share"] for e in evals if isinstance(e.get("cpu_share"), (int, float))]
    val = final.get("val_loss", math.nan)
    best = min((e["val_loss"] for e in evals if math.isfinite(e["val_loss"])), default=math.nan)
    in_bpc = per_character_run(evals, record)
    # an axis the run does not read (muon_lr under AdamW) is left empty
    values = {k: as_text(r.setting[k]) if k in r.setting else "" for k in names}
    config = {k: v for section in ("model", "train") if isinstance(record.get(section), dict)
              for k, v in record[section].items()}      # the run's settings, in one table
    row = {**values, **{k: r.tuned.get(k, "") for k in tuned}, "seed": r.seed,
           "final_train_loss": final.get("train_loss", math.nan), "final_val_loss": val, "best_val_loss": best,
           "per_character": in_bpc, "final_val_bpc": bpc(val) if in_bpc else math.nan,
           "best_val_bpc": bpc(best) if in_bpc else math.nan,
           "tokens_per_sec": statistics.median(speeds) if speeds else math.nan,
           "cpu_share": statistics.median(shares) if shares else math.nan,
           "elapsed_s": final.get("elapsed_s", math.nan),   # training time, across resumes
           "diverged": result.get("status") == "diverged" or (bool(evals) and not math.isfinite(val)),
           "status": result.get("status", "not run"),
           "code": " ".join(listed_in(record)) or "unknown",
           "ran_as": "; ".join(listed_in(record, "ran_as")),
           **compute(config, evals),
           "_config": config, "_setting": setting_label(r.setting), "_evals": evals, "_folder": r.folder,
           "_values": values,      # the axes' values, for the figures
           "_tuned": r.tuned, "_stage": r.stage, "_setting_values": r.setting, "_read": skipped is not None}
    row["_left_out"] = unfinished(row, skipped)
    if row["_left_out"]:
        row["status"] = LEFT_OUT
    return row
