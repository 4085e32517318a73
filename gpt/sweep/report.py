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
from .grid import DONE, NOT_COMPARED, SPEED, by_setting, counted
from .plots import plot, plot_diagnostics
from .results import LEFT_OUT, collect
from .status import main as follow


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



# the family-wise error of a study's comparisons with its baseline, all together
ALPHA = 0.05


def welch_p(base: dict, s: dict) -> float:
    """The two-sided p of Welch's t-test (unequal variances) of a setting's mean final loss
    against the baseline's, from each one's mean, std (n - 1) and number of seeds (2 or more)."""
    if s["std"] == 0 and base["std"] == 0:      # no spread at all: any difference is beyond it
        return 0.0 if s["mean"] != base["mean"] else 1.0
    from scipy import stats     # here: train.py imports this module, and SciPy takes a second to load
    return float(stats.ttest_ind_from_stats(s["mean"], s["std"], s["n"], base["mean"], base["std"],
                                            base["n"], equal_var=False).pvalue)


def holm(ps: list[float]) -> list[float]:
    """Holm–Bonferroni adjusted p-values: the smallest p times m, the next times m - 1 and so on,
    each at least the one before it and at most 1. Those under ALPHA hold the chance of any false
    'differs' among the m comparisons to ALPHA. (SciPy has no Holm; statsmodels, which has, is large.)"""
    adjusted, highest = [1.0] * len(ps), 0.0
    for rank, i in enumerate(sorted(range(len(ps)), key=ps.__getitem__)):
        highest = max(highest, min(1.0, (len(ps) - rank) * ps[i]))
        adjusted[i] = highest
    return adjusted


def versus(base: dict, s: dict, p: float | None = None) -> str:
    """A setting's mean final loss against the baseline's: better or worse where p, its
    Holm-adjusted p among the study's comparisons, is under ALPHA, else within noise. Without p,
    its own Welch p: a study of one comparison."""
    diff = s["mean"] - base["mean"]
    p = welch_p(base, s) if p is None else p
    return f"{'worse' if diff > 0 else 'better'} by {abs(diff):.3f}" if p < ALPHA else f"within noise ({diff:+.3f})"


