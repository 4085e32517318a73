import csv
import dataclasses
import json
import math
import re
import shutil
from pathlib import Path

import pytest

import train
from conftest import tiny_args
from gpt.sweep import grid, plots, report, runner
from gpt.cli import parse_argv
from gpt.config import REPO_ROOT, GPTConfig, TrainConfig
from gpt.errors import UserError
from gpt.train.outcome import DIVERGED_EXIT


def test_grid_expansion_and_run_names(tmp_path):
    runs = grid.expand({"residual": [True, False], "norm_placement": ["pre", "post"]}, 2, 10, tmp_path)
    assert [r.folder.name for r in runs] == [
        "residual=true__norm_placement=pre__seed=10", "residual=true__norm_placement=pre__seed=11",
        "residual=true__norm_placement=post__seed=10", "residual=true__norm_placement=post__seed=11",
        "residual=false__norm_placement=pre__seed=10", "residual=false__norm_placement=pre__seed=11",
        "residual=false__norm_placement=post__seed=10", "residual=false__norm_placement=post__seed=11",
    ]
    assert runs[5].setting == {"residual": False, "norm_placement": "pre"} and runs[5].seed == 11
    assert [r.folder.name for r in grid.expand({}, 3, 0, tmp_path)] == ["base__seed=0", "base__seed=1",
                                                                         "base__seed=2"]


@pytest.mark.e2e
def test_a_bad_grid_point_fails_before_anything_runs(data_dir, tmp_path, capsys, cpu_rounds_when_asked):
    out = tmp_path / "sw"
    assert train.main(tiny_args(data_dir, out, "--sweep", "n_head=2,3")) == 2
    assert "n_embd=16 is not divisible by n_head=3" in capsys.readouterr().err
    assert not out.exists()
    # a point refused only once its device is known: compile with medium on a CPU
    assert train.main(tiny_args(data_dir, out, "--matmul_precision=medium", "--sweep", "compile=false,true")) == 2
    assert "compile=true with matmul_precision=medium makes CPU steps slower" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.e2e
def test_a_tiny_sweep_reports_and_skips_finished_runs(data_dir, tmp_path, capsys):
    out = tmp_path / "sw"
    argv = tiny_args(data_dir, out, "--max_iters=6", "--eval_interval=3",
                     "--sweep", "residual=true,false", "--jobs=2")
    assert train.main(argv) == 0
    printed = capsys.readouterr().out
    assert "| residual=true | 1 |" in printed and "| residual=false | 1 |" in printed
    wrote = f"written: {out / 'summary.md'}, {out / 'sweep.csv'}, {out / 'curves.png'} and {out / 'diagnostics.png'}\n"
    assert printed.endswith(wrote)      # where the report went, at the sweep's end
    rows = list(csv.DictReader(open(out / "sweep.csv")))
    assert [(r["residual"], r["seed"], r["status"]) for r in rows] == [("true", "1337", "finished"),
                                                                      ("false", "1337", "finished")]
    for r in rows:
        assert math.isfinite(float(r["final_val_loss"])) and float(r["tokens_per_sec"]) > 0
        evals = [json.loads(line) for line in open(out / f"residual={r['residual']}__seed=1337" / "metrics.jsonl")]
        assert float(r["best_val_loss"]) == pytest.approx(min(e["val_loss"] for e in evals if e["kind"] == "eval"))
        assert float(r["elapsed_s"]) == pytest.approx([e for e in evals if e["kind"] == "eval"][-1]["elapsed_s"])
        assert r["diverged"] == "False"
        # eval_train=false by default: the train split at the last evaluation alone, which the csv reads
        assert ["train_loss" in e for e in evals if e["kind"] == "eval"] == [False, False, True]
        assert math.isfinite(float(r["final_train_loss"]))
        # its process's start, on the clock of its loop's timing line, which falls within its wall time
        result = json.loads((out / f"residual={r['residual']}__seed=1337" / "result.json").read_text())
        [timing] = [e for e in evals if e["kind"] == "timing"]
        assert result["started"] < timing["loop_start"] < timing["loop_end"] < result["started"] + result["wall_s"]
    summary = (out / "summary.md").read_text()
    assert "| residual=true | 1 |" in summary and "baseline" in summary and "needs 2+ seeds" in summary
    # the loss table, compute, the steps to the baseline and the diagnostics
    assert summary.count("| residual=") == 7
    assert (out / "curves.png").stat().st_size > 10_000
    assert (out / "diagnostics.png").stat().st_size > 10_000
    stamp = (out / "residual=true__seed=1337" / "metrics.jsonl").stat().st_mtime_ns
    assert train.main(argv) == 0                             # again: both runs are skipped
    assert "2 runs (2 already finished)" in capsys.readouterr().out
    assert (out / "residual=true__seed=1337" / "metrics.jsonl").stat().st_mtime_ns == stamp
    assert report.main(["report", str(out)]) == 0
    assert capsys.readouterr().out.endswith(wrote)     # and when the report is written again


def test_a_sweeps_runs_score_the_train_split_at_the_end_unless_told(tmp_path):
    run = grid.SweepRun({"residual": True}, 1337, tmp_path / "run")
    values = {"out_dir": str(tmp_path), "max_iters": 6}
    assert "--eval_train=false" in grid.train_argv(values, run, 1)
    assert "--eval_train=true" in grid.train_argv({**values, "eval_train": True}, run, 1)


@pytest.mark.e2e
@pytest.mark.parametrize("axis, message", [
    ("seed=1,2", "the sweep sets seed itself"),
    ("seeds=2,3", "the sweep sets seeds itself"),
    ("n_layer=2,2", "--sweep lists n_layer=2 twice; list each value once"),
    ("seed=1,1", "the sweep sets seed itself"),
    ("wandb_run_name=a,A", "two settings would share one run folder (wandb_run_name=a and "
                           "wandb_run_name=A); give values that differ by more than case"),
    ("out_dir=a,b", "the sweep sets out_dir itself"),
])
def test_axes_the_sweep_cannot_take(data_dir, tmp_path, capsys, axis, message):
    assert train.main(tiny_args(data_dir, tmp_path / "sw", "--sweep", axis)) == 2
    assert message in capsys.readouterr().err


@pytest.mark.e2e
def test_a_sweep_folder_refuses_other_settings_and_counts_completed_checkpoints(data_dir, tmp_path, capsys):
    out = tmp_path / "sw"
    argv = tiny_args(data_dir, out, "--max_iters=4", "--eval_interval=2", "--sweep", "residual=true,false")
    assert train.main(argv) == 0
    assert train.main(argv[:-2] + ["--max_iters=8", "--sweep", "residual=true,false"]) == 2
    assert ("holds runs trained with other settings (residual=true__seed=1337: max_iters=4 in the run, 8 now)"
            in capsys.readouterr().err)
    # a run that ended but whose result was never recorded (the sweep was stopped just then)
    (out / "residual=false__seed=1337" / "result.json").unlink()
    assert train.main(argv) == 0
    assert "2 runs (2 already finished)" in capsys.readouterr().out


