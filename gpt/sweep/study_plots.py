"""The figures of a tuned or sized study: final loss against the tuned value (lr.png), and each
setting's loss against its parameter count with a power law fitted (size.png)."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

from .grid import as_text, factors
from .plots import _colours
from .stats import SIZES, crossing, overlap, power_law
from .tune import Tuning


def has_size(axes: dict) -> bool:
    return any(set(names) & set(SIZES) for names, _ in factors(axes))


def size_names(axes: dict) -> list[str]:
    return [n for names, _ in factors(axes) if set(names) & set(SIZES) for n in names]


def split_setting(setting: dict, sizes: list[str]) -> tuple[str, str]:
    """(the setting without its size, its size) as labels."""
    rest = ", ".join(f"{k}={as_text(v)}" for k, v in setting.items() if k not in sizes) or "base"
    size = ", ".join(f"{k}={as_text(v)}" for k, v in setting.items() if k in sizes)
    return rest, size


def lr_labels(settings: list[dict], sizes: list[str]) -> list[str]:
    """Legend entries for settings drawn in one panel: the first by every option that varies among
    them, each other by the options where it differs from the first, so linked axes stay legible."""
    names = [k for k in settings[0] if k not in sizes and len({as_text(s.get(k)) for s in settings}) > 1]
    if not names:
        return [split_setting(s, sizes)[0] for s in settings]
    first = settings[0]
    return [textwrap.fill(", ".join(f"{k}={as_text(s.get(k))}" for k in names if i == 0 or s.get(k) != first.get(k)),
                          90, break_on_hyphens=False) for i, s in enumerate(settings)]


def plot_lr(sweep: dict, tunings: list[Tuning], tuning_rows: list[dict], path: Path) -> None:
    """Final val loss against the first tuned option (log axis where its values are positive): a line
    per setting through the mean of its tuning seeds, the seeds as points, the chosen value ringed,
    a diverged or pruned run as an x at the top; one panel per size where the sweep has a size axis."""
    from matplotlib.figure import Figure
    name = next(iter(sweep["tune"]))
    sizes = size_names(sweep["axes"])
    panels = {}
    for t in tunings:
        panels.setdefault(split_setting(t.setting, sizes)[1], []).append(t)
    labels = {split_setting(t.setting, sizes)[0]: label for group in panels.values()
              for t, label in zip(group, lr_labels([t.setting for t in group], sizes))}
    lines = sum(label.count("\n") + 1 for label in set(labels.values()))
    fig = Figure(figsize=(6 * len(panels), 4.5 + 0.16 * lines), layout="constrained")
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    finite = [r["final_val_loss"] for r in tuning_rows if r["status"] == "finished" and math.isfinite(r["final_val_loss"])]
    top = max(finite) if finite else 1.0
    for ax, (size, group) in zip(axes, panels.items()):
        for t, colour in zip(group, _colours(len(group))):
            label = labels[split_setting(t.setting, sizes)[0]]
            # along the first option, the other options at their chosen (or first) values
            fixed = {n: (t.chosen or t.points[0])[n] for n in t.names if n != name} if t.points else {}
            line = sorted((p[name], i) for i, p in enumerate(t.points)     # halving's stopped points left out
                          if name in p and p not in t.halved and all(p[n] == v for n, v in fixed.items()))
            means = [(v, t.mean(i)) for v, i in line if t.losses[i] and None not in t.losses[i]]
            shown = [(v, m) for v, m in means if math.isfinite(m)]
            if shown:
                ax.plot(*zip(*shown), "-", color=colour, label=label)
            for v, i in line:
                for loss in t.losses[i]:
                    if loss is None:
                        continue
                    ax.plot([v], [loss if math.isfinite(loss) else top], "o" if math.isfinite(loss) else "x",
                            color=colour, ms=4, alpha=0.7)
            if t.chosen and name in t.chosen:
                best = [m for v, m in shown if v == t.chosen[name]]
                if best:
                    ax.plot([t.chosen[name]], best, "o", ms=11, mfc="none", color=colour)
        values = [p[name] for t in group for p in t.points if name in p]
        if values and all(v > 0 for v in values):
            ax.set_xscale("log")
        ax.set_xlabel(name)
        ax.set_ylabel("final val loss (tuning seeds)")
        ax.set_title(f"{size + ': ' if size else ''}ring = chosen, x = diverged or pruned", fontsize=9)
        ax.grid(alpha=0.3, which="both")
    # one legend below the panels (a size's panel repeats the same settings): linked axes make long entries
    handles = {label: h for ax in axes for h, label in zip(*ax.get_legend_handles_labels())}
    if handles:
        fig.legend(handles.values(), handles.keys(), loc="outside lower center", fontsize=7, frameon=False)
    fig.savefig(path, dpi=110)


def size_fits(axes_spec: dict, summary: list[dict]) -> tuple[dict, dict, list[str]]:
    """Per setting without its size, its (parameters, mean final val loss) points and its power-law
    fit over the sizes measured; and where two fits cross, a line saying at which size, and whether
    that is within the measured range or an extrapolation beyond it."""
    sizes = size_names(axes_spec)
    lines = {}
    for s in summary:
        params = next((r["params"] for r in s["_group"] if math.isfinite(r.get("params", math.nan))), math.nan)
        if math.isfinite(s["mean"]) and math.isfinite(params):
            lines.setdefault(split_setting(s["_group"][0]["_setting_values"], sizes)[0], []).append((params, s["mean"]))
    for points in lines.values():
        points.sort()
    fits = {k: f for k, pts in lines.items() if (f := power_law([p for p, _ in pts], [v for _, v in pts]))}
    notes, keys = [], list(fits)
    for i, a in enumerate(keys):
        for b in keys[i + 1:]:
            if at := crossing(fits[a], fits[b]):
                # the pair's own overlap: a crossing beyond one setting's sizes is not measured
                low, high = overlap(lines[a], lines[b])
                if low > high:
                    notes.append(f"{a} and {b}: fits cross at {at:,.3g} parameters (no size was measured for both)")
                    continue
                where = "within" if low <= at <= high else "an extrapolation beyond"
                notes.append(f"{a} and {b}: fits cross at {at:,.3g} parameters ({where} the sizes both "
                             f"were measured at, {low:,.0f} to {high:,.0f})")
    return lines, fits, notes


def plot_size(axes_spec: dict, summary: list[dict], path: Path) -> None:
    """Each setting's mean final val loss against its parameter count, log-log, with its power law
    fitted over the sizes measured drawn across them; the fits' crossings in the title."""
    from matplotlib.figure import Figure
    lines, fits, notes = size_fits(axes_spec, summary)
    fig = Figure(figsize=(7, 5), layout="constrained")
    ax = fig.subplots()
    for (label, points), colour in zip(lines.items(), _colours(len(lines))):
        ax.plot(*zip(*points), "o", color=colour, label=label)
        if label in fits:
            a, b = fits[label]
            xs = [points[0][0], points[-1][0]]
            ax.plot(xs, [math.exp(a) * x ** b for x in xs], "-", color=colour, alpha=0.7,
                    label=f"{label}: fit, exponent {b:.3f}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("parameters")
    ax.set_ylabel("final val loss, mean over seeds")
    ax.grid(alpha=0.3, which="both")
    ax.set_title("\n".join(notes) or "a power law per setting over the sizes measured", fontsize=8)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)
    fig.savefig(path, dpi=110)
