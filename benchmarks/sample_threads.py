"""Time sampling idle and beside a training run of the CPU recipe, at each thread choice, in one run.

    python benchmarks/sample_threads.py [--tokens 1000] [--rounds 3]

The model has the CPU recipe's shape (configs/shakespeare_char_cpu.toml) and random weights: the
work per token does not depend on the weights. Each round samples --tokens tokens, as sample.py
does, at three choices: `auto` (sample.py's default, --threads=0), `torch` (torch's own count,
what sampling used before it chose) and `one` (--threads=1). Then it starts
`train.py --config shakespeare_char_cpu` in the background (data/shakespeare_char must be
prepared), waits for its first logged step, and times the same rounds beside it. It prints the
medians and the ratios the choice is judged by: beside the run against idle, and auto against torch.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))   # this project's package, also from a clone that is not installed
import torch  # noqa: E402

from gpt import GPTConfig  # noqa: E402
from gpt.config_files import read_config_file  # noqa: E402
from gpt.console import Parser  # noqa: E402
from gpt.speed.threads import sampling_threads  # noqa: E402
from gpt.model import GPT  # noqa: E402

CHOICES = {"auto": 0, "torch": torch.get_num_threads(), "one": 1}


def recipe_model() -> GPT:
    values, _ = read_config_file("shakespeare_char_cpu")
    shape = {k: values[k] for k in ("n_layer", "n_head", "n_embd", "block_size")}
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=65, **shape)).eval()


def time_sampling(model: GPT, tokens: int, threads: int) -> float:
    """Seconds for `tokens` new tokens, each read to the host as sample.py reads it."""
    generator = torch.Generator().manual_seed(0)
    start = time.perf_counter()
    stream = model.generate_stream(torch.zeros((1, 1), dtype=torch.long), tokens, 0.8, None, 1.0, True, generator)
    for token in sampling_threads(stream, threads, torch.device("cpu")):
        token.item()
    return time.perf_counter() - start


def rounds(model: GPT, tokens: int, count: int, label: str) -> dict[str, float]:
    seconds = {name: [] for name in CHOICES}
    for r in range(count):
        order = list(CHOICES) if r % 2 == 0 else list(reversed(CHOICES))
        for name in order:
            seconds[name].append(time_sampling(model, tokens, CHOICES[name]))
        print(f"{label} round {r + 1}: " + ", ".join(f"{n} {seconds[n][-1]:.2f} s" for n in CHOICES), flush=True)
    return {name: statistics.median(s) for name, s in seconds.items()}


def start_training(out_dir: Path) -> subprocess.Popen:
    """The CPU recipe in the background, once its first step is logged."""
    proc = subprocess.Popen([sys.executable, str(ROOT / "train.py"), "--config", "shakespeare_char_cpu",
                             f"--out_dir={out_dir}", "--max_iters=1000000", "--lr_decay_iters=1000000",
                             "--eval_interval=100000", "--log_interval=1"],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    metrics = out_dir / "metrics.jsonl"
    deadline = time.monotonic() + 300
    while not (metrics.is_file() and metrics.stat().st_size):
        if proc.poll() is not None:
            sys.exit(f"error: the training run ended before its first step: {proc.stderr.read().decode()[-500:]}")
        if time.monotonic() > deadline:
            stop(proc)
            sys.exit("error: the training run logged no step in 300 s")
        time.sleep(0.5)
    return proc


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def main(argv: list[str] | None = None) -> int:
    parser = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=1000, help="new tokens per timing")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the three choices, idle and busy")
    args = parser.parse_args(argv)
    if args.tokens < 1 or args.rounds < 1:
        parser.error("--tokens and --rounds must be at least 1")
    if not (ROOT / "data" / "shakespeare_char" / "train.bin").is_file():
        parser.error("data/shakespeare_char is not prepared: run python data/shakespeare_char/prepare.py")
    model = recipe_model()
    time_sampling(model, 64, 0)     # warm-up
    idle = rounds(model, args.tokens, args.rounds, "idle")
    with tempfile.TemporaryDirectory() as tmp:
        proc = start_training(Path(tmp) / "run")
        try:
            busy = rounds(model, args.tokens, args.rounds, "beside training")
        finally:
            stop(proc)
    print(f"\n{args.tokens} tokens, median of {args.rounds} rounds (torch's count is {CHOICES['torch']}):")
    for name in CHOICES:
        print(f"  {name:5s}  idle {idle[name]:6.2f} s   beside training {busy[name]:6.2f} s   "
              f"ratio {busy[name] / idle[name]:.2f}")
    print(f"auto beside training / torch idle: {busy['auto'] / idle['torch']:.2f}")
    print(f"auto idle / torch idle: {idle['auto'] / idle['torch']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
