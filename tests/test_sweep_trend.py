import pytest

import train
from conftest import ROOT, tiny_args
from gpt.sweep import report, stats, trend


@pytest.mark.e2e
def test_a_trend_joins_one_study_run_at_two_sizes_setting_by_setting(data_dir, tmp_path, capsys):
    for width in (16, 32):
        argv = tiny_args(data_dir, tmp_path / f"w{width}", "--max_iters=4", "--eval_interval=4", f"--n_embd={width}",
                         "--sweep", "residual=true,false", "--seeds=2", "--jobs=2")
        assert train.main(argv) == 0
    capsys.readouterr()
    out = tmp_path / "trend.png"
    assert report.main(["trend", str(out), str(tmp_path / "w16"), str(tmp_path / "w32" / "summary.md")]) == 0
    printed = capsys.readouterr().out
    points = trend.read_points(tmp_path / "w32")
    assert set(points) == {"residual=true", "residual=false"}
    params, mean, std = points["residual=true"]
    assert params > trend.read_points(tmp_path / "w16")["residual=true"][0] and std >= 0
    assert f"| residual=true | {params:,.0f} | {mean:.3f} ± {std:.3f} |" in printed
    assert printed.count("| residual=false |") == 2 and printed.endswith(f"written: {out}\n")
    assert out.stat().st_size > 10_000


@pytest.mark.parametrize("args, message", [
    (["t.png", "missing", "missing2"], "missing: no such sweep report"),
    (["t.txt", "a.md", "a.md"], "OUT.png t.txt: a picture's name must end in a format matplotlib writes"),
    (["t.png", "other.md", "a.md"], "holds no table of 'final val loss (mean ± std)'"),
    (["t.png", "a.md", "a.md"], "no setting appears at two sizes in these reports"),
])
def test_a_trend_of_bad_reports_is_refused_in_one_line(tmp_path, monkeypatch, capsys, args, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "other.md").write_text("# notes\n\nno tables here\n")
    (tmp_path / "a.md").write_text(
        "| setting | runs | final val loss (mean ± std) |\n|---|---|---|\n| x=1 | 3 | 2.000 ± 0.010 |\n\n"
        "| setting | parameters (without embeddings) | FLOPs per token |\n|---|---|---|\n| x=1 | 1,000 (900) | 1e6 |\n")
    assert report.main(["trend", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and not (tmp_path / "t.png").exists()


def test_a_trend_wants_an_output_and_two_reports(capsys):
    assert report.main(["trend", "t.png", "a.md"]) == 2
    assert capsys.readouterr().err.startswith("usage: python -m gpt.sweep trend OUT.png")


@pytest.mark.e2e
def test_the_documented_trends_draw_from_the_committed_reports(tmp_path, capsys):
    lines = [line.split()[4:] for line in (ROOT / "docs" / "results.md").read_text().splitlines()
             if line.startswith("python -m gpt.sweep trend ")]
    assert len(lines) >= 10
    for out, *reports in lines:
        assert (ROOT / out).exists() and len(reports) >= 2
        assert report.main(["trend", str(tmp_path / "t.png"), *(str(ROOT / r) for r in reports)]) == 0
        table = capsys.readouterr().out
        rows = [line for line in table.splitlines() if line.startswith("| ")]
        assert len(rows) >= 1 + 2 * 2       # the heading, and two settings at two sizes at least


def report_text(params: str, loss: str, extra_row: str = "") -> str:
    return ("| setting | runs | final val loss (mean ± std) |\n|---|---|---|\n"
            f"| x=1 | 1 | {loss} |\n{extra_row}\n\n"
            "| setting | parameters (without embeddings) | FLOPs per token |\n|---|---|---|\n"
            f"| x=1 | {params} | 1e6 |\n")


def test_one_seed_reports_join_with_no_spread_and_odd_rows_are_named_not_guessed(tmp_path, capsys):
    (tmp_path / "small.md").write_text(report_text("1,000 (900)", "2.500", "| x=2 | 1 | - ± 0.1 |\n| x=3 |"))
    (tmp_path / "large.md").write_text(report_text("4,000 (3,600)", "2.250"))
    out = tmp_path / "t.png"
    assert report.main(["trend", str(out), str(tmp_path / "small.md"), str(tmp_path / "large.md")]) == 0
    captured = capsys.readouterr()
    assert "| x=1 | 1,000 | 2.500 ± 0.000 |" in captured.out and "| x=1 | 4,000 | 2.250 ± 0.000 |" in captured.out
    assert "x=2 left out (loss '- ± 0.1'" in captured.err and "Traceback" not in captured.err
    assert out.stat().st_size > 0


def test_a_crossing_counts_as_measured_only_where_both_settings_were():
    a, b = [(1e3, 2.0, 0), (1e4, 1.5, 0)], [(1e4, 1.6, 0), (1e5, 1.2, 0)]
    assert stats.both_measured(a, b, 1e4) and not stats.both_measured(a, b, 3e4)


def test_a_study_calls_a_crossing_measured_only_within_both_settings_sizes():
    from gpt.sweep.study_plots import size_fits

    def entry(pos, width, params, mean):
        return {"mean": mean, "_group": [{"params": params, "_setting_values": {"n_embd": width, "pos_encoding": pos}}]}
    # learned: 3.0 falling to 2.4 over 1e4..1.6e5; rope: flat near 2.55 over 1e4..4e4 only (its widest run failed)
    summary = [entry("learned", 32, 1e4, 3.0), entry("learned", 64, 4e4, 2.7), entry("learned", 128, 1.6e5, 2.4),
               entry("rope", 32, 1e4, 2.55), entry("rope", 64, 4e4, 2.549), entry("rope", 128, 1.6e5, float("nan"))]
    _, fits, notes = size_fits({"n_embd": [32, 64, 128], "pos_encoding": ["learned", "rope"]}, summary)
    assert set(fits) == {"pos_encoding=learned", "pos_encoding=rope"}
    # the fits meet between 4e4 and 1.6e5: within the sizes of the study, beyond rope's
    at = float(notes[0].split("cross at ")[1].split(" parameters")[0].replace(",", ""))
    assert len(notes) == 1 and 4e4 < at < 1.6e5
    assert "an extrapolation beyond the sizes both were measured at, 10,000 to 40,000" in notes[0]
    # measured at no common size: the note says so rather than a range that runs backwards
    apart = [entry("learned", 32, 1e4, 3.0), entry("learned", 64, 4e4, 2.7), entry("learned", 128, 1.6e5, float("nan")),
             entry("rope", 32, 1e4, float("nan")), entry("rope", 64, 6e4, 2.55), entry("rope", 128, 1.6e5, 2.549)]
    apart[4]["_group"][0]["_setting_values"]["n_embd"] = 96
    _, _, notes = size_fits({"n_embd": [32, 64, 96, 128], "pos_encoding": ["learned", "rope"]}, apart)
    assert len(notes) == 1 and notes[0].endswith("(no size was measured for both)")
