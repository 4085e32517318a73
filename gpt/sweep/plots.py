"""A sweep's figures: each setting's validation curve and final losses, and its per-block diagnostics."""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import TYPE_CHECKING

from ..data import bpc
from .compute import along
from .grid import by_setting, counted, drawn

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

MAX_SETTINGS = 6    # settings one panel compares; a grid of more is drawn as small multiples
LINES = (("-", "solid"), ("--", "dashed"), (":", "dotted"), ("-.", "dash-dot"))


def _colours(n: int) -> list:
    """n distinct colours: tab10's, then (up to 20) tab20's, each hue in a dark and a light
    shade, then n hues spread along turbo."""
    import matplotlib
    if n <= 10:
        return list(matplotlib.colormaps["tab10"].colors[:n])
    if n <= 20:
        return list(matplotlib.colormaps["tab20"].colors[:n])
    return [matplotlib.colormaps["turbo"](i / (n - 1)) for i in range(n)]


def _last(row: dict) -> float:
    return row["_evals"][-1]["val_loss"] if row["_evals"] else math.nan


def _options(rows: list[dict]) -> dict[str, list[str]]:
    """Each swept option's values among these rows, in the sweep's order."""
    options = {}
    for row in rows:
        for name, value in row["_values"].items():
            values = options.setdefault(name, [])
            if value not in values:
                values.append(value)
    return options


def _varying(settings: list[list[dict]]) -> list[str]:
    """The options whose value differs between these settings (each the rows of its runs)."""
    return [name for name, values in _options([g[0] for g in settings]).items() if len(values) > 1]


def split_by(rows: list[dict]) -> str | None:
    """The option whose values split a grid of more than MAX_SETTINGS settings into panels, or
    None. Of the options with at most MAX_SETTINGS values (so the panels stay few), the one whose
    values' mean last val losses differ most: each panel then holds settings close together, and
    its own zoom shows their differences. On a tie (no results yet), the one with fewest values,
    then the first swept. A grid sweeping one option alone is not split."""
    settings = list(by_setting(rows).values())
    varying = _varying(settings)
    if len(settings) <= MAX_SETTINGS or len(varying) < 2:
        return None
    options = {name: values for name, values in _options(rows).items() if name in varying}
    few = [name for name in varying if len(options[name]) <= MAX_SETTINGS]
    if not few:
        few = [min(varying, key=lambda name: len(options[name]))]

    def spread(name: str) -> float:
        means = []
        for value in options[name]:
            finals = [_last(r) for r in drawn(rows) if r["_values"][name] == value and math.isfinite(_last(r))]
            means += [statistics.fmean(finals)] if finals else []
        return max(means) - min(means) if len(means) > 1 else 0.0
    return max(few, key=lambda name: (spread(name), -len(options[name])))   # max keeps the first of equals


def panels(rows: list[dict]) -> tuple[str | None, dict[str, list[list[dict]]]]:
    """split_by's option, and the settings (each the rows of its runs) of each panel by the
    panel's name: option=value, or "" for a single panel of all settings."""
    option = split_by(rows)
    out = {}
    for group in by_setting(rows).values():
        out.setdefault(f"{option}={group[0]['_values'][option]}" if option else "", []).append(group)
    return option, out


def _labels(settings: list[list[dict]]) -> tuple[str, list[str]]:
    """A legend's title and entries: the options that vary among these settings, and their values."""
    names = _varying(settings)
    if not names:       # one setting: it names itself
        return "", [g[0]["_setting"] for g in settings]
    # an axis a setting does not read (muon_lr under AdamW) is left out of its entry
    return ", ".join(names), [", ".join(v for n in names if (v := g[0]["_values"][n])) for g in settings]


def _zoom(ax: Axes, low: float, high: float, headroom: float, peak: float, unigram: float | None) -> str:
    """Set ax's y axis from low over a span of high - low (or 2% of the loss, if more), with 5%
    of the span below and `headroom` of it above; draw the unigram level where it falls inside.
    Returns what lies outside, for the title."""
    # at least 2% of the loss: differences far below it are noise, not worth the whole height
    span = max(high - low, 0.02 * abs(high), 1e-3)
    bottom, top = low - 0.05 * span, low + (1 + headroom) * span
    ax.set_ylim(bottom, top)
    notes = [f"clipped above {top:.2f} (earlier losses reach {peak:.2f})"] if peak > top else []
    if unigram is not None and bottom <= unigram <= top:
        ax.axhline(unigram, color="black", ls=":", label="unigram level")     # no setting's colour
    elif unigram is not None:
        notes.append(f"unigram level {unigram:.2f} is {'above' if unigram > top else 'below'} the view")
    return "; ".join(notes)


BPC_AXIS_IN = 0.75     # inches bpc_axis takes right of its axes: its ticks, their numbers and its label


