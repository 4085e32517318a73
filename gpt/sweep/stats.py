"""The statistics of a sweep's report: one setting's final losses against another's (paired by seed
where the runs are matched, else Welch's test), Holm–Bonferroni over a study's comparisons, the
comparisons a factorial study asks for, LR sensitivity, and how a verdict moves with size."""

from __future__ import annotations

import itertools
import math
import statistics

from ..config import read_by_optimizer
from .grid import factors

# the family-wise error of a study's comparisons, all together
ALPHA = 0.05
# runs of one seed and these settings train on the same batches (docs/sweeps.md, Paired comparisons)
SAME_BATCHES = ("batch_size", "block_size", "gradient_accumulation_steps")
# the options that set a model's size: an axis of them makes a study's size trend
SIZES = ("n_embd", "n_layer")


def finals(group: list[dict]) -> dict[int, float]:
    """A setting's final val loss per seed, as its test counts it: a run that diverged counts at the
    unigram loss (it learned no more than character frequencies), so that an unstable setting is
    not judged on its survivors; runs without a result are left out."""
    out = {}
    for i, r in enumerate(group):
        seed = r.get("seed", f"run {i}")    # rows made by hand may have none: then nothing pairs
        if r["status"] not in ("finished", "diverged"):
            continue
        if r["diverged"]:
            unigram = next((e["unigram_loss"] for e in r.get("_evals", []) if "unigram_loss" in e), math.nan)
            if math.isfinite(unigram):
                out[seed] = unigram
        elif math.isfinite(r["final_val_loss"]):
            out[seed] = r["final_val_loss"]
    return out


def matched(base: list[dict], other: list[dict]) -> bool:
    """Whether two settings' runs of one seed train on the same batches."""
    configs = [r.get("_config") for r in (*base, *other)]
    return all(configs) and all(len({repr(c.get(k)) for c in configs}) == 1 for k in SAME_BATCHES)


def compare(base: dict[int, float], other: dict[int, float], paired: bool) -> dict | None:
    """other's losses against base's: the mean difference (other - base), its 95% confidence
    interval and two-sided p, by the paired t-test over the seeds both have (where paired and 2+
    seeds match) or else Welch's unequal-variance t-test; None with fewer than 2 values a side."""
    from scipy import stats     # here: train.py imports this module, and SciPy takes a second to load
    both = sorted(set(base) & set(other))
    if paired and len(both) >= 2:
        diffs = [other[s] - base[s] for s in both]
        mean, sd, n = statistics.fmean(diffs), statistics.stdev(diffs), len(diffs)
        if sd == 0:
            return {"test": "paired", "n": n, "diff": mean, "low": mean, "high": mean, "p": 0.0 if mean else 1.0}
        half = stats.t.ppf(0.975, n - 1) * sd / math.sqrt(n)
        p = float(2 * stats.t.sf(abs(mean) / (sd / math.sqrt(n)), n - 1))   # scipy's ttest_rel, from these moments
        return {"test": "paired", "n": n, "diff": mean, "low": mean - half, "high": mean + half, "p": p}
    a, b = list(base.values()), list(other.values())
    if len(a) < 2 or len(b) < 2:
        return None
    diff = statistics.fmean(b) - statistics.fmean(a)
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    if va + vb == 0:
        return {"test": "Welch", "n": min(len(a), len(b)), "diff": diff, "low": diff, "high": diff,
                "p": 0.0 if diff else 1.0}
    df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    half = stats.t.ppf(0.975, df) * math.sqrt(va + vb)
    p = float(2 * stats.t.sf(abs(diff) / math.sqrt(va + vb), df))    # scipy's ttest_ind, from these moments
    return {"test": "Welch", "n": min(len(a), len(b)), "diff": diff, "low": diff - half, "high": diff + half, "p": p}


def welch_p(base: dict, s: dict) -> float:
    """The two-sided p of Welch's t-test (unequal variances) of a setting's mean final loss
    against the baseline's, from each one's mean, std (n - 1) and number of seeds (2 or more)."""
    if s["std"] == 0 and base["std"] == 0:      # no spread at all: any difference is beyond it
        return 0.0 if s["mean"] != base["mean"] else 1.0
    from scipy import stats
    return float(stats.ttest_ind_from_stats(s["mean"], s["std"], s["n"], base["mean"], base["std"],
                                            base["n"], equal_var=False).pvalue)


