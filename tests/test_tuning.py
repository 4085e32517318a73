"""Tuning per setting: the grid, its extension at an edge, the choice, the seeds kept apart, and bad input."""

import csv
import json
import math
import shutil

import pytest

from conftest import tiny_args
from gpt.cli import parse_argv
from gpt.errors import UserError
from gpt.sweep import report, submitted, tune
from gpt.sweep.grid import settings_of
from test_slurm import slurm  # noqa: F401  (the fake Slurm tools, a fixture)
import train


def losses_from(table: dict[float, float]):
    """loss_at for tune_setting from a table of learning rate -> final loss (None: not ended)."""
    return lambda point, seed: table.get(point["learning_rate"])


def test_the_best_value_inside_the_grid_is_chosen_without_extension():
    t = tune.tune_setting({"n_head": 4}, ["learning_rate"], {"learning_rate": [1e-3, 1e-2, 1e-1]}, [7], 2,
                          losses_from({1e-3: 2.3, 1e-2: 2.0, 1e-1: 2.6}))
    assert t.chosen == {"learning_rate": 1e-2} and len(t.points) == 3
    assert t.where("learning_rate", 2) == "inside"


def test_a_best_value_at_the_edge_extends_the_grid_one_step_at_a_time_up_to_the_limit():
    table = {1e-3: 2.5, 1e-2: 2.3, 1e-1: 2.2, 1.0: 2.1, 10.0: 2.0, 100.0: 1.9}
    t = tune.tune_setting({}, ["learning_rate"], {"learning_rate": [1e-3, 1e-2, 1e-1]}, [7], 2, losses_from(table))
    # a factor of 10 each way: 1.0, then 10.0, and no further
    assert [p["learning_rate"] for p in t.points] == [1e-3, 1e-2, 1e-1, 1.0, 10.0]
    assert t.chosen == {"learning_rate": 10.0}
    assert t.where("learning_rate", 2) == "at the high edge after 2 extensions: the best may lie beyond"
    # with the extension's result not in yet, nothing is chosen, and the point waits to be trained
    waiting = tune.tune_setting({}, ["learning_rate"], {"learning_rate": [1e-3, 1e-2, 1e-1]}, [7], 2,
                                losses_from({k: v for k, v in table.items() if k < 1.0}))
    assert waiting.chosen is None and waiting.points[-1] == {"learning_rate": 1.0}
    # extended at the low edge, back inside once the next value is worse
    t = tune.tune_setting({}, ["learning_rate"], {"learning_rate": [3e-3, 1e-2]}, [7], 2,
                          losses_from({3e-3: 2.0, 1e-2: 2.2, 9e-4: 2.1}))
    assert t.chosen == {"learning_rate": 3e-3} and t.where("learning_rate", 2) == "inside (grid extended by 1)"


def test_a_diverged_tuning_run_counts_as_the_worst_loss_never_as_an_error():
    inf = math.inf
    t = tune.tune_setting({}, ["learning_rate"], {"learning_rate": [1e-3, 1e-2, 1e-1]}, [7, 8], 0,
                          lambda p, seed: inf if (p["learning_rate"] == 1e-2 and seed == 8) else
                          {1e-3: 2.3, 1e-2: 1.9, 1e-1: 2.2}[p["learning_rate"]])
    # 1e-2 is best on seed 7, but diverged on seed 8: its mean is the worst, so 1e-1 wins
    assert t.mean(1) == inf and t.chosen == {"learning_rate": 1e-1}
    everything = tune.tune_setting({}, ["learning_rate"], {"learning_rate": [1e-3, 1e-2]}, [7], 1,
                                   lambda p, seed: inf)
    # all diverged: the grid extended downward once, and its lowest value is the pick
    assert everything.chosen == {"learning_rate": 1e-4} and len(everything.points) == 3


def test_grid_steps_are_factors_for_positive_grids_and_stay_whole_for_whole_numbers():
    assert tune.step_beyond([3e-3, 1e-2, 3e-2], low=False) == 0.09
    assert tune.step_beyond([3e-3, 1e-2, 3e-2], low=True) == 0.0009
    assert tune.step_beyond([50, 100, 200], low=True) == 25
    assert tune.step_beyond([-1.0, 0.0, 1.0], low=True) == -2.0
    assert tune.step_beyond([1, 2], low=True) is None        # 0.5 rounds to a value it already has


