"""The report's tables beyond the one against the baseline: each axis within each level of the others
(the factorial reading), how its verdicts move with size, losses at equal compute and equal time, a
tuned sweep's choices with their LR sensitivity, the steps to the baseline's loss, and diagnostics."""

from __future__ import annotations

import math
import statistics

from .compute import along, common_budget, loss_at
from .grid import by_setting, counted, factors, setting_label
from .stats import SIZES, compare, holm, key_of, lr_sensitivity, matched, size_trend, verdict, within_levels
from .tune import Tuning, point_label

# settings further apart than this in parameters or FLOPs per token spend unequal compute per step
COMPUTE_GAP = 0.05
# a CPU run whose threads got less of their time than this shared its cores: its speed is not the setting's
CONTENDED = 0.8


def p_text(p: float) -> str:
    return "< 0.001" if p < 0.001 else f"{p:.3f}"


def within_level_rows(axes: dict, summary: list[dict]) -> list[dict]:
    """Each within-level comparison with its test and its Holm-adjusted p over all of them: the
    study's family."""
    by_key = {key_of(s["_group"][0]["_setting_values"]): s for s in summary if s["_group"]}
    labels = {key: s["setting"] for key, s in by_key.items()}
    by_label = {s["setting"]: s for s in summary}
    out = []
    for axis, level, base_label, label in within_levels(axes, labels):
        base, s = by_label[base_label], by_label[label]
        c = compare(base["_finals"], s["_finals"], matched(base["_group"], s["_group"]))
        if c is not None:
            out.append({"axis": axis, "level": level, "base": base, "setting": s, **c})
    for row, p in zip(out, holm([r["p"] for r in out])):
        row["p_holm"] = p
        row["verdict"] = verdict(row["diff"], p)
    return out


def within_level_section(axes: dict, rows: list[dict]) -> str:
    """The factorial reading's table, for a sweep of two or more axes."""
    if len(factors(axes)) < 2:
        return ""
    if not rows:
        return "No within-level comparison has 2 or more seeds a side yet."
    lines = ["| axis | within | setting | against | difference | 95% CI | test | p | Holm-adjusted p | verdict |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['axis']} | {r['level']} | {value_of(r['setting'], r['axis'])} | "
                     f"{value_of(r['base'], r['axis'])} | {r['diff']:+.3f} | {r['low']:+.3f} to {r['high']:+.3f} | "
                     f"{r['test']} | {p_text(r['p'])} | {p_text(r['p_holm'])} | {r['verdict']} |")
    return (f"Each axis is compared within each level of the other axes (each value against the axis's "
            f"first), at equal steps: {len(rows)} comparison{'s' * (len(rows) != 1)}, held together to a "
            "family-wise error of 5% (Holm–Bonferroni). The table above compares every setting with the "
            "first one instead, a family of its own.\n\n" + "\n".join(lines))


def value_of(s: dict, axis: str) -> str:
    values = s["_group"][0]["_setting_values"]
    return ":".join(str(values[n]).lower() if isinstance(values[n], bool) else str(values[n])
                    for n in axis.split(":"))


def size_of(s: dict) -> float:
    sizes = [r["params"] for r in s["_group"] if isinstance(r.get("params"), (int, float)) and math.isfinite(r["params"])]
    return sizes[0] if sizes else math.nan


def size_section(axes: dict, rows: list[dict]) -> str:
    """Where the axes include a size: per comparison along another axis, whether its verdict holds
    at every size, flips, or holds from some size on."""
    size_axes = [":".join(names) for names, _ in factors(axes) if set(names) & set(SIZES)]
    if not size_axes or len(factors(axes)) < 2:
        return ""
    trends = {}
    for r in rows:
        if r["axis"] in size_axes:
            continue
        size = ", ".join(part for part in r["level"].split(", ")
                         if part.split("=")[0] in {n for a in size_axes for n in a.split(":")})
        rest = ", ".join(part for part in r["level"].split(", ") if part not in size.split(", "))
        key = (r["axis"], value_of(r["setting"], r["axis"]), value_of(r["base"], r["axis"]), rest)
        word = r["verdict"].split(" by")[0].split(" (")[0]
        trends.setdefault(key, []).append((size_of(r["setting"]), size, word))
    if not trends:
        return ""
    lines = ["| axis | setting | against | within | verdict across sizes (smallest first) |", "|---|---|---|---|---|"]
    for (axis, value, base, rest), found in trends.items():
        found.sort(key=lambda t: t[0])
        lines.append(f"| {axis} | {value} | {base} | {rest or '—'} | "
                     f"{size_trend([(size, word) for _, size, word in found])} |")
    return ("Each comparison above along an axis other than the size, read across the sizes measured "
            "(ordered by parameter count); size.png draws each setting's loss against its parameters.\n\n"
            + "\n".join(lines))


