"""Measure a study as its user waits for it: where its wall time goes, and its FLOP rate.

    python benchmarks/study_cost.py [--config sweeps/tuned/cost] [--steps N] [--seeds N] [--jobs N]
                                    [--keep] [--json PATH] [--name=value ...]

It runs the study with `python train.py --config NAME` into a scratch folder, as a user would, and
times it whole. Then, from what the runs wrote (result.json's start and wall time, metrics.jsonl's
timing line and first step), it splits the run slots' time (the wall time times --jobs) into:
start-up (process, imports, data, model build, the run-time estimate, the first step), training
steps, evaluations (with their diagnostics and checkpoint saves), each run's ending (process exit,
the sweep noticing it), the report (from the last run's end to the study's), the sweep's own start
(before its first run) and what is left (gaps between runs, slots idle while a tuned study waits
for the results that choose its next runs). It gives the study's model FLOPs per second (each run's FLOPs
per token times the tokens it trained, over the wall time) as a fraction of the matmul peak
gpt.bench measures here and of one run of the study's first setting (at its first tuned value)
trained alone in this process on all its threads, timed steps only. Runs whose threads got less
than 80% of their CPU time (cpu_share) are named: their cores were shared.

--steps scales warmup_iters, lr_decay_iters and eval_interval with max_iters. Any other
--name=value is given to the study's train.py; those this script sets (SET_HERE) are refused.
"""

from __future__ import annotations

import argparse
import math
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))   # this project's package and train.py, also from a clone not installed
from gpt.bench import BenchConfig, peak_flops, time_training  # noqa: E402
from gpt.cli import parse_argv  # noqa: E402
from gpt.config import GPTConfig, SweepConfig, TrainConfig, build  # noqa: E402
from gpt.console import Parser, to_json  # noqa: E402
from gpt.data import load_meta  # noqa: E402
from gpt.errors import UserError  # noqa: E402
from gpt.speed.precision import matmul_precision  # noqa: E402
from gpt.sweep.comparisons import CONTENDED  # noqa: E402
from gpt.sweep.grid import read_json, settings_of  # noqa: E402
from gpt.sweep.results import collect  # noqa: E402
from gpt.train.metrics import read_jsonl  # noqa: E402
from gpt.train.runtime import autocast_dtype, resolve_device  # noqa: E402

CONFIG = "sweeps/tuned/cost"
SET_HERE = ("out_dir", "max_iters", "seeds", "jobs", "resume", "overwrite", "launcher")
SINGLE = BenchConfig(bench_iters=50, bench_warmup=10)     # the run alone: steps timed, and untimed before
# the parts of the run slots' time, in the table's order, with what each holds
PARTS = {"start_up": "start-up (process, imports, data, model, estimate, first step)",
         "steps": "training steps",
         "evaluations": "evaluations (with diagnostics and checkpoint saves)",
         "run_ending": "runs' ending (process exit, the sweep noticing)",
         "report": "the report (from the last run's end to the study's)",
         "sweep_start": "the sweep's start (before its first run)",
         "left": "left (gaps between runs, slots waiting for tuning results)"}


def study_argv(config: str, values: dict, knobs: argparse.Namespace, extra: list[str], out_dir: Path) -> list[str]:
    """The study's `python train.py` command: the config, the size knobs given, the options given."""
    given = {a[2:].partition("=")[0] for a in extra if a.startswith("--")}
    argv = [sys.executable, str(ROOT / "train.py"), "--config", config, f"--out_dir={out_dir}"]
    if knobs.steps is not None:     # the schedule and evaluations keep their places in the run
        cfg = build(TrainConfig, values)
        scaled = {"warmup_iters": round(cfg.warmup_iters * knobs.steps / cfg.max_iters),
                  "lr_decay_iters": max(1, round(cfg.lr_decay_iters * knobs.steps / cfg.max_iters)),
                  "eval_interval": max(1, round(cfg.eval_interval * knobs.steps / cfg.max_iters))}
        argv += [f"--max_iters={knobs.steps}", *(f"--{k}={v}" for k, v in scaled.items() if k not in given)]
    argv += [f"--{name}={getattr(knobs, name)}" for name in ("seeds", "jobs") if getattr(knobs, name) is not None]
    return argv + extra


def run_study(argv: list[str], folder: Path) -> tuple[float, float]:
    """Run the study, its output in folder/output.txt; its start and end (seconds since the epoch).
    Exits with the study's last line and status if it fails."""
    output = folder / "output.txt"
    with open(output, "w") as out:
        start = time.time()
        code = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT).returncode
        end = time.time()
    if code != 0:
        lines = output.read_text(errors="replace").strip().splitlines() or [f"the study exited with status {code}"]
        print(f"study: {lines[-1]}", file=sys.stderr)
        raise SystemExit(code)
    return start, end