def sweep_record(**more) -> dict:
    return {"axes": {"n_head": [1, 2]}, "seeds": 3, "base_seed": 1337, "command": "x",
            "tune": {"learning_rate": [1e-3, 1e-2]}, "tune_seeds": 2, "tune_seed": -1, "tune_extend": 1, **more}


def finish(folder, loss: float, status: str = "finished") -> None:
    folder.mkdir(parents=True)
    (folder / "metrics.jsonl").write_text(json.dumps({"kind": "eval", "iter": 10, "train_loss": loss,
                                                      "val_loss": loss}) + "\n")
    (folder / "result.json").write_text(json.dumps({"status": status, "returncode": 0}))


def test_each_setting_is_confirmed_at_its_own_value_on_seeds_apart_from_the_tuning_seeds(tmp_path):
    sweep = sweep_record()
    first = tune.plan(sweep, tmp_path)
    assert {r.seed for r in first.tuning_runs} == {2337, 2338} and not first.confirm_runs
    assert all(r.folder.parent == tmp_path / "tune" for r in first.tuning_runs)
    best = {1: 1e-2, 2: 1e-3}       # n_head=1 likes the high rate, n_head=2 the low one, inside a wider grid
    for r in first.tuning_runs:
        finish(r.folder, 2.0 if r.tuned["learning_rate"] == best[r.setting["n_head"]] else 2.5)
    done = tune.plan(sweep, tmp_path)
    # the edge: each best sits at an edge, so one more point each, then the choice
    extended = [r for r in done.tuning_runs if not r.folder.exists()]
    assert sorted((r.setting["n_head"], r.tuned["learning_rate"]) for r in extended) == [
        (1, 0.1), (1, 0.1), (2, 0.0001), (2, 0.0001)]
    for r in extended:
        finish(r.folder, 2.6)
    chosen = tune.plan(sweep, tmp_path)
    assert [t.chosen for t in chosen.tunings] == [{"learning_rate": 1e-2}, {"learning_rate": 1e-3}]
    assert [(r.setting["n_head"], r.tuned["learning_rate"], r.seed) for r in chosen.confirm_runs] == [
        (1, 1e-2, 1337), (1, 1e-2, 1338), (1, 1e-2, 1339), (2, 1e-3, 1337), (2, 1e-3, 1338), (2, 1e-3, 1339)]
    assert not {r.seed for r in chosen.confirm_runs} & {r.seed for r in chosen.tuning_runs}
    assert chosen.confirm_runs[0].folder == tmp_path / "n_head=1__learning_rate=0.01__seed=1337"


def test_a_muon_grid_is_left_out_of_the_adamw_settings_of_an_optimizer_axis(tmp_path):
    sweep = sweep_record(axes={"optimizer": ["adamw", "muon"]}, tune={"muon_lr": [0.01, 0.02]})
    current = tune.plan(sweep, tmp_path)
    assert [t.names for t in current.tunings] == [[], ["muon_lr"]]
    assert current.tunings[0].chosen == {}      # AdamW's runs go straight to its seeds
    assert {r.setting["optimizer"] for r in current.tuning_runs} == {"muon"}
    assert [r.setting["optimizer"] for r in current.confirm_runs] == ["adamw"] * 3


def test_tuning_seeds_that_overlap_the_confirmation_seeds_are_refused():
    with pytest.raises(UserError, match=r"the tuning seeds 1338\.\.1339 overlap the confirmation seeds "
                                        r"1337\.\.1339 \(at 1338\).*--tune_seed=1340"):
        tune.check_seeds(sweep_record(tune_seed=1338))
    tune.check_seeds(sweep_record(tune_seed=1340))


def test_linked_axes_move_together():
    settings = settings_of({"n_layer:n_embd": [[2, 128], [8, 64]], "qk_norm": [False, True]})
    assert settings == [{"n_layer": 2, "n_embd": 128, "qk_norm": False}, {"n_layer": 2, "n_embd": 128, "qk_norm": True},
                        {"n_layer": 8, "n_embd": 64, "qk_norm": False}, {"n_layer": 8, "n_embd": 64, "qk_norm": True}]
    args = parse_argv(["--sweep", "n_layer:n_embd=2:128,8:64", "--sweep", "qk_norm=false,true"])
    assert args.sweep["n_layer:n_embd"] == [(2, 128), (8, 64)]


