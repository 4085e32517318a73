"""Successive halving of tuning runs: a run paused at a rung and resumed, the rung's choice of which
grid points train on, and a halved study's choice and report."""

import json
import math

import pytest

import train
from conftest import benchmark, tiny_args, untimed_metrics
from gpt import checkpoint
from gpt.sweep import halving, tune
from gpt.sweep.grid import ended
from gpt.train.outcome import PAUSED_EXIT


@pytest.mark.e2e
def test_a_run_paused_and_resumed_trains_the_losses_of_one_never_paused(data_dir, tmp_path, capsys):
    args = ["--max_iters=16", "--eval_interval=8", "--dropout=0.1", "--seed=5"]
    whole, paused = tmp_path / "whole", tmp_path / "paused"
    assert train.main(tiny_args(data_dir, whole, *args)) == 0
    assert train.main(tiny_args(data_dir, paused, *args, "--pause_at=6")) == PAUSED_EXIT
    said = capsys.readouterr().out
    assert f"paused at iteration 6 (pause_at); continue with --out_dir={paused} --resume" in said
    assert checkpoint.load(paused / "ckpt.pt")["iter"] == 6
    assert [r["iter"] for r in untimed_metrics(paused, "eval")] == [0, 6]      # evaluated where it paused
    # the same command again pauses where it stands, training nothing
    assert train.main([f"--out_dir={paused}", "--resume", "--pause_at=6"]) == PAUSED_EXIT
    assert checkpoint.load(paused / "ckpt.pt")["iter"] == 6
    # --resume alone trains on to max_iters: the pause is how that start ran, not the run's setting
    assert train.main([f"--out_dir={paused}", "--resume"]) == 0
    assert untimed_metrics(paused, "train") == untimed_metrics(whole, "train")
    finals = [{k: v for k, v in r.items() if k not in ("elapsed_s", "tokens_per_sec", "cpu_share")}
              for r in (untimed_metrics(whole, "eval")[-1], untimed_metrics(paused, "eval")[-1])]
    assert finals[0] == finals[1] and finals[0]["iter"] == 16
    events = [json.loads(line) for line in (paused / "metrics.jsonl").read_text().splitlines()]
    assert [e["iter"] for e in events if e.get("event") == "paused"] == [6, 6]


@pytest.mark.parametrize("extra, message", [
    (["--pause_at=16"], "pause_at=16 is not before max_iters=16: there would be nothing left to resume"),
    (["--pause_at=-1"], "pause_at=-1 must not be negative"),
])
def test_a_pause_past_the_end_is_refused_in_one_line(data_dir, tmp_path, capsys, extra, message):
    assert train.main(tiny_args(data_dir, tmp_path / "r", "--max_iters=16", *extra)) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and not (tmp_path / "r").exists()


def test_the_leader_its_neighbours_and_the_best_half_train_on():
    rates = [{"learning_rate": v} for v in (1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1)]
    # the leader 3e-2: its neighbours 1e-2 and 1e-1 go on with it, and the best half (1e-3 is in it)
    kept = halving.kept_points(rates, ["learning_rate"], [2.1, 2.4, 2.3, 2.0, 2.35, 2.9])
    assert sorted(rates[i]["learning_rate"] for i in kept) == [1e-3, 1e-2, 3e-2, 1e-1]
    # a leader at an edge has one neighbour; nothing learned by the rung: every point goes on
    assert halving.kept_points(rates[:4], ["learning_rate"], [2.0, 2.5, 2.6, 2.7]) == {0, 1}
    assert halving.kept_points(rates[:4], ["learning_rate"], [math.inf] * 4) == {0, 1, 2, 3}
    # two tuned options: the neighbours along each, the other held at the leader's
    grid = tune.grid_points(["learning_rate", "muon_lr"], {"learning_rate": [1e-3, 1e-2, 1e-1],
                                                            "muon_lr": [1e-2, 3e-2, 1e-1]})
    losses = [3.0, 2.9, 3.1, 3.2, 2.0, 3.3, 3.4, 3.5, 3.6]   # the middle point leads; 5 make the best half
    kept = {tuple(grid[i].values()) for i in halving.kept_points(grid, ["learning_rate", "muon_lr"], losses)}
    assert kept == {(1e-2, 3e-2), (1e-3, 3e-2), (1e-1, 3e-2), (1e-2, 1e-2), (1e-2, 1e-1), (1e-3, 1e-2), (1e-3, 1e-1)}