@pytest.mark.e2e
def test_a_relative_out_dir_is_one_folder_wherever_the_sweep_starts(data_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    argv = tiny_args(data_dir, "rel", "--max_iters=2", "--eval_interval=2", "--sweep", "residual=true")
    assert train.main(argv) == 0
    run = tmp_path / "rel" / "residual=true__seed=1337"
    assert (run / "ckpt.pt").exists() and (run / "result.json").exists()


@pytest.mark.slow     # over 10 s; .ci/run runs the slow tests too
def test_a_batch_size_axis_scores_every_run_as_the_baseline_is(data_dir, tmp_path, capsys):
    out = tmp_path / "sw"
    assert train.main(tiny_args(data_dir, out, "--max_iters=2", "--eval_interval=2",
                                "--sweep", "batch_size=4,2")) == 0
    assert ("every run is evaluated alike, on eval_iters batches of 4 windows "
            "(--eval_batch_size=0 gives each run its own batch_size)") in capsys.readouterr().out
    firsts = []
    for b in (4, 2):
        folder = out / f"batch_size={b}__seed=1337"
        assert json.loads((folder / "config.json").read_text())["train"]["eval_batch_size"] == 4
        firsts.append([e for e in map(json.loads, open(folder / "metrics.jsonl")) if e["kind"] == "eval"][0])
    assert firsts[0]["val_loss"] == firsts[1]["val_loss"]      # same initial weights, same text
    # a value added in front later: the sweep keeps its windows, and its runs
    assert train.main(tiny_args(data_dir, out, "--max_iters=2", "--eval_interval=2",
                                "--sweep", "batch_size=1,4,2")) == 0
    assert "sweep: 3 runs (2 already finished)" in capsys.readouterr().out
    assert json.loads((out / "batch_size=1__seed=1337" / "config.json").read_text())["train"]["eval_batch_size"] == 4
    assert json.loads((out / "sweep.json").read_text())["eval_batch_size"] == 4
    for damaged in ({"axes": ["batch_size"]}, {"axes": {"batch_size": 4}, "eval_batch_size": True}):
        (out / "sweep.json").write_text(json.dumps(damaged))    # edited by hand: the axis decides
        assert train.main(tiny_args(data_dir, out, "--max_iters=2", "--eval_interval=2",
                                    "--sweep", "batch_size=4,2")) == 0
    # given by the user, it is kept
    capsys.readouterr()
    assert train.main(tiny_args(data_dir, tmp_path / "sw2", "--max_iters=2", "--eval_interval=2",
                                "--eval_batch_size=3", "--sweep", "batch_size=4,2")) == 0
    assert "every run is evaluated alike" not in capsys.readouterr().out
    config = json.loads((tmp_path / "sw2" / "batch_size=2__seed=1337" / "config.json").read_text())
    assert config["train"]["eval_batch_size"] == 3


@pytest.mark.e2e
def test_runs_trained_by_other_code_are_marked(data_dir, tmp_path, capsys):
    from gpt.checkpoint import code_version
    out = tmp_path / "sw"
    argv = tiny_args(data_dir, out, "--max_iters=2", "--eval_interval=2", "--sweep", "residual=true,false")
    assert train.main(argv) == 0
    assert "other code" not in capsys.readouterr().out
    config = out / "residual=false__seed=1337" / "config.json"
    record = json.loads(config.read_text())
    assert record["code"] == [code_version()]
    record["code"] = ["0123456789ab"]              # as if gpt/ had been edited since it ran
    config.write_text(json.dumps(record))
    assert train.main(argv) == 0
    printed = capsys.readouterr().out
    assert "1 of the runs kept were trained, in whole or in part, by other code than this" in printed
    assert f"1 of these runs were trained, in whole or in part, by other code than the present ({code_version()})" \
        in (out / "summary.md").read_text()
    assert [r["code"] for r in csv.DictReader(open(out / "sweep.csv"))] == [code_version(), "0123456789ab"]


@pytest.mark.e2e
def test_settings_that_ran_the_same_way_here_are_named(data_dir, tmp_path, capsys):
    out = tmp_path / "sw"      # on a CPU, high and highest are both exact float32
    argv = tiny_args(data_dir, out, "--max_iters=2", "--eval_interval=2", "--sweep",
                     "matmul_precision=high,highest")
    assert train.main(argv) == 0
    note = ("Settings whose runs all ran the same way (sweep.csv's ran_as), so what tells them apart is "
            "noise: matmul_precision=high and matmul_precision=highest (cpu float32 matmul=highest).")
    assert note in capsys.readouterr().out and note in (out / "summary.md").read_text()
    assert {r["ran_as"] for r in csv.DictReader(open(out / "sweep.csv"))} == {"cpu float32 matmul=highest"}


def test_ran_alike_needs_one_way_for_every_run_and_the_same_other_axes():
    def row(setting, ran_as, status="finished", **axes):
        return {"_setting": setting, "ran_as": ran_as, "status": status, **axes}
    way, other = "cpu float32 matmul=highest", "cpu bfloat16 matmul=highest"
    rows = [row("dtype=float32", way, dtype="float32"), row("dtype=fast", way, dtype="fast"),
            row("dtype=bfloat16", other, dtype="bfloat16")]
    assert report.ran_alike(rows, {"dtype": 0}) == [f"dtype=float32 and dtype=fast ({way})"]
    rows[1]["ran_as"] = ""              # trained by code older than the record
    assert report.ran_alike(rows, {"dtype": 0}) == []
    rows[1]["ran_as"] = f"{way}; {other}"   # resumed on a machine with bfloat16
    assert report.ran_alike(rows, {"dtype": 0}) == []
    rows[1] = row("dtype=fast", way, dtype="fast")
    rows.append(row("dtype=fast", other, "failed", dtype="fast"))    # a failed run does not count
    assert len(report.ran_alike(rows, {"dtype": 0})) == 1
    rows.append(row("dtype=fast", other, dtype="fast"))              # a finished one does
    assert report.ran_alike(rows, {"dtype": 0}) == []
    # apart on another axis, two settings compare different models
    rows = [row(f"dtype={d}__n_layer={n}", way, dtype=d, n_layer=n) for d in ("float32", "fast") for n in (1, 2)]
    assert report.ran_alike(rows, {"dtype": 0, "n_layer": 0}) == [
        f"dtype=float32__n_layer=1 and dtype=fast__n_layer=1 ({way})",
        f"dtype=float32__n_layer=2 and dtype=fast__n_layer=2 ({way})"]
    rows = [row(f"n_layer={n}", way, n_layer=n) for n in (1, 2)]
    assert report.ran_alike(rows, {"n_layer": 0}) == []


@pytest.mark.e2e
def test_the_report_names_a_run_resumed_by_hand_with_other_settings(data_dir, tmp_path, capsys):
    out = tmp_path / "sw"
    assert train.main(tiny_args(data_dir, out, "--max_iters=2", "--eval_interval=2", "--seeds=2",
                                "--sweep", "residual=true,false")) == 0
    assert "differ from the rest" not in capsys.readouterr().out
    run = out / "residual=true__seed=1338"
    assert train.main([f"--out_dir={run}", "--resume", "--max_iters=4"]) == 0
    capsys.readouterr()
    report.report(out)
    note = ("Runs whose settings differ from the rest of the sweep beyond its axes, averaged in above: "
            "residual=true__seed=1338: max_iters=4 (the others 2).")
    assert note in capsys.readouterr().out and note in (out / "summary.md").read_text()


@pytest.mark.e2e
def test_the_report_names_runs_whose_speed_settings_differ(data_dir, tmp_path, capsys):
    out = tmp_path / "sw"
    short = tiny_args(data_dir, out, "--max_iters=2", "--eval_interval=2")     # TINY: no flushing
    # the runs are processes of their own, where flushing reaches every thread
    assert train.main([*short, "--flush_denormal=true", "--sweep", "activation=gelu,relu"]) == 0
    assert "other speed settings" not in capsys.readouterr().out
    assert train.main([*short, "--sweep", "activation=gelu,relu,gelu_tanh"]) == 0     # two reused
    out_text = capsys.readouterr().out
    note = ("Runs that ran with other speed settings than the rest, so their tokens/s in sweep.csv does not "
            "compare alike: activation=gelu_tanh__seed=1337: flush_denormal=false (the others true).")
    assert note in out_text and note in (out / "summary.md").read_text()
    assert "differ from the rest of the sweep beyond its axes" not in out_text     # the losses compare
    # a speed setting that is an axis is what the sweep compares: not named
    rows = [{"_setting": f"flush_denormal={v}", "seed": 1, "_config": {"flush_denormal": v, "threads": 1}}
            for v in (True, False)]
    assert report.odd_runs(rows, {"flush_denormal": [True, False]}, grid.SPEED) == []
    assert report.odd_runs(rows, {}, grid.SPEED) == [
        "flush_denormal is split: false in 1 (flush_denormal=False__seed=1), true in 1 (flush_denormal=True__seed=1)"]


@pytest.mark.slow     # over 10 s; .ci/run runs the slow tests too
def test_a_batch_size_sweep_that_scored_each_run_on_its_own_windows_can_go_on(data_dir, tmp_path, capsys):
    out = tmp_path / "sw"
    short = ["--max_iters=2", "--eval_interval=2"]
    # as sweeps did before eval_batch_size: each run scored on batches of its own size
    assert train.main(tiny_args(data_dir, out, *short, "--eval_batch_size=0", "--sweep", "batch_size=4,2")) == 0
    capsys.readouterr()
    record = json.loads((out / "sweep.json").read_text())
    assert record.pop("eval_batch_size") == 0       # remembered: the same command without it goes on
    (out / "sweep.json").write_text(json.dumps(record))     # as such a sweep recorded it, without
    assert train.main(tiny_args(data_dir, out, *short, "--seeds=2", "--sweep", "batch_size=4,2")) == 2
    err = capsys.readouterr().err      # the baseline's windows are the pinned ones; the other run's are not
    assert "batch_size=2__seed=1337: eval_batch_size=2 in the run, 4 now" in err
    assert train.main(tiny_args(data_dir, out, *short, "--seeds=2", "--eval_batch_size=0",
                                "--sweep", "batch_size=4,2")) == 0
    assert "(2 already finished)" in capsys.readouterr().out
    # an eval_batch_size axis is the user's own choice: nothing is pinned
    assert train.main(tiny_args(data_dir, tmp_path / "sw2", *short, "--sweep", "batch_size=4,2",
                                "--sweep", "eval_batch_size=1,3")) == 0
    assert "every run is evaluated alike" not in capsys.readouterr().out
    config = json.loads((tmp_path / "sw2" / "batch_size=4__eval_batch_size=3__seed=1337" / "config.json").read_text())
    assert config["train"]["eval_batch_size"] == 3


def test_odd_runs_skip_unread_settings_and_name_a_split_without_a_majority():
    def row(setting, seed, **config):
        return {"_setting": setting, "seed": seed,
                "_config": {"lr_schedule": "cosine", "cooldown_frac": 0.2, "max_iters": 10, **config}}
    # cosine never reads cooldown_frac: a continued sweep that gave another is no odd run
    rows = [row("a", 1), row("a", 2, cooldown_frac=0.5), row("a", 3, cooldown_frac=0.5)]
    assert report.odd_runs(rows, {}) == []
    rows = [row("a", 1, lr_schedule="wsd"), row("a", 2, lr_schedule="wsd"),
            row("a", 3, lr_schedule="wsd", cooldown_frac=0.5)]
    assert report.odd_runs(rows, {}) == ["a__seed=3: cooldown_frac=0.5 (the others 0.2)"]
    # a constant schedule reads neither min_lr nor lr_decay_iters; cosine does
    for schedule, odd in (("constant", []), ("cosine", ["a__seed=3: min_lr=0.0 (the others 0.0001)"])):
        rows = [row("a", seed, lr_schedule=schedule, min_lr=1e-4 if seed < 3 else 0.0) for seed in (1, 2, 3)]
        assert report.odd_runs(rows, {}) == odd
    # two against two: neither is the sweep's, so both are named, in a fixed order
    rows = [row("a", 1), row("a", 2, max_iters=20), row("b", 1), row("b", 2, max_iters=20)]
    assert report.odd_runs(rows, {}) == ["max_iters is split: 10 in 2 (a__seed=1, b__seed=1), "
                                        "20 in 2 (a__seed=2, b__seed=2)"]
    rows = [row("a", s, max_iters=10 if s < 5 else 20) for s in range(1, 9)]     # many: counted only
    assert report.odd_runs(rows, {}) == ["max_iters is split: 10 in 4, 20 in 4"]
    # a 0 that stands for another setting's value is that value; with that setting an axis, it varies
    rows = [row("a", 1, batch_size=4, eval_batch_size=0), row("a", 2, batch_size=4, eval_batch_size=0),
            row("a", 3, batch_size=4, eval_batch_size=4)]
    assert report.odd_runs(rows, {}) == []
    rows = [row(f"n_head={h}", 1, n_head=h, n_kv_head=h) for h in (1, 2, 4)]
    assert report.odd_runs(rows, {"n_head": [1, 2, 4]}) == []
    # older code recorded n_kv_head as n_head's value, this code as 0: the same setting
    rows = [row(f"n_head={h}", s, n_head=h, n_kv_head=h if s == 1 else 0) for h in (1, 2, 4) for s in (1, 2)]
    assert report.odd_runs(rows, {"n_head": [1, 2, 4]}) == []
    assert report.odd_runs([row("a", s, n_head=4, n_kv_head=4 if s == 1 else 0) for s in (1, 2, 3)], {}) == []
    # pinned by a batch_size axis, it is still compared: a run resumed with a smaller one is named
    rows = [row(f"batch_size={b}", s, batch_size=b, eval_batch_size=4) for b in (4, 8) for s in (1, 2)]
    rows[3]["_config"]["eval_batch_size"] = 2
    assert report.odd_runs(rows, {"batch_size": [4, 8]}) == ["batch_size=8__seed=2: eval_batch_size=2 (the others 4)"]
    # following the axis (0) is the sweep's setting; the one run pinned apart is named
    rows = [row(f"batch_size={b}", s, batch_size=b, eval_batch_size=0) for b in (8, 16) for s in (1, 2)]
    rows[3]["_config"]["eval_batch_size"] = 8
    assert report.odd_runs(rows, {"batch_size": [8, 16]}) == [
        "batch_size=16__seed=2: eval_batch_size=8 (the others 'as batch_size')"]
    rows = [row(f"n_head={h}", s, n_head=h, n_kv_head=h) for h in (2, 4) for s in (1, 2)]
    rows[3]["_config"]["n_kv_head"] = 2                 # grouped-query attention in one run
    assert report.odd_runs(rows, {"n_head": [2, 4]}) == [
        "n_head=4__seed=2: n_kv_head=2 (the others 'as n_head')"]
    # given for every run, a value that equals the axis's in one of them is no odd run
    for kv, heads in ((2, (2, 4, 8)), (1, (1, 2, 4))):
        rows = [row(f"n_head={h}", s, n_head=h, n_kv_head=kv) for h in heads for s in (1, 2)]
        assert report.odd_runs(rows, {"n_head": list(heads)}) == []
    rows = [row(f"batch_size={b}", s, batch_size=b, eval_batch_size=4) for b in (4, 8) for s in (1, 2)]
    rows[0]["_config"]["eval_batch_size"] = 0           # the same windows as the 4 pinned
    assert report.odd_runs(rows, {"batch_size": [4, 8]}) == []
    # pinned by the sweep, a run resumed by hand at 0 (its own batch size) is the odd one
    rows = [row(f"batch_size={b}", s, batch_size=b, eval_batch_size=4) for b in (4, 8) for s in (1, 2)]
    rows[3]["_config"]["eval_batch_size"] = 0
    assert report.odd_runs(rows, {"batch_size": [4, 8]}) == [
        "batch_size=8__seed=2: eval_batch_size='as batch_size' (the others 4)"]


@pytest.mark.e2e
def test_a_sweep_makes_good_a_finished_runs_failed_best_copy(data_dir, tmp_path, capsys, monkeypatch):
    from gpt import checkpoint
    out = tmp_path / "sw"
    argv = tiny_args(data_dir, out, "--max_iters=4", "--eval_interval=2", "--sweep", "residual=true")
    assert train.main(argv) == 0
    run = out / "residual=true__seed=1337"
    assert checkpoint.load(run / "ckpt.pt")["best_iter"] == 4
    (run / "ckpt_best.pt").unlink()                 # as a full disk at its copy left the run
    (run / "result.json").write_text(json.dumps({"status": "failed", "returncode": 2, "wall_s": 1.0}))
    capsys.readouterr()
    assert train.main(argv) == 0
    assert (f"{run.name}: ckpt_best.pt did not hold the best iteration, 4: copied it from ckpt.pt"
            in capsys.readouterr().out)
    assert checkpoint.load(run / "ckpt_best.pt")["iter"] == 4
    # never while another process trains the run, and a copy that fails is said, the run kept
    (run / "ckpt_best.pt").unlink()
    entry = grid.SweepRun({"residual": True}, 1337, run)
    with checkpoint.hold_folder(run):
        assert not grid.finished_by_checkpoint(entry, 4)
    assert not (run / "ckpt_best.pt").exists()

    def read_only(*args):
        raise grid.UserError(f"cannot save {run / 'ckpt_best.pt'} (Read-only file system)")
    monkeypatch.setattr(checkpoint, "save_copy", read_only)
    capsys.readouterr()
    assert not grid.finished_by_checkpoint(entry, 4)     # its own resume mends it, or says why not
    assert f"{run.name}: cannot save {run / 'ckpt_best.pt'} (Read-only file system)" in capsys.readouterr().out
    monkeypatch.undo()
    (run / "result.json").unlink()                  # as the sweep leaves a run it did not count
    assert train.main(argv) == 0
    assert checkpoint.load(run / "ckpt_best.pt")["iter"] == 4


@pytest.mark.e2e
def test_a_diverged_run_is_recorded_not_dropped(data_dir, tmp_path, capsys):
    out = tmp_path / "sw"
    # a learning rate this large sends the weights, then the loss, to inf/nan within a few steps
    argv = tiny_args(data_dir, out, "--max_iters=30", "--eval_interval=10", "--warmup_iters=0",
                     "--grad_clip=0", "--sweep", "learning_rate=1e-3,1e9", "--min_lr=0")
    assert train.main(argv) == 0
    rows = {r["learning_rate"]: r for r in csv.DictReader(open(out / "sweep.csv"))}
    assert rows["1000000000.0"]["diverged"] == "True" and rows["1000000000.0"]["status"] == "diverged"
    assert rows["0.001"]["diverged"] == "False"
    # diverged runs are counted, and kept out of the mean: no loss to average here
    assert "| learning_rate=1000000000.0 | 1 | — | — | 1 |" in (out / "summary.md").read_text()


def test_summary_flags_differences_beyond_seed_noise():
    def rows(label, vals):
        return [{"_setting": label, "final_val_loss": v, "status": "finished", "diverged": False,
                 "per_character": True} for v in vals]
    diverged = [{"_setting": "b", "final_val_loss": 9.0, "status": "diverged", "diverged": True,
                 "per_character": True}]
    summary = report.summarize(rows("a", [2.00, 2.01, 1.99]) + rows("b", [2.30, 2.31, 2.29]) + diverged
                              + rows("c", [2.00, 2.03, 1.98]))
    assert summary[1]["runs"] == 4 and summary[1]["diverged"] == 1 and summary[1]["n"] == 3
    assert summary[0]["vs_baseline"] == "baseline"
    assert summary[1]["vs_baseline"] == "worse by 0.300"
    assert summary[2]["vs_baseline"].startswith("within noise")
    assert summary[1]["mean"] == pytest.approx(2.30) and summary[1]["std"] == pytest.approx(0.01)


def test_a_difference_of_two_and_a_half_standard_errors_is_noise_at_three_seeds():
    # 3 seeds each, equal spread: Welch's test has 4 degrees of freedom, critical t 2.776; two
    # standard errors (the old rule) would call 2.5 a difference, though it happens by chance
    # in about 7% of identical pairs
    base = {"mean": 2.0, "std": 0.01, "n": 3}
    se = (2 * 0.01 ** 2 / 3) ** 0.5
    assert report.versus(base, {"mean": 2.0 + 2.5 * se, "std": 0.01, "n": 3}).startswith("within noise")
    assert report.versus(base, {"mean": 2.0 - 2.9 * se, "std": 0.01, "n": 3}) == f"better by {2.9 * se:.3f}"
    # no spread on either side: any difference is real, none is not
    still = {"mean": 3.342, "std": 0.0, "n": 3}
    assert report.versus(still, {"mean": 3.341, "std": 0.0, "n": 3}) == "better by 0.001"
    assert report.versus(still, dict(still)) == "within noise (+0.000)"


def test_report_of_a_folder_that_is_not_a_sweep(tmp_path, capsys):
    assert report.main(["report", str(tmp_path)]) == 2
    assert "sweep.json does not exist" in capsys.readouterr().err
    (tmp_path / "sweep.json").write_text("{")     # cut short; the report takes no --out_dir
    assert report.main(["report", str(tmp_path)]) == 2
    assert re.fullmatch(r"error: .*sweep.json is damaged \(.*\); remove it, and the sweep's command writes it "
                        r"again\n", capsys.readouterr().err)


@pytest.mark.parametrize("argv", [["--help"], ["report", "-h"], ["report", "DIR", "--help"]])
def test_sweep_help_is_help(argv, capsys):
    assert report.main(argv) == 0
    assert capsys.readouterr().out.startswith("usage: python -m gpt.sweep report DIR [--x=steps|flops|seconds]\n")


def test_a_sweeps_reader_of_a_runs_metrics_names_each_line_it_skips(tmp_path, capsys):
    run = tmp_path / "n_layer=2__seed=1"
    run.mkdir()
    path = run / "metrics.jsonl"
    path.write_text('{"kind": "eval", "iter": 2, "train_loss": 2.0, "val_loss": 2.1}\n{"kind": "ev\n'
                    '{"kind": "eval", "iter": 4, "train_loss": 1.9, "val_loss": 2.0}\n')
    assert grid.final_eval(run)["iter"] == 4
    assert capsys.readouterr().err == f"{path}:2: not valid JSON; the line is skipped\n"


@pytest.mark.e2e
def test_each_run_is_judged_finished_by_its_own_max_iters(data_dir, tmp_path, capsys):
    out = tmp_path / "sw"
    argv = tiny_args(data_dir, out, "--eval_interval=2", "--sweep", "max_iters=2,4")
    assert train.main(argv) == 0
    final = grid.final_eval(out / "max_iters=4__seed=1337")
    assert re.search(rf"\] max_iters=4__seed=1337: finished, val {final['val_loss']:.4f} "
                     rf"\({final['val_loss'] / math.log(2):.3f} bpc\) at iteration 4, \d+ s\n", capsys.readouterr().out)
    for name in ("max_iters=2__seed=1337", "max_iters=4__seed=1337"):
        (out / name / "result.json").unlink()
    assert train.main(argv) == 0
    assert "2 runs (2 already finished)" in capsys.readouterr().out
    result = (out / "max_iters=2__seed=1337" / "result.json").read_text()
    assert json.loads(result) == {"status": "finished", "returncode": 0, "wall_s": None}  # not timed


@pytest.mark.e2e
def test_a_failed_run_is_reported_retried_and_fails_the_sweep(data_dir, tmp_path, capsys):
    out = tmp_path / "sw"
    argv = tiny_args(data_dir, out, "--max_iters=2", "--eval_interval=2", "--sweep", "block_size=16,4000")
    assert train.main(argv) == 1
    captured = capsys.readouterr()
    assert "| block_size=4000 | 0 (1 failed) | — | — | 0 | no result |" in captured.out
    assert "1 of 2 runs failed" in captured.err and "block_size=4000__seed=1337/log.txt" in captured.err
    named = (f"Failed, so in no mean or curve (1; what went wrong is in each log.txt, and the sweep's "
             f"command tries them again): block_size=4000__seed=1337/log.txt.")
    assert named in captured.out and named in (out / "summary.md").read_text()
    assert "too few for block_size=4000" in (out / "block_size=4000__seed=1337" / "log.txt").read_text()
    rows = {r["block_size"]: r["status"] for r in csv.DictReader(open(out / "sweep.csv"))}
    assert rows == {"16": "finished", "4000": "failed"}
    assert train.main(argv) == 1                               # the failed run alone is tried again
    assert "2 runs (1 already finished)" in capsys.readouterr().out


@pytest.mark.e2e
def test_a_relative_data_dir_is_read_from_where_the_sweep_starts(data_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(data_dir.parent)
    argv = tiny_args(Path("data"), tmp_path / "sw", "--max_iters=2", "--eval_interval=2",
                     "--sweep", "residual=true")
    assert train.main(argv) == 0
    assert json.loads((tmp_path / "sw" / "residual=true__seed=1337" / "result.json").read_text())[
        "status"] == "finished"


@pytest.mark.e2e
def test_a_sweep_axis_with_no_values_is_refused(tmp_path, capsys):
    config = tmp_path / "empty.toml"
    config.write_text("max_iters = 2\n[sweep]\nn_head = []\n")
    assert train.main(["--config", str(config)]) == 2
    assert "[sweep] n_head = [] lists no values" in capsys.readouterr().err


def test_a_baseline_without_results_is_named_as_the_reason():
    rows = [{"_setting": "a", "final_val_loss": math.nan, "status": "diverged", "diverged": True,
             "per_character": False}]
    rows += [{"_setting": "b", "final_val_loss": v, "status": "finished", "diverged": False, "per_character": False}
             for v in (2.0, 2.1)]
    assert report.summarize(rows)[1]["vs_baseline"] == "baseline has no result"


@pytest.mark.e2e
def test_resume_is_refused_for_a_sweep(data_dir, tmp_path, capsys):
    advice = "a sweep resumes its stopped runs and restarts its failed ones by itself; run the same command again"
    for flag in ("--resume", "--overwrite"):
        assert train.main(tiny_args(data_dir, tmp_path / "sw", flag, "--sweep", "residual=true,false")) == 2
        assert capsys.readouterr().err == f"error: {flag}: {advice} without {flag}\n"
    assert train.main(["--config", "sweeps/heads", "--resume"]) == 2     # a sweep's file: the same advice
    assert advice in capsys.readouterr().err
    assert not (tmp_path / "sw").exists()
    # a sweep into one run's folder: that run would be lost to --resume
    run = tmp_path / "run"
    assert train.main(tiny_args(data_dir, run, "--max_iters=2", "--eval_interval=2")) == 0
    assert train.main(tiny_args(data_dir, run, "--sweep", "residual=true,false")) == 2
    assert capsys.readouterr().err == (f"error: out_dir={str(run)!r} holds a run (ckpt.pt and ckpt_best.pt); "
                                       "its sweep folders would mix with it; choose another --out_dir\n")
    assert not (run / "sweep.json").exists()
    # a sweep's folder given to --resume alone, as if it were one run
    (tmp_path / "sw").mkdir()
    (tmp_path / "sw" / "sweep.json").write_text("{}")
    assert train.main([f"--out_dir={tmp_path / 'sw'}", "--resume"]) == 2
    assert "is a sweep; run the sweep's own command again, without --resume" in capsys.readouterr().err


@pytest.mark.slow     # over 10 s; .ci/run runs the slow tests too
def test_a_run_trained_under_another_axis_is_not_reused_with_other_settings(data_dir, tmp_path, capsys):
    out = tmp_path / "sw"

    def sweep_with(*extra):
        return train.main(tiny_args(data_dir, out, "--max_iters=2", "--eval_interval=2", *extra))
    assert sweep_with("--sweep", "n_head=1,2") == 0
    assert sweep_with("--sweep", "activation=gelu,relu") == 0
    capsys.readouterr()
    # the n_head runs were trained with gelu: they must not stand for relu runs
    assert sweep_with("--sweep", "n_head=1,2", "--activation=relu") == 2
    assert "holds runs trained with other settings (n_head=1__seed=1337: activation=gelu in the run, relu now)" in capsys.readouterr().err
    # a default typed out is no change, nor is a speed setting; a run recorded with a relative
    # data_dir read the repository's
    assert sweep_with("--sweep", "n_head=1,2", "--activation=gelu", "--flush_denormal=true") == 0
    run = grid.SweepRun({"n_head": 1}, 1337, out / "n_head=1__seed=1337")
    record = json.loads((run.folder / "config.json").read_text())
    model_cfg = GPTConfig(**record["model"])
    train_cfg = TrainConfig(**{**record["train"], "data_dir": str(REPO_ROOT / "data")})
    record["train"]["data_dir"] = "data"
    (run.folder / "config.json").write_text(json.dumps(record))
    assert grid.changed_settings(run, model_cfg, train_cfg) == []
    assert grid.changed_settings(run, model_cfg, TrainConfig(**{**record["train"], "data_dir": "/x"})) == [f"data_dir={REPO_ROOT / 'data'} in the run, /x now"]
    # a setting the record lacks (a field newer than the run) is the default the run used; where
    # the folder sits is not a setting
    del record["model"]["activation"]
    record["train"]["out_dir"] = "elsewhere"
    (run.folder / "config.json").write_text(json.dumps(record))
    assert grid.changed_settings(run, model_cfg, train_cfg) == []
    relu = GPTConfig(**{**record["model"], "activation": "relu"})
    assert grid.changed_settings(run, relu, train_cfg) == ["activation=gelu in the run, relu now"]
    # a replaced field reads as its successor: decay_lr=true was the cosine schedule
    del record["train"]["lr_schedule"]
    for decay_lr, changed in ((True, []), (False, ["lr_schedule=constant in the run, cosine now"])):
        record["train"]["decay_lr"] = decay_lr
        (run.folder / "config.json").write_text(json.dumps(record))
        assert grid.changed_settings(run, model_cfg, train_cfg) == changed
    # cooldown_frac changes nothing but a wsd run
    record["train"]["decay_lr"] = True
    (run.folder / "config.json").write_text(json.dumps(record))
    cooled = dataclasses.replace(train_cfg, cooldown_frac=0.5)
    assert grid.changed_settings(run, model_cfg, cooled) == []
    assert grid.changed_settings(run, model_cfg, dataclasses.replace(cooled, lr_schedule="wsd")) == [
        "lr_schedule=cosine in the run, wsd now", "cooldown_frac=0.2 in the run, 0.5 now"]
    # nor min_lr a constant one
    record["train"].update(decay_lr=False, min_lr=1e-4)
    (run.folder / "config.json").write_text(json.dumps(record))
    flat = dataclasses.replace(train_cfg, lr_schedule="constant", min_lr=1e-5)
    assert grid.changed_settings(run, model_cfg, flat) == []
    assert grid.changed_settings(run, model_cfg, dataclasses.replace(flat, lr_schedule="linear")) == [
        "min_lr=0.0001 in the run, 1e-05 now", "lr_schedule=constant in the run, linear now"]


@pytest.mark.e2e
@pytest.mark.parametrize("extra, axis", [
    ((), "cooldown_frac=0.1,0.5"),                                    # cosine by default
    (("--lr_schedule=constant",), "min_lr=0,1e-5"),
    (("--lr_schedule=constant",), "lr_decay_iters=3,4"),
])
def test_a_sweep_over_a_setting_no_run_reads_is_refused(data_dir, tmp_path, capsys, extra, axis):
    out = tmp_path / "sw"
    assert train.main(tiny_args(data_dir, out, "--max_iters=2", *extra, "--sweep", axis)) == 2
    name = axis.split("=")[0]
    err = capsys.readouterr().err
    readers = "wsd reads" if name == "cooldown_frac" else "cosine, linear, wsd read"
    assert err == (f"error: the axis {name}: lr_schedule={'constant' if extra else 'cosine'} does not read it, "
                   f"so the runs would train alike; only {readers} it: set --lr_schedule to one, or sweep "
                   "lr_schedule too\n")
    assert not out.exists()


@pytest.mark.e2e
def test_a_sweep_over_a_setting_no_value_of_its_schedule_axis_reads_is_refused(data_dir, tmp_path, capsys):
    out = tmp_path / "sw"
    argv = tiny_args(data_dir, out, "--max_iters=2", "--sweep", "lr_schedule=constant,cosine",
                     "--sweep", "cooldown_frac=0.1,0.5")
    assert train.main(argv) == 2
    assert capsys.readouterr().err == ("error: the axis cooldown_frac: lr_schedule=constant,cosine does not read "
                                       "it, so the runs would train alike; only wsd reads it: add one to the "
                                       "lr_schedule axis\n")
    assert not out.exists()


@pytest.mark.e2e
def test_a_sweep_over_a_setting_some_runs_read_goes_ahead(data_dir, tmp_path):
    out = tmp_path / "sw"
    argv = tiny_args(data_dir, out, "--max_iters=2", "--eval_interval=2", "--sweep", "lr_schedule=cosine,wsd",
                     "--sweep", "cooldown_frac=0.1,0.5")
    assert train.main(argv) == 0
    assert len(list(out.glob("*/config.json"))) == 4


@pytest.mark.e2e
def test_a_sweep_keeps_its_runs_when_its_axes_are_given_in_another_order(data_dir, tmp_path, capsys):
    out = tmp_path / "sw"
    args = tiny_args(data_dir, out, "--max_iters=2", "--eval_interval=2")
    assert train.main([*args, "--sweep", "residual=true", "--sweep", "bias=true,false"]) == 0
    capsys.readouterr()
    assert train.main([*args, "--sweep", "bias=true,false", "--sweep", "residual=true"]) == 0
    assert "2 runs (2 already finished)" in capsys.readouterr().out
    assert json.loads((out / "sweep.json").read_text())["axes"] == {"residual": [True], "bias": [True, False]}


@pytest.mark.e2e
def test_a_sweep_that_cannot_start_leaves_no_folder_and_checks_every_seed(data_dir, tmp_path, capsys):
    out = tmp_path / "sw"
    assert train.main(tiny_args(data_dir, out, "--dataset=nope", "--sweep", "n_layer=1,2")) == 2
    assert "nope" in capsys.readouterr().err and not out.exists()
    assert train.main(tiny_args(data_dir, out, f"--seed={2 ** 32 - 1}", "--seeds=2")) == 2
    assert ("seed=4294967295 with seeds=2: the seeds would run to 4294967296, past 2**32 - 1"
            in capsys.readouterr().err) and not out.exists()
    # a typo'd count is refused before the runs are listed, which would fill the memory first
    assert train.main(tiny_args(data_dir, out, "--seed=0", "--seeds=20000000", "--sweep", "n_layer=1,2")) == 2
    assert capsys.readouterr().err == ("error: the sweep would make 40,000,000 runs (20000000 seeds of each "
                                       "setting), more than 100,000; give fewer seeds or axis values\n")
    assert not out.exists()
    out.mkdir()     # and by the report, of a sweep.json edited so
    (out / "sweep.json").write_text(json.dumps({"axes": {}, "seeds": 10 ** 9, "base_seed": 0, "command": "x"}))
    assert report.main(["report", str(out)]) == 2
    assert "the sweep would make 1,000,000,000 runs" in capsys.readouterr().err


@pytest.mark.e2e
def test_a_file_where_a_run_folder_goes_is_refused(data_dir, tmp_path, capsys, monkeypatch):
    out = tmp_path / "sw"
    argv = tiny_args(data_dir, out, "--max_iters=2", "--eval_interval=2", "--sweep", "residual=true,false")
    out.mkdir()
    (out / "residual=false__seed=1337").write_text("notes")
    assert train.main(argv) == 2
    assert capsys.readouterr().err == (f"error: {out / 'residual=false__seed=1337'} is a file, where the sweep "
                                       "keeps that run; move it away\n")
    assert (out / "residual=false__seed=1337").read_text() == "notes"
    (out / "residual=false__seed=1337").unlink()
    real_mkdir = Path.mkdir

    def mkdir(self, *args, **kwargs):     # a full disk, met by the second run
        if self.name.startswith("residual=false"):
            raise OSError(28, "No space left on device")
        return real_mkdir(self, *args, **kwargs)
    monkeypatch.setattr(Path, "mkdir", mkdir)
    stopped, real_stop = [], runner._stop
    monkeypatch.setattr(runner, "_stop", lambda running, *a: stopped.append(len(running)) or real_stop(running, *a))
    # two at once: the first run is under way when the second cannot start; one at a time: it is done
    for jobs, under_way in (("--jobs=2", "; the runs under way were stopped and saved"), ("--jobs=1", "")):
        assert train.main([*argv, jobs]) == 2
        assert capsys.readouterr().err.endswith(
            f"error: cannot start the run in {out / 'residual=false__seed=1337'} (No space left on device)"
            f"{under_way}: fix it, and run the same command again to continue\n")
    assert stopped == [1, 0]
    monkeypatch.undo()
    assert train.main(argv) == 0


def test_diverged_runs_stay_out_of_the_diagnostics_table_and_nan_out_of_the_best(tmp_path):
    def final(grad):
        return {"iter": 4, "val_loss": 2.0, "block_grad_norm": [grad, grad], "block_update_ratio": [1e-3] * 2,
                "block_rms": [1.0] * 2, "block_pos_sim": [0.5] * 2, "head_entropy": [[1.0], [1.0]]}
    rows = [{"_setting": "a", "status": "finished", "diverged": False, "_evals": [final(1.0)]},
            {"_setting": "a", "status": "diverged", "diverged": True, "_evals": [final(1e6)]}]
    assert "| a | 1.00e+00 / 1.00e+00 |" in report.diagnostics_table(rows)
    # best val loss of a run whose log holds a nan evaluation (kept with --skip_nonfinite)
    (tmp_path / "sweep.json").write_text(json.dumps({"axes": {"max_iters": [4]}, "seeds": 1,
                                                      "base_seed": 0, "command": "train"}))
    run = tmp_path / "max_iters=4__seed=0"
    run.mkdir()
    evals = [{"kind": "eval", "iter": i, "train_loss": v, "val_loss": v}
             for i, v in ((0, math.nan), (2, 3.0), (4, 2.5))]
    (run / "metrics.jsonl").write_text("".join(json.dumps(e) + "\n" for e in evals))
    assert report.collect(tmp_path)[1][0]["best_val_loss"] == 2.5


@pytest.mark.e2e
def test_a_sweep_under_torchrun_is_refused(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    assert train.main(["--out_dir", str(tmp_path / "sw"), "--sweep", "n_layer=1,2"]) == 2
    assert "not torchrun (use --jobs=N" in capsys.readouterr().err
    assert not (tmp_path / "sw").exists()


@pytest.mark.e2e
def test_a_data_dir_axis_is_read_from_where_the_sweep_starts_and_restarts(data_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(data_dir.parent)
    argv = tiny_args(Path("data"), tmp_path / "sw", "--max_iters=2", "--eval_interval=2")[1:]
    argv += ["--sweep", "data_dir=data"]                    # the relative path as an axis value
    assert train.main(argv) == 0
    assert train.main(argv) == 0
    assert "1 run (1 already finished)" in capsys.readouterr().out


@pytest.mark.e2e
def test_a_failed_run_may_be_retried_with_other_settings(data_dir, tmp_path, capsys):
    out = tmp_path / "sw"
    argv = tiny_args(data_dir, out, "--max_iters=2", "--eval_interval=2", "--sweep", "residual=true")
    assert train.main(argv) == 0
    run = out / "residual=true__seed=1337"
    for name in ("ckpt.pt", "ckpt_best.pt"):                # as if it had crashed before saving
        (run / name).unlink()
    (run / "result.json").write_text(json.dumps({"status": "failed", "returncode": 1, "wall_s": 1.0}))
    assert train.main([*argv, "--learning_rate=2e-3"]) == 0  # it starts afresh: nothing is reused
    assert json.loads((run / "config.json").read_text())["train"]["learning_rate"] == 2e-3
    (run / "config.json").write_text('{"model": null}')
    assert train.main([*argv, "--learning_rate=2e-3"]) == 2
    assert "config.json is not a run config of this project" in capsys.readouterr().err
    (run / "config.json").write_text("")                    # cut short
    assert train.main([*argv, "--learning_rate=2e-3"]) == 2
    assert re.fullmatch(r"error: .*config.json is damaged \(Expecting value: .*\); move the run's folder away, "
                        r"and the sweep's command trains it again\n", capsys.readouterr().err)
    shutil.move(run, tmp_path / "aside")                    # as told
    assert train.main([*argv, "--learning_rate=2e-3"]) == 0
    assert json.loads((run / "config.json").read_text())["train"]["learning_rate"] == 2e-3


@pytest.mark.e2e
def test_a_sweep_resumes_a_stopped_run_it_started(no_estimate, data_dir, tmp_path, monkeypatch):
    import os
    import signal

    from gpt import checkpoint
    from gpt.model import GPT
    out = tmp_path / "sw"
    run = out / "residual=true__seed=1337"
    real_forward, calls = GPT.forward, []

    def stopped(self, idx, targets=None):       # SIGTERM in the third step
        if self.training:
            calls.append(1)
            if len(calls) == 3:
                os.kill(os.getpid(), signal.SIGTERM)
        return real_forward(self, idx, targets)
    monkeypatch.setattr(GPT, "forward", stopped)
    # the run as the sweep starts it (a fresh run is told --overwrite=true), stopped part way
    assert train.main(tiny_args(data_dir, run, "--max_iters=6", "--eval_interval=2", "--residual=true",
                                "--overwrite=true")) == 143
    monkeypatch.undo()
    assert checkpoint.load(run / "ckpt.pt")["iter"] == 3
    assert train.main(tiny_args(data_dir, out, "--max_iters=6", "--eval_interval=2",
                                "--sweep", "residual=true")) == 0
    assert checkpoint.load(run / "ckpt.pt")["iter"] == 6
    assert "resuming" in (run / "log.txt").read_text()


def test_plotted_settings_never_share_a_colour():
    import matplotlib
    assert plots._colours(4) == list(matplotlib.colormaps["tab10"].colors[:4])
    for n in (10, 16, 45):
        assert len(set(plots._colours(n))) == n


@pytest.mark.e2e
@pytest.mark.parametrize("code, status", [(0, "finished"), (DIVERGED_EXIT, "diverged")])
def test_a_run_that_ended_as_the_sweep_was_stopped_is_recorded(code, status, data_dir, tmp_path, monkeypatch,
                                                                capsys):
    class Ended:        # a run whose end the sweep had not yet seen when Ctrl-C came
        returncode = code

        def __init__(self, *args, **kwargs):
            pass

        def poll(self):
            return None

        def terminate(self):
            pass

        def wait(self):
            return code

    def ctrl_c(seconds):
        raise KeyboardInterrupt
    monkeypatch.setattr(runner.subprocess, "Popen", Ended)
    monkeypatch.setattr(runner.time, "sleep", ctrl_c)
    out = tmp_path / "sw"
    assert train.main(tiny_args(data_dir, out, "--sweep", "n_layer=1", "--run_start=fresh")) == 130
    result = json.loads((out / "n_layer=1__seed=1337" / "result.json").read_text())
    assert (result["status"], result["returncode"]) == (status, code)
    assert f"[1/1 done] n_layer=1__seed=1337: {status}, " in capsys.readouterr().out    # counted as done


@pytest.mark.e2e
def test_a_report_that_cannot_be_written_still_prints_its_table(data_dir, tmp_path, capsys):
    out = tmp_path / "sw"
    assert train.main(tiny_args(data_dir, out, "--max_iters=2", "--eval_interval=2", "--sweep", "n_layer=1")) == 0
    (out / "sweep.csv").unlink()
    (out / "sweep.csv").mkdir()                 # unwritable even for root, as a read-only copy is
    capsys.readouterr()
    assert report.main(["report", str(out)]) == 2
    captured = capsys.readouterr()
    assert "| n_layer=1 |" in captured.out
    assert captured.err.startswith(f"error: the report cannot be written to {out / 'sweep.csv'} (Is a directory)")
    assert captured.err.count("\n") == 1
    (out / "sweep.csv").rmdir()
    (out / "curves.png").unlink()
    (out / "curves.png").mkdir()                # the picture, written by matplotlib, is named too
    assert report.main(["report", str(out)]) == 2
    assert capsys.readouterr().err.startswith(f"error: the report cannot be written to {out / 'curves.png'} (")


@pytest.mark.parametrize("record", [{"axes": {"n_layer": [1]}, "seeds": "x", "base_seed": 1, "command": ""},
                                    {"axes": ["n_layer"], "seeds": 1, "base_seed": 1, "command": ""}])
def test_a_damaged_sweep_description_gets_one_line(record, tmp_path, capsys):
    (tmp_path / "sweep.json").write_text(json.dumps(record))
    assert report.main(["report", str(tmp_path)]) == 2
    assert capsys.readouterr().err == (f"error: {tmp_path / 'sweep.json'} is not a sweep description; "
                                       "run the sweep again to rewrite it\n")


@pytest.mark.e2e
def test_a_sweep_whose_run_folders_would_have_too_long_a_name_is_refused_before_anything_is_written(data_dir, tmp_path):
    out = tmp_path / "sw"
    argv = tiny_args(data_dir, out, *(f"--sweep={name}={value}" for name, value in (
        ("learning_rate", "0.001"), ("weight_decay", "0.01"), ("beta2", "0.95"), ("warmup_iters", "10"),
        ("grad_clip", "0.5"), ("norm_placement", "sandwich"), ("pos_encoding", "sinusoidal"),
        ("activation", "gelu_tanh"), ("scale_embeddings", "true"), ("tie_weights", "false"),
        ("qk_norm", "true"), ("norm_type", "rmsnorm"), ("lr_schedule", "constant"))))
    for made in (False, True):      # in a folder that exists, where asking after the name would fail
        if made:
            out.mkdir()
        with pytest.raises(UserError, match=r"^a run's folder would be named learning_rate=0.001__.*, 2\d\d bytes, "
                                            r"more than the 255 a file system allows; sweep fewer axes"):
            runner.run(parse_argv(argv), [])
        assert out.exists() == made and not any(out.iterdir() if made else ())


@pytest.mark.e2e
def test_a_data_dir_axis_with_a_tilde_names_its_runs_as_typed_and_trains_in_the_home_folder(data_dir, tmp_path,
                                                                                            monkeypatch, capsys):
    import shutil
    monkeypatch.setenv("HOME", str(tmp_path))
    shutil.copytree(data_dir, tmp_path / "d1")
    out = tmp_path / "sw"
    argv = [a for a in tiny_args(data_dir, out, "--max_iters=2", "--eval_interval=2", "--sweep", "data_dir=~/d1")
            if not a.startswith("--data_dir=")]
    assert train.main(argv) == 0
    assert [p.name for p in out.iterdir() if p.is_dir()] == ["data_dir=~"]     # its / nests, as before
    config = json.loads((out / "data_dir=~" / "d1__seed=1337" / "config.json").read_text())
    assert config["train"]["data_dir"] == str(tmp_path / "d1")
    assert train.main(argv) == 0
    assert "(1 already finished)" in capsys.readouterr().out


@pytest.mark.e2e
@pytest.mark.parametrize("record", [{"axes": None}, {"axes": 5}, {"axes": {"batch_size": [4]}, "eval_batch_size": "x"}])
def test_a_sweep_json_edited_by_hand_is_rewritten(record, data_dir, tmp_path):
    out = tmp_path / "sw"
    argv = tiny_args(data_dir, out, "--max_iters=2", "--eval_interval=2", "--sweep", "batch_size=4,2")
    assert train.main(argv) == 0
    (out / "sweep.json").write_text(json.dumps(record))
    assert train.main(argv) == 0
    assert json.loads((out / "sweep.json").read_text())["axes"] == {"batch_size": [4, 2]}


@pytest.mark.e2e
def test_a_sweep_given_an_empty_out_dir_says_so(data_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert train.main(tiny_args(data_dir, tmp_path, "--out_dir=", "--sweep", "n_layer=1")) == 2
    assert capsys.readouterr().err == "error: out_dir is empty; give a folder name\n"
    assert list(tmp_path.iterdir()) == [tmp_path / "data"]


def test_the_diagnostics_picture_marks_whole_blocks_only(tmp_path, monkeypatch):
    from matplotlib.figure import Figure
    saved = []
    monkeypatch.setattr(Figure, "savefig", lambda fig, *a, **k: saved.append(fig))
    final = {"block_grad_norm": [1.0, 0.5], "block_update_ratio": [1e-3, 2e-3], "block_rms": [1.0, 2.0],
             "block_pos_sim": [0.5, 0.4]}
    rows = [{"_setting": "x=a", "_values": {"x": "a"}, "seed": s, "status": "finished", "diverged": False,
             "_evals": [final]} for s in (1, 2)]
    plots.plot_diagnostics(rows, tmp_path / "d.png")
    ticks = [t for ax in saved[0].axes for t in ax.get_xticks() if 0 <= t <= 1]
    assert ticks and all(t == int(t) for t in ticks)


NORM_STUDY = {"norm_placement": ["pre", "post"], "residual": ["true", "false"], "learning_rate": ["0.001", "0.005"],
              "warmup_iters": ["100", "0"]}


def grid_rows(axes: dict[str, list[str]], seeds: int = 3, per_character: bool = False) -> list[dict]:
    """Rows as report.collect makes them, of a grid whose settings end 0.03 apart (those with
    residual=false stuck at the unigram level, 3.35), each run evaluated 5 times from 4.2 down."""
    import itertools
    rows = []
    for i, values in enumerate(itertools.product(*axes.values())):
        setting = dict(zip(axes, values))
        end = 3.35 if setting.get("residual") == "false" else 2.1 + 0.03 * i
        for seed in range(seeds):
            evals = [{"iter": it, "val_loss": end + 0.004 * seed + (4.2 - end) * math.exp(-it / 60),
                      "unigram_loss": 3.35} for it in range(0, 500, 100)]
            evals[-1].update(block_grad_norm=[1.0 + i, 0.5], block_update_ratio=[1e-3, 2e-3 + i * 1e-4],
                             block_rms=[1.0, 2.0 + i], block_pos_sim=[0.5, 0.4 - 0.01 * i])
            rows.append({**setting, "seed": seed, "status": "finished", "diverged": False, "_evals": evals,
                         "final_val_loss": evals[-1]["val_loss"], "per_character": per_character, "_values": setting,
                         "_setting": grid.setting_label(setting)})
    return rows


def setting_lines(ax) -> list:
    return [line for line in ax.lines if line.get_label() != "unigram level"]


def test_a_grid_of_16_settings_is_drawn_in_one_row_of_panels_per_value_of_one_option():
    from matplotlib.colors import to_rgba
    rows = grid_rows(NORM_STUDY)
    assert plots.split_by(rows) == "residual"           # its values' final losses differ most
    fig = plots.curves_figure(rows)
    assert len(fig.axes) == 4                           # per value: the curves and the final losses
    for (curves, finals), value in zip(zip(fig.axes[::2], fig.axes[1::2]), ("true", "false")):
        panel = [r for r in rows if r["residual"] == value]
        assert curves.get_title().startswith(f"residual={value}: ")
        lines = setting_lines(curves)
        assert len(lines) == 8 and len({to_rgba(line.get_color()) for line in lines}) == 8
        legend = finals.get_legend()
        assert legend.get_title().get_text() == "norm_placement, learning_rate, warmup_iters"
        texts = [t.get_text() for t in legend.get_texts()]
        assert texts[0] == "pre, 0.001, 100" and not any("residual" in t or value in t.split(", ") for t in texts)
        # a point per seed for each setting, and a bar at each setting's mean
        seeds = [line for line in finals.lines if line.get_marker() == "o"]
        assert [len(line.get_xdata()) for line in seeds] == [3] * 8
        assert sum(line.get_marker() == "_" for line in finals.lines) == 8
        # the curves whole, the first evaluations (4.2 at iteration 0) too, on one log scale in every row
        ends = [r["final_val_loss"] for r in panel]
        span = max(max(ends) - min(ends), 0.02 * max(ends))     # a range of at least 2% of the loss
        bottom, top = curves.get_ylim()
        assert curves.get_yscale() == "log" and bottom < min(r["final_val_loss"] for r in rows) and top > 4.2
        assert curves.get_ylim() == fig.axes[0].get_ylim()
        # the final losses zoomed to them
        bottom, top = finals.get_ylim()
        assert min(ends) - 0.1 * span <= bottom < min(ends) and max(ends) < top <= min(ends) + 1.15 * span
    # the unigram level is drawn in each curve panel, and in the final losses' where their zoom holds it,
    # else the title says where it is
    assert "unigram level 3.35 is above the view" in fig.axes[1].get_title()
    assert [line.get_label() for line in fig.axes[0].lines].count("unigram level") == 1
    assert [line.get_label() for line in fig.axes[2].lines].count("unigram level") == 1


def test_a_grid_of_few_settings_is_one_row_whose_legend_names_what_varies():
    from matplotlib.colors import to_rgba
    rows = grid_rows({"dropout": ["0.0"], "residual": ["true", "false"], "n_layer": ["1", "2"]}, seeds=2)
    fig = plots.curves_figure(rows)
    assert len(fig.axes) == 2 and plots.split_by(rows) is None
    assert len({to_rgba(line.get_color()) for line in setting_lines(fig.axes[0])}) == 4
    legend = fig.axes[1].get_legend()
    assert legend.get_title().get_text() == "residual, n_layer"     # dropout is the same everywhere
    texts = [t.get_text() for t in legend.get_texts()]
    assert texts == ["true, 1", "true, 2", "false, 1", "false, 2", "unigram level"]
    assert [len(line.get_xdata()) for line in fig.axes[1].lines if line.get_marker() == "o"] == [2] * 4
    # more than 6 settings of one option alone: one panel, every colour its own
    rows = grid_rows({"learning_rate": [str(i) for i in range(12)]}, seeds=1)
    fig = plots.curves_figure(rows)
    assert len(fig.axes) == 2 and len({to_rgba(line.get_color()) for line in setting_lines(fig.axes[0])}) == 12


def test_the_diagnostics_of_16_settings_fit_a_page_with_one_legend_off_the_data():
    from matplotlib.colors import to_rgba
    fig = plots.diagnostics_figure(grid_rows(NORM_STUDY))
    assert len(fig.axes) == 4 and {ax.get_subplotspec().get_geometry()[:2] for ax in fig.axes} == {(2, 2)}
    width, height = fig.get_size_inches()
    assert width <= 11 and height <= 11 and min(width, height) <= 8.5
    for ax in fig.axes:
        assert len({to_rgba(line.get_color()) for line in ax.lines}) == len(ax.lines) == 16
        assert ax.get_legend() is None
    assert len(fig.legends) == 1 and len(fig.legends[0].get_texts()) == 16
    fig.draw_without_rendering()
    legend = fig.legends[0].get_window_extent()
    assert not any(legend.overlaps(ax.get_window_extent()) for ax in fig.axes)
    # the split's values by line style, each setting by colour
    assert {line.get_linestyle() for line in fig.axes[0].lines} == {"-", "--"}


def test_the_summary_table_gives_bits_per_character_beside_the_loss_of_per_character_settings():
    def rows(label, vals, per_character):
        return [{"_setting": label, "final_val_loss": v, "status": "finished", "diverged": False,
                 "per_character": per_character} for v in vals]
    table = report.summary_table(report.summarize(rows("a", [2.00, 2.01, 1.99], True)
                                                  + rows("b", [2.30, 2.31, 2.29], False)))
    ln2 = math.log(2)
    assert table.splitlines() == [
        "| setting | runs | final val loss (mean ± std) | final val bpc (mean ± std) | diverged | vs baseline |",
        "|---|---|---|---|---|---|",
        f"| a | 3 | 2.000 ± 0.010 | {2.0 / ln2:.3f} ± {0.01 / ln2:.3f} | 0 | baseline |",
        "| b | 3 | 2.300 ± 0.010 | — | 0 | worse by 0.300 |"]
    assert f"{2.0 / ln2:.3f} ± {0.01 / ln2:.3f}" == "2.885 ± 0.014"
    # BPE alone: the table as it was, with no bpc in it
    table = report.summary_table(report.summarize(rows("b", [2.30, 2.31, 2.29], False)))
    assert table.splitlines()[:3] == ["| setting | runs | final val loss (mean ± std) | diverged | vs baseline |",
                                      "|---|---|---|---|---|", "| b | 3 | 2.300 ± 0.010 | 0 | baseline |"]


def write_sweep(out, runs: dict[int, tuple[list[float], dict, bool]]) -> None:
    """A sweep over n_layer, by hand: per n_layer its finished run's val losses, config.json and
    whether its evaluations carry bpc (those of code older than bpc do not)."""
    out.mkdir()
    (out / "sweep.json").write_text(json.dumps({"axes": {"n_layer": list(runs)}, "seeds": 1, "base_seed": 0,
                                                "command": "train"}))
    for n_layer, (losses, record, with_bpc) in runs.items():
        run = out / f"n_layer={n_layer}__seed=0"
        run.mkdir()
        evals = [{"kind": "eval", "iter": 2 * i, "train_loss": v, "val_loss": v,
                  **({"train_bpc": v / math.log(2), "val_bpc": v / math.log(2)} if with_bpc else {})}
                 for i, v in enumerate(losses)]
        (run / "metrics.jsonl").write_text("".join(json.dumps(e) + "\n" for e in evals))
        (run / "config.json").write_text(json.dumps(record))
        (run / "result.json").write_text(json.dumps({"status": "finished", "returncode": 0, "wall_s": 1.0}))


def test_the_report_gives_bits_per_character_of_new_runs_and_of_old_runs_on_char_data(data_dir, tmp_path, capsys):
    bpe = data_dir / "bpe"
    bpe.mkdir()
    (bpe / "meta.json").write_text(json.dumps({"tokenizer": "tiktoken", "vocab_size": 50, "encoding": "gpt2"}))
    def on(dataset, folder=data_dir):
        return {"train": {"data_dir": str(folder), "dataset": dataset}}
    out = tmp_path / "sw"
    write_sweep(out, {1: ([3.0, 2.0], {}, True),            # new: its evaluations say so
                      2: ([3.0, 2.2], on("tiny"), False),    # older than bpc, on char data
                      3: ([3.0, 2.4], on("tiny", tmp_path / "gone"), False),   # its data since deleted
                      4: ([3.0, 2.6], on("bpe"), False)})
    table = report.report(out)
    ln2 = math.log(2)
    assert table.splitlines()[:6] == [
        "| setting | runs | final val loss (mean ± std) | final val bpc (mean ± std) | diverged | vs baseline |",
        "|---|---|---|---|---|---|",
        f"| n_layer=1 | 1 | 2.000 | {2.0 / ln2:.3f} | 0 | baseline |",
        f"| n_layer=2 | 1 | 2.200 | {2.2 / ln2:.3f} | 0 | needs 2+ seeds |",
        "| n_layer=3 | 1 | 2.400 | — | 0 | needs 2+ seeds |",
        "| n_layer=4 | 1 | 2.600 | — | 0 | needs 2+ seeds |"]
    rows = list(csv.DictReader(open(out / "sweep.csv")))
    assert [float(r["final_val_bpc"]) for r in rows[:2]] == pytest.approx([2.0 / ln2, 2.2 / ln2], rel=1e-12)
    assert float(rows[1]["best_val_bpc"]) == pytest.approx(2.2 / ln2, rel=1e-12)
    assert all(math.isnan(float(r["final_val_bpc"])) for r in rows[2:])
    assert (out / "curves.png").stat().st_size > 10_000
    # a sweep of BPE runs alone: no bpc anywhere
    out = tmp_path / "bpe_sweep"
    write_sweep(out, {4: ([3.0, 2.6], on("bpe"), False)})
    capsys.readouterr()
    assert "bpc" not in report.report(out) and "bpc" not in capsys.readouterr().out
    assert "bpc" not in (out / "sweep.csv").read_text() and "bpc" not in (out / "summary.md").read_text()


def test_curves_of_per_character_runs_read_in_bits_per_character_on_a_second_axis():
    rows = grid_rows({"dropout": ["0.0"], "residual": ["true", "false"], "n_layer": ["1", "2"]}, seeds=2,
                     per_character=True)
    fig = plots.curves_figure(rows)
    fig.draw_without_rendering()
    for ax in fig.axes:
        (bits,) = ax.child_axes
        assert bits.get_ylabel() == "bits per character"
        assert bits.get_ylim() == pytest.approx([y / math.log(2) for y in ax.get_ylim()], rel=1e-9)
    # the legend stays clear of the second axis' numbers
    legend = fig.axes[1].get_legend().get_window_extent()
    assert legend.x0 > fig.axes[1].child_axes[0].get_tightbbox().x1
    # a BPE run among them: the axis would misread it, so there is none
    rows[-1]["per_character"] = False
    assert not any(ax.child_axes for ax in plots.curves_figure(rows).axes)
    assert not any(ax.child_axes for ax in plots.curves_figure(grid_rows(NORM_STUDY)).axes)


def test_the_report_names_runs_that_scored_the_train_split_at_other_evaluations():
    def run(seed, **config):
        return {"_setting": "activation=relu", "seed": seed, "_config": {"activation": "relu", **config}}
    # a sweep begun before eval_train (no such key: every evaluation) and continued after it
    rows = [run(1), run(2), run(3, eval_train=False)]
    assert report.uneven_evaluations(rows, {"activation": 0}) == [
        "activation=relu__seed=3: eval_train=false (the others true)"]
    assert report.uneven_evaluations([run(1, eval_train=False), run(2, eval_train=False)], {"activation": 0}) == []
    assert report.uneven_evaluations([run(1, eval_train=True), run(2)], {"activation": 0}) == []
    # an axis of the sweep is what it compares: not named
    assert report.uneven_evaluations([run(1), run(2, eval_train=False)], {"eval_train": 0}) == []
