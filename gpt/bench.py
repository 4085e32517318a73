"""Benchmark a config: training speed, model FLOPs utilisation, peak memory, sampling speed.

    python -m gpt.bench --config shakespeare_char_cpu [--name=value ...] [--bench_iters=50] [--json]

Training is timed through the real training loop (gpt.train.loop.train) in a scratch folder: the
median time of the steps after the first `bench_warmup`, evaluation excluded. MFU compares the
model's FLOPs per second with a peak: on a CPU or an Apple GPU the best float32 (at the run's
matmul_precision) or bfloat16 matmul rate measured there and then, on CUDA the GPU's datasheet
dense bf16 rate when it is known. Peak memory is that of the training steps. Sampling is timed
at the caller's precision, as sample.py samples.
"""

from __future__ import annotations

from .console import interrupt_quietly_while_loading

interrupt_quietly_while_loading(__name__)      # before torch loads

import contextlib
import dataclasses
import io
import math
import re
import resource
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from .cli import help_text, parse_argv
from .config import GPTConfig, TrainConfig, build, check_types, opt
from .console import interrupt_in_one_line, output_may_close, to_json
from .speed import attach_attention, lay_out_weights
from .speed.precision import matmul_precision
from .speed.split import split_plan
from .data import load_meta
from .diagnostics import measure
from .errors import UserError, say_error
from .model import GPT
from .train.loop import train
from .train.metrics import read_jsonl
from .train.runtime import autocast_dtype, resolve_device
from .train.setup import tokens_per_step

# dense (not 2:4 sparse) bf16 tensor-core FLOP/s from NVIDIA's datasheets, by model name as torch
# reports it; a name must match whole ("L4" is not "L40S", "H20" not "H200"), and the first match
# wins, so variants come first. Datasheets: HGX B200/B100 (per GPU: half the sparse rate), H100/H800
# and H200 (SXM, PCIe, NVL), H20, A100, L40S, L4, A40, A10, RTX 6000 Ada, RTX A6000, GeForce 4090/3090.
GPU_PEAK_BF16 = {"B200": 2250e12, "B100": 1750e12,
                 "H100 PCIe": 756e12, "H100 NVL": 835e12, "H100": 989e12, "H800 PCIe": 756e12, "H800": 989e12,
                 "H200 NVL": 835e12, "H200": 989e12, "GH200": 989e12, "H20": 148e12,
                 "A100": 312e12, "L40S": 362e12, "L4": 121e12, "A40": 149.7e12, "A10": 125e12,
                 "RTX 6000 Ada": 364.2e12, "RTX A6000": 154.8e12, "4090": 165e12, "3090": 71e12}
UNKNOWN_PEAK = "unknown GPU, MFU not computed"


# training-loop settings the bench makes its own; accepted and unused, so that a train.py command
# line times as it is, but for max_iters, which would look like the number of timed steps
SET_BY_BENCH = ("eval_iters", "log_interval", "diagnostics", "wandb", "wandb_project", "wandb_run_name",
                "out_dir", "overwrite")


@dataclass
class BenchConfig:
    bench_iters: int = opt(50, "timed training steps")
    bench_warmup: int = opt(10, "untimed steps before them")
    sample_tokens: int = opt(0, "tokens to generate when timing sampling; 0 means block_size - 1")
    json: bool = opt(False, "print JSON instead of a table")

    def __post_init__(self):
        check_types(self)
        if self.bench_iters <= 0:
            raise UserError(f"bench_iters={self.bench_iters} must be positive")
        for name in ("bench_warmup", "sample_tokens"):
            if getattr(self, name) < 0:
                raise UserError(f"{name}={getattr(self, name)} must not be negative")


def gpu_peak(name: str, dtype: torch.dtype, tf32: bool = True) -> tuple[float, str]:
    """The datasheet rate for bfloat16, or for float32 on TF32 tensor cores (half of it); plain
    float32 (matmul_precision=highest) runs off the tensor cores, at a rate not tabled here."""
    if dtype == torch.float32 and not tf32:
        return float("nan"), f"{name}: float32 without TF32, peak not tabled"
    for key, value in GPU_PEAK_BF16.items():
        if re.search(rf"(?<![A-Za-z0-9]){key}(?![A-Za-z0-9])", name):
            return (value if dtype == torch.bfloat16 else value / 2), f"{name} datasheet"
    return float("nan"), f"{name}: {UNKNOWN_PEAK}"


def synchronize(device: str) -> None:
    """Wait for the device's queued work: GPU calls return before it is done."""
    kind = torch.device(device).type
    if kind == "cuda":
        torch.cuda.synchronize(device)
    elif kind == "mps":
        torch.mps.synchronize()