@pytest.mark.parametrize("argv, message", [
    (["--tune", "learning_rate=fast,slow"], "--tune learning_rate=fast is not a number; give a list such as "
                                            "3e-3,1e-2,3e-2"),
    (["--tune", "learning_rate=1e-3"], "--tune learning_rate=0.001 is a grid of one value, which tunes nothing"),
    (["--tune", "learning_rate=1e-3,1e-3"], "--tune learning_rate lists 0.001 twice"),
    (["--tune", "learning_rate=1e-3,1e-2", "--sweep", "learning_rate=1e-3,1e-2"],
     "--tune learning_rate: learning_rate is also an axis of the sweep"),
    (["--tune", "learning_rate=1e-3,1e-2", "--learning_rate=1e-3"], "is also tuned by --tune learning_rate"),
    (["--tune", "pos_encoding=rope,none"], "--tune pos_encoding: only a numeric option can be tuned"),
    (["--tune", "seeds=1,2"], "--tune seeds: not a setting a run reads"),
    (["--tune", "learning_rate"], "should look like --tune learning_rate=3e-3,1e-2,3e-2"),
    (["--sweep", "n_layer:n_embd=2:128,8"], "the value 8 has 1 part(s) for 2 linked options; give each as "
                                            "<n_layer>:<n_embd>"),
    (["--sweep", "n_layer:n_embd=2:128,2:128"], "lists n_layer:n_embd=2:128 twice"),
    (["--sweep", "n_layer=1,2", "--sweep", "n_layer:n_embd=2:128,8:64"], "n_layer is on two axes"),
])
def test_bad_tuning_and_linked_axes_are_refused_in_one_line(argv, message):
    with pytest.raises(UserError) as e:
        parse_argv(argv)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_a_config_files_tune_table_is_read_and_a_command_lines_tune_replaces_its_axis(tmp_path):
    config = tmp_path / "study.toml"
    config.write_text('max_iters = 10\n[sweep]\nlearning_rate = [1e-3, 1e-2]\nqk_norm = [false, true]\n'
                      '"n_layer:n_embd" = [[2, 32], [4, 16]]\n[tune]\nwarmup_iters = [10, 20]\n')
    args = parse_argv(["--config", str(config)])
    assert args.tune == {"warmup_iters": [10, 20]} and args.sweep["n_layer:n_embd"] == [(2, 32), (4, 16)]
    args = parse_argv(["--config", str(config), "--tune", "learning_rate=3e-3,1e-2,3e-2"])
    assert list(args.sweep) == ["qk_norm", "n_layer:n_embd"]
    assert args.tune == {"warmup_iters": [10, 20], "learning_rate": [3e-3, 1e-2, 3e-2]}
    config.write_text("[tune]\nlearning_rate = 0.1\n")
    with pytest.raises(UserError, match=r"\[tune\] must be a table of option = \[values\]"):
        parse_argv(["--config", str(config)])


@pytest.mark.slow     # over 15 s on 2 AVX2 cores; .ci/run runs the slow tests too
@pytest.mark.e2e
def test_a_tuned_sweep_resumes_half_tuned_and_trains_nothing_twice(data_dir, tmp_path, capsys):
    out = tmp_path / "sw"
    argv = tiny_args(data_dir, out, "--max_iters=6", "--eval_interval=3", "--min_lr_ratio=0.1",
                     "--sweep", "residual=true,false", "--tune", "learning_rate=1e-3,3e-3", "--tune_extend=1",
                     "--seeds=2", "--jobs=2")
    assert train.main(argv) == 0
    said = capsys.readouterr().out
    runs = sorted(p.parent for p in out.rglob("metrics.jsonl"))
    tuning = [p for p in runs if p.parent.name == "tune"]
    assert len(tuning) in (5, 6) and len(runs) - len(tuning) == 4     # one more point per setting at most
    assert "lr.png" in said and (out / "lr.png").stat().st_size > 10_000
    summary = (out / "summary.md").read_text()
    assert "## Tuning" in summary and "| residual=true | learning_rate=" in summary
    stamps = {p: (p / "metrics.jsonl").stat().st_mtime_ns for p in runs}
    # half tuned: a tuning run and a confirmation run taken away; the command trains those two alone
    shutil.rmtree(tuning[0])
    shutil.rmtree([p for p in runs if p.parent == out][0])
    assert train.main(argv) == 0
    retrained = [p for p in runs if (p / "metrics.jsonl").stat().st_mtime_ns != stamps[p]]
    assert sorted(retrained) == sorted([tuning[0], [p for p in runs if p.parent == out][0]])
    capsys.readouterr()
    assert train.main(argv) == 0
    assert f"sweep: {len(runs)} runs ({len(tuning)} tuning, 4 at each setting's chosen value) ({len(runs)} already " \
           "finished)" in capsys.readouterr().out