def run_parts(folder: Path) -> dict:
    """One run's seconds in each part, from its result.json and its metrics.jsonl's timing lines
    (one per process: a run paused at halving's rung and resumed has two), with the first step (the
    train line at iteration 0) counted as start-up; and its first start and its end."""
    result = read_json(folder / "result.json")
    rows = read_jsonl(folder / "metrics.jsonl")
    timing = [r for r in rows if r["kind"] == "timing"]
    starts = result.get("starts") or [[result.get("started"), result.get("wall_s")]]
    if len(timing) != len(starts) or not all(isinstance(s, (int, float)) and w for s, w in starts):
        raise UserError(f"{folder} holds no timing line and start time for each of its processes; was it "
                        "trained by this code?")
    first = next((r["ms"] / 1000 for r in rows if r["kind"] == "train" and r["iter"] == 0), 0.0)
    return {"start_up": sum(t["loop_start"] - s for t, (s, _) in zip(timing, starts)) + first,
            "steps": sum(t["steps_s"] for t in timing) - first, "evaluations": sum(t["evals_s"] for t in timing),
            "run_ending": sum(s + w - t["loop_start"] - t["steps_s"] - t["evals_s"]
                              for t, (s, w) in zip(timing, starts)),
            "_started": starts[0][0], "_end": starts[-1][0] + starts[-1][1]}


def breakdown(out_dir: Path, start: float, end: float, jobs: int) -> dict:
    """The study's wall time, the run slots' seconds and share in each part, its model FLOPs, and
    its runs measured under contention."""
    _, rows, _ = collect(out_dir)
    runs = [run_parts(r["_folder"]) for r in rows]
    wall, slots = end - start, jobs * (end - start)
    seconds = {name: sum(r[name] for r in runs) for name in ("start_up", "steps", "evaluations", "run_ending")}
    seconds["report"] = jobs * (end - max(r["_end"] for r in runs))
    seconds["sweep_start"] = jobs * (min(r["_started"] for r in runs) - start)
    seconds["left"] = slots - sum(seconds.values())
    contended = [{"run": str(r["_folder"].relative_to(out_dir)), "cpu_share": r["cpu_share"]}
                 for r in rows if r["cpu_share"] < CONTENDED]
    return {"wall_s": wall, "jobs": jobs, "runs": len(rows), "tuning_runs": sum(r["_stage"] == "tune" for r in rows),
            "slot_s": slots, "seconds": seconds, "shares": {k: v / slots for k, v in seconds.items()},
            "flops": sum(r["total_flops"] for r in rows if math.isfinite(r["total_flops"])),
            "contended": contended}


def single_run(values: dict, axes: dict, grids: dict) -> dict:
    """The study's first setting at its first tuned value, trained alone in this process: its model
    FLOPs per second over its timed steps, and the measured matmul peak of its dtype."""
    values = {**values, **settings_of(axes)[0], **{name: grid[0] for name, grid in grids.items()}}
    model_cfg, cfg = build(GPTConfig, values), build(TrainConfig, values)
    cfg = build(TrainConfig, {**vars(cfg), "threads": 0})   # all of this process's threads, as one run alone
    timed = time_training(model_cfg, cfg, SINGLE)
    vocab = load_meta(Path(cfg.data_dir) / cfg.dataset)["vocab_size"]
    per_token = build(GPTConfig, {**vars(model_cfg), "vocab_size": vocab}).flops_per_token()
    device = resolve_device(cfg.device)
    with matmul_precision(cfg.matmul_precision, device.split(":")[0]):     # as the runs' matmuls ran
        peak, source = peak_flops(device, autocast_dtype(cfg, device))
    return {"single_tokens_per_s": timed["tokens_per_sec"], "single_flops_per_s": per_token * timed["tokens_per_sec"],
            "single_cpu_share": timed.get("cpu_share", math.nan), "peak_flops_per_s": peak, "peak_source": source}


