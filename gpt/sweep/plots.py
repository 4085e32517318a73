"""A sweep's figures: validation curves per setting with their seed bands, and the per-block diagnostics."""

from __future__ import annotations

import statistics
from pathlib import Path

from ..figures import pyplot
from .grid import by_setting, drawn


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


