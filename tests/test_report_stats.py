"""A sweep report's verdicts hold together over a study: Welch's test per setting, Holm–Bonferroni over them all."""

import json
import math
import statistics
from pathlib import Path

import pytest
from scipy import stats

from gpt.sweep import report

BASE = [2.00, 2.01, 1.99]       # std 0.01: against 3 more seeds of std 0.01, Welch's test has df 4


def shifted(p: float) -> list[float]:
    """BASE moved up by the difference whose Welch p against BASE is p."""
    d = stats.t.isf(p / 2, 4) * math.sqrt(2 / 3) * 0.01
    return [v + d for v in BASE]


def rows(label, values):
    return [{"_setting": label, "final_val_loss": v, "status": "finished", "diverged": False,
             "per_character": False} for v in values]


def study(settings: dict[str, list[float]]) -> list[dict]:
    return report.summarize([r for label, values in settings.items() for r in rows(label, values)])


def test_holm_adjusts_the_smallest_p_most_and_keeps_the_order():
    assert report.holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert report.holm([0.5, 0.001, 0.2, 0.9]) == pytest.approx([1.0, 0.004, 0.6, 1.0])
    assert report.holm([0.02]) == [0.02] and report.holm([]) == []


def test_holm_turns_a_verdict_each_comparison_alone_would_give():
    summary = study({"base": BASE, "a": shifted(0.01), "b": shifted(0.04), "c": shifted(0.03)})
    assert [s["p"] for s in summary[1:]] == pytest.approx([0.01, 0.04, 0.03])
    assert [s["p_holm"] for s in summary[1:]] == pytest.approx([0.03, 0.06, 0.06])
    assert [s["vs_baseline"].split(" by")[0].split(" (")[0] for s in summary] == [
        "baseline", "worse", "within noise", "within noise"]
    # each alone is a study of one comparison, and differs
    assert all(report.versus(summary[0], s).startswith("worse by") for s in summary[1:])


def test_one_comparison_is_welchs_test_on_the_seeds():
    worse = [2.025, 2.015, 2.035]
    p = stats.ttest_ind(worse, BASE, equal_var=False).pvalue
    assert 0.01 < p < 0.05
    summary = study({"base": BASE, "worse": worse})
    assert summary[1]["p"] == summary[1]["p_holm"] == pytest.approx(p, rel=1e-9)
    assert summary[1]["vs_baseline"] == "worse by 0.025"
    # a second setting, level with the baseline, makes it the first of two: 2p, over 0.05
    summary = study({"base": BASE, "worse": worse, "level": [v + 0.001 for v in BASE]})
    assert summary[1]["p_holm"] == pytest.approx(2 * p, rel=1e-9)
    assert summary[1]["vs_baseline"] == "within noise (+0.025)"
    assert summary[2]["p_holm"] == summary[2]["p"] > 0.8


def test_settings_without_a_test_are_not_counted_among_the_comparisons():
    worse = [2.025, 2.015, 2.035]
    diverged = [{"_setting": "diverged", "final_val_loss": math.nan, "status": "diverged", "diverged": True,
                 "per_character": False}]
    summary = report.summarize(rows("base", BASE) + rows("one seed", [2.5]) + rows("worse", worse) + diverged)
    assert [s["vs_baseline"] for s in summary] == ["baseline", "needs 2+ seeds", "worse by 0.025", "no result"]
    assert math.isnan(summary[1]["p"]) and summary[2]["p_holm"] == summary[2]["p"]


def test_no_spread_on_either_side_keeps_any_difference_real_among_many():
    still = [3.342] * 3
    summary = study({"base": still, "lower": [3.341] * 3, "same": still, "noisy": [3.30, 3.35, 3.40]})
    assert [s["vs_baseline"] for s in summary] == ["baseline", "better by 0.001", "within noise (+0.000)",
                                                   "within noise (+0.008)"]
    assert summary[1]["p_holm"] == 0.0 and summary[2]["p_holm"] == 1.0


@pytest.fixture
def quiet(monkeypatch):
    """The figures left out: they take a second and are not what is tested here."""
    monkeypatch.setattr(report, "plot", lambda rows, path, x="steps": None)
    monkeypatch.setattr(report, "plot_diagnostics", lambda rows, path: None)