def table(r: dict) -> str:
    """The breakdown and the two fractions, as lines."""
    lines = [f"study: {r['runs']} runs ({r['tuning_runs']} tuning), {r['jobs']} at a time; wall time "
             f"{r['wall_s']:.1f} s; run slots' time (wall time x {r['jobs']}) {r['slot_s']:.1f} s"]
    width = max(len(text) for text in PARTS.values())
    lines += [f"  {PARTS[k]:<{width}}  {100 * r['shares'][k]:5.1f}%  {r['seconds'][k]:7.1f} s" for k in PARTS]
    lines.append(f"model FLOP/s of the study over its wall time: {r['flops_per_s'] / 1e12:.4f} TFLOP/s")
    lines.append(f"  {100 * r['fraction_of_peak']:.1f}% of the peak, {r['peak_flops_per_s'] / 1e12:.3f} TFLOP/s "
                 f"({r['peak_source']})")
    share = r["single_cpu_share"]
    lines.append(f"  {100 * r['fraction_of_single_run']:.1f}% of one run alone, "
                 f"{r['single_flops_per_s'] / 1e12:.4f} TFLOP/s ({r['single_tokens_per_s']:,.0f} tokens/s, "
                 f"timed steps" + (f", cpu_share {share:.2f})" if math.isfinite(share) else ")"))
    busy, notes = r["contended"], []
    if busy:
        notes.append(f"{len(busy)} of {r['runs']} runs got less than {CONTENDED:.0%} of their threads' CPU time "
                     "(cpu_share): " + ", ".join(f"{c['run']} ({c['cpu_share']:.2f})" for c in busy[:5])
                     + (f" and {len(busy) - 5} more" if len(busy) > 5 else ""))
    if share < CONTENDED:
        notes.append(f"the run alone got {share:.2f} of its threads' CPU time")
    if notes:
        lines.append("contention: " + "; ".join(notes) + "; the machine was shared: its rates, and their "
                     "ratio, are not what it gives alone")
    return "\n".join(lines)


def checked(parser: Parser, args: argparse.Namespace, extra: list[str]):
    """The study's parsed command line and its jobs, once the flags and options are valid; a bad one
    exits in one line."""
    for name in ("steps", "seeds", "jobs"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            parser.error(f"--{name}={getattr(args, name)} must be at least 1")
    for name in (a[2:].partition("=")[0] for a in extra if a.startswith("--")):
        if name in SET_HERE:
            parser.error(f"--{name}: this script sets it (use --steps, --seeds or --jobs for the study's size)")
    if args.json and (Path(args.json).is_dir() or not Path(args.json).resolve().parent.is_dir()):
        parser.error(f"--json {args.json}: not a file in an existing folder")   # before minutes of study
    knobs = [f"--{name}={getattr(args, name)}" for name in ("seeds", "jobs") if getattr(args, name) is not None]
    study = parse_argv(["--config", args.config, *extra, *knobs])
    sweep_cfg = build(SweepConfig, study.values)
    if not (study.sweep or study.tune or sweep_cfg.seeds > 1):
        raise UserError(f"--config {args.config} is one run, not a study; give a sweep config, e.g. {CONFIG}")
    return study, sweep_cfg.jobs


def main(argv: list[str] | None = None) -> int:
    parser = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=CONFIG, help="the study, a sweep config")
    parser.add_argument("--steps", type=int, help="steps per run; default: the config's max_iters")
    parser.add_argument("--seeds", type=int, help="seeds per setting; default: the config's")
    parser.add_argument("--jobs", type=int, help="runs at once; default: the config's")
    parser.add_argument("--keep", action="store_true", help="keep the study's folder, and say where it is")
    parser.add_argument("--json", metavar="PATH", help="write the figures to PATH as JSON too")
    args, extra = parser.parse_known_args(argv)
    folder = None
    try:
        study, jobs = checked(parser, args, extra)
        folder = Path(tempfile.mkdtemp(prefix="study_cost_"))
        command = study_argv(args.config, study.values, args, extra, folder / "study")
        print(f"running the study: python {' '.join(command[1:])}", file=sys.stderr, flush=True)
        start, end = run_study(command, folder)
        result = {"command": " ".join(["python", *command[1:]]), **breakdown(folder / "study", start, end, jobs)}
        print("timing one run of its first setting alone", file=sys.stderr, flush=True)
        result.update(single_run(study.values, study.sweep, study.tune))
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted; nothing was measured", file=sys.stderr)
        return 130
    finally:
        if folder and args.keep:
            print(f"the study's folder, kept: {folder / 'study'} (its output: {folder / 'output.txt'})",
                  file=sys.stderr)
        elif folder:
            shutil.rmtree(folder, ignore_errors=True)
    result["flops_per_s"] = result["flops"] / result["wall_s"]
    result["fraction_of_peak"] = result["flops_per_s"] / result["peak_flops_per_s"]
    result["fraction_of_single_run"] = result["flops_per_s"] / result["single_flops_per_s"]
    print(table(result))
    if args.json:
        Path(args.json).write_text(to_json(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
