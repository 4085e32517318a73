"""Size trends across studies: each setting's final loss against its parameter count, read from the
reports (summary.md) of the same study run at several sizes.

    python -m gpt.sweep trend OUT.png DIR_OR_SUMMARY DIR_OR_SUMMARY [...]

A study with a size axis draws its own size.png; this joins studies run apart, e.g. one at width 64
and its copy at width 128, setting by setting (the same label in each report), with a power law
fitted per setting and where two fits cross.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from ..config import user_path
from ..errors import UserError, say_error
from ..figures import check_picture_name, pyplot, save_figure
from .plots import _colours
from .stats import both_measured, crossing, power_law

LOSS = "final val loss (mean ± std)"
PARAMS = "parameters (without embeddings)"
NUMBER = r"-?\d+(?:\.\d+)?"
USAGE = "usage: python -m gpt.sweep trend OUT.png DIR_OR_SUMMARY DIR_OR_SUMMARY [...]"


def table_column(lines: list[str], heading: str) -> dict[str, str]:
    """{setting: cell} of the first markdown table whose heading row names `heading`."""
    for i, line in enumerate(lines):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and heading in cells:
            at, rows = cells.index(heading), {}
            for row in lines[i + 2:]:
                if not row.startswith("|"):
                    break
                values = [c.strip() for c in row.strip().strip("|").split("|")]
                if len(values) > at:    # a row cut short is no point
                    rows[values[0]] = values[at]
            return rows
    return {}


def read_points(source: Path) -> dict[str, tuple[float, float, float]]:
    """{setting: (parameters, mean, std)} from a sweep folder's summary.md, or such a file."""
    path = source / "summary.md" if source.is_dir() else source
    if not path.is_file():
        raise UserError(f"{source}: no such sweep report (a folder holding summary.md, or the file itself)")
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError as e:
        raise UserError(f"{path} cannot be read ({e.strerror})") from None
    losses, params = table_column(lines, LOSS), table_column(lines, PARAMS)
    if not losses or not params:
        raise UserError(f"{path} holds no table of '{LOSS}' and '{PARAMS}'; is it a sweep's summary.md?")
    points = {}
    for setting, cell in losses.items():
        # one seed has no spread, so its report gives the mean alone
        loss = re.fullmatch(rf"({NUMBER})(?: ± ({NUMBER}))?", cell)
        count = re.match(r"\d[\d,]*", params.get(setting, ""))
        if loss and count:
            points[setting] = (float(count.group().replace(",", "")), float(loss[1]), float(loss[2] or 0.0))
        else:       # no finished run has no mean; a row of another shape is named, not guessed at
            print(f"{path}: {setting} left out (loss {cell!r}, parameters {params.get(setting, 'none')!r})",
                  file=sys.stderr)
    return points


def trend(sources: list[Path], out: Path) -> list[str]:
    """Draw out from the reports; returns a markdown table of the points and the fits' crossings."""
    check_picture_name(out, "OUT.png")
    lines: dict[str, list[tuple[float, float, float]]] = {}
    for source in sources:
        for setting, point in read_points(source).items():
            lines.setdefault(setting, []).append(point)
    if not any(len({p for p, _, _ in pts}) > 1 for pts in lines.values()):
        raise UserError("no setting appears at two sizes in these reports; give the same study run at "
                        "several sizes")
    fits = {}
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 5))
    for (label, points), colour in zip(lines.items(), _colours(len(lines))):
        points.sort()
        xs, means, stds = zip(*points)
        ax.errorbar(xs, means, yerr=stds, fmt="o-", color=colour, capsize=3, label=label)
        if fit := power_law(list(xs), list(means)):
            fits[label] = fit
    # where the ranking of two settings changes within the sizes both were measured at; crossings
    # beyond them are extrapolation
    notes = [f"{a} and {b}: fits cross at {at:,.3g} parameters, within the sizes measured"
             for i, a in enumerate(fits) for b in list(fits)[i + 1:]
             if (at := crossing(fits[a], fits[b])) and both_measured(lines[a], lines[b], at)]
    ax.set_xscale("log")
    ax.set_xlabel("parameters")
    ax.set_ylabel("final val loss, mean ± std over seeds")
    ax.grid(alpha=0.3, which="both")
    ax.set_title("\n".join(notes) or "one point per report", fontsize=8)
    ax.legend(fontsize=7)
    save_figure(fig, out)
    table = ["| setting | parameters | final val loss | power-law exponent |", "|---|---|---|---|"]
    for label, points in lines.items():
        exponent = f"{fits[label][1]:.3f}" if label in fits else "—"
        for p, mean, std in points:
            table.append(f"| {label} | {p:,.0f} | {mean:.3f} ± {std:.3f} | {exponent} |")
    return table + [""] + notes


def main(argv: list[str]) -> int:
    if {"-h", "--help"} & set(argv):
        print(f"{USAGE}\n\n{__doc__.split(chr(10) + chr(10))[2].strip()}")
        return 0
    if len(argv) < 3 or any(a.startswith("-") for a in argv):
        print(USAGE, file=sys.stderr)
        return 2
    try:
        out = Path(user_path(argv[0], "OUT.png"))
        table = trend([Path(user_path(a, "a report")) for a in argv[1:]], out)
    except UserError as e:
        say_error(e)
        return 2
    print("\n".join(table).rstrip() + f"\n\nwritten: {out}")
    return 0
