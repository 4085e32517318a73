"""What successive halving would have chosen in tuned studies trained without it, and the steps it saves.

    python benchmarks/halving_check.py DIR [DIR ...]

Each DIR is a tuned sweep's folder trained with tune_halving off, whose tuning runs evaluated at a
quarter of max_iters (tune_evals=4, the default, does where max_iters is a multiple of 4). The
sweep's plan is made twice from the same runs: as trained, and as halving would have made it, its
stopped points read at the rung and its kept ones to the end. Per setting it prints the value each
chooses, how many grid steps apart they are, the points halving stops, and the tuning steps it
saves; then the totals over every DIR.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))   # this project's package, also from a clone that is not installed
from gpt.config import TrainConfig, build  # noqa: E402
from gpt.console import Parser  # noqa: E402
from gpt.errors import UserError, say_error  # noqa: E402
from gpt.sweep import tune  # noqa: E402
from gpt.sweep.grid import setting_label  # noqa: E402


def steps_apart(grid: dict[str, list], a: dict, b: dict) -> int:
    """Grid steps between two points: the most, over the tuned options, of the places between their
    values in the option's sorted values (extensions included where both were tried)."""
    return max((abs(sorted(values).index(a[n]) - sorted(values).index(b[n])) for n, values in grid.items()
                if a.get(n) in values and b.get(n) in values), default=0)


def check(out_dir: Path) -> list[dict]:
    """Per setting of the study in out_dir: both choices, their distance, the points stopped and
    the tuning steps trained whole and halved."""
    path = out_dir / "sweep.json"
    if not path.exists():
        raise UserError(f"{out_dir} holds no sweep.json; give a tuned sweep's folder")
    sweep = json.loads(path.read_text())
    if not sweep.get("tune") or sweep.get("tune_halving"):
        raise UserError(f"{out_dir} is not a tuned sweep trained without halving")
    whole, halved = tune.plan(sweep, out_dir), tune.plan({**sweep, "tune_halving": True}, out_dir)
    rows = []
    for w, h in zip(whole.tunings, halved.tunings):
        if not w.names:
            continue
        max_iters = build(TrainConfig, {**sweep.get("values", {}), **w.setting}).max_iters
        seeds = len(tune.tuning_seeds(sweep))
        grid = {n: sorted({p[n] for p in w.points}) for n in w.names}
        apart = steps_apart(grid, w.chosen, h.chosen) if w.chosen and h.chosen else None
        rows.append({"study": out_dir.name, "setting": setting_label(w.setting), "whole": w.chosen,
                     "halved": h.chosen, "apart": apart, "stopped": h.halved,
                     "steps": len(w.points) * seeds * max_iters,
                     "saved": len(h.halved) * seeds * (max_iters - h.rung) if h.rung else 0})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="python benchmarks/halving_check.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("dirs", nargs="+", type=Path, help="tuned sweep folders trained without halving")
    args = parser.parse_args(argv)
    try:
        rows = [row for d in args.dirs for row in check(d)]
    except UserError as e:
        say_error(e)
        return 2
    print("| study | setting | chosen whole | chosen halved | grid steps apart | stopped at the rung | tuning steps saved |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        apart = "not chosen: a point it needs was not trained" if r["apart"] is None else str(r["apart"])
        print(f"| {r['study']} | {r['setting']} | {tune.point_label(r['whole'] or {})} | "
              f"{tune.point_label(r['halved'] or {})} | {apart} | "
              f"{', '.join(tune.point_label(p) for p in r['stopped']) or 'none'} | "
              f"{r['saved'] / r['steps']:.0%} |")
    same = sum(r["apart"] == 0 for r in rows)
    far = [r for r in rows if r["apart"] is None or r["apart"] > 1]
    saved, steps = sum(r["saved"] for r in rows), sum(r["steps"] for r in rows)
    print(f"\n{len(rows)} settings: the same value in {same}, one grid step apart in "
          f"{sum(r['apart'] == 1 for r in rows)}, further or not chosen in {len(far)}; halving saves "
          f"{saved:,} of {steps:,} tuning steps ({saved / steps if steps else math.nan:.0%})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
