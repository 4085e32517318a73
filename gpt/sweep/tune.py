"""Tuning per setting: each setting's grid trained on tuning seeds, its best value chosen (the grid
extended where the best sits at an edge), then the confirmation runs at that value.

Everything here follows from sweep.json and the run folders' results, so a sweep started again,
its status and its report all see the same plan: tuning runs ended are reused, and a grid given
more values reuses the points it already holds.
"""

from __future__ import annotations

import itertools
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from ..config import GPTConfig, TrainConfig, build, read_by_optimizer
from ..errors import UserError
from . import halving
from .grid import DONE, SweepRun, evals_of, expand, final_eval, run_folder, settings_of, status_of

TUNE_DIR = "tune"       # the tuning runs' folders, apart from the confirmation runs
SEED_OFFSET = 1000      # the first tuning seed by default: seed + this


def tuning_extra(sweep: dict, setting: dict) -> dict:
    """What a setting's tuning runs get beyond their values: stop_hopeless where the sweep prunes,
    and evaluations only as often as tune_evals asks, without diagnostics (the choice reads the final
    val loss, LR sensitivity the first; neither the report nor the figures read the rest)."""
    extra = {"stop_hopeless": True} if sweep.get("tune_prune") else {}
    if sweep.get("tune_evals"):     # sweeps recorded before tune_evals evaluate as they always did
        cfg = build(TrainConfig, {**sweep.get("values", {}), **setting})
        extra.update(eval_interval=max(cfg.eval_interval, math.ceil(cfg.max_iters / sweep["tune_evals"])),
                     diagnostics=False)
    return extra


def tuning_seeds(sweep: dict) -> list[int]:
    first = sweep["tune_seed"] if sweep.get("tune_seed", -1) != -1 else sweep["base_seed"] + SEED_OFFSET
    return list(range(first, first + sweep.get("tune_seeds", 1)))


def check_seeds(sweep: dict) -> None:
    """Refuse tuning seeds that are also confirmation seeds (the runs that chose a value would then
    judge it) or that leave seed's range."""
    tuning, base = tuning_seeds(sweep), sweep["base_seed"]
    confirm = range(base, base + sweep["seeds"])
    if tuning[-1] >= 2 ** 32:
        raise UserError(f"the tuning seeds would run to {tuning[-1]}, past 2**32 - 1; give a lower --tune_seed")
    both = sorted(set(tuning) & set(confirm))
    if both:
        raise UserError(f"the tuning seeds {tuning[0]}..{tuning[-1]} overlap the confirmation seeds "
                        f"{confirm[0]}..{confirm[-1]} (at {both[0]}): a value would be judged on the runs that "
                        f"chose it; give --tune_seed={confirm[-1] + 1} or higher")


def step_beyond(values: list, low: bool):
    """One grid step past the low or the high end of sorted values: the factor between the two values
    at that end where all are positive (a log grid), else their difference. Whole numbers stay
    whole; floats keep 3 significant digits."""
    end, next_in = (values[0], values[1]) if low else (values[-1], values[-2])
    new = end * end / next_in if all(v > 0 for v in values) else end + (end - next_in)
    if isinstance(end, int):
        new = round(new)
        return new if new not in values and (new > 0 or not all(v > 0 for v in values)) else None
    return float(f"{new:.3g}")


def point_label(point: dict) -> str:
    return ", ".join(f"{k}={v:g}" for k, v in point.items()) if point else "—"


