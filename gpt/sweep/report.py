"""A sweep's report: the runs' results collected, compared over seeds, and written as tables and figures."""

from __future__ import annotations

import csv
import json
import math
import statistics
import sys
from pathlib import Path

from .. import checkpoint
from ..config_files import shown
from ..config import TrainConfig, read_by, user_path
from ..data import bpc
from ..errors import UserError, say_error
from .comparisons import (compute_section, crossings_text, diagnostics_table, size_section, steps_to_baseline,
                          tuning_section, within_level_rows, within_level_section)
from .compute import COLUMNS
from .grid import DONE, NOT_COMPARED, SPEED, axis_names, by_setting, counted
from .study_plots import has_size, plot_lr, plot_size, size_fits
from .tune import point_label
from .stats import compare, finals, holm, matched, verdict, welch_p
from .plots import plot, plot_diagnostics
from .results import LEFT_OUT, collect
from .status import main as follow
from .trend import main as trend_main


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



def versus(base: dict, s: dict, p: float | None = None) -> str:
    """A setting's mean final loss against the baseline's: better or worse where p, its
    Holm-adjusted p among the study's comparisons, is under ALPHA, else within noise. Without p,
    its own Welch p: a study of one comparison."""
    diff = s.get("diff", s["mean"] - base["mean"])
    return verdict(diff, welch_p(base, s) if p is None else p)


def summarize(rows: list[dict]) -> list[dict]:
    """One row per setting: final val loss mean and std over seeds, and how it compares with the
    first setting (the baseline): the paired t-test over seeds where the runs of one seed train on
    the same batches, else Welch's; a run that diverged counts at the unigram loss in the test.
    The p of each and its Holm-adjusted p over the study's comparisons."""
    out, groups = [], by_setting(rows)
    for label, group in groups.items():
        ran = [r for r in group if r["status"] in DONE]
        finite = [r["final_val_loss"] for r in counted(group) if math.isfinite(r["final_val_loss"])]
        diverged = sum(r["diverged"] for r in group)
        out.append({"setting": label, "runs": len(ran), "diverged": diverged,
                    "unstable": 0 < diverged < len(ran), "failed": sum(r["status"] == "failed" for r in group),
                    "left_out": sum(r["status"] == LEFT_OUT for r in group),
                    "per_character": any(r["per_character"] for r in group),
                    "mean": statistics.fmean(finite) if finite else math.nan,
                    "std": statistics.stdev(finite) if len(finite) > 1 else math.nan,
                    "n": len(finite), "_finals": finals(group), "_group": group,
                    "tuned": group[0].get("_tuned", {})})
    base = out[0] if out else None
    tested = []
    for s in out:
        s["p"] = s["p_holm"] = math.nan
        s["test"] = ""
        if s is base:
            s["vs_baseline"] = "baseline"
        elif not s["n"] and not s["_finals"]:
            s["vs_baseline"] = "no result"
        elif not base["n"] and not base["_finals"]:
            s["vs_baseline"] = "baseline has no result"
        elif (c := compare(base["_finals"], s["_finals"], matched(base["_group"], s["_group"]))) is None:
            s["vs_baseline"] = "needs 2+ seeds"
        else:
            s.update(p=c["p"], test=c["test"], diff=c["diff"], low=c["low"], high=c["high"])
            tested.append(s)
    # the study's comparisons are one family: its verdicts hold together at ALPHA
    for s, p in zip(tested, holm([s["p"] for s in tested])):
        s["p_holm"] = p
        s["vs_baseline"] = versus(base, s, p)
    return out


def mean_std(mean: float, std: float) -> str:
    if not math.isfinite(mean):
        return "—"
    return f"{mean:.3f} ± {std:.3f}" if math.isfinite(std) else f"{mean:.3f}"


