import json
import math
import os
import re

import pytest
import torch

from conftest import tiny_args, benchmark
from gpt import bench
from gpt.config import GPTConfig
from gpt.model import GPT
from gpt.speed.precision import cpu_rounds_matmuls


def test_flops_per_token_is_six_per_weight_plus_attention():
    cfg = GPTConfig(n_layer=2, n_head=2, n_embd=16, block_size=8, vocab_size=65)
    weights = GPT(cfg).num_params(non_embedding=True)
    assert cfg.flops_per_token() == 6 * weights + 12 * 2 * 8 * 16


@pytest.mark.e2e
def test_bench_reports_consistent_figures(data_dir, tmp_path, capsys):
    argv = tiny_args(data_dir, tmp_path / "unused", "--bench_iters=5", "--bench_warmup=2", "--json")
    assert bench.main(argv) == 0
    r = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert r["ms_per_iter"] > 0
    assert r["tokens_per_sec"] == pytest.approx(4 * 16 / r["ms_per_iter"] * 1000)
    assert 0 < r["mfu"] < 1 and r["peak_tflops"] > 0
    assert r["sample_new_tokens"] == 15 and r["sample_tokens_per_sec_cache"] > 0
    assert 0 < r["diagnostics_share"] < 1
    assert not (tmp_path / "unused").exists()        # timing runs in a scratch folder


def test_bench_rejects_bad_arguments(capsys, monkeypatch):
    for arg, said in (("--bench_iters=0", "bench_iters=0 must be positive"),
                      ("--bench_warmup=-1", "bench_warmup=-1 must not be negative"),
                      ("--sample_tokens=-2", "sample_tokens=-2 must not be negative")):
        assert bench.main([arg]) == 2
        assert capsys.readouterr().err == f"error: {said}\n"
    assert bench.main(["--config", "shakespeare_char_cpu", "--max_iters=20"]) == 2
    assert "--max_iters: the bench sets it itself" in capsys.readouterr().err
    assert bench.main(["--help"]) == 0      # what it sets itself is not offered as an option
    shown = capsys.readouterr().out
    assert "--bench_iters=" in shown and "--n_layer=" in shown
    assert not any(f"--{name}=" in shown for name in ("max_iters", "resume", *bench.SET_BY_BENCH))
    assert f"{', '.join(bench.SET_BY_BENCH)} are accepted, and not used." in shown
    # it would time the default model; with --config, not the line that sends one to train.py
    for argv in (["--out_dir=out/some_run", "--resume"], ["--config", "shakespeare_char", "--resume=true"],
                 ["--resume", "--n_layer=1"], ["--config", "shakespeare_char", "--resume", "true"]):
        assert bench.main(argv) == 2
        assert capsys.readouterr().err == ("error: --resume: the bench times a fresh model of the settings "
                                           "given; give the run's --config and options instead\n")

    def timed(model_cfg, train_cfg, bench_cfg):     # reached: nothing refused
        raise bench.UserError("timing")
    monkeypatch.setattr(bench, "measure_speed", timed)
    for argv in (["--resume=false"], ["--config", "shakespeare_char", "--resume", "no"]):
        assert bench.main(argv) == 2
        assert capsys.readouterr().err.endswith(" in a scratch folder, then sampling\nerror: timing\n")


TABLE_ROW = {"device": "cuda", "dtype": "bfloat16", "split_parts": 1, "params": 1, "ms_per_iter": 1.0,
             "tokens_per_sec": 1.0, "achieved_tflops": 1.0, "peak_memory_mb": 1.0, "diagnostics_ms": 1.0,
             "diagnostics_share": 0.1, "sample_new_tokens": 1, "sample_tokens_per_sec_cache": 1.0,
             "sample_tokens_per_sec_no_cache": 1.0, "past_block_tokens_per_sec_cache": 1.0,
             "past_block_tokens_per_sec_no_cache": 1.0}