def crossings_text(notes: list[str]) -> str:
    if not notes:
        return ""
    return ("\n\nPower laws fitted to each setting's mean loss against its parameters (size.png):\n\n"
            + "\n".join(f"- {n}" for n in notes))


def compute_section(summary: list[dict]) -> str:
    """Each setting's parameters and FLOPs per token, a warning where they differ by more than
    COMPUTE_GAP, and each setting's val loss at the largest FLOPs budget and the longest training
    time every one of its runs reached."""
    settings = [s for s in summary if counted(s["_group"])
                and all(math.isfinite(r["params"]) for r in counted(s["_group"]))]
    if not settings:        # runs without a config.json to size them by
        return ""
    runs = [r for s in settings for r in counted(s["_group"])]
    contended = [r for r in runs if r.get("cpu_share", math.nan) < CONTENDED]
    apart = {id(r) for r in contended}
    timed = [r for r in runs if id(r) not in apart]
    budgets = {"flops": common_budget(runs, "flops"), "seconds": common_budget(timed, "seconds")}
    seconds = (f"at {budgets['seconds']:.3g} s of training" if math.isfinite(budgets["seconds"])
               else "at equal training time (no run had its cores to itself)")
    lines = ["| setting | parameters (without embeddings) | FLOPs per token | val loss at equal steps "
             f"| at {budgets['flops']:.3g} FLOPs | {seconds} |",
             "|---|---|---|---|---|---|"]
    for s in settings:
        group = counted(s["_group"])
        cells = []
        for x in ("flops", "seconds"):
            values = [loss_at(along(r, x), budgets[x]) for r in group if x == "flops" or id(r) not in apart]
            values = [v for v in values if math.isfinite(v)]
            cells.append(mean_text(values))
        first = group[0]
        lines.append(f"| {s['setting']} | {first['params']:,.0f} ({first['params_no_emb']:,.0f}) | "
                     f"{first['flops_per_token']:.3g} | {mean_text([r['final_val_loss'] for r in group])} | "
                     f"{cells[0]} | {cells[1]} |")
    said = ("Compute: each setting's size and its val loss at the largest FLOPs budget and the longest "
            "training time every run reached (read off its eval curve, linear between evaluations). "
            "Seconds compare only runs that ran alike (see ran_as and the speed notes).")
    if contended:
        said += (f" {len(contended)} of the {len(runs)} runs got less than {CONTENDED:.0%} of their threads' CPU "
                 "time (sweep.csv's cpu_share: other work shared the cores), so their seconds and tokens/s are "
                 "not the setting's; the time column leaves them out: "
                 + ", ".join(f"{r['_folder'].name} ({r['cpu_share']:.0%})" for r in contended[:5])
                 + (f" and {len(contended) - 5} more" if len(contended) > 5 else "") + ".")
    gap = compute_gap(settings)
    return said + ("\n\n" + gap if gap else "") + "\n\n" + "\n".join(lines)


def compute_gap(settings: list[dict]) -> str:
    """A line where settings differ by more than COMPUTE_GAP in parameters or FLOPs per token."""
    for key, what in (("flops_per_token", "FLOPs per token"), ("params", "parameters")):
        values = {s["setting"]: counted(s["_group"])[0][key] for s in settings}
        values = {k: v for k, v in values.items() if isinstance(v, (int, float)) and math.isfinite(v)}
        if len(values) > 1 and max(values.values()) > (1 + COMPUTE_GAP) * min(values.values()):
            low, high = min(values, key=values.get), max(values, key=values.get)
            return (f"Warning: the settings differ by more than {COMPUTE_GAP:.0%} in {what} ({low}: "
                    f"{values[low]:,.3g}, {high}: {values[high]:,.3g}), so at equal steps the larger spends "
                    "more compute: the equal-FLOPs column is the fair comparison.")
    return ""


