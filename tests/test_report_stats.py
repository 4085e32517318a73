"""A sweep report's verdicts hold together over a study: Welch's test per setting, Holm–Bonferroni over them all."""

import json
import math
import statistics

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
