"""A sweep report counts as finished only the runs whose metrics.jsonl shows it, and says which it left out."""

import csv
import json
import statistics

import pytest

from gpt import checkpoint, figures
from gpt.errors import UserError
from gpt.sweep import grid, report, status
from gpt.train.metrics import read_jsonl, read_metrics
from test_sweep import write_sweep

# per n_layer, the val loss of seeds 0, 1 and 2 at iterations 250 and 500 (max_iters): with all
# three seeds n_layer=6 is 0.046 worse, within noise by the paired test (the per-seed differences
# 0.070, 0.033 and 0.036 spread; Welch's test would say worse, p 0.034); seeds 1 and 2 alone differ
# alike, so paired they are worse; with seed 0's iteration 250 taken as its final loss, Welch's
# test finds it within noise
MIDWAY = {4: [2.4102, 2.4188, 2.4131], 6: [2.4791, 2.4510, 2.4498]}
FINAL = {4: [2.3817, 2.3909, 2.3847], 6: [2.4515, 2.4236, 2.4211]}
CODE = "c0ffee000000"


@pytest.fixture(autouse=True)
def quick(monkeypatch):
    """The figures left out (they take a second): the rows they would draw are kept instead."""
    drawn = {}
    monkeypatch.setattr(report, "plot", lambda rows, path, x="steps": drawn.update(curves=rows))
    monkeypatch.setattr(report, "plot_diagnostics", lambda rows, path: None)
    monkeypatch.setattr(checkpoint, "code_version", lambda: CODE)     # the source may change meanwhile
    return drawn