def summary_table(summary: list[dict]) -> str:
    """The settings' final val loss and, where a setting's runs are per character, its bits per
    character beside it (loss / ln 2: the mean and std are the loss's over ln 2)."""
    in_bpc = any(s["per_character"] for s in summary)
    tuned = any(s["tuned"] for s in summary)
    head = ["setting", "runs", *["chosen value"] * tuned, "final val loss (mean ± std)",
            *["final val bpc (mean ± std)"] * in_bpc, "diverged", "vs baseline"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for s in summary:
        apart = [f"{s[key]} {key.replace('_', ' ')}" for key in ("failed", "left_out") if s[key]]
        runs = f"{s['runs']} ({', '.join(apart)})" if apart else str(s["runs"])
        bpc_cell = mean_std(bpc(s["mean"]), bpc(s["std"])) if s["per_character"] else "—"
        diverged = f"{s['diverged']} (unstable)" if s["unstable"] else s["diverged"]
        cells = [s["setting"], runs, *[point_label(s["tuned"])] * tuned, mean_std(s["mean"], s["std"]),
                 *[bpc_cell] * in_bpc, diverged, s["vs_baseline"]]
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    return "\n".join(lines)


def shown_p(p: float) -> str:
    return "< 0.001" if p < 0.001 else f"{p:.3f}"


def interval(s: dict) -> str:
    return f"{s['low']:+.3f} to {s['high']:+.3f}"


def against_baseline(summary: list[dict]) -> str:
    """What 'worse' and 'better' mean, and each tested setting's difference from the baseline with
    its 95% confidence interval, the test that gave its p, and its Holm-adjusted p."""
    said = ("Baseline: the first setting. 'worse/better' means a t-test (two-sided) over the seeds finds the "
            "means differ: the paired one over the per-seed differences where runs of one seed train on the "
            "same batches (the same seed, batch_size, block_size and gradient_accumulation_steps), else "
            "Welch's; with one seed there is no noise estimate.")
    if any(s["unstable"] for s in summary):
        said += (" A setting marked unstable diverged on some seeds: its diverged runs count at the unigram "
                 "loss in its test, so it is not judged on its survivors (its mean ± std is theirs alone).")
    tested = [s for s in summary if math.isfinite(s["p"])]
    if not tested:
        return said
    m = len(tested)
    held = (f"{m} comparisons with the baseline are held together" if m > 1
            else "1 comparison with the baseline is held")
    said += (f"\n\nThe {held} to a family-wise error of 5% (Holm–Bonferroni): a setting is 'worse' or 'better' "
             "only where its Holm-adjusted p is under 0.05.")
    lines = ["| setting | difference | 95% CI | test | p | Holm-adjusted p |", "|---|---|---|---|---|---|"]
    lines += [f"| {s['setting']} | {s['diff']:+.3f} | {interval(s)} | {s['test']} | {shown_p(s['p'])} "
              f"| {shown_p(s['p_holm'])} |" for s in tested]
    return said + "\n\n" + "\n".join(lines)


def runs_read(rows: list[dict]) -> str:
    """How many runs' metrics.jsonl the report read, and each run it left out and why, which it
    says on stderr too."""
    left_out = [r for r in rows if r["status"] == LEFT_OUT]
    for r in left_out:
        print(f"{r['_folder']}: left out of the means and curves: {r['_left_out']}", file=sys.stderr)
    read = sum(r["_read"] for r in rows)
    said = f"{read} run{'s' * (read != 1)} read"
    if not left_out:
        return said + "."
    return (f"{said}; {len(left_out)} left out of the means and curves, though recorded as finished: "
            + "; ".join(f"{r['_folder'].name} ({r['_left_out']})" for r in left_out) + ".")


def uneven_evaluations(rows: list[dict], axes) -> list[str]:
    """Runs that scored the train split at other evaluations than most (eval_train); runs of code
    before eval_train scored it at every evaluation, as true does."""
    return odd_runs([{**r, "_config": {"eval_train": True, **r["_config"]}} for r in rows], axes, ("eval_train",))


def notes(rows: list[dict], axes: list[str]) -> str:
    """What the table's reader should know of the runs: odd settings, speeds that do not compare,
    settings that ran alike, failed runs, a partial sweep, runs of older code."""
    table = runs_read(rows)
    odd = odd_runs(rows, axes)
    if odd:
        table += ("\n\nRuns whose settings differ from the rest of the sweep beyond its axes, averaged "
                  "in above: " + "; ".join(odd) + ".")
    slower = odd_runs(rows, axes, SPEED)
    if slower:
        table += ("\n\nRuns that ran with other speed settings than the rest, so their tokens/s in "
                  "sweep.csv does not compare alike: " + "; ".join(slower) + ".")
    uneven = uneven_evaluations(rows, axes)
    if uneven:
        table += ("\n\nRuns that scored the train split at other evaluations than the rest (eval_train), so "
                  "their seconds of training, which count their evaluations, compare a few percent unevenly "
                  "(the compute table's time column, --x=seconds): " + "; ".join(uneven) + ".")
    alike = ran_alike(rows, axes)
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
    return table


def partial(rows: list[dict], tunings: list) -> str:
    """A line for a sweep not yet whole: runs without a result, settings still tuning."""
    said = ""
    missing = [r for r in rows if r["status"] == "not run"]
    if missing:     # a sweep whose jobs still run: its means are of the runs ended so far
        said = (f"Partial: {len(rows) - len(missing)} of {len(rows)} runs have a result; {len(missing)} are "
                "queued, running or not started yet.\n\n")
    tuning = sum(t.chosen is None for t in tunings)
    if tuning:
        said += (f"Partial: {tuning} of {len(tunings)} settings are still tuning, so they are not in the "
                 "tables yet; the sweep's command trains the rest.\n\n")
    return said


def write_csv(path: Path, rows: list[dict], columns: list[str]) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)