def test_the_summary_says_how_many_comparisons_share_the_five_percent(tmp_path, quiet):
    out = tmp_path / "sw"
    losses = {1: BASE, 2: shifted(0.01), 3: shifted(0.04), 4: shifted(0.03)}
    out.mkdir()
    (out / "sweep.json").write_text(json.dumps({"axes": {"n_layer": list(losses)}, "seeds": 3, "base_seed": 0,
                                                "command": "train.py --sweep n_layer=1,2,3,4 --seeds=3"}))
    for n_layer, values in losses.items():
        for seed, v in enumerate(values):
            run = out / f"n_layer={n_layer}__seed={seed}"
            run.mkdir()
            (run / "metrics.jsonl").write_text(json.dumps({"kind": "eval", "iter": 10, "train_loss": v,
                                                           "val_loss": v}) + "\n")
            # a batch size of each setting's own: its runs see other batches, so Welch's test compares them
            (run / "config.json").write_text(json.dumps({"model": {"n_layer": n_layer},
                                                         "train": {"seed": seed, "batch_size": 4 * n_layer}}))
            (run / "result.json").write_text(json.dumps({"status": "finished", "returncode": 0, "wall_s": 1.0}))
    report.report(out)
    summary = (out / "summary.md").read_text()
    assert ("The 3 comparisons with the baseline are held together to a family-wise error of 5% "
            "(Holm–Bonferroni): a setting is 'worse' or 'better' only where its Holm-adjusted p is under "
            "0.05.") in summary.splitlines()
    d = [f"{statistics.fmean(v) - 2.0:+.3f}" for v in losses.values()]
    half = stats.t.ppf(0.975, 4) * math.sqrt(2 / 3) * 0.01     # Welch's df is 4 at equal spreads
    ci = [f"{x - half:+.3f} to {x + half:+.3f}" for x in (statistics.fmean(v) - 2.0 for v in losses.values())]
    assert ("| setting | difference | 95% CI | test | p | Holm-adjusted p |\n|---|---|---|---|---|---|\n"
            f"| n_layer=2 | {d[1]} | {ci[1]} | Welch | 0.010 | 0.030 |\n"
            f"| n_layer=3 | {d[2]} | {ci[2]} | Welch | 0.040 | 0.060 |\n"
            f"| n_layer=4 | {d[3]} | {ci[3]} | Welch | 0.030 | 0.060 |\n") in summary
    assert f"| n_layer=3 | 3 | {2.0 + float(d[2]):.3f} ± 0.010 | 0 | within noise ({d[2]}) |" in summary
    assert "| n_layer=2 | 3 |" in summary and f"| worse by {float(d[1]):.3f} |" in summary


def test_runs_matched_by_seed_are_compared_by_their_per_seed_differences():
    from gpt.sweep import stats as st
    base = {0: 2.00, 1: 2.10, 2: 1.90, 3: 2.05}
    other = {0: 2.02, 1: 2.13, 2: 1.91, 3: 2.08}      # 0.02 to 0.03 above, seed by seed
    c = st.compare(base, other, paired=True)
    diffs = [other[s] - base[s] for s in base]
    t = stats.ttest_rel(list(other.values()), list(base.values()))
    half = stats.t.ppf(0.975, 3) * statistics.stdev(diffs) / 2
    assert c["test"] == "paired" and c["p"] == pytest.approx(t.pvalue)
    assert (c["low"], c["high"]) == pytest.approx((statistics.fmean(diffs) - half, statistics.fmean(diffs) + half))
    # unpaired, the seeds' spread (0.1) hides the same shift
    welch = st.compare(base, other, paired=False)
    assert welch["test"] == "Welch" and c["p"] < 0.05 < 0.5 < welch["p"]
    assert welch["p"] == pytest.approx(stats.ttest_ind(list(other.values()), list(base.values()),
                                                       equal_var=False).pvalue)
    # seeds that do not match are left out of the pairs; fewer than two pairs fall back on Welch
    assert st.compare(base, {0: 2.02, 7: 2.2, 8: 2.1}, paired=True)["test"] == "Welch"
    assert st.compare({0: 2.0}, {0: 2.1}, paired=True) is None