def mean_text(values: list[float]) -> str:
    values = [v for v in values if math.isfinite(v)]
    if not values:
        return "—"
    return f"{statistics.fmean(values):.3f} ± {statistics.stdev(values):.3f}" if len(values) > 1 else f"{values[0]:.3f}"


def tuning_section(sweep: dict, tunings: list[Tuning], tuning_rows: list[dict]) -> str:
    """A tuned sweep's choices: per setting, the value chosen, where it sits in the values tried, its
    LR sensitivity over the given grid, and its tuning runs that diverged or were pruned."""
    if not sweep.get("tune"):
        return ""
    by_folder = {r["_folder"]: r for r in tuning_rows}
    lines = ["| setting | chosen | where it sits | LR sensitivity | tuning runs | diverged or pruned |",
             "|---|---|---|---|---|---|"]
    for t in tunings:
        label = setting_label(t.setting)
        runs = [r for r in tuning_rows if r["_setting_values"] == t.setting]
        stopped = [f"{point_label(r['_tuned'])} seed {r['seed']} ({r['status']})" for r in runs
                   if r["status"] in ("diverged", "pruned")]
        if t.chosen is None:
            lines.append(f"| {label} | still tuning | — | — | {len(runs)} | {', '.join(stopped) or 'none'} |")
            continue
        where = "; ".join(f"{n}: {t.where(n, sweep.get('tune_extend', 2))}" for n in t.names) or "not tuned"
        lines.append(f"| {label} | {point_label(t.chosen)} | {where} | {sensitivity_text(t, by_folder)} | "
                     f"{len(runs)} | {', '.join(stopped) or 'none'} |")
    seeds = sweep.get("tune_seeds", 1)
    return (f"Each setting was tuned over {', '.join(f'{n} = {point_label_list(v)}' for n, v in sweep['tune'].items())} "
            f"(a value at the grid's edge extends it by one grid step, up to {sweep.get('tune_extend', 2)} per edge) "
            f"on {seeds} tuning seed{'s' * (seeds != 1)}, apart from the seeds compared above, and "
            "each setting is compared at its own best value. A diverged or pruned tuning run counts as the "
            "worst loss. LR sensitivity (Wortsman et al. 2023): the mean over the given grid of "
            "min(final loss, initial loss) minus the best of them; the lower, the less the setting's result "
            "depends on hitting its best rate.\n\n" + "\n".join(lines) + halving_text(tunings))


def halving_text(tunings: list[Tuning]) -> str:
    """What successive halving stopped: per setting, the points stopped at the rung, with their val
    loss there against the best point's."""
    halved = [t for t in tunings if t.rung]
    if not halved:
        return ""
    lines = []
    for t in halved:
        stopped = ", ".join(f"{point_label(p)} ({t.at_rung[t.base.index(p)]:.3f})" for p in t.halved) or "none"
        finite = [(v, i) for i, v in enumerate(t.at_rung) if math.isfinite(v)]
        best = (f"the best there {point_label(t.base[min(finite)[1]])} ({min(finite)[0]:.3f})" if finite
                else "no point had learned there")
        lines.append(f"- {setting_label(t.setting)}: stopped {stopped}; {best}")
    return ("\n\nSuccessive halving (tune_halving): each setting's given grid trained to step "
            f"{', '.join(sorted({str(t.rung) for t in halved}))} and paused; the point best there, its neighbours "
            "one grid step away and the best half trained on, and the rest stopped (val loss at that "
            "step in brackets). LR sensitivity needs every point's final loss, so it is not given for "
            "a setting whose grid was halved.\n" + "\n".join(lines))


def point_label_list(values: list) -> str:
    return ", ".join(f"{v:g}" for v in values)


def sensitivity_text(t: Tuning, by_folder: dict) -> str:
    """LR sensitivity over the points of the given grid (the same for every setting, so that the
    figures compare), from each point's mean loss and the runs' initial loss."""
    if not t.trained or t.halved:
        return "—"
    base = [i for i, p in enumerate(t.points) if p in t.base]
    initial = [e["val_loss"] for r in by_folder.values() if r["_setting_values"] == t.setting
               for e in r["_evals"][:1] if e["iter"] == 0 and math.isfinite(e["val_loss"])]
    if not initial:
        return "—"
    value = lr_sensitivity([(i, t.mean(i)) for i in base], statistics.fmean(initial))
    return f"{value:.3f}" if math.isfinite(value) else "—"


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