def test_gpu_peaks_match_whole_model_names():
    bf16 = torch.bfloat16
    assert bench.gpu_peak("NVIDIA L4", bf16)[0] == 121e12
    assert bench.gpu_peak("NVIDIA A100-SXM4-80GB", bf16)[0] == 312e12
    assert bench.gpu_peak("NVIDIA A100-SXM4-80GB", torch.float32)[0] == 156e12
    peak, label = bench.gpu_peak("NVIDIA A100-SXM4-80GB", torch.float32, tf32=False)   # at highest
    assert math.isnan(peak) and label == "NVIDIA A100-SXM4-80GB: float32 without TF32, peak not tabled"
    assert bench.gpu_peak("NVIDIA A100-SXM4-80GB", bf16, tf32=False)[0] == 312e12
    assert bench.gpu_peak("NVIDIA H100 PCIe", bf16)[0] == 756e12
    assert bench.gpu_peak("NVIDIA H100 NVL", bf16)[0] == 835e12
    assert bench.gpu_peak("NVIDIA H100 80GB HBM3", bf16)[0] == 989e12
    assert bench.gpu_peak("NVIDIA GH200 480GB", bf16)[0] == 989e12
    assert bench.gpu_peak("NVIDIA H200", bf16)[0] == 989e12
    assert bench.gpu_peak("NVIDIA H200 NVL", bf16)[0] == 835e12
    # the common datacenter and workstation GPUs, each by its own name, not a shorter one's
    for name, peak in (("NVIDIA L40S", 362e12), ("NVIDIA B200", 2250e12), ("NVIDIA B100", 1750e12),
                       ("NVIDIA H800", 989e12), ("NVIDIA H800 PCIe", 756e12), ("NVIDIA H20", 148e12),
                       ("NVIDIA A40", 149.7e12), ("NVIDIA RTX A6000", 154.8e12),
                       ("NVIDIA RTX 6000 Ada Generation", 364.2e12)):
        assert bench.gpu_peak(name, bf16)[0] == peak, name
    for other in ("NVIDIA A10G", "NVIDIA RTX A4000"):     # not an A10, not an RTX A6000: unknown
        peak, label = bench.gpu_peak(other, bf16)
        assert math.isnan(peak) and label == f"{other}: unknown GPU, MFU not computed"
    row = dict(line.split("  ", 1) for line in bench.format_table(
        {**TABLE_ROW, "peak_source": label, "peak_tflops": math.nan, "mfu": math.nan}).splitlines())
    assert row["MFU"].strip() == "unknown GPU, MFU not computed"


def test_a_bench_stopped_by_ctrl_c_prints_no_table(monkeypatch, capsys):
    from gpt import bench

    def stopped(model_cfg, cfg):        # the training loop took the signal and saved
        return {"stopped_by": "SIGINT"}
    monkeypatch.setattr(bench, "train", stopped)
    assert bench.main(["--n_layer=1", "--n_embd=16", "--n_head=2", "--block_size=16"]) == 130
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.endswith("\ninterrupted; nothing was measured\n")


@pytest.mark.e2e
@pytest.mark.parametrize("precision", ["high", "medium"])
def test_the_cpu_peak_is_measured_at_the_runs_matmul_precision_and_sampling_at_the_callers(
        data_dir, tmp_path, capsys, monkeypatch, precision, cpu_rounds_when_asked):
    rates, sampled_at = [], []
    monkeypatch.setattr(bench, "peak_flops", lambda *a: rates.append(cpu_rounds_matmuls()) or (1e12, "measured float32 matmul"))
    sampling = bench.time_sampling
    monkeypatch.setattr(bench, "time_sampling", lambda *a: sampled_at.append(cpu_rounds_matmuls()) or sampling(*a))
    argv = tiny_args(data_dir, tmp_path / "unused", "--bench_iters=2", "--bench_warmup=1", "--json",
                     f"--matmul_precision={precision}")
    assert bench.main(argv) == 0
    assert rates == [precision == "medium"] and set(sampled_at) == {False}     # as sample.py samples
    assert json.loads(capsys.readouterr().out)["peak_source"] == f"measured float32 matmul at {precision} precision"


@pytest.mark.parametrize("capability, dtype", [((7, 5), torch.float32), ((8, 0), torch.bfloat16),
                                               ((9, 0), torch.bfloat16)])
def test_auto_dtype_is_bfloat16_only_on_gpus_that_compute_it(monkeypatch, capability, dtype):
    from gpt.config import TrainConfig
    from gpt.train.runtime import autocast_dtype
    asked = []
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device: asked.append(device) or capability)
    assert autocast_dtype(TrainConfig(), "cuda:1") == dtype     # a T4 (7.5) only emulates bfloat16
    assert asked == [torch.device("cuda:1")]                    # the run's GPU, not the current one
    assert autocast_dtype(TrainConfig(), "cpu") == torch.float32
    assert autocast_dtype(TrainConfig(dtype="bfloat16"), "cpu") == torch.bfloat16
    assert autocast_dtype(TrainConfig(dtype="fast"), "cuda:1") == dtype


