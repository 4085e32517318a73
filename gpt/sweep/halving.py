"""Successive halving of tuning runs: where a setting's grid pauses, and which points train on from there.

A setting's given grid trains to a rung, a quarter of max_iters (Jamieson and Talwalkar 2016; Li
et al. 2018), and pauses. Once every point has reached it, the point best there (the leader), its
neighbours one grid step away along each tuned option, and the best half train on to the end; the
rest stop. Where the final loss falls and rises once along the grid, and the final best lies within
two grid steps of the leader, the value chosen is then at most one grid step from the one the whole
grid would choose.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

from ..config import TrainConfig, build
from .grid import evals_of, status_of

RUNG_FRACTION = 4       # the rung: max_iters // this
MIN_POINTS = 3          # fewer points keep every one (the leader and its neighbours, or the best half)


def rung_for(sweep: dict, setting: dict, points: int) -> int:
    """The iteration a setting's given grid of `points` pauses at: 0 where the sweep does not halve
    (tune_halving off, or recorded before it), or where the grid is too small to stop any point."""
    if not sweep.get("tune_halving") or points < MIN_POINTS:
        return 0
    return build(TrainConfig, {**sweep.get("values", {}), **setting}).max_iters // RUNG_FRACTION


def loss_at_rung(folder: Path, rung: int) -> float | None:
    """A tuning run's val loss at the rung, however it ended after it: inf where its loss there was
    not finite, or it diverged or was pruned before it; nan where it finished without evaluating
    there (a grid that grew to halving's size); None while it has not reached the rung."""
    there = [e["val_loss"] for e in evals_of(folder) if e["iter"] == rung]
    if there:
        return there[-1] if math.isfinite(there[-1]) else math.inf
    status = status_of(folder)
    return math.inf if status in ("diverged", "pruned") else math.nan if status == "finished" else None


def mean_at_rung(losses: list[float | None]) -> float | None:
    """A point's loss at the rung over its tuning seeds (None while a seed has not reached it): a seed
    lost there makes it the worst, inf."""
    if None in losses:
        return None
    return math.inf if any(v == math.inf for v in losses) else statistics.fmean(losses)


def kept_at_rung(points: list[dict], names: list[str], at_rung: list[float | None], lost) -> set[int] | None:
    """The indices of the points that train past the rung; None while one has not reached it. Every
    point trains on where one finished without evaluating at the rung (nothing to compare), and
    where every kept point ended lost(i) (diverged or pruned past the rung): the stopped ones are
    then the setting's only chance."""
    if any(v is not None and math.isnan(v) for v in at_rung):
        return set(range(len(points)))
    if None in at_rung:
        return None
    kept = kept_points(points, names, at_rung)
    return set(range(len(points))) if all(lost(i) for i in kept) else kept


def kept_points(points: list[dict], names: list[str], at_rung: list[float]) -> set[int]:
    """The indices of the points that train on: the leader (the lowest loss at the rung, the first on
    a tie), its neighbours one grid step away along each option, and the best half. Where no point
    learned by the rung, every one trains on: the rung says nothing."""
    order = sorted(range(len(points)), key=lambda i: (at_rung[i], i))
    leader = points[order[0]]
    if at_rung[order[0]] == math.inf:
        return set(range(len(points)))
    kept = set(order[:math.ceil(len(points) / 2)])
    for name in names:
        values = sorted({p[name] for p in points})
        at = values.index(leader[name])
        for j in (at - 1, at + 1):
            neighbour = {**leader, name: values[j]} if 0 <= j < len(values) else None
            if neighbour in points:
                kept.add(points.index(neighbour))
    return kept