def paused_at(folder, rung: int, loss: float, status: str = "paused") -> None:
    folder.mkdir(parents=True)
    rows = [{"kind": "eval", "iter": 0, "val_loss": 4.2}, {"kind": "eval", "iter": rung, "val_loss": loss}]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "result.json").write_text(json.dumps({"status": status, "returncode": 5}))


def test_the_plan_pauses_the_grid_at_the_rung_then_lets_the_kept_points_train_on(tmp_path):
    sweep = {"axes": {"n_head": [4]}, "seeds": 2, "base_seed": 1337, "command": "x", "tune_seeds": 1,
             "tune_seed": -1, "tune_extend": 1, "tune_halving": True, "values": {"max_iters": 400},
             "tune": {"learning_rate": [1e-3, 3e-3, 1e-2, 3e-2]}}
    first = tune.plan(sweep, tmp_path)
    assert [r.extra.get("pause_at") for r in first.tuning_runs] == [100] * 4 and not first.confirm_runs
    rung = dict(zip((1e-3, 3e-3, 1e-2, 3e-2), (2.6, 2.2, 2.1, 2.5)))
    for r in first.tuning_runs[:3]:
        paused_at(r.folder, 100, rung[r.tuned["learning_rate"]])
    waiting = tune.plan(sweep, tmp_path)     # one point short of the rung: all wait, nothing stops
    assert [r.extra.get("pause_at") for r in waiting.tuning_runs] == [100] * 4
    paused_at(first.tuning_runs[3].folder, 100, rung[3e-2])
    at_rung = tune.plan(sweep, tmp_path)
    going_on = {r.tuned["learning_rate"]: "pause_at" not in r.extra for r in at_rung.tuning_runs}
    assert going_on == {1e-3: False, 3e-3: True, 1e-2: True, 3e-2: True}
    [t] = at_rung.tunings
    assert t.halved == [{"learning_rate": 1e-3}] and t.rung == 100 and t.chosen is None
    for r in at_rung.tuning_runs[1:]:       # the three train on; 3e-3 ends best
        (r.folder / "metrics.jsonl").open("a").write(json.dumps(
            {"kind": "eval", "iter": 400, "val_loss": 1.9 if r.tuned["learning_rate"] == 3e-3 else 2.0}) + "\n")
        (r.folder / "result.json").write_text(json.dumps({"status": "finished", "returncode": 0}))
    done = tune.plan(sweep, tmp_path)
    assert done.tunings[0].chosen == {"learning_rate": 3e-3}
    assert [r.tuned for r in done.confirm_runs] == [{"learning_rate": 3e-3}] * 2
    # the stopped point counts as ended, so the sweep trains nothing more of it
    assert ended(done.tuning_runs[0], "paused") and not ended(at_rung.tuning_runs[1], "paused")


