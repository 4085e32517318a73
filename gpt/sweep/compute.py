"""A run's compute, read from its config and eval curve: parameters, FLOPs per token, tokens and FLOPs
seen, seconds; and a run's val loss at a given FLOPs budget or wall-clock time."""

from __future__ import annotations

import math

from ..config import GPTConfig, build
from ..errors import UserError

# the columns compute() adds to a run's row of sweep.csv
COLUMNS = ("params", "params_no_emb", "flops_per_token", "tokens", "total_flops", "seconds")


def tokens_per_iter(config: dict) -> int:
    return config["batch_size"] * config["block_size"] * config.get("gradient_accumulation_steps", 1)


def compute(config: dict, evals: list[dict]) -> dict:
    """The run's parameters (all, and without the embedding tables), training FLOPs per token (the
    estimate of gpt/bench.py), tokens and FLOPs up to its last evaluation, and its training seconds;
    NaN where the run has no config yet."""
    try:
        model = build(GPTConfig, config)
        per_iter = tokens_per_iter(config)
    except (UserError, KeyError, TypeError):
        return dict.fromkeys(COLUMNS, math.nan)
    last = evals[-1] if evals else {}
    tokens = last.get("iter", 0) * per_iter
    return {"params": model.num_params(), "params_no_emb": model.num_params(non_embedding=True),
            "flops_per_token": model.flops_per_token(), "tokens": tokens,
            "total_flops": tokens * model.flops_per_token(), "seconds": last.get("elapsed_s", math.nan)}


def along(row: dict, x: str) -> list[tuple[float, float]]:
    """The run's finite evaluations as (x, val loss): x is steps, flops (model FLOPs seen) or seconds
    (of training)."""
    per_step = tokens_per_iter(row["_config"]) * row["flops_per_token"] if x == "flops" else 1.0
    points = []
    for e in row["_evals"]:
        at = e.get("elapsed_s", math.nan) if x == "seconds" else e["iter"] * per_step
        if math.isfinite(e["val_loss"]) and math.isfinite(at):
            points.append((at, e["val_loss"]))
    return points


def loss_at(points: list[tuple[float, float]], budget: float) -> float:
    """The val loss at `budget` on a curve of (x, loss) points, linear between the evaluations around
    it; NaN where the curve does not reach it."""
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if x0 <= budget <= x1:
            return y0 if x1 == x0 else y0 + (y1 - y0) * (budget - x0) / (x1 - x0)
    if points and points[-1][0] == budget:
        return points[-1][1]
    return math.nan


def common_budget(rows: list[dict], x: str) -> float:
    """The largest budget every one of these runs reached: the least of their last evaluations' x."""
    ends = [points[-1][0] for r in rows if (points := along(r, x))]
    return min(ends) if ends and len(ends) == len(rows) else math.nan