def bpc_axis(ax: Axes, ticks: list[float] | None = None) -> None:
    """A right-hand axis reading ax's losses (nats per character or byte) in bits per character;
    with ticks (losses), at those losses."""
    axis = ax.secondary_yaxis("right", functions=(bpc, lambda bits: bits * math.log(2)))
    axis.set_ylabel("bits per character")
    if ticks:
        from matplotlib.ticker import NullFormatter
        axis.set_yticks([bpc(t) for t in ticks], [f"{bpc(t):.2f}" for t in ticks])
        axis.yaxis.set_minor_formatter(NullFormatter())


def _in_bpc(settings: list[list[dict]]) -> bool:
    """Whether every drawn run with results is per character, so that a bpc axis reads them all."""
    flags = [r["per_character"] for group in settings for r in drawn(group) if r["_evals"]]
    return bool(flags) and all(flags)


X_LABELS = {"steps": "iteration", "flops": "model FLOPs (training)", "seconds": "seconds of training"}


def _curves(ax: Axes, settings: list[list[dict]], colours: list, labels: list[str], x: str,
            unigram: float | None) -> tuple[float, float] | None:
    """Val loss against x (steps, flops or seconds): one line per setting, the mean over seeds with
    the seeds' range as a band (against seconds, which differ run by run, a line per seed), and the
    unigram level dotted. Returns the lowest and highest loss drawn, for a y axis that holds every
    curve whole."""
    lows, highs = [], []
    for group, colour, label in zip(settings, colours, labels):
        curves = [along(row, x) for row in drawn(group) if row["_evals"]]
        curves = [c for c in curves if c]
        if not curves:
            continue
        if x == "seconds":
            for i, c in enumerate(curves):
                ax.plot(*zip(*c), color=colour, label=label if i == 0 else None, lw=1)
            lows.append(min(v for c in curves for _, v in c))
            highs.append(max(v for c in curves for _, v in c))
            continue
        by_x = {}
        for c in curves:
            for at, v in c:
                by_x.setdefault(at, []).append(v)
        xs = sorted(by_x)
        ax.plot(xs, [statistics.fmean(by_x[i]) for i in xs], color=colour, label=label)
        low, high = [min(by_x[i]) for i in xs], [max(by_x[i]) for i in xs]
        if max(len(by_x[i]) for i in xs) > 1:
            ax.fill_between(xs, low, high, color=colour, alpha=0.2)
        lows += low
        highs += high
    if unigram is not None and lows:
        ax.axhline(unigram, color="black", ls=":", label="unigram level")     # no setting's colour
    ax.set_xlabel(X_LABELS[x])
    ax.set_ylabel("val loss (log scale)")
    ax.grid(alpha=0.3, which="both")
    return (min(lows), max(highs)) if lows else None


def _whole(axes: list, spans: list, unigram: float | None, in_bpc: list[bool]) -> None:
    """One y scale for every curve panel, from the lowest loss to the highest, on a log axis so
    that the first steps and the last differences are both in view (the unigram level too), its
    ticks plain numbers; a bits-per-character axis where the panel's runs are per character."""
    from matplotlib.ticker import NullFormatter
    spans = [s for s in spans if s]
    if not spans:
        return
    low, high = min(s[0] for s in spans), max(s[1] for s in spans)
    if unigram is not None:
        high = max(high, unigram)
    ticks = [low * (high / low) ** (i / 5) for i in range(6)]
    for ax, bits in zip(axes, in_bpc):
        ax.set_yscale("log")
        ax.set_ylim(low * 0.98, high * 1.02)
        ax.set_yticks(ticks, [f"{t:.2f}" for t in ticks])
        ax.yaxis.set_minor_formatter(NullFormatter())
        if bits:
            bpc_axis(ax, ticks)


def _finals(ax: Axes, settings: list[list[dict]], colours: list, labels: list[str], unigram: float | None) -> str:
    """Each setting's final val loss: a point per finished seed, a bar at their mean; y zoomed to
    the points. Returns the zoom's note."""
    points = []
    for x, (group, colour) in enumerate(zip(settings, colours)):
        finals = [_last(r) for r in counted(group) if math.isfinite(_last(r))]
        if not finals:
            continue
        # the seeds side by side, so that equal losses do not hide one another
        offsets = [0.4 * (i / (len(finals) - 1) - 0.5) if len(finals) > 1 else 0.0 for i in range(len(finals))]
        ax.plot([x + o for o in offsets], finals, "o", color=colour, ms=5, alpha=0.8)
        ax.plot([x], [statistics.fmean(finals)], "_", color=colour, ms=22, mew=2)
        points += finals
    ax.set_xticks(range(len(settings)), labels, rotation=30, ha="right", fontsize=7)
    ax.set_xlim(-0.6, len(settings) - 0.4)
    ax.set_ylabel("final val loss")
    ax.grid(alpha=0.3, axis="y")
    return _zoom(ax, min(points), max(points), 0.1, max(points), unigram) if points else "no finished run yet"