def peak_flops(device: str, dtype: torch.dtype) -> tuple[float, str]:
    if torch.device(device).type == "cuda":
        return gpu_peak(torch.cuda.get_device_name(device), dtype,
                        tf32=torch.backends.cuda.matmul.fp32_precision == "tf32")
    n = 1024        # a CPU's or an Apple GPU's rate, measured on the device itself
    a, b = (torch.randn(n, n, dtype=dtype, device=device) for _ in range(2))
    best = float("inf")
    for _ in range(10):
        synchronize(device)
        t = time.perf_counter()
        for _ in range(5):
            a @ b
        synchronize(device)
        best = min(best, (time.perf_counter() - t) / 5)
    return 2 * n ** 3 / best, f"measured {str(dtype).removeprefix('torch.')} matmul"


def peak_memory_mb(device: str) -> float:
    """The GPU's allocations at their peak since the last reset; elsewhere the process's."""
    if torch.device(device).type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2 ** 20
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / 2 ** 20 if sys.platform == "darwin" else rss / 1024     # bytes on macOS, KiB on Linux


def time_training(model_cfg: GPTConfig, train_cfg: TrainConfig, bench: BenchConfig) -> dict:
    steps = bench.bench_warmup + bench.bench_iters
    with tempfile.TemporaryDirectory() as tmp:
        cfg = dataclasses.replace(train_cfg, out_dir=tmp, max_iters=steps, eval_interval=steps,
                                  eval_iters=1, log_interval=1, diagnostics=False, wandb=False)
        with contextlib.redirect_stdout(io.StringIO()):  # the inner run's lines are not the result
            summary = train(model_cfg, cfg)
        if summary["stopped_by"]:       # the loop took the Ctrl-C: a table of a cut run is no result
            raise KeyboardInterrupt
        rows = read_jsonl(Path(tmp) / "metrics.jsonl")
    ms = [r["ms"] for r in rows if r["kind"] == "train" and r["iter"] >= bench.bench_warmup]
    median = statistics.median(ms)
    # on a CPU, the last evaluation's share of CPU time the steps got: under 1, other work took some
    shares = [r["cpu_share"] for r in rows if r["kind"] == "eval" and "cpu_share" in r][-1:]
    return {"ms_per_iter": median, "tokens_per_sec": tokens_per_step(model_cfg, train_cfg) / median * 1000,
            **({"cpu_share": shares[0]} if shares else {})}


def time_diagnostics(model: GPT, batch_size: int, device: str) -> float:
    """Milliseconds that one evaluation's diagnostics take (median of 5)."""
    T = model.config.block_size
    x = torch.randint(model.config.vocab_size, (batch_size, T), device=device)
    times = []
    for _ in range(5):
        t = time.perf_counter()
        measure(model, x, x)
        times.append(1000 * (time.perf_counter() - t))
    return statistics.median(times)


@torch.no_grad()
def time_sampling(model: GPT, new_tokens: int, prompt_len: int, use_cache: bool, device: str) -> float:
    idx = torch.zeros((1, prompt_len), dtype=torch.long, device=device)
    model.generate(idx, 4, temperature=0, use_cache=use_cache)             # warm-up
    synchronize(device)
    t = time.perf_counter()
    model.generate(idx, new_tokens, temperature=0, use_cache=use_cache)
    synchronize(device)
    return new_tokens / (time.perf_counter() - t)


def measure_speed(model_cfg: GPTConfig, train_cfg: TrainConfig, bench: BenchConfig) -> dict:
    """Training's speed, MFU and peak memory, the diagnostics' share, and sampling's speed, for one config."""
    device = resolve_device(train_cfg.device)
    dtype = autocast_dtype(train_cfg, device)
    if torch.device(device).type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    parts = split_plan(model_cfg, train_cfg, device, 1, train_cfg.threads or torch.get_num_threads())
    result = time_training(model_cfg, train_cfg, bench)
    training_peak = peak_memory_mb(device)      # before the diagnostics and sampling add theirs
    meta = load_meta(Path(train_cfg.data_dir) / train_cfg.dataset)
    model_cfg = dataclasses.replace(model_cfg, vocab_size=meta["vocab_size"])
    model = lay_out_weights(attach_attention(GPT(model_cfg))).to(device).eval()
    n_params = model.num_params(non_embedding=True)
    device_type = torch.device(device).type
    with matmul_precision(train_cfg.matmul_precision, device_type):  # as the run's matmuls ran
        peak, peak_source = peak_flops(device, dtype)
        diag_ms = time_diagnostics(model, train_cfg.batch_size, device)
    if dtype == torch.float32 and device_type == "cpu":
        peak_source += f" at {train_cfg.matmul_precision} precision"
    achieved = model_cfg.flops_per_token() * result["tokens_per_sec"]
    new = bench.sample_tokens or model_cfg.block_size - 1
    result.update(
        diagnostics_ms=diag_ms,
        diagnostics_share=diag_ms / (diag_ms + train_cfg.eval_interval * result["ms_per_iter"]),
        device=device, dtype=str(dtype).removeprefix("torch."), split_parts=parts, params=n_params,
        achieved_tflops=achieved / 1e12, peak_tflops=peak / 1e12, peak_source=peak_source,
        mfu=achieved / peak, peak_memory_mb=training_peak,
        sample_new_tokens=new,
        sample_tokens_per_sec_cache=time_sampling(model, new, 1, True, device),
        sample_tokens_per_sec_no_cache=time_sampling(model, new, 1, False, device),
        past_block_tokens_per_sec_cache=time_sampling(model, 64, model_cfg.block_size, True, device),
        past_block_tokens_per_sec_no_cache=time_sampling(model, 64, model_cfg.block_size, False, device),
    )
    return result