def holm(ps: list[float]) -> list[float]:
    """Holm–Bonferroni adjusted p-values: the smallest p times m, the next times m - 1 and so on,
    each at least the one before it and at most 1. Those under ALPHA hold the chance of any false
    'differs' among the m comparisons to ALPHA. A NaN p (no test) counts as 1, last, so it never
    moves another's rank. (SciPy has no Holm; statsmodels, which has, is large.)"""
    ps = [1.0 if math.isnan(p) else p for p in ps]
    adjusted, highest = [1.0] * len(ps), 0.0
    for rank, i in enumerate(sorted(range(len(ps)), key=ps.__getitem__)):
        highest = max(highest, min(1.0, (len(ps) - rank) * ps[i]))
        adjusted[i] = highest
    return adjusted


def verdict(diff: float, p_holm: float) -> str:
    """better or worse (lower or higher loss) where the Holm-adjusted p is under ALPHA, else within noise."""
    return f"{'worse' if diff > 0 else 'better'} by {abs(diff):.3f}" if p_holm < ALPHA else f"within noise ({diff:+.3f})"


def within_levels(axes: dict[str, list], labels: dict[tuple, str]) -> list[tuple[str, str, str, str]]:
    """The factorial reading of a grid: along each axis, each value against the axis's first value,
    within each level of the other axes. labels maps a setting's (name, value) pairs, sorted, to its
    label. Returns (axis, level, baseline label, setting label), for the settings the grid holds; a
    setting made once for an optimizer that does not read an axis (AdamW and muon_lr) is found
    under its own values, and never compared with itself."""
    parts = factors(axes)
    out = []
    for i, (names, values) in enumerate(parts):
        others = parts[:i] + parts[i + 1:]
        for level in itertools.product(*(vals for _, vals in others)):
            fixed = {n: v for (ns, _), value in zip(others, level) for n, v in zip(ns, value)}
            where = ", ".join(f"{n}={shown_value(v)}" for n, v in fixed.items()) or "—"
            base = labels.get(key_of(read_only({**fixed, **dict(zip(names, values[0]))})))
            for value in values[1:]:
                label = labels.get(key_of(read_only({**fixed, **dict(zip(names, value))})))
                if base and label and label != base:
                    out.append((":".join(names), where, base, label))
    return out


def read_only(setting: dict) -> dict:
    """A setting without the options its optimizer does not read, as the grid holds it."""
    if "optimizer" not in setting:
        return setting
    return {k: v for k, v in setting.items() if read_by_optimizer(setting["optimizer"], k)}


def key_of(setting: dict) -> tuple:
    return tuple(sorted((k, shown_value(v)) for k, v in setting.items()))


def shown_value(value) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def lr_sensitivity(points: list[tuple[float, float]], initial: float) -> float:
    """Wortsman et al. (2023): the mean over a grid of min(loss, initial loss) minus the grid's best
    loss. points are (value, loss) with a diverged run's loss inf; 0 means every value of the grid
    trains as well as the best."""
    losses = [min(loss, initial) for _, loss in points]
    return statistics.fmean(losses) - min(losses) if losses else math.nan


def size_trend(verdicts: list[tuple[str, str]]) -> str:
    """How a comparison's verdict moves along sizes, given (size, verdict word) from the smallest
    size up, each word better, worse or within noise."""
    words = [w for _, w in verdicts]
    if len(set(words)) == 1:
        return f"{words[0]} at every size"
    if {"better", "worse"} <= set(words):
        return "flips: " + ", ".join(f"{w} at {s}" for s, w in verdicts)
    for start in range(1, len(words)):
        tail, head = set(words[start:]), set(words[:start])
        if len(tail) == 1 and head == {"within noise"} and "within noise" not in tail:
            return f"{words[-1]} from {verdicts[start][0]} on (within noise below)"
    return "depends on size: " + ", ".join(f"{w} at {s}" for s, w in verdicts)


def power_law(params: list[float], losses: list[float]) -> tuple[float, float] | None:
    """(a, b) of loss = exp(a) * params ** b fitted in log-log by least squares; None with fewer
    than two sizes."""
    if len(set(params)) < 2:
        return None
    xs, ys = [math.log(p) for p in params], [math.log(v) for v in losses]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return my - b * mx, b


def crossing(fit1: tuple[float, float], fit2: tuple[float, float]) -> float | None:
    """The parameter count at which two power-law fits meet; None if they are parallel."""
    (a1, b1), (a2, b2) = fit1, fit2
    if b1 == b2:
        return None
    x = (a2 - a1) / (b1 - b2)
    return math.exp(x) if -700 < x < 700 else None


def overlap(a: list[tuple], b: list[tuple]) -> tuple[float, float]:
    """The parameter counts that both settings were measured over, (low, high); low > high where
    none: a and b are each setting's points, (parameters, ...) sorted by parameters."""
    return max(a[0][0], b[0][0]), min(a[-1][0], b[-1][0])


def both_measured(a: list[tuple], b: list[tuple], size: float) -> bool:
    """Whether size lies within the parameter counts that both settings were measured over."""
    low, high = overlap(a, b)
    return low <= size <= high