@dataclass
class Tuning:
    """One setting's tuning: its grid points (the given grid, then extensions), each point's final
    val loss per tuning seed (inf: diverged or pruned; None: not ended), and the chosen point once
    every point has ended."""
    setting: dict
    names: list[str]
    base: list[dict]
    points: list[dict]
    losses: list[list[float | None]]
    extended: dict = field(default_factory=dict)      # (name, "low" | "high") -> grid steps added
    closed: dict = field(default_factory=dict)        # (name, side) -> the next step, not a valid value
    chosen: dict | None = None
    rung: int = 0                                      # the iteration halving compared the given grid at
    at_rung: list[float] = field(default_factory=list)     # each given point's mean val loss there
    halved: list[dict] = field(default_factory=list)       # the given points stopped there

    @property
    def trained(self) -> bool:
        """Whether some point trained without diverging or being pruned."""
        return any(self.mean(i) < math.inf for i in range(len(self.points)) if None not in self.losses[i])

    def mean(self, i: int) -> float:
        """Point i's mean loss over its tuning seeds; a diverged seed makes it the worst, inf."""
        ended = self.losses[i]
        return math.inf if any(v == math.inf for v in ended) else statistics.fmean(ended)

    def where(self, name: str, limit: int) -> str:
        """Where the chosen value of `name` sits in the values tried: inside, or at an edge, and
        whether the edge was extended, up to its limit."""
        values = sorted({p[name] for p in self.points})
        v = self.chosen[name]
        if not self.trained:
            return "none: every value tried diverged or was pruned; the lowest is used"
        if values[0] < v < values[-1]:
            steps = sum(self.extended.get((name, side), 0) for side in ("low", "high"))
            return f"inside{f' (grid extended by {steps})' if steps else ''}"
        side = "low" if v == values[0] else "high"
        added = self.extended.get((name, side), 0)
        if (name, side) in self.closed:
            return (f"at the {side} edge: the next step, {self.closed[(name, side)]:g}, is not a valid value, "
                    "so the best may lie beyond")
        if added >= limit:
            return f"at the {side} edge after {added} extension{'s' * (added != 1)}: the best may lie beyond"
        return f"at the {side} edge"


def grid_points(names: list[str], grids: dict[str, list]) -> list[dict]:
    """Every combination of the tuned options' given values, the first option slowest."""
    return [dict(zip(names, values)) for values in itertools.product(*(grids[n] for n in names))]


def tune_setting(setting: dict, names: list[str], grids: dict[str, list], seeds: list[int], extend: int,
                 loss_at, valid=lambda point: True) -> Tuning:
    """A setting's tuning as far as its results go: loss_at(point, seed) is a run's final loss (inf
    if it diverged or was pruned) or None if it has not ended. The grid grows by one step past an
    edge where the best point sits, up to `extend` steps per edge and only to points valid(point)
    allows, and the choice is made once every point has ended; on equal losses the first point in
    the grid wins. Where every point diverged, the lowest values count as the best, so the grid
    grows downward."""
    if not names:       # it reads no tuned option (muon_lr under AdamW): nothing to choose
        return Tuning(setting, names, [], [], [], chosen={})
    base = grid_points(names, grids)
    t = Tuning(setting, names, base, list(base), [])
    while True:
        t.losses = [[loss_at(p, s) for s in seeds] for p in t.points]
        if any(v is None for ended in t.losses for v in ended):
            return t
        best = t.points[min(range(len(t.points)), key=lambda i: (t.mean(i), i))]
        if not t.trained:       # nothing learned anywhere: look lower
            best = min(t.points, key=lambda p: tuple(p[n] for n in names))
        added = False
        for name in names:
            values = sorted({p[name] for p in t.points})
            for side, edge in (("low", values[0]), ("high", values[-1])):
                if best[name] != edge or t.extended.get((name, side), 0) >= extend:
                    continue
                new = step_beyond(values, side == "low")
                if new is None or new in values or not (new < edge if side == "low" else new > edge):
                    continue
                if not valid({**best, name: new}):
                    t.closed[(name, side)] = new
                    continue
                t.points.append({**best, name: new})
                t.extended[(name, side)] = t.extended.get((name, side), 0) + 1
                added = True
        if not added:
            t.chosen = best
            return t