def summarize(rows: list[dict]) -> list[dict]:
    """One row per setting: final val loss mean and std over seeds, and how it compares with the
    first setting (the baseline): Welch's p and its Holm-adjusted p where both have 2+ seeds."""
    out = []
    for label, group in by_setting(rows).items():
        ran = [r for r in group if r["status"] in DONE]
        finite = [r["final_val_loss"] for r in counted(group) if math.isfinite(r["final_val_loss"])]
        out.append({"setting": label, "runs": len(ran), "diverged": sum(r["diverged"] for r in group),
                    "failed": sum(r["status"] == "failed" for r in group),
                    "left_out": sum(r["status"] == LEFT_OUT for r in group),
                    "per_character": any(r["per_character"] for r in group),
                    "mean": statistics.fmean(finite) if finite else math.nan,
                    "std": statistics.stdev(finite) if len(finite) > 1 else math.nan,
                    "n": len(finite)})
    base = out[0] if out else None
    tested = []
    for s in out:
        s["p"] = s["p_holm"] = math.nan
        if s is base:
            s["vs_baseline"] = "baseline"
        elif not s["n"]:
            s["vs_baseline"] = "no result"
        elif not base["n"]:
            s["vs_baseline"] = "baseline has no result"
        elif s["n"] < 2 or base["n"] < 2:
            s["vs_baseline"] = "needs 2+ seeds"
        else:
            s["p"] = welch_p(base, s)
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
    head = ["setting", "runs", "final val loss (mean ± std)", *["final val bpc (mean ± std)"] * in_bpc,
            "diverged", "vs baseline"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for s in summary:
        apart = [f"{s[key]} {key.replace('_', ' ')}" for key in ("failed", "left_out") if s[key]]
        runs = f"{s['runs']} ({', '.join(apart)})" if apart else str(s["runs"])
        bpc_cell = mean_std(bpc(s["mean"]), bpc(s["std"])) if s["per_character"] else "—"
        cells = [s["setting"], runs, mean_std(s["mean"], s["std"]), *[bpc_cell] * in_bpc, s["diverged"],
                 s["vs_baseline"]]
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    return "\n".join(lines)


def shown_p(p: float) -> str:
    return "< 0.001" if p < 0.001 else f"{p:.3f}"


def against_baseline(summary: list[dict]) -> str:
    """What 'worse' and 'better' mean, and each tested setting's difference from the baseline with
    its Welch p and Holm-adjusted p."""
    said = ("Baseline: the first setting. 'worse/better' means Welch's t-test (two-sided) over the seeds "
            "finds the means differ; with one seed there is no noise estimate.")
    tested = [s for s in summary if math.isfinite(s["p"])]
    if not tested:
        return said
    m = len(tested)
    held = (f"{m} comparisons with the baseline are held together" if m > 1
            else "1 comparison with the baseline is held")
    said += (f"\n\nThe {held} to a family-wise error of 5% (Holm–Bonferroni): a setting is 'worse' or 'better' "
             "only where its Holm-adjusted p is under 0.05.")
    lines = ["| setting | difference | Welch's p | Holm-adjusted p |", "|---|---|---|---|"]
    lines += [f"| {s['setting']} | {s['mean'] - summary[0]['mean']:+.3f} | {shown_p(s['p'])} "
              f"| {shown_p(s['p_holm'])} |" for s in tested]
    return said + "\n\n" + "\n".join(lines)


def steps_to_baseline(rows: list[dict]) -> str:
    """Per setting, the first evaluation at which each seed's run reaches the final val loss of the
    baseline's run of the same seed: how many steps it takes to match the baseline (modded-nanogpt's
    measure of an optimizer); '—' where it never does. Empty for a sweep of one setting."""
    groups = list(by_setting(rows).values())
    base = {r["seed"]: r for r in counted(groups[0]) if math.isfinite(r["final_val_loss"])} if groups else {}
    lines = []
    for group in groups[1:]:
        cells = []
        for r in counted(group):
            if r["seed"] in base:
                target = base[r["seed"]]["final_val_loss"]
                cells.append(next((e["iter"] for e in r["_evals"] if e["val_loss"] <= target), None))
        reached = [c for c in cells if c is not None]
        mean = f"{statistics.fmean(reached):.0f}" if reached and len(reached) == len(cells) else "—"
        lines.append(f"| {group[0]['_setting']} | {', '.join('—' if c is None else str(c) for c in cells) or '—'} "
                     f"| {mean} |")
    if not lines or not base:
        return ""
    ends = sorted({r["_evals"][-1]["iter"] for r in base.values() if r["_evals"]})
    return ("| setting | step reaching the baseline's final val loss, per seed | mean |\n|---|---|---|\n"
            + "\n".join(lines) + f"\n\nThe baseline ends at step {', '.join(map(str, ends))}; each run is "
            "held to its own seed's baseline run, at its evaluations.")


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


def report(out_dir: Path) -> str:
    """Write sweep.csv, summary.md, curves.png and diagnostics.png into out_dir; print and
    return the summary table."""
    out_dir = Path(out_dir)
    sweep, rows = collect(out_dir)
    in_bits = ["final_val_bpc", "best_val_bpc"] if any(r["per_character"] for r in rows) else []
    columns = [*sweep["axes"], "seed", "final_train_loss", "final_val_loss", "best_val_loss", *in_bits,
               "tokens_per_sec", "elapsed_s", "diverged", "status", "code", "ran_as"]
    summary = summarize(rows)
    table = summary_table(summary) + "\n\n" + runs_read(rows)
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
    missing = [r for r in rows if r["status"] == "not run"]
    if missing:     # a sweep whose jobs still run: its means are of the runs ended so far
        table = (f"Partial: {len(rows) - len(missing)} of {len(rows)} runs have a result; {len(missing)} are "
                 "queued, running or not started yet.\n\n" + table)
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
            f"# Sweep {out_dir.name}\n\n`{sweep['command']}`\n\n{table}\n\n{against_baseline(summary)}\n\n"
            + (f"## Steps to the baseline's loss\n\n{reach}\n\n" if (reach := steps_to_baseline(rows)) else "")
            + f"## Diagnostics at the final evaluation\n\n{diagnostics_table(rows)}\n", encoding="utf-8")
        plot(rows, out_dir / "curves.png")
        plot_diagnostics(rows, out_dir / "diagnostics.png")
    except OSError as e:    # a read-only copy, a full disk: the table is still worth printing
        print(table)
        where = e.filename or out_dir     # matplotlib's own errors may not name the file
        raise UserError(f"the report cannot be written to {where} ({e.strerror or e}); the table "
                        "is above") from None
    print(table)
    print(f"\nwritten: {out_dir / 'summary.md'}, {out_dir / 'sweep.csv'}, {out_dir / 'curves.png'} and "
          f"{out_dir / 'diagnostics.png'}")
    return table


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    usage = ("usage: python -m gpt.sweep report DIR\n"
             "       python -m gpt.sweep status DIR\n"
             "       python -m gpt.sweep cancel DIR")
    if {"-h", "--help"} & set(argv):
        print(f"{usage}\n\nreport writes DIR/sweep.csv, summary.md, curves.png and diagnostics.png for the "
              "sweep in DIR.\nstatus shows a submitted sweep's runs done, running, queued and failed (exit "
              "status 0 while some are queued or running);\ncancel cancels its queued and running jobs.\n"
              "Sweeps run with: python train.py --config NAME --sweep name=v1,v2 ... [--launcher=slurm]")
        return 0
    if len(argv) != 2 or argv[0] not in ("report", "status", "cancel"):
        print(usage, file=sys.stderr)
        return 2
    if argv[0] != "report":
        return follow(argv[0], argv[1])
    try:
        report(Path(user_path(argv[1], "DIR")))
    except UserError as e:
        say_error(e)
        return 2
    return 0