def test_a_setting_that_diverged_on_a_seed_is_marked_unstable_and_counted_at_the_unigram_loss():
    def run(label, seed, loss, diverged=False):
        return {"_setting": label, "seed": seed, "final_val_loss": math.nan if diverged else loss,
                "status": "diverged" if diverged else "finished", "diverged": diverged, "per_character": False,
                "_config": {"batch_size": 16}, "_evals": [{"iter": 0, "val_loss": 4.2, "unigram_loss": 3.3}]}
    rows = [run("base", s, 2.0 + 0.01 * s) for s in range(3)]
    rows += [run("fragile", 0, 1.95), run("fragile", 1, 1.96), run("fragile", 2, 0, diverged=True)]
    summary = report.summarize(rows)
    fragile = summary[1]
    assert fragile["unstable"] and fragile["n"] == 2 and fragile["mean"] == pytest.approx(1.955)
    # judged with its third seed at 3.3, not on its two survivors (which alone look better)
    assert fragile["_finals"] == {0: 1.95, 1: 1.96, 2: 3.3} and fragile["diff"] > 0
    assert "(unstable)" in report.summary_table(summary)


def test_a_nan_p_counts_last_in_holm_and_moves_no_other():
    from gpt.sweep import stats as st
    assert st.holm([0.01, math.nan, 0.02]) == pytest.approx([0.03, 1.0, 0.04])
    assert st.holm([math.nan, 0.01]) == pytest.approx([1.0, 0.02])


def test_a_two_axis_study_compares_each_axis_within_each_level_of_the_other():
    from gpt.sweep import stats as st
    axes = {"parallel": [False, True], "learning_rate": [1e-3, 1e-2]}
    labels = {st.key_of({"parallel": p, "learning_rate": lr}): f"{p}/{lr}" for p in (False, True) for lr in (1e-3, 1e-2)}
    assert st.within_levels(axes, labels) == [
        ("parallel", "learning_rate=0.001", "False/0.001", "True/0.001"),
        ("parallel", "learning_rate=0.01", "False/0.01", "True/0.01"),
        ("learning_rate", "parallel=false", "False/0.001", "False/0.01"),
        ("learning_rate", "parallel=true", "True/0.001", "True/0.01")]
    # a linked axis is one factor; a setting the grid does not hold (muon_lr under AdamW) is skipped
    del labels[st.key_of({"parallel": True, "learning_rate": 1e-2})]
    assert len(st.within_levels(axes, labels)) == 2


def test_lr_sensitivity_is_the_mean_of_the_capped_losses_over_the_grid_less_the_best():
    from gpt.sweep import stats as st
    # initial loss 4.2; a diverged point counts at it
    assert st.lr_sensitivity([(1e-3, 2.3), (1e-2, 2.0), (1e-1, math.inf)], 4.2) == pytest.approx(
        (2.3 + 2.0 + 4.2) / 3 - 2.0)
    assert st.lr_sensitivity([(1e-3, 2.0), (1e-2, 2.0)], 4.2) == 0.0


def test_the_loss_at_a_flops_budget_is_read_off_the_eval_curve():
    from gpt.sweep import compute
    row = {"_config": {"batch_size": 2, "block_size": 5}, "flops_per_token": 100.0,
           "_evals": [{"iter": 0, "val_loss": 4.0, "elapsed_s": 0.0}, {"iter": 10, "val_loss": 3.0, "elapsed_s": 2.0},
                      {"iter": 20, "val_loss": 2.0, "elapsed_s": 5.0}]}
    points = compute.along(row, "flops")
    assert points == [(0.0, 4.0), (10000.0, 3.0), (20000.0, 2.0)]     # iter x 10 tokens x 100 FLOPs
    assert compute.loss_at(points, 15000.0) == pytest.approx(2.5)
    assert compute.loss_at(points, 20000.0) == 2.0 and math.isnan(compute.loss_at(points, 25000.0))
    assert compute.loss_at(compute.along(row, "seconds"), 3.5) == pytest.approx(2.5)
    short = {**row, "_evals": row["_evals"][:2]}
    assert compute.common_budget([row, short], "flops") == 10000.0