def make_sweep(out):
    """Two settings of three seeds each, every run finished at max_iters=500 with a metrics.jsonl
    and a config.json as a run writes them."""
    out.mkdir()
    (out / "sweep.json").write_text(json.dumps({"axes": {"n_layer": [4, 6]}, "seeds": 3, "base_seed": 0,
                                                "command": "train.py --sweep n_layer=4,6 --seeds=3"}))
    for n_layer in FINAL:
        for seed in range(3):
            run = out / f"n_layer={n_layer}__seed={seed}"
            run.mkdir()
            evals = [(0, 4.1744), (250, MIDWAY[n_layer][seed]), (500, FINAL[n_layer][seed])]
            lines = [{"kind": "eval", "iter": it, "train_loss": v - 0.01, "val_loss": v, "elapsed_s": it / 10,
                      "tokens_per_sec": 5000.0 + seed} for it, v in evals]
            (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
            (run / "config.json").write_text(json.dumps({
                "model": {"n_layer": n_layer}, "train": {"max_iters": 500, "eval_interval": 250, "seed": seed},
                "code": [CODE]}))
            (run / "result.json").write_text(json.dumps({"status": "finished", "returncode": 0, "wall_s": 1.0}))
    return out


def cut_last_line(path):
    path.write_text("".join(path.read_text().splitlines(keepends=True)[:-1]))


# the report of make_sweep as it was before runs were checked against their metrics.jsonl, with
# the count of runs read added under the table, and the family-wise correction, the test, its
# interval and p-values under the note (one comparison: Holm's p is the test's); the runs' config.json
# give no batch size, which the pairing reads alike for all, and no model to size (no compute table)
HEALTHY_SUMMARY = """# Sweep sw

`train.py --sweep n_layer=4,6 --seeds=3`

| setting | runs | final val loss (mean ± std) | diverged | vs baseline |
|---|---|---|---|---|
| n_layer=4 | 3 | 2.386 ± 0.005 | 0 | baseline |
| n_layer=6 | 3 | 2.432 ± 0.017 | 0 | within noise (+0.046) |

6 runs read.

Baseline: the first setting. 'worse/better' means a t-test (two-sided) over the seeds finds the means differ: the paired one over the per-seed differences where runs of one seed train on the same batches (the same seed, batch_size, block_size and gradient_accumulation_steps), else Welch's; with one seed there is no noise estimate.

The 1 comparison with the baseline is held to a family-wise error of 5% (Holm–Bonferroni): a setting is 'worse' or 'better' only where its Holm-adjusted p is under 0.05.

| setting | difference | 95% CI | test | p | Holm-adjusted p |
|---|---|---|---|---|---|
| n_layer=6 | +0.046 | -0.004 to +0.097 | paired | 0.059 | 0.059 |

## Steps to the baseline's loss

| setting | step reaching the baseline's final val loss, per seed | mean |
|---|---|---|
| n_layer=6 | —, —, — | — |

The baseline ends at step 500; each run is held to its own seed's baseline run, at its evaluations.

## Diagnostics at the final evaluation


"""
HEALTHY_CSV = f"""n_layer,seed,final_train_loss,final_val_loss,best_val_loss,tokens_per_sec,cpu_share,elapsed_s,params,params_no_emb,flops_per_token,tokens,total_flops,seconds,diverged,status,code,ran_as
4,0,2.3717,2.3817,2.3817,5000.0,nan,50.0,nan,nan,nan,nan,nan,nan,False,finished,{CODE},
4,1,2.3809,2.3909,2.3909,5001.0,nan,50.0,nan,nan,nan,nan,nan,nan,False,finished,{CODE},
4,2,2.3747000000000003,2.3847,2.3847,5002.0,nan,50.0,nan,nan,nan,nan,nan,nan,False,finished,{CODE},
6,0,2.4415,2.4515,2.4515,5000.0,nan,50.0,nan,nan,nan,nan,nan,nan,False,finished,{CODE},
6,1,2.4136,2.4236,2.4236,5001.0,nan,50.0,nan,nan,nan,nan,nan,nan,False,finished,{CODE},
6,2,2.4111000000000002,2.4211,2.4211,5002.0,nan,50.0,nan,nan,nan,nan,nan,nan,False,finished,{CODE},
""".replace("\n", "\r\n")      # csv's own line ends


def test_a_healthy_sweeps_report_is_unchanged(tmp_path, capsys, quick):
    out = make_sweep(tmp_path / "sw")
    assert report.main(["report", str(out)]) == 0
    assert (out / "summary.md").read_text() == HEALTHY_SUMMARY
    assert (out / "sweep.csv").read_bytes().decode() == HEALTHY_CSV
    assert capsys.readouterr().err == ""
    assert len([r for group in grid.by_setting(quick["curves"]).values() for r in grid.drawn(group)]) == 6


def test_a_run_cut_before_its_max_iters_is_left_out_and_named(tmp_path, capsys, quick):
    out = make_sweep(tmp_path / "sw")
    cut = out / "n_layer=6__seed=0"
    cut_last_line(cut / "metrics.jsonl")        # its evaluation at 500 gone: 250's (2.4791) is the last
    assert report.main(["report", str(out)]) == 0
    why = "its metrics.jsonl ends at iteration 250, not at its max_iters 500"
    assert capsys.readouterr().err == f"{cut}: left out of the means and curves: {why}\n"
    summary = (out / "summary.md").read_text()
    # the mean of seeds 1 and 2 alone (2.4224), paired with theirs of n_layer=4: worse by their
    # differences' mean, not within noise
    assert "| n_layer=6 | 2 (1 left out) | 2.422 ± 0.002 | 0 | worse by 0.035 |" in summary
    assert "| n_layer=4 | 3 | 2.386 ± 0.005 | 0 | baseline |" in summary
    assert "within noise" not in summary
    assert (f"6 runs read; 1 left out of the means and curves, though recorded as finished: "
            f"n_layer=6__seed=0 ({why}).") in summary.splitlines()
    rows = {(r["n_layer"], r["seed"]): r for r in csv.DictReader(open(out / "sweep.csv"))}
    assert rows["6", "0"]["status"] == "left out" and rows["6", "0"]["final_val_loss"] == "2.4791"
    assert [rows["6", s]["status"] for s in "12"] == ["finished", "finished"]
    drawn = [r["_folder"] for group in grid.by_setting(quick["curves"]).values() for r in grid.drawn(group)]
    assert cut not in drawn and len(drawn) == 5


def test_the_cut_runs_loss_would_have_turned_the_verdict():
    """What the report said before it checked runs against their max_iters."""
    def setting(values):
        return {"mean": statistics.fmean(values), "std": statistics.stdev(values), "n": len(values)}
    base = setting(FINAL[4])
    assert report.versus(base, setting(FINAL[6])) == "worse by 0.046"
    assert report.versus(base, setting([MIDWAY[6][0], *FINAL[6][1:]])) == "within noise (+0.056)"


def test_a_malformed_middle_line_is_named_by_file_and_line_and_its_run_left_out(tmp_path, capsys):
    out = tmp_path / "sw"       # its runs' config.json give no max_iters: the line lost alone leaves one out
    write_sweep(out, {1: ([3.0, 2.5, 2.0], {}, True), 2: ([3.0, 2.6, 2.2], {}, True)})
    path = out / "n_layer=2__seed=0" / "metrics.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    path.write_text(lines[0] + lines[1][:25] + "\n" + lines[2])      # the final evaluation still whole
    told = f"{path}:2: not valid JSON; the line is skipped\n"
    assert report.main(["report", str(out)]) == 0
    assert capsys.readouterr().err == (told + f"{path.parent}: left out of the means and curves: line 2 of its "
                                       "metrics.jsonl could not be read\n")
    summary = (out / "summary.md").read_text()
    assert "| n_layer=2 | 0 (1 left out) | — | — | 0 | no result |" in summary
    assert ("2 runs read; 1 left out of the means and curves, though recorded as finished: n_layer=2__seed=0 "
            "(line 2 of its metrics.jsonl could not be read).") in summary
    # every reader of metrics.jsonl says so: the sweep's status, and a run's dashboard (here one
    # whose only evaluation is the line cut, so that nothing is drawn)
    assert status.main("status", str(out)) == 1
    assert capsys.readouterr().err == told
    path.write_text(lines[0].replace('"eval"', '"train"') + lines[1][:25] + "\n")
    with pytest.raises(UserError, match="has no evaluation yet"):
        figures.run_figure(path.parent, tmp_path / "dashboard.png")
    assert capsys.readouterr().err == told


def test_runs_read_are_counted_and_diverged_or_unfinished_runs_keep_their_place(tmp_path, capsys):
    out = make_sweep(tmp_path / "sw")
    running = out / "n_layer=4__seed=2"           # under way: no result yet, its log short of 500
    (running / "result.json").unlink()
    cut_last_line(running / "metrics.jsonl")
    diverged = out / "n_layer=6__seed=2"
    (diverged / "result.json").write_text(json.dumps({"status": "diverged", "returncode": 3, "wall_s": 1.0}))
    cut_last_line(diverged / "metrics.jsonl")
    (out / "n_layer=6__seed=1" / "metrics.jsonl").unlink()    # recorded as finished, with no log at all
    table = report.report(out)
    assert capsys.readouterr().err == (f"{out / 'n_layer=6__seed=1'}: left out of the means and curves: it has "
                                       "no metrics.jsonl\n")
    assert table.startswith("Partial: 5 of 6 runs have a result; 1 are queued, running or not started yet.")
    assert "| n_layer=4 | 2 | 2.386 ± 0.007 | 0 | baseline |" in table
    # one diverged, one finished: unstable (the diverged run's log gives no unigram loss to count it at)
    assert "| n_layer=6 | 2 (1 left out) | 2.451 | 1 (unstable) | needs 2+ seeds |" in table
    assert ("5 runs read; 1 left out of the means and curves, though recorded as finished: n_layer=6__seed=1 "
            "(it has no metrics.jsonl).") in table


def test_each_line_left_out_of_a_metrics_log_is_said_once_with_its_number(tmp_path):
    path = tmp_path / "metrics.jsonl"
    good = [{"kind": "train", "iter": 1, "loss": 2.5}, {"kind": "eval", "iter": 2, "train_loss": 2.0, "val_loss": 2.1}]
    path.write_text(json.dumps(good[0]) + "\n\n" + '{"kind": "eval", "iter": "x"}\n'
                    + '{"kind": "eval", "iter": 3, "val_loss": null}\n' + json.dumps(good[1]) + '\n{"kind": "tr')
    log = read_metrics(path)
    assert log.rows == good == read_jsonl(path)
    assert log.problems() == [
        f"{path}:2: not valid JSON; the line is skipped",
        f'{path}:3: not a metrics row (a text "kind" and a whole-number "iter"); the line is skipped',
        f"{path}:4: an evaluation without a val_loss number; the line is skipped",
        f"{path}:6: not valid JSON (the file ends within the line); the line is skipped"]
    path.write_text("".join(json.dumps(row) + "\n" for row in good))
    assert read_metrics(path).skipped == {} and read_metrics(path).rows == good
    path.write_text("")
    assert read_metrics(path) == (path, [], {})


def test_the_steps_to_the_baseline_loss_hold_each_seed_to_its_own_baseline_run():
    def run(setting, seed, losses):
        evals = [{"iter": 100 * i, "val_loss": v} for i, v in enumerate(losses)]
        return {"_setting": setting, "seed": seed, "status": "finished", "diverged": False,
                "final_val_loss": losses[-1], "_evals": evals}
    rows = [run("base", 0, [4.0, 3.0, 2.0, 1.5]), run("base", 1, [4.0, 3.0, 2.5, 1.9]),
            # seed 0 reaches its own baseline's 1.5 at step 300; seed 1 its 1.9 at step 200,
            # though it never reaches seed 0's
            run("fast", 0, [4.0, 2.0, 1.6, 1.5]), run("fast", 1, [4.0, 2.2, 1.8, 1.7]),
            run("slow", 0, [4.0, 3.0, 2.0, 1.6]), run("slow", 1, [4.0, 3.0, 2.0, 1.8])]
    table = report.steps_to_baseline(rows)
    assert "| fast | 300, 200 | 250 |" in table
    assert "| slow | —, 300 | — |" in table       # a seed that never gets there leaves no mean
    assert "The baseline ends at step 300" in table
    assert report.steps_to_baseline(rows[:2]) == ""