@pytest.mark.e2e
def test_slurm_submits_a_tuned_sweep_stage_by_stage_and_status_says_when(data_dir, tmp_path, slurm, capsys):
    out = tmp_path / "sw"
    argv = tiny_args(data_dir, out, "--max_iters=6", "--sweep", "residual=true,false", "--seeds=2",
                     "--tune", "learning_rate=1e-3,1e-2,1e-1", "--launcher=slurm")
    assert train.main(argv) == 0
    printed = capsys.readouterr().out
    assert "submitted 6 runs as Slurm job 4242" in printed and "tuning: once these runs end, run the same command" in printed
    jobs = submitted.read(out)["jobs"]
    assert sorted(jobs) == sorted(f"tune/residual={r}__learning_rate={lr}__seed=2337"
                                  for r in ("true", "false") for lr in ("0.001", "0.01", "0.1"))
    (slurm / "sacct.txt").write_text("".join(f"{job['id']}|RUNNING\n" for job in jobs.values()))
    assert report.main(["status", str(out)]) == 0
    assert capsys.readouterr().out.startswith("tuning: 0 of 2 settings have their value chosen")
    for name in jobs:       # the jobs end: 1e-2 best for both settings
        finish(out / name, 2.0 if "0.01_" in name else 2.4)
    (slurm / "sacct.txt").write_text("".join(f"{job['id']}|COMPLETED\n" for job in jobs.values()))
    (slurm / "scripts.txt").unlink()
    assert train.main(argv) == 0        # the same command: the choice made, the seeds at it submitted
    assert "submitted 4 runs as Slurm job 4242" in capsys.readouterr().out
    assert [n for n in submitted.read(out)["jobs"] if not n.startswith("tune/")] == [
        f"residual={r}__learning_rate=0.01__seed={s}" for r in ("true", "false") for s in (1337, 1338)]
    (slurm / "sacct.txt").write_text("".join(f"4242_{i}|RUNNING\n" for i in range(4)))
    assert report.main(["status", str(out)]) == 0
    assert capsys.readouterr().out.startswith("tuning: every setting's value is chosen (2)")


@pytest.mark.slow     # over 10 s; .ci/run runs the slow tests too
def test_submitit_local_runs_a_tuned_sweep_through_its_stages(data_dir, tmp_path, capsys):
    out = tmp_path / "sw"
    argv = tiny_args(data_dir, out, "--max_iters=6", "--eval_interval=3", "--tune", "learning_rate=1e-3,3e-3",
                     "--tune_extend=1", "--seeds=2", "--jobs=2", "--launcher=submitit_local", "--slurm_time=5")
    assert train.main(argv) == 0
    rows = list(csv.DictReader(open(out / "sweep.csv")))
    chosen = rows[0]["learning_rate"]
    assert [(r["seed"], r["status"]) for r in rows] == [("1337", "finished"), ("1338", "finished")]
    assert {r["learning_rate"] for r in rows} == {chosen} and len(list(csv.DictReader(open(out / "tuning.csv")))) >= 2
    assert "## Tuning" in (out / "summary.md").read_text()


def wandb_run_record(folder):
    """The run record (group, job type, tags) of the offline wandb run in a run folder, read from the
    .wandb file wandb writes: LevelDB's log format (32 KiB blocks of checksum, length, type, data)
    after wandb's 7-byte header, each record one of wandb's protobuf Records."""
    import struct
    from wandb.proto import wandb_internal_pb2
    data = next(folder.glob("wandb/offline-run-*/run-*.wandb")).read_bytes()
    pos, block, pending = 7, 32768, b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            if record.WhichOneof("record_type") == "run":
                return record.run
    raise AssertionError(f"no run record in {folder}")


