"""Time Muon's step at muon_split=fused, qkv and heads on one config's model, in one process.

    python benchmarks/muon_split.py --config NAME [--rounds 7] [--steps 30] [--name=value ...]

Each split gets the config's model (the same seed and random gradients for all), and its Muon
part (opt.muon.step: momentum, orthogonalisation, the update of the blocks' matrices; AdamW's part
is left out, being the same for all) is stepped a few times untimed, then --steps times timed.
A fourth arm, whole_batched, is gpt/muon.py's SplitMuon with every matrix whole: fused's
blocks through qkv's and heads' batched code, which tells the batching's share of a difference
from the split's. Each round times every split, the order turning round by one each round, so a drift of the
machine falls on all alike. It prints each round's ms per step, then per split the median ms and
the median of the rounds' ratios to fused. Any other --name=value is a model or training option
(--threads sets torch's threads; 0 keeps torch's count).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))   # this project's package, also from a clone that is not installed
from gpt.cli import parse_argv  # noqa: E402
from gpt.config import GPTConfig, TrainConfig, build  # noqa: E402
from gpt.console import Parser  # noqa: E402
from gpt.errors import UserError  # noqa: E402
from gpt.model import GPT  # noqa: E402
from gpt.muon import SplitMuon  # noqa: E402
from gpt.optim import make_optimizer  # noqa: E402

SPLITS = ("fused", "qkv", "heads", "whole_batched")
WARMUP = 3      # untimed steps first: allocations and the first calls' set-up


def stepper(model_cfg: GPTConfig, cfg: TrainConfig, split: str):
    """The Muon part of the optimizer at `split` (or whole_batched), over a fresh model whose
    gradients are set."""
    torch.manual_seed(cfg.seed)
    model = GPT(model_cfg)
    option = "fused" if split == "whole_batched" else split
    opt = make_optimizer(model, build(TrainConfig, {**vars(cfg), "optimizer": "muon", "muon_split": option}))
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    if split == "whole_batched":
        group = opt.muon.param_groups[0]
        return SplitMuon(group["params"], {}, lr=group["lr"], nesterov=True, momentum=group["momentum"],
                         weight_decay=group["weight_decay"], ns_dtype=opt.muon.ns_dtype)
    return opt.muon


def ms_per_step(muon, steps: int) -> float:
    for _ in range(WARMUP):
        muon.step()
    start = time.perf_counter()
    for _ in range(steps):
        muon.step()
    return (time.perf_counter() - start) * 1000 / steps


def main(argv: list[str] | None = None) -> int:
    parser = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=7, help="rounds, each timing every split")
    parser.add_argument("--steps", type=int, default=30, help="timed Muon steps per split and round")
    args, options = parser.parse_known_args(argv)
    if args.rounds < 1 or args.steps < 1:
        parser.error(f"--rounds={args.rounds} and --steps={args.steps} must be at least 1")
    try:
        values = parse_argv(options, (GPTConfig, TrainConfig)).values
        model_cfg, cfg = build(GPTConfig, values), build(TrainConfig, values)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    torch.set_flush_denormal(cfg.flush_denormal)    # as training sets it
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    optimizers = {split: stepper(model_cfg, cfg, split) for split in SPLITS}
    times = {split: [] for split in SPLITS}
    for r in range(args.rounds):
        for split in SPLITS[r % len(SPLITS):] + SPLITS[:r % len(SPLITS)]:
            times[split].append(ms_per_step(optimizers[split], args.steps))
        print(f"round {r + 1}: " + ", ".join(f"{s} {times[s][-1]:.3f} ms" for s in SPLITS), flush=True)
    for split in SPLITS:
        ratio = statistics.median(t / f for t, f in zip(times[split], times["fused"]))
        print(f"{split}: {statistics.median(times[split]):.3f} ms a Muon step, {ratio:.2f}x fused "
              "(median of the rounds' ratios)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
