"""On a CUDA GPU: training, evaluation and sampling there agree with the CPU. Skipped without a GPU;
benchmarks/gpu_check.sh runs them (python -m pytest -m cuda tests/test_cuda.py)."""

import json

import pytest
import torch

import train
from conftest import tiny_args
from gpt import checkpoint
from gpt.generate import generate
from gpt.train.loop import Loop

pytestmark = [pytest.mark.cuda, pytest.mark.e2e,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def evals(out):
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r["kind"] == "eval"]


def test_a_run_on_the_gpu_in_float32_matches_the_cpu_and_bfloat16_trains(data_dir, tmp_path):
    args = ["--max_iters=40", "--eval_interval=20", "--learning_rate=3e-3", "--matmul_precision=highest"]
    cpu, gpu = tmp_path / "cpu", tmp_path / "gpu"
    assert train.main(tiny_args(data_dir, cpu, *args)) == 0
    assert train.main(tiny_args(data_dir, gpu, *args, "--device=cuda", "--dtype=float32")) == 0
    for a, b in zip(evals(cpu), evals(gpu)):
        assert abs(a["val_loss"] - b["val_loss"]) < 2e-3
    bf16 = tmp_path / "bf16"
    assert train.main(tiny_args(data_dir, bf16, *args, "--device=cuda", "--dtype=bfloat16", "--compile=true")) == 0
    assert evals(bf16)[-1]["val_loss"] < evals(bf16)[0]["val_loss"] - 0.5


def test_greedy_samples_on_the_gpu_are_the_cpus(data_dir, tmp_path):
    out = tmp_path / "run"
    assert train.main(tiny_args(data_dir, out, "--max_iters=20", "--eval_interval=20")) == 0
    cpu_model, _ = checkpoint.load_for_sampling(out, "cpu")
    gpu_model, _ = checkpoint.load_for_sampling(out, "cuda")
    idx = torch.tensor([[1, 2, 3]])
    torch.backends.cuda.matmul.allow_tf32 = False
    a = generate(cpu_model, idx, 20, temperature=0)
    b = generate(gpu_model, idx.cuda(), 20, temperature=0).cpu()
    assert torch.equal(a, b)


def test_a_training_step_on_the_gpu_never_waits_for_it(data_dir, tmp_path, monkeypatch):
    real_step = Loop.step

    def step(self, it):     # any synchronising call inside a step raises
        torch.cuda.set_sync_debug_mode("error")
        try:
            real_step(self, it)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    monkeypatch.setattr(Loop, "step", step)
    out = tmp_path / "run"
    assert train.main(tiny_args(data_dir, out, "--max_iters=6", "--eval_interval=6", "--device=cuda",
                                "--gradient_accumulation_steps=2", "--grad_clip=0.01", "--dropout=0.1")) == 0
