import json

import pytest

from conftest import tiny_args
from gpt import bench
from gpt.config import GPTConfig


def test_flops_per_token_is_six_per_weight_plus_attention():
    cfg = GPTConfig(n_layer=2, n_head=2, n_embd=16, block_size=8)
    assert bench.flops_per_token(cfg, 1000) == 6 * 1000 + 12 * 2 * 8 * 16


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


def test_bench_rejects_bad_arguments(capsys):
    assert bench.main(["--bench_iters=0"]) == 2
    assert capsys.readouterr().err.startswith("error: bench_iters must be positive")
    assert bench.main(["--config", "shakespeare_char_cpu", "--max_iters=20"]) == 2
    assert "--max_iters: the bench sets it itself" in capsys.readouterr().err