@pytest.mark.parametrize("native", [False, True])
def test_fast_dtype_is_bfloat16_only_on_cpus_that_compute_it(monkeypatch, native):
    # emulated, bfloat16 made the earlier AdamW fast config's steps 10-15x slower than float32
    from gpt.speed import precision
    from gpt.train import runtime
    from gpt.config import TrainConfig
    monkeypatch.setattr(precision, "cpu_computes_bfloat16", lambda: native)
    assert runtime.autocast_dtype(TrainConfig(dtype="fast"), "cpu") == (torch.bfloat16 if native else torch.float32)
    assert runtime.autocast_dtype(TrainConfig(dtype="auto"), "cpu") == torch.float32
    assert runtime.autocast_dtype(TrainConfig(dtype="fast"), "mps") == torch.float32


def _compare_nanogpt(monkeypatch, *argv):
    import importlib.util
    import sys
    from conftest import ROOT
    spec = importlib.util.spec_from_file_location("compare_nanogpt", ROOT / "benchmarks" / "compare_nanogpt.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(sys, "argv", ["compare_nanogpt.py", *argv])
    return module.main()


@pytest.mark.e2e
def test_compare_nanogpt_writes_whole_val_losses_and_checks_its_json_path_first(data_dir, tmp_path,
                                                                                 monkeypatch, capsys):
    import train
    out = tmp_path / "run"
    assert train.main(tiny_args(data_dir, out, "--max_iters=2", "--eval_interval=2")) == 0
    capsys.readouterr()
    ckpt = out / "ckpt.pt"
    assert _compare_nanogpt(monkeypatch, "--whole_val", str(ckpt), "--json", str(tmp_path / "r.json")) == 0
    loss = json.loads((tmp_path / "r.json").read_text())["whole_val"][str(ckpt)]
    assert capsys.readouterr().out == f"{ckpt}: {loss:.4f}\n" and 0 < loss < 10
    for bad in (tmp_path, tmp_path / "r.json" / "x.json", tmp_path / "no" / "x.json"):
        with pytest.raises(SystemExit) as end:
            _compare_nanogpt(monkeypatch, "--whole_val", str(ckpt), "--json", str(bad))
        assert end.value.code == 2
        assert capsys.readouterr().err == (f"error: --json {bad}: give a file in a folder that exists "
                                           "(see compare_nanogpt.py --help)\n")


def _thread_split_module():
    import importlib.util
    from conftest import ROOT
    spec = importlib.util.spec_from_file_location("thread_split", ROOT / "benchmarks" / "thread_split.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _thread_split(*argv):
    return _thread_split_module().main(list(argv))


def _tiny_for_thread_split(data_dir, tmp_path):
    """A tiny run's settings, less those the script sets for each run."""
    return [a for a in tiny_args(data_dir, tmp_path / "unused")
            if a[2:].partition("=")[0] not in _thread_split_module().SET_HERE]


@pytest.mark.e2e
@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs 2 CPUs")
def test_the_thread_split_benchmark_times_both_arms_in_alternating_rounds(data_dir, tmp_path, capsys):
    found = torch.get_num_threads()
    args = _tiny_for_thread_split(data_dir, tmp_path)
    try:
        assert _thread_split("--rounds", "2", "--steps", "22", "--config", "shakespeare_char_cpu", *args,
                             "--threads=2") == 0
    finally:
        torch.set_num_threads(found)
    out = capsys.readouterr().out.splitlines()
    rounds = [re.fullmatch(r"round (\d): batch ([\d.]+) ms, ops ([\d.]+) ms", line) for line in out[:2]]
    assert [m.group(1) for m in rounds] == ["1", "2"]
    batch, ops = (sorted(float(m.group(i)) for m in rounds) for i in (2, 3))
    median = re.fullmatch(r"median ms per step: batch ([\d.]+), ops ([\d.]+); split steps ([\d.]+)x as "
                          r"fast \(median of the rounds' ratios ([\d.]+)x\)", out[2])
    assert float(median.group(1)) == pytest.approx(sum(batch) / 2, abs=0.01)
    assert float(median.group(2)) == pytest.approx(sum(ops) / 2, abs=0.01)
    # from figures printed to 0.01 ms, of steps this tiny model takes in a fraction of a millisecond
    assert float(median.group(3)) == pytest.approx(float(median.group(2)) / float(median.group(1)), rel=0.1)
    ratios = [float(m.group(3)) / float(m.group(2)) for m in rounds]
    assert float(median.group(4)) == pytest.approx(sum(ratios) / 2, rel=0.1)
    assert not (tmp_path / "unused").exists()       # its runs go to a folder it removes


@pytest.mark.parametrize("argv, message", [
    (["--steps", "20"], r"^error: --steps=20 leaves no step to time: give more than 20 \(see .*--help\)\n$"),
    (["--rounds", "0"], r"^error: --rounds=0 must be at least 1"),
    (["--threads=1"], r"^error: thread_split=batch cannot split this run: the run gets one CPU thread .*: "
                      r"nothing to compare\n$"),
    (["--max_iters=30"], r"^error: --max_iters: this script sets it for each run \(see .*--help\)\n$"),
    (["--thread_split=ops"], r"^error: --thread_split: this script sets it for each run"),
    (["--sweep", "n_layer=1,2"], r"^error: --sweep: this script times one run's settings, not a sweep"),
    (["--wandb_run_name", "wandb", "--n_layer=0"], r"^error: n_layer=0 must be positive\n$"),  # a value, not a name
])
def test_the_thread_split_benchmark_refuses_bad_input_in_one_line(argv, message, data_dir, tmp_path, capsys):
    args = _tiny_for_thread_split(data_dir, tmp_path)
    with pytest.raises(SystemExit) as stop:
        _thread_split("--config", "shakespeare_char_cpu", *args, *argv)
    assert stop.value.code == 2
    assert re.search(message, capsys.readouterr().err)


def test_the_thread_split_benchmark_wants_a_config_and_says_when_a_run_was_stopped(monkeypatch, capsys):
    module = _thread_split_module()
    with pytest.raises(SystemExit) as stop:
        module.main(["--rounds", "1"])
    assert stop.value.code == 2
    assert capsys.readouterr().err.startswith("error: give --config NAME, e.g. --config shakespeare_char_cpu")
    monkeypatch.setattr(module.train, "main", lambda argv: 130)     # Ctrl-C: the loop saves and says nothing
    with pytest.raises(SystemExit) as stop:
        module.main(["--config", "shakespeare_char_cpu"])
    assert stop.value.code == 130
    assert capsys.readouterr().err == "stopped: training exited with status 130\n"
    monkeypatch.setattr(module, "median_step_ms", lambda argv, out_dir: 1.0)
    assert module.main(["--config=shakespeare_char_cpu", "--rounds", "1"]) == 0      # the = form too


@pytest.mark.e2e
def test_the_optimizer_benchmark_runs_both_arms_to_the_same_losses(data_dir, tmp_path, capsys):
    module = benchmark("optimizer")
    args = [a for a in tiny_args(data_dir, tmp_path / "unused") if a[2:].partition("=")[0] not in module.SET_HERE]
    assert module.main(["--rounds", "1", "--config", "shakespeare_char_cpu", *args,
                                          "--max_iters=22", "--eval_interval=22"]) == 0
    out = capsys.readouterr().out.splitlines()
    arms = re.fullmatch(r"round 1: ours ([\d.]+) s, ([\d.]+) ms/step, val ([\d.]+); "
                        r"torch ([\d.]+) s, ([\d.]+) ms/step, val ([\d.]+)", out[0])
    assert arms and arms.group(3) == arms.group(6)      # the same kernel: the same losses
    wall = re.fullmatch(r"s per process: ours ([\d.]+), torch fused ([\d.]+); torch / ours ([\d.]+) "
                        r"\(median of the rounds' ratios ([\d.]+)\)", out[1])
    assert float(wall.group(1)) == pytest.approx(float(arms.group(1)), abs=0.01)
    assert float(wall.group(3)) == pytest.approx(float(arms.group(4)) / float(arms.group(1)), rel=0.01)
    assert out[2].startswith("ms per step: ours ") and out[3] == "final val loss: the same in every round"
    assert not (tmp_path / "unused").exists()


def test_the_optimizer_benchmark_times_the_step_alone(capsys):
    assert benchmark("optimizer").main(["--config", "sweeps/tuned/optimizer", "--step_only"]) == 0
    line = re.fullmatch(r"sweeps/tuned/optimizer: 308,288 parameters, 1 thread\(s\): a step of ours ([\d.]+) ms, "
                        r"of torch.optim.AdamW\(fused=True\) ([\d.]+) ms; torch / ours ([\d.]+) \(median of the "
                        r"rounds' ratios\)", capsys.readouterr().out.strip())
    assert line and all(float(v) > 0 for v in line.groups())


@pytest.mark.parametrize("argv, message", [
    (["--rounds", "1"], "error: give --config NAME, e.g. --config shakespeare_char_fast"),
    (["--step_only"], "error: --step_only takes --config NAME and a --threads of at least 1"),
    (["--config", "shakespeare_char_cpu", "--rounds", "0"], "error: --rounds=0 must be at least 1"),
    (["--config", "shakespeare_char_cpu", "--out_dir=x"], "error: --out_dir: this script sets it for each run"),
    (["--config", "shakespeare_char_cpu", "--sweep", "n_layer=1,2"], "error: --sweep: this script times one run's"),
    pytest.param(["--config", "shakespeare_char_cpu", "--n_layer=0"], "ours: error: n_layer=0 must be positive",
                 marks=pytest.mark.e2e),     # refused by the arm's own train.py process
])
def test_the_optimizer_benchmark_refuses_bad_input_in_one_line(argv, message, capsys):
    with pytest.raises(SystemExit) as stop:
        benchmark("optimizer").main(argv)
    err = capsys.readouterr().err
    assert stop.value.code in (1, 2) and err.startswith(message) and err.count("\n") == 1, err


@pytest.mark.e2e
def test_the_checkout_comparison_times_a_checkout_against_itself(data_dir, tmp_path, capsys):
    from conftest import ROOT
    args = [a for a in tiny_args(data_dir, tmp_path / "unused") if not a.startswith("--out_dir=")]
    assert benchmark("compare_checkouts").main(["--other", str(ROOT), "--rounds", "1", "--config",
                                                 "shakespeare_char_cpu", *args, "--bench_iters=3",
                                                 "--bench_warmup=1"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("round 1: this ms_per_iter ") and "; other ms_per_iter " in out[0]
    figures = dict(re.findall(r"(\w+ \w+) ([\d,.]+)", out[0]))
    assert len(out) == 4
    for line, key in zip(out[1:], ("ms_per_iter", "sample_tokens_per_sec_cache", "sample_tokens_per_sec_no_cache")):
        assert line.startswith(f"{key}: this ") and "x as fast (median of the rounds' paired ratios" in line
    assert figures


@pytest.mark.slow     # over 15 s on 2 AVX2 cores; .ci/run runs the slow tests too
@pytest.mark.e2e
def test_the_sampling_comparison_gives_a_checkout_against_itself_ratios_near_one(capsys):
    from conftest import ROOT
    assert benchmark("compare_sampling").main(["--other", str(ROOT), "--rounds", "1", "--tokens", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    sampled = re.fullmatch(r"sampling: this ([\d.]+), other ([\d.]+) tokens/s; this is ([\d.]+)x as fast "
                           r"\(median of the rounds' paired ratios\)", out[1])
    assert float(sampled.group(3)) == pytest.approx(float(sampled.group(1)) / float(sampled.group(2)), rel=0.01)
    assert out[2].startswith("forward and backward: this ")


@pytest.mark.parametrize("script, argv, message", [
    ("compare_checkouts", ["--other", "/nonexistent"], "no checkout of this project there"),
    ("compare_checkouts", ["--other", ".", "--rounds", "0"], "--rounds=0 must be at least 1"),
    ("compare_sampling", ["--other", "/nonexistent"], "no checkout of this project there"),
    ("compare_sampling", ["--other", ".", "--tokens", "0"], "--tokens in [1, 255]"),
])
def test_the_checkout_comparisons_refuse_bad_input_in_one_line(script, argv, message, capsys, monkeypatch):
    from conftest import ROOT
    monkeypatch.chdir(ROOT)
    with pytest.raises(SystemExit) as stop:
        benchmark(script).main(argv)
    err = capsys.readouterr().err
    assert stop.value.code == 2 and message in err and err.count("\n") == 1, err


@pytest.mark.slow
def test_the_gpu_check_script_runs_through_on_a_cpu_when_made_small(data_dir, tmp_path):
    """benchmarks/gpu_check.sh, with EXTRA making every run tiny and on the CPU: each step works and
    the summary names what a GPU run would report."""
    import json
    import os
    import subprocess
    from conftest import ROOT
    small = (f"--device=cpu --n_layer=1 --n_head=2 --n_embd=16 --block_size=16 --batch_size=4 --data_dir={data_dir} "
             "--dataset=tiny --dropout=0.0 --compile=false")
    env = {**os.environ, "OUT": str(tmp_path / "out"), "EXTRA": small,
           "TRAIN_EXTRA": "--max_iters=20 --eval_interval=10 --eval_iters=2",
           "BENCH_EXTRA": "--bench_iters=3 --bench_warmup=1 --sample_tokens=4"}
    proc = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_check.sh")], cwd=ROOT, capture_output=True,
                          text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert {"seconds_to_val_1.47", "tokens_per_sec", "mfu", "peak_memory_mb"} <= summary.keys()
    assert summary["tokens_per_sec"] > 0 and (tmp_path / "out" / "sample.txt").read_text().startswith("ROMEO:")


def test_the_muon_split_benchmark_times_every_split_against_fused(capsys):
    module = benchmark("muon_split")
    assert module.main(["--rounds", "2", "--steps", "1", "--config", "shakespeare_char_cpu", "--n_layer=1",
                        "--n_embd=32", "--activation=swiglu", "--flush_denormal=false"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in out] == ["round 1", "round 2", "fused", "qkv", "heads", "whole_batched"]
    assert out[2].endswith("1.00x fused (median of the rounds' ratios)")
    assert module.main(["--config", "shakespeare_char_cpu", "--muon_split=rows"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


STUDY_COST_TINY = ["--steps", "3", "--seeds", "1", "--n_layer=1", "--n_head=2", "--n_embd=16", "--block_size=16",
                   "--batch_size=4", "--eval_iters=2", "--tune_extend=0",
                   "--flush_denormal=false"]    # the run alone trains in this process: leave its threads as found


@pytest.mark.slow     # two whole tiny studies, about half a minute each
@pytest.mark.parametrize("jobs", ["1", "2"])
def test_the_study_cost_benchmark_splits_a_tiny_study_s_wall_time(jobs, data_dir, tmp_path, capsys, monkeypatch):
    import tempfile
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    path = tmp_path / "cost.json"
    assert benchmark("study_cost").main([*STUDY_COST_TINY, "--jobs", jobs, "--json", str(path),
                                          f"--data_dir={data_dir}", "--dataset=tiny"]) == 0
    r = json.loads(path.read_text())
    assert {"wall_s", "jobs", "runs", "slot_s", "seconds", "shares", "flops_per_s", "peak_flops_per_s",
            "single_flops_per_s", "fraction_of_peak", "fraction_of_single_run", "contended", "command"} <= r.keys()
    assert r["runs"] == 2 * 3 + 2 and r["tuning_runs"] == 6 and r["jobs"] == int(jobs)     # 2 settings, 3 rates
    assert set(r["shares"]) == {"start_up", "steps", "evaluations", "run_ending", "report", "sweep_start", "left"}
    assert all(0 <= share <= 1 for share in r["shares"].values()), r["shares"]
    assert sum(r["shares"].values()) == pytest.approx(1, abs=1e-6) and r["shares"]["steps"] > 0
    assert r["slot_s"] == pytest.approx(int(jobs) * r["wall_s"])
    for name in ("fraction_of_peak", "fraction_of_single_run"):
        assert 0 < r[name] and math.isfinite(r[name])
    out = capsys.readouterr().out
    assert out.startswith(f"study: 8 runs (6 tuning), {jobs} at a time; wall time ")
    assert "training steps" in out and "% of the peak" in out and "% of one run alone" in out
    assert list(scratch.iterdir()) == []        # the study's folder is gone, without --keep


@pytest.mark.parametrize("argv, message", [
    (["--steps", "0"], r"^error: --steps=0 must be at least 1 \(see .*--help\)\n$"),
    (["--jobs", "0"], r"^error: --jobs=0 must be at least 1"),
    (["--max_iters=5"], r"^error: --max_iters: this script sets it \(use --steps"),
    (["--out_dir=x"], r"^error: --out_dir: this script sets it"),
    (["--json", "/no/such/folder/cost.json"], r"^error: --json /no/such/folder/cost.json: not a file in an "),
    (["--config", "shakespeare_char_cpu"], r"^error: --config shakespeare_char_cpu is one run, not a study; "),
    (["--config", "nope"], r"^error: no config named 'nope'"),
])
def test_the_study_cost_benchmark_refuses_bad_input_in_one_line(argv, message, capsys):
    try:
        code = benchmark("study_cost").main(argv)
    except SystemExit as stop:
        code = stop.code
    err = capsys.readouterr().err
    assert code == 2 and re.search(message, err) and err.count("\n") == 1, err