def test_a_verdict_is_read_across_sizes():
    from gpt.sweep import stats as st
    assert st.size_trend([("64", "better"), ("128", "better")]) == "better at every size"
    assert st.size_trend([("64", "better"), ("128", "worse")]) == "flips: better at 64, worse at 128"
    assert st.size_trend([("64", "within noise"), ("128", "worse"), ("256", "worse")]) == \
        "worse from 128 on (within noise below)"
    assert st.size_trend([("64", "worse"), ("128", "within noise")]) == \
        "depends on size: worse at 64, within noise at 128"
    fit_a, fit_b = st.power_law([1e4, 1e5], [3.0, 2.0]), st.power_law([1e4, 1e5], [2.5, 2.2])
    at = st.crossing(fit_a, fit_b)
    assert math.exp(fit_a[0]) * at ** fit_a[1] == pytest.approx(math.exp(fit_b[0]) * at ** fit_b[1])
    assert 1e4 < at < 1e5


def sized_rows(ends: dict[tuple[int, str], list[float]]) -> list[dict]:
    """Rows of a sweep over n_embd and pos_encoding with these final losses per seed."""
    from gpt.sweep import grid
    rows = []
    for (width, pos), losses in ends.items():
        setting = {"n_embd": width, "pos_encoding": pos}
        for seed, loss in enumerate(losses):
            rows.append({"_setting": grid.setting_label(setting), "_setting_values": setting, "seed": seed,
                         "final_val_loss": loss, "status": "finished", "diverged": False, "per_character": False,
                         "_config": {"batch_size": 16}, "_evals": [], "params": 1000.0 * width})
    return rows


def test_the_size_table_says_where_a_verdict_holds():
    from gpt.sweep import comparisons
    axes = {"n_embd": [64, 128], "pos_encoding": ["learned", "none"]}
    rows = sized_rows({(64, "learned"): [2.00, 2.01, 2.02], (64, "none"): [2.005, 2.02, 2.02],
                       (128, "learned"): [1.90, 1.91, 1.92], (128, "none"): [1.99, 2.00, 2.01]})
    levels = comparisons.within_level_rows(axes, report.summarize(rows))
    assert [(r["axis"], r["level"], r["test"]) for r in levels] == [
        ("n_embd", "pos_encoding=learned", "paired"), ("n_embd", "pos_encoding=none", "paired"),
        ("pos_encoding", "n_embd=64", "paired"), ("pos_encoding", "n_embd=128", "paired")]
    table = comparisons.size_section(axes, levels)
    assert "| pos_encoding | none | learned | — | worse from n_embd=128 on (within noise below) |" in table


def test_runs_that_shared_their_cores_are_named_and_left_out_of_the_time_comparison():
    from gpt.sweep import comparisons
    def run(label, seed, share, slope):
        evals = [{"iter": it, "val_loss": 4.0 - slope * it, "elapsed_s": it / 10.0} for it in (0, 100, 200)]
        return {"_setting": label, "seed": seed, "final_val_loss": evals[-1]["val_loss"], "status": "finished",
                "diverged": False, "per_character": False, "_evals": evals, "_folder": Path(f"{label}{seed}"),
                "_config": {"batch_size": 2, "block_size": 4}, "params": 100.0, "params_no_emb": 90.0,
                "flops_per_token": 600.0, "cpu_share": share}
    rows = [run("a", 0, 0.97, 0.005), run("a", 1, 0.95, 0.005), run("b", 0, 0.4, 0.006), run("b", 1, 0.96, 0.006)]
    table = comparisons.compute_section(report.summarize(rows))
    assert "1 of the 4 runs got less than 80% of their threads' CPU time" in table and "b0 (40%)" in table
    # the time column reads seed 1 of b alone: 4.0 - 0.006 * 200 at 20 s
    assert "| b | 100 (90) | 600 | 2.800 ± 0.000 | 2.800 ± 0.000 | 2.800 |" in table