def format_table(r: dict) -> str:
    rows = [
        ("device / dtype", f"{r['device']} / {r['dtype']}" + (f", each batch split by rows over "
                                                               f"{r['split_parts']} threads"
                                                               if r["split_parts"] > 1 else "")),
        ("parameters (non-embedding)", f"{r['params']:,}"),
        ("training ms/iter (median)", f"{r['ms_per_iter']:.1f}"),
        ("training tokens/s", f"{r['tokens_per_sec']:,.0f}"),
        ("model TFLOP/s achieved", f"{r['achieved_tflops']:.3f}"),
        (f"peak TFLOP/s ({r['peak_source']})", f"{r['peak_tflops']:.3f}"),
        ("MFU", f"{100 * r['mfu']:.1f}%" if math.isfinite(r["mfu"]) else r["peak_source"].split(": ")[-1]),
        ("peak memory MB", f"{r['peak_memory_mb']:.0f}"),
        ("diagnostics ms per evaluation", f"{r['diagnostics_ms']:.1f}"),
        ("diagnostics share of training time", f"{100 * r['diagnostics_share']:.2f}%"),
        (f"sampling tokens/s, {r['sample_new_tokens']} new, KV cache", f"{r['sample_tokens_per_sec_cache']:,.0f}"),
        (f"sampling tokens/s, {r['sample_new_tokens']} new, no cache", f"{r['sample_tokens_per_sec_no_cache']:,.0f}"),
        ("sampling past block_size, KV cache", f"{r['past_block_tokens_per_sec_cache']:,.0f}"),
        ("sampling past block_size, no cache", f"{r['past_block_tokens_per_sec_no_cache']:,.0f}"),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    sections = (GPTConfig, TrainConfig, BenchConfig)
    if "-h" in argv or "--help" in argv:
        print(help_text("-m gpt.bench", sections, hidden=("max_iters", "resume", *SET_BY_BENCH)))
        print(f"The bench times bench_warmup + bench_iters steps in a scratch folder; "
              f"{', '.join(SET_BY_BENCH)} are accepted, and not used.")
        return 0
    args = None
    try:
        if any(a.partition("=")[0] == "--max_iters" for a in argv):
            raise UserError("--max_iters: the bench sets it itself (bench_warmup + bench_iters "
                            "steps); use --bench_iters=N")
        args = parse_argv(argv, sections)
        if args.values.get("resume"):   # it would time the default model, not the run's
            raise UserError("--resume: the bench times a fresh model of the settings given; give "
                            "the run's --config and options instead")
        bench = build(BenchConfig, args.values)
        model_cfg, train_cfg = build(GPTConfig, args.values), build(TrainConfig, args.values)
        # at once, on stderr (--json keeps stdout): a bare call times the full default model
        given = f"--config {args.config_name}" if args.config_name else "no --config: defaults for all not given"
        print(f"timing {bench.bench_warmup} + {bench.bench_iters} steps ({given}) in a scratch folder, then "
              "sampling", file=sys.stderr, flush=True)
        result = measure_speed(model_cfg, train_cfg, bench)
    except UserError as e:
        say_error(e, args.blame(str(e)) if args else None)
        return 2
    except KeyboardInterrupt:
        print("interrupted; nothing was measured", file=sys.stderr)
        return 130
    print(to_json(result) if bench.json else format_table(result))
    return 0


if __name__ == "__main__":
    # | head: no traceback for the reader going away; Ctrl-C: one line
    with interrupt_in_one_line(), output_may_close(product=True):
        sys.exit(main())