def ended_loss(folder: Path) -> float | None:
    """A tuning run's final val loss for the choice: inf where it diverged or was pruned, None where
    it has not ended (or failed, so the sweep tries it again)."""
    status = status_of(folder)
    if status not in DONE:
        return None
    if status != "finished":
        return math.inf
    final = final_eval(folder)
    loss = final["val_loss"] if final else math.nan
    return loss if math.isfinite(loss) else math.inf


@dataclass
class Plan:
    """The runs a sweep needs now: for a tuned sweep, each setting's tuning runs so far and the
    confirmation runs of the settings whose value is chosen; otherwise its runs."""
    tunings: list[Tuning]
    tuning_runs: list[SweepRun]
    confirm_runs: list[SweepRun]

    @property
    def chosen_all(self) -> bool:
        return all(t.chosen is not None for t in self.tunings)


def valid_point(sweep: dict, values: dict) -> bool:
    """Whether a grid point, over the sweep's other values (recorded in sweep.json), is a config a
    run accepts: a step past the edge may leave an option's range (a learning rate under min_lr, a
    beta of 1). A sweep recorded without its values takes every point as valid."""
    if "values" not in sweep:
        return True
    try:
        build(GPTConfig, {**sweep["values"], **values})
        build(TrainConfig, {**sweep["values"], **values})
    except (UserError, TypeError, ValueError):
        return False
    return True


def tuned_names(sweep: dict, setting: dict) -> list[str]:
    """The tuned options this setting reads: under AdamW, a muon_* option is not."""
    return [n for n in sweep["tune"] if "optimizer" not in setting or read_by_optimizer(setting["optimizer"], n)]


def plan(sweep: dict, out_dir: Path) -> Plan:
    """The sweep's runs as its description (sweep.json) and its run folders' results give them."""
    out_dir = Path(out_dir)
    if not sweep.get("tune"):
        return Plan([], [], expand(sweep["axes"], sweep["seeds"], sweep["base_seed"], out_dir))
    seeds = tuning_seeds(sweep)
    tunings, tuning_runs, confirm_runs = [], [], []
    for setting in settings_of(sweep["axes"]):
        def folder(point: dict, seed: int, setting=setting) -> Path:
            return run_folder(out_dir / TUNE_DIR, setting, seed, point)
        names = tuned_names(sweep, setting)
        base = grid_points(names, sweep["tune"]) if names else []
        rung = halving.rung_for(sweep, setting, len(base))
        at_rung = [halving.mean_at_rung([halving.loss_at_rung(folder(p, s), rung) for s in seeds])
                   for p in base] if rung else []
        kept = halving.kept_at_rung(base, names, at_rung, lambda i: all(
            ended_loss(folder(base[i], s)) == math.inf for s in seeds)) if rung else None
        paused = [p for i, p in enumerate(base) if rung and (kept is None or i not in kept)]

        def loss_at(point: dict, seed: int) -> float | None:
            if point in paused:     # waiting for the rest to reach the rung (None), or stopped there
                return None if kept is None else math.inf
            return ended_loss(folder(point, seed))
        t = tune_setting(setting, names, sweep["tune"], seeds, sweep.get("tune_extend", 2), loss_at,
                         lambda point, setting=setting: valid_point(sweep, {**setting, **point}))
        if kept is not None:
            t.rung, t.at_rung = rung, at_rung
            t.halved = [p for i, p in enumerate(base) if i not in kept and at_rung[i] < math.inf]   # not lost
        tunings.append(t)
        extra = tuning_extra(sweep, setting)
        tuning_runs += [SweepRun(setting, s, folder(p, s), dict(p), "tune",
                                 {**extra, "pause_at": rung} if p in paused else extra)
                        for p in t.points for s in seeds]
        if t.chosen is not None:
            confirm_runs += [SweepRun(setting, seed, run_folder(out_dir, setting, seed, t.chosen), dict(t.chosen))
                             for seed in range(sweep["base_seed"], sweep["base_seed"] + sweep["seeds"])]
    return Plan(tunings, tuning_runs, confirm_runs)
