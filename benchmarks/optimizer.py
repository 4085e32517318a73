"""Time gpt.optim.AdamW against torch.optim.AdamW(fused=True), alternating in one run.

    python benchmarks/optimizer.py --config NAME [--rounds 5] [--name=value ...]
    python benchmarks/optimizer.py --config NAME --step_only [--threads N]

Both arms train the config from scratch through train.py, each in a process of its own started
the same way; the torch arm only replaces the optimizer that make_optimizer builds, with the same
parameter groups and hyperparameters. Each round runs both, swapping which goes first. It prints
per run the whole process's wall time (start-up, evaluations and all), the median ms per step
after the first 20, and the final val loss; then the medians, and the median of the rounds'
paired ratios. Any other --name=value is a training option, given to both arms.

With --step_only it times the optimizer's step alone instead, on the config's model with made-up
gradients, both optimizers in one process, 200 steps a round, 7 rounds alternating which goes first.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))   # this project's package, also from a clone that is not installed
from gpt.console import Parser  # noqa: E402
from gpt.train.metrics import read_jsonl  # noqa: E402

SKIP = 20   # steps left out of each median: start-up effects
SET_HERE = ("out_dir", "overwrite", "resume", "log_interval", "wandb")

# the process each arm runs: train.py's main, with make_optimizer replaced in the torch arm
LAUNCH = """
import sys, torch
sys.path.insert(0, {root!r})
import gpt.train.setup as setup
if {torch_arm}:
    class AdamW(torch.optim.AdamW):
        def step(self, found_inf=None):     # torch's fused kernel reads the flag from here
            self.found_inf = found_inf
            return super().step()

        def set_lr(self, lr):               # the loop sets the schedule's rate through this
            for group in self.param_groups:
                group["lr"] = lr

    def make_optimizer(model, cfg):
        params = [p for p in model.parameters() if p.requires_grad]
        groups = [{{"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.weight_decay}},
                  {{"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}}]
        return AdamW(groups, lr=cfg.learning_rate, betas=(cfg.beta1, cfg.beta2), fused=True)
    setup.make_optimizer = make_optimizer
import train
sys.exit(train.main(sys.argv[1:]))
"""


def one_run(arm: str, argv: list[str], out_dir: Path) -> dict:
    """Train in a fresh process; its wall seconds, median step ms and final val loss."""
    code = LAUNCH.format(root=str(ROOT), torch_arm=arm == "torch")
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code, *argv, f"--out_dir={out_dir}", "--overwrite=true",
                           "--log_interval=1", "--wandb=false"], cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        lines = proc.stderr.strip().splitlines() or [f"training exited with status {proc.returncode}"]
        print(f"{arm}: {lines[-1]}", file=sys.stderr)
        raise SystemExit(2)
    rows = read_jsonl(out_dir / "metrics.jsonl")
    steps = [r["ms"] for r in rows if r["kind"] == "train" and r["iter"] >= SKIP]
    if not steps:
        print(f"error: the run made no step past the first {SKIP}: give more --max_iters", file=sys.stderr)
        raise SystemExit(2)
    val = [r["val_loss"] for r in rows if r["kind"] == "eval"][-1]
    return {"wall_s": wall, "step_ms": statistics.median(steps), "val_loss": val}


def step_only(config: str, threads: int) -> None:
    """Time AdamW's step alone, ours against torch.optim.AdamW(fused=True), over the same groups."""
    import torch
    from gpt.config_files import read_config_file
    from gpt.model import GPT
    from gpt.model_config import GPTConfig
    from gpt.optim import decay_groups
    from gpt.speed.optim import AdamW
    torch.set_num_threads(threads)
    values = read_config_file(config)[0]
    model = GPT(GPTConfig(**{k: v for k, v in values.items() if k in GPTConfig.__dataclass_fields__},
                          vocab_size=65))
    params = list(model.parameters())
    for p in params:
        p.grad = torch.randn_like(p) * 1e-3
    groups = decay_groups(params, 0.1)
    arms = {"ours": AdamW(groups, lr=1e-3, betas=(0.9, 0.99)),
            "torch": torch.optim.AdamW([dict(g) for g in groups], lr=1e-3, betas=(0.9, 0.99), fused=True)}
    ms = {arm: [] for arm in arms}
    for r in range(-1, 7):      # round -1 warms both up
        for arm in (list(arms) if r % 2 == 0 else list(arms)[::-1]):
            start = time.perf_counter()
            for _ in range(200):
                arms[arm].step()
            if r >= 0:
                ms[arm].append((time.perf_counter() - start) / 200 * 1e3)
    paired = statistics.median(t / o for o, t in zip(ms["ours"], ms["torch"]))
    print(f"{config}: {sum(p.numel() for p in params):,} parameters, {threads} thread(s): a step of ours "
          f"{statistics.median(ms['ours']):.3f} ms, of torch.optim.AdamW(fused=True) "
          f"{statistics.median(ms['torch']):.3f} ms; torch / ours {paired:.2f} (median of the rounds' ratios)")


def main(argv: list[str] | None = None) -> int:
    parser = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5, help="pairs of runs")
    parser.add_argument("--step_only", action="store_true", help="time the optimizer's step alone")
    parser.add_argument("--threads", type=int, default=1, help="with --step_only: torch's thread count")
    args, training = parser.parse_known_args(argv)
    if args.step_only:
        config = [a.partition("=")[2] for a in training if a.startswith("--config=")] or \
            [training[i + 1] for i, a in enumerate(training[:-1]) if a == "--config"]
        if not config or args.threads < 1:
            parser.error("--step_only takes --config NAME and a --threads of at least 1")
        step_only(config[0], args.threads)
        return 0
    if args.rounds < 1:
        parser.error(f"--rounds={args.rounds} must be at least 1")
    names = [arg[2:].partition("=")[0] for arg in training if arg.startswith("--")]
    if "config" not in names:       # the default model takes minutes a step on a CPU
        parser.error("give --config NAME, e.g. --config shakespeare_char_fast")
    for name in names:
        if name in SET_HERE:
            parser.error(f"--{name}: this script sets it for each run")
        if name in ("sweep", "seeds", "jobs"):
            parser.error(f"--{name}: this script times one run's settings, not a sweep")
    runs = {"ours": [], "torch": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for arm in (("ours", "torch") if r % 2 == 0 else ("torch", "ours")):
                runs[arm].append(one_run(arm, training, Path(tmp) / arm))
            print(f"round {r + 1}: " + "; ".join(
                f"{arm} {runs[arm][-1]['wall_s']:.2f} s, {runs[arm][-1]['step_ms']:.2f} ms/step, "
                f"val {runs[arm][-1]['val_loss']:.4f}" for arm in runs), flush=True)
    for key, unit in (("wall_s", "s per process"), ("step_ms", "ms per step")):
        ours, torch_ = (statistics.median(run[key] for run in runs[arm]) for arm in ("ours", "torch"))
        paired = statistics.median(t[key] / o[key] for o, t in zip(runs["ours"], runs["torch"]))
        print(f"{unit}: ours {ours:.3f}, torch fused {torch_:.3f}; torch / ours {torch_ / ours:.3f} "
              f"(median of the rounds' ratios {paired:.3f})")
    same = all(o["val_loss"] == t["val_loss"] for o, t in zip(runs["ours"], runs["torch"]))
    print("final val loss: " + ("the same in every round" if same else
                                "differs: " + ", ".join(f"{o['val_loss']:.6f} vs {t['val_loss']:.6f}"
                                                        for o, t in zip(runs["ours"], runs["torch"]))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
