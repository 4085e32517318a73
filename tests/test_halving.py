"""Successive halving of tuning runs: a run paused at a rung and resumed, the rung's choice of which
grid points train on, and a halved study's choice and report."""

import json

import pytest

import train
from conftest import tiny_args, untimed_metrics
from gpt import checkpoint
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