@pytest.mark.slow     # over 10 s (wandb starts a service per run); .ci/run runs the slow tests too
def test_a_sweeps_runs_are_one_wandb_group_with_their_settings_as_job_type_and_tags(data_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    out = tmp_path / "study"
    argv = tiny_args(data_dir, out, "--max_iters=2", "--eval_interval=2", "--wandb=true", "--jobs=2",
                     "--sweep", "residual=true,false", "--tune", "learning_rate=1e-3,1e-2", "--tune_extend=0")
    assert train.main(argv) == 0
    tuning = out / "tune" / "residual=false__learning_rate=0.01__seed=2337"
    run = wandb_run_record(tuning)
    assert (run.run_group, run.job_type) == ("study", "residual=false")
    assert list(run.tags) == ["residual=false", "learning_rate=0.01", "seed=2337", "stage=tune"]
    confirm = next(out.glob("residual=true__learning_rate=*__seed=1337"))
    run = wandb_run_record(confirm)
    assert run.run_group == "study" and run.job_type == "residual=true"
    assert {"residual=true", "seed=1337", "stage=confirm"} <= set(run.tags)


def test_a_step_past_the_edge_that_is_no_valid_value_closes_that_edge():
    # the best at the low edge; the next step down, 9e-05, would be under min_lr=1e-4
    sweep = sweep_record(axes={"n_head": [4]}, tune={"learning_rate": [3e-4, 1e-3, 3e-3]},
                         values={"min_lr": 1e-4, "n_embd": 64})
    assert not tune.valid_point(sweep, {"n_head": 4, "learning_rate": 9e-5})
    assert tune.valid_point(sweep, {"n_head": 4, "learning_rate": 3e-4})
    t = tune.tune_setting({}, ["learning_rate"], sweep["tune"], [7], 2,
                          losses_from({3e-4: 2.0, 1e-3: 2.1, 3e-3: 2.2}),
                          lambda point: tune.valid_point(sweep, {"n_head": 4, **point}))
    assert t.chosen == {"learning_rate": 3e-4} and len(t.points) == 3
    assert t.where("learning_rate", 2) == ("at the low edge: the next step, 9e-05, is not a valid value, so the "
                                           "best may lie beyond")
    # a beta stepped to 1 or past it is no value either
    beta = tune.tune_setting({}, ["beta2"], {"beta2": [0.95, 0.99]}, [7], 2,
                             lambda p, s: {0.95: 2.1, 0.99: 2.0}[p["beta2"]],
                             lambda point: tune.valid_point({"values": {}}, point))
    assert beta.chosen == {"beta2": 0.99} and "is not a valid value" in beta.where("beta2", 2)


def test_a_setting_that_learned_at_no_value_says_so():
    from gpt.sweep import comparisons
    t = tune.tune_setting({}, ["learning_rate"], {"learning_rate": [1e-2, 1e-1]}, [7], 2, lambda p, s: math.inf)
    # every point diverged: the grid grows downward to its limit, and the lowest is used
    assert [p["learning_rate"] for p in t.points] == [1e-2, 1e-1, 1e-3, 1e-4] and t.chosen == {"learning_rate": 1e-4}
    assert not t.trained and t.where("learning_rate", 2).startswith("none: every value tried diverged")
    assert comparisons.sensitivity_text(t, {}) == "—"


def test_within_levels_finds_a_setting_made_once_for_an_optimizer_that_does_not_read_an_axis():
    from gpt.sweep import stats as st
    axes = {"optimizer": ["adamw", "muon"], "muon_lr": [0.01, 0.02]}
    labels = {st.key_of(s): grid_label for s, grid_label in
              (({"optimizer": "adamw"}, "adamw"), ({"optimizer": "muon", "muon_lr": 0.01}, "muon 0.01"),
               ({"optimizer": "muon", "muon_lr": 0.02}, "muon 0.02"))}
    assert st.within_levels(axes, labels) == [
        ("optimizer", "muon_lr=0.01", "adamw", "muon 0.01"), ("optimizer", "muon_lr=0.02", "adamw", "muon 0.02"),
        ("muon_lr", "optimizer=muon", "muon 0.01", "muon 0.02")]


def test_a_tuned_option_no_schedule_reads_is_refused():
    from gpt.sweep import runner
    with pytest.raises(UserError, match=r"--tune cooldown_frac: lr_schedule=cosine does not read it"):
        runner._check_tuned_read({}, {"n_head": [2, 4]}, {"cooldown_frac": [0.1, 0.2]})
    runner._check_tuned_read({"lr_schedule": "wsd"}, {"n_head": [2, 4]}, {"cooldown_frac": [0.1, 0.2]})
    with pytest.raises(UserError, match="--sweep n_layer:n_layer links an option with itself"):
        parse_argv(["--sweep", "n_layer:n_layer=1:2,3:4"])


@pytest.mark.e2e
def test_stop_hopeless_lets_a_slow_start_train_on(data_dir, tmp_path):
    # a rate far too low: above the unigram level after warmup, but still falling, so not pruned
    assert train.main(tiny_args(data_dir, tmp_path / "slow", "--max_iters=12", "--eval_interval=3",
                                "--learning_rate=1e-5", "--min_lr=1e-6", "--stop_hopeless=true")) == 0
    # a rate that blows up: pruned at its first evaluation after warmup, exit status 4
    assert train.main(tiny_args(data_dir, tmp_path / "fast", "--max_iters=12", "--eval_interval=3",
                                "--learning_rate=30", "--grad_clip=0", "--stop_hopeless=true")) == 4


def test_lr_png_names_each_linked_setting_by_what_differs_from_the_first():
    from gpt.sweep.study_plots import lr_labels
    settings = [{"tie_weights": True, "embed_lr": 0.0, "beta1": 0.9, "n_embd": 64},
                {"tie_weights": False, "embed_lr": 0.0, "beta1": 0.9, "n_embd": 64},
                {"tie_weights": True, "embed_lr": 0.0, "beta1": 0.8, "n_embd": 64}]
    assert lr_labels(settings, ["n_embd"]) == ["tie_weights=true, beta1=0.9", "tie_weights=false", "beta1=0.8"]
    assert lr_labels([{"muon_split": "fused"}, {"muon_split": "qkv"}], []) == ["muon_split=fused", "muon_split=qkv"]
    long = [{f"option_{i}": 0 for i in range(8)}, {f"option_{i}": 1 for i in range(8)}]
    assert all(max(map(len, label.split("\n"))) <= 90 and "\n" in label for label in lr_labels(long, []))


@pytest.mark.slow     # over 15 s on 2 AVX2 cores; .ci/run runs the slow tests too
@pytest.mark.e2e
def test_tuning_runs_evaluate_as_tune_evals_asks_and_train_the_same_losses(data_dir, tmp_path, capsys):
    def study(out, *more):
        assert train.main(tiny_args(data_dir, out, "--max_iters=12", "--eval_interval=2", "--sweep",
                                    "residual=true,false", "--tune", "learning_rate=1e-3,3e-3", "--tune_extend=0",
                                    "--jobs=2", *more)) == 0
        with open(out / "tuning.csv") as f:
            return {(r["residual"], r["learning_rate"]): r["final_val_loss"] for r in csv.DictReader(f)}
    few, every = study(tmp_path / "few", "--tune_evals=3"), study(tmp_path / "every", "--tune_evals=0")
    assert few == every and len(few) == 4      # the choice reads the same final losses to the bit
    evals = {p.parent: [r for r in map(json.loads, p.read_text().splitlines()) if r["kind"] == "eval"]
             for p in (tmp_path / "few").rglob("metrics.jsonl")}
    tuning = [rows for folder, rows in evals.items() if folder.parent.name == "tune"]
    assert len(tuning) == 4 and all([r["iter"] for r in rows] == [0, 4, 8, 12] and "grad_norm" not in str(rows)
                                    for rows in tuning)
    confirm = [rows for folder, rows in evals.items() if folder.parent.name == "few"]
    assert len(confirm) == 2 and all([r["iter"] for r in rows] == list(range(0, 13, 2))
                                     and "block_grad_norm" in rows[-1] for rows in confirm)
    # a study begun with every evaluation goes on under the default without calling its runs changed
    capsys.readouterr()
    assert study(tmp_path / "every") == every and "already finished" in capsys.readouterr().out