def report(out_dir: Path, x: str = "steps") -> str:
    """Write sweep.csv, summary.md, curves.png (val loss against x: steps, flops or seconds) and
    diagnostics.png into out_dir, and for a tuned sweep tuning.csv and lr.png, for a sweep with a
    size axis size.png; print and return the summary table."""
    out_dir = Path(out_dir)
    sweep, every, current = collect(out_dir)
    rows = [r for r in every if r["_stage"] == "confirm"]
    tuning_rows = [r for r in every if r["_stage"] == "tune"]
    tunings = current.tunings
    names = axis_names(sweep["axes"])
    in_bits = ["final_val_bpc", "best_val_bpc"] if any(r["per_character"] for r in rows) else []
    columns = [*names, *sweep.get("tune", {}), "seed", "final_train_loss", "final_val_loss", "best_val_loss",
               *in_bits, "tokens_per_sec", "cpu_share", "elapsed_s", *COLUMNS, "diverged", "status", "code", "ran_as"]
    summary = summarize(rows)
    table = partial(rows, tunings) + summary_table(summary) + "\n\n" + notes(rows, [*names, *sweep.get("tune", {})])
    levels = within_level_rows(sweep["axes"], summary)
    sections = {"Tuning": tuning_section(sweep, tunings, tuning_rows),
                "Within each level": within_level_section(sweep["axes"], levels),
                "Across sizes": size_section(sweep["axes"], levels) + (crossings_text(size_fits(sweep["axes"], summary)[2])
                                                                      if has_size(sweep["axes"]) else ""),
                "At equal compute": compute_section(summary),
                "Steps to the baseline's loss": steps_to_baseline(rows),
                "Diagnostics at the final evaluation": diagnostics_table(rows)}
    figures = ["curves.png", "diagnostics.png", *["lr.png"] * bool(tunings), *["size.png"] * has_size(sweep["axes"])]
    try:
        write_csv(out_dir / "sweep.csv", rows, columns)
        if tunings:
            write_csv(out_dir / "tuning.csv", tuning_rows, columns)
        (out_dir / "summary.md").write_text(
            f"# Sweep {out_dir.name}\n\n`{sweep['command']}`\n\n{table}\n\n{against_baseline(summary)}\n\n"
            + "".join(f"## {title}\n\n{text}\n\n" for title, text in sections.items()
                      if text or title.startswith("Diagnostics")).removesuffix("\n"), encoding="utf-8")
        plot(rows, out_dir / "curves.png", x)
        plot_diagnostics(rows, out_dir / "diagnostics.png")
        if tunings:
            plot_lr(sweep, tunings, tuning_rows, out_dir / "lr.png")
        if has_size(sweep["axes"]):
            plot_size(sweep["axes"], summary, out_dir / "size.png")
    except OSError as e:    # a read-only copy, a full disk: the table is still worth printing
        print(table)
        where = e.filename or out_dir     # matplotlib's own errors may not name the file
        raise UserError(f"the report cannot be written to {where} ({e.strerror or e}); the table "
                        "is above") from None
    print(table)
    written = ["summary.md", "sweep.csv", *["tuning.csv"] * bool(tunings), *figures]
    print(f"\nwritten: {', '.join(str(out_dir / name) for name in written[:-1])} and {out_dir / written[-1]}")
    return table


X_AXES = ("steps", "flops", "seconds")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    usage = ("usage: python -m gpt.sweep report DIR [--x=steps|flops|seconds]\n"
             "       python -m gpt.sweep status DIR\n"
             "       python -m gpt.sweep cancel DIR\n"
             "       python -m gpt.sweep trend OUT.png DIR DIR [...]")
    if argv[:1] == ["trend"]:
        return trend_main(argv[1:])
    if {"-h", "--help"} & set(argv):
        print(f"{usage}\n\nreport writes DIR/sweep.csv, summary.md, curves.png and diagnostics.png (and a tuned "
              "sweep's tuning.csv and lr.png, a sized one's size.png) for the sweep in DIR;\n--x draws "
              "curves.png against steps (the default), model FLOPs or seconds of training.\nstatus shows a "
              "sweep's runs done, running, queued and failed (exit status 0 while some are queued or running);"
              "\ncancel cancels its queued and running jobs;\ntrend draws each setting's final loss against its "
              "parameters from the reports of one study run at several sizes.\n"
              "Sweeps run with: python train.py --config NAME --sweep name=v1,v2 ... [--tune name=v1,v2,...] "
              "[--launcher=slurm]")
        return 0
    x = next((a.removeprefix("--x=") for a in argv if a.startswith("--x=")), "steps")
    rest = [a for a in argv if not a.startswith("--x=")]
    if len(rest) != 2 or rest[0] not in ("report", "status", "cancel") or (len(rest) != len(argv) and rest[0] != "report"):
        print(usage, file=sys.stderr)
        return 2
    if rest[0] != "report":
        return follow(rest[0], rest[1])
    try:
        if x not in X_AXES:
            raise UserError(f"--x={x}: curves.png is drawn against {', '.join(X_AXES)}; give one of them")
        report(Path(user_path(rest[1], "DIR")), x)
    except UserError as e:
        say_error(e)
        return 2
    return 0
