"""Time sampling and a forward-backward pass of this checkout's model against another checkout's, in one process.

    python benchmarks/compare_sampling.py --other PATH [--rounds 10] [--tokens 255]

Both checkouts' `gpt` packages are loaded side by side (the other one under another name), the
same weights go into both models (the shakespeare_char shape: 6 layers, 6 heads, 384 wide, block
256), and each round times, in alternating order, generate() of --tokens new tokens from one with
the KV cache, and one forward and backward pass of a batch of 12 windows. Timings taken in one
process, interleaved, do not carry the drift between processes that a small shared CPU shows.
It prints the medians and the median of the rounds' paired ratios.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))   # this project's package, also from a clone that is not installed
import torch  # noqa: E402

import gpt  # noqa: E402
from gpt.console import Parser  # noqa: E402

SHAPE = dict(vocab_size=65, block_size=256, n_layer=6, n_head=6, n_embd=384)


def load_other(path: Path):
    """The other checkout's gpt package, importable as `gpt_other` beside this one's."""
    spec = importlib.util.spec_from_file_location("gpt_other", path / "gpt" / "__init__.py",
                                                  submodule_search_locations=[str(path / "gpt")])
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpt_other"] = module
    spec.loader.exec_module(module)
    return module


def build(package, state: dict | None):
    model = importlib.import_module(f"{package.__name__}.model").GPT(package.GPTConfig(**SHAPE))
    if state is not None:
        model.load_state_dict(state)
    return model.eval()


def time_sampling(model, tokens: int) -> float:
    torch.manual_seed(0)
    start = time.perf_counter()
    model.generate(torch.zeros((1, 1), dtype=torch.long), tokens, temperature=1.0, top_k=None)
    return tokens / (time.perf_counter() - start)


def time_step(model, x: torch.Tensor, y: torch.Tensor) -> float:
    model.train()
    start = time.perf_counter()
    _, loss = model(x, y)
    loss.backward()
    ms = 1000 * (time.perf_counter() - start)
    model.zero_grad(set_to_none=True)
    model.eval()
    return ms


def main(argv: list[str] | None = None) -> int:
    parser = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--other", required=True, help="the other checkout's folder")
    parser.add_argument("--rounds", type=int, default=10, help="pairs of timings")
    parser.add_argument("--tokens", type=int, default=255, help="new tokens per sampling timing")
    args = parser.parse_args(argv)
    other_path = Path(args.other).expanduser().resolve()
    if not (other_path / "gpt" / "__init__.py").is_file():
        parser.error(f"--other {args.other}: no checkout of this project there (gpt/__init__.py is missing)")
    if args.rounds < 1 or not 1 <= args.tokens < SHAPE["block_size"]:
        parser.error(f"--rounds must be at least 1 and --tokens in [1, {SHAPE['block_size'] - 1}]")
    torch.manual_seed(0)
    this = build(gpt, None)
    other = build(load_other(other_path), this.state_dict())
    gen = torch.Generator().manual_seed(0)
    x = torch.randint(SHAPE["vocab_size"], (12, SHAPE["block_size"]), generator=gen)
    y = torch.randint(SHAPE["vocab_size"], (12, SHAPE["block_size"]), generator=gen)
    time_sampling(this, 8), time_sampling(other, 8), time_step(this, x, y), time_step(other, x, y)   # warm-up
    tokens_s = {"this": [], "other": []}
    step_ms = {"this": [], "other": []}
    for r in range(args.rounds):
        for arm in (("this", "other") if r % 2 == 0 else ("other", "this")):
            model = this if arm == "this" else other
            tokens_s[arm].append(time_sampling(model, args.tokens))
            step_ms[arm].append(time_step(model, x, y))
        print(f"round {r + 1}: sampling {tokens_s['this'][-1]:.1f} against {tokens_s['other'][-1]:.1f} tokens/s; "
              f"forward and backward {step_ms['this'][-1]:.1f} against {step_ms['other'][-1]:.1f} ms", flush=True)
    sampling = statistics.median(t / o for t, o in zip(tokens_s["this"], tokens_s["other"]))
    step = statistics.median(o / t for t, o in zip(step_ms["this"], step_ms["other"]))
    print(f"sampling: this {statistics.median(tokens_s['this']):.1f}, other {statistics.median(tokens_s['other']):.1f} "
          f"tokens/s; this is {sampling:.3f}x as fast (median of the rounds' paired ratios)")
    print(f"forward and backward: this {statistics.median(step_ms['this']):.1f}, other "
          f"{statistics.median(step_ms['other']):.1f} ms; this is {step:.3f}x as fast (median of the rounds' paired ratios)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