def curves_figure(rows: list[dict], x: str = "steps") -> Figure:
    """One row of two panels per panel of `panels` (one per value of split_by's option once the
    grid has more than MAX_SETTINGS settings): the val curves against x, whole and on one y scale
    in every row, and each setting's final losses, zoomed to them (what that clips is in its
    title). Within a row colours do not repeat, and the legend names only the options varying there."""
    from matplotlib.figure import Figure
    from matplotlib.transforms import ScaledTranslation
    option, split = panels(rows)
    count = max(len(split), 1)      # a sweep.json edited to an empty axis has no setting at all
    fig = Figure(figsize=(13, 1 + 3.6 * count), layout="constrained")
    grid = fig.subplots(count, 2, squeeze=False, width_ratios=(3, 2))
    unigram = next((row["_evals"][-1]["unigram_loss"] for row in rows
                    if row["_evals"] and "unigram_loss" in row["_evals"][-1]), None)
    spans, bits = [], []
    for (name, settings), (curve_ax, final_ax) in zip(split.items(), grid):
        colours = _colours(len(settings))
        title, labels = _labels(settings)
        spans.append(_curves(curve_ax, settings, colours, labels, x, unigram))
        how = "a line per seed" if x == "seconds" else "mean over seeds, band = min..max"
        curve_ax.set_title(f"{name + ': ' if name else ''}val loss, {how}" + ("" if spans[-1] else "\nno results yet"),
                           fontsize=9)
        note = _finals(final_ax, settings, colours, labels, unigram)
        in_bpc = _in_bpc(settings)
        bits.append(in_bpc)
        if in_bpc:
            bpc_axis(final_ax)
        final_ax.set_title(f"{name + ': ' if name else ''}final val loss, a point per seed, bar = mean"
                           + (f"\n{note}" if note else ""), fontsize=9)
        if curve_ax.get_legend_handles_labels()[0]:     # nothing drawn: no run has results
            past = ScaledTranslation(BPC_AXIS_IN * in_bpc, 0, fig.dpi_scale_trans)     # right of a bpc axis
            final_ax.legend(*curve_ax.get_legend_handles_labels(), fontsize=7, title=title, title_fontsize=7,
                            loc="upper left", bbox_to_anchor=(1.02, 1.0), bbox_transform=final_ax.transAxes + past)
    _whole(list(grid[:, 0]), spans, unigram, bits)
    if option:
        fig.suptitle(f"one row per value of {option}, the option whose values' final losses differ most",
                     fontsize=10)
    return fig


def plot(rows: list[dict], path: Path, x: str = "steps") -> None:
    curves_figure(rows, x).savefig(path, dpi=110)


DIAGNOSTICS = (("block_grad_norm", "gradient norm", True), ("block_update_ratio", "update / weight", True),
               ("block_rms", "residual stream RMS", True), ("block_pos_sim", "position similarity", False))


def diagnostics_figure(rows: list[dict]) -> Figure:
    """Per block, each diagnostic at the final evaluation, mean over seeds: one line per setting,
    in a 2 x 2 grid on a page (10 x 8 inches) with one legend below it. Every panel holds all
    settings (a split would take four panels per value), so each setting has its own colour;
    where curves_figure splits the grid, the line style tells split_by's values apart."""
    from matplotlib.figure import Figure
    fig = Figure(figsize=(10, 8), layout="constrained")
    option, split = panels(rows)
    settings = [group for groups in split.values() for group in groups]
    styles = [LINES[i % len(LINES)][0] for i, groups in enumerate(split.values()) for _ in groups]
    title, labels = _labels(settings)
    for ax, (key, name, log) in zip(fig.subplots(2, 2).flat, DIAGNOSTICS):
        for group, colour, style, label in zip(settings, _colours(len(settings)), styles, labels):
            values = [r["_evals"][-1][key] for r in drawn(group) if r["_evals"] and key in r["_evals"][-1]]
            if values:
                mean = [statistics.fmean(v[b] for v in values) for b in range(len(values[0]))]
                ax.plot(range(len(mean)), mean, "o", ls=style, color=colour, label=label)
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("block")
        ax.xaxis.get_major_locator().set_params(integer=True)   # blocks are whole: no 0.5 tick
        if log:
            ax.set_yscale("log")
        ax.grid(alpha=0.3)
    handles = {label: h for ax in fig.axes for h, label in zip(*ax.get_legend_handles_labels())}
    if handles:     # nothing drawn: no run has diagnostics
        fig.legend(handles.values(), handles.keys(), loc="outside lower center", ncol=min(4, len(handles)),
                   fontsize=7, title=title, title_fontsize=7)
    styled = ", ".join(f"{LINES[i % len(LINES)][1]} {name}" for i, name in enumerate(split))
    fig.suptitle("at the last evaluation, mean over seeds" + (f"; line style: {styled}" if option else ""),
                 fontsize=10)
    return fig


def plot_diagnostics(rows: list[dict], path: Path) -> None:
    diagnostics_figure(rows).savefig(path, dpi=110)