@pytest.mark.slow     # over 15 s on 2 AVX2 cores; .ci/run runs the slow tests too
@pytest.mark.e2e
def test_a_halved_study_trains_the_kept_points_to_the_losses_of_a_whole_one(data_dir, tmp_path, capsys):
    def study(out, *more):
        code = train.main(tiny_args(data_dir, out, "--max_iters=16", "--eval_interval=4", "--sweep",
                                    "residual=true,false", "--tune", "learning_rate=3e-4,1e-3,3e-3,1e-2",
                                    "--tune_extend=0", "--jobs=2", *more))
        finals = {}
        for metrics in (out / "tune").glob("*/metrics.jsonl"):
            rows = [json.loads(line) for line in metrics.read_text().splitlines()]
            finals[metrics.parent.name] = [(r["iter"], r["val_loss"]) for r in rows if r["kind"] == "eval"][-1]
        return code, finals
    code, whole = study(tmp_path / "whole", "--tune_halving=false")
    assert code == 0
    code, halved = study(tmp_path / "halved")       # halving is the default
    assert code == 0
    stopped = {name for name, (it, _) in halved.items() if it == 4}
    # 4 points a setting: the leader, its neighbours and the best half go on, so at most 2 stop in each;
    # after 16 steps the highest rate leads, and the two lowest stop
    assert {n.split("__")[1] for n in stopped} == {"learning_rate=0.0003", "learning_rate=0.001"}
    assert len(stopped) == 4 and all(halved[n] == whole[n] for n in halved if n not in stopped)
    for name in stopped:
        assert checkpoint.load(tmp_path / "halved" / "tune" / name / "ckpt.pt")["iter"] == 4
    # a run paused and resumed keeps each process's start, and study_cost reads the two as one run
    kept = next(n for n in halved if n not in stopped)
    result = json.loads((tmp_path / "halved" / "tune" / kept / "result.json").read_text())
    assert len(result["starts"]) == 2 and result["starts"][-1] == [result["started"], result["wall_s"]]
    parts = benchmark("study_cost").run_parts(tmp_path / "halved" / "tune" / kept)
    assert parts["_started"] == result["starts"][0][0] and parts["_end"] == pytest.approx(sum(result["starts"][1]))
    assert all(parts[k] > 0 for k in ("start_up", "steps", "evaluations"))
    summary = (tmp_path / "halved" / "summary.md").read_text()
    assert "Successive halving (tune_halving): each setting's given grid trained to step 4 and paused" in summary
    def chosen(out):
        return [t.chosen for t in tune.plan(json.loads((out / "sweep.json").read_text()), out).tunings]
    assert chosen(tmp_path / "halved") == chosen(tmp_path / "whole") == [{"learning_rate": 1e-2}] * 2
    # the check reads the whole study as halving would have: the same choice, and the steps it saves
    check = benchmark("halving_check")
    capsys.readouterr()
    assert check.main([str(tmp_path / "whole")]) == 0
    said = capsys.readouterr().out
    assert "| whole | residual=true | learning_rate=0.01 | learning_rate=0.01 | 0 | learning_rate=0.0003, " \
           "learning_rate=0.001 | 38% |" in said
    assert "2 settings: the same value in 2" in said and "halving saves 48 of 128 tuning steps (38%)" in said
    assert check.main([str(tmp_path / "halved")]) == 2
    assert "is not a tuned sweep trained without halving" in capsys.readouterr().err
    assert study(tmp_path / "halved")[0] == 0       # nothing left to train
    assert "sweep: 10 runs (8 tuning, 2 at each setting's chosen value) (10 already finished)" in capsys.readouterr().out
    assert study(tmp_path / "halved", "--tune_halving=false")[0] == 2
    assert "was tuned with tune_halving=true; give --tune_halving=true to continue it" in capsys.readouterr().err
    # a study recorded before halving existed goes on without it, training nothing again
    record = json.loads((tmp_path / "whole" / "sweep.json").read_text())
    del record["tune_halving"]
    (tmp_path / "whole" / "sweep.json").write_text(json.dumps(record))
    assert study(tmp_path / "whole")[0] == 0
    assert "(10 already finished)" in capsys.readouterr().out
    assert json.loads((tmp_path / "whole" / "sweep.json").read_text())["tune_halving"] is False


def test_a_kept_point_that_diverges_after_the_rung_changes_nothing_that_was_decided(tmp_path):
    sweep = {"axes": {"n_head": [4]}, "seeds": 1, "base_seed": 1337, "command": "x", "tune_seeds": 1,
             "tune_seed": -1, "tune_extend": 0, "tune_halving": True, "values": {"max_iters": 400},
             "tune": {"learning_rate": [1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2]}}
    runs = {r.tuned["learning_rate"]: r for r in tune.plan(sweep, tmp_path).tuning_runs}
    for lr, loss in zip(runs, (2.8, 2.5, 2.0, 2.3, 2.6, 2.9)):     # 1e-3 leads; 3e-4, 3e-3 its neighbours
        paused_at(runs[lr].folder, 100, loss)
    kept = {r.tuned["learning_rate"] for r in tune.plan(sweep, tmp_path).tuning_runs if "pause_at" not in r.extra}
    assert kept == {3e-4, 1e-3, 3e-3}
    # the leader diverges later; the others finish, 3e-4 best: the kept set and the choice stand
    (runs[1e-3].folder / "result.json").write_text(json.dumps({"status": "diverged", "returncode": 3}))
    for lr, loss in ((3e-4, 1.8), (3e-3, 1.9)):
        (runs[lr].folder / "metrics.jsonl").open("a").write(json.dumps({"kind": "eval", "iter": 400,
                                                                         "val_loss": loss}) + "\n")
        (runs[lr].folder / "result.json").write_text(json.dumps({"status": "finished", "returncode": 0}))
    [t] = tune.plan(sweep, tmp_path).tunings
    assert t.chosen == {"learning_rate": 3e-4} and [p["learning_rate"] for p in t.halved] == [1e-4, 1e-2, 3e-2]
    # and should every kept point be lost, the stopped ones train on
    for lr in (3e-4, 3e-3):
        (runs[lr].folder / "result.json").write_text(json.dumps({"status": "diverged", "returncode": 3}))
    again = tune.plan(sweep, tmp_path)
    assert all("pause_at" not in r.extra for r in again.tuning_runs) and again.tunings[0].chosen is None
