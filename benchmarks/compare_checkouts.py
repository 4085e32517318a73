"""Time this checkout against another one of this project (an older commit, say), alternating.

    python benchmarks/compare_checkouts.py --other PATH [--rounds 5] [--name=value ...]

Each round runs `python -m gpt.bench --json` once in each checkout, in separate processes,
swapping which goes first, with the same options (default: --config shakespeare_char_cpu). It
prints per round the training ms per step and the sampling tokens/s (KV cache, and without it)
of both, then the median over the rounds of each ratio this / other. A code change that should
cost no speed (a refactoring) shows ratios within the rounds' noise of 1.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))   # this project's package, also from a clone that is not installed
from gpt.console import Parser  # noqa: E402

# what is compared, and whether more is faster
MEASURES = {"ms_per_iter": False, "sample_tokens_per_sec_cache": True, "sample_tokens_per_sec_no_cache": True}


def bench(checkout: Path, options: list[str]) -> dict:
    """One `python -m gpt.bench --json` in checkout, importing that checkout's package."""
    proc = subprocess.run([sys.executable, "-m", "gpt.bench", "--json", *options], cwd=checkout,
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(checkout)})
    if proc.returncode != 0:
        lines = proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"]
        print(f"{checkout}: {lines[-1]}", file=sys.stderr)
        raise SystemExit(2)
    return json.loads(proc.stdout)


def main(argv: list[str] | None = None) -> int:
    parser = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--other", required=True, help="the other checkout's folder")
    parser.add_argument("--rounds", type=int, default=5, help="pairs of runs")
    args, options = parser.parse_known_args(argv)
    other = Path(args.other).expanduser().resolve()
    if not (other / "gpt" / "bench.py").is_file():
        parser.error(f"--other {args.other}: no checkout of this project there (gpt/bench.py is missing)")
    if args.rounds < 1:
        parser.error(f"--rounds={args.rounds} must be at least 1")
    options = options or ["--config", "shakespeare_char_cpu"]
    results = {"this": [], "other": []}
    for r in range(args.rounds):
        for arm in (("this", "other") if r % 2 == 0 else ("other", "this")):
            results[arm].append(bench(ROOT if arm == "this" else other, options))
        print(f"round {r + 1}: " + "; ".join(
            f"{arm} " + ", ".join(f"{key} {results[arm][-1][key]:,.1f}" for key in MEASURES) for arm in results),
            flush=True)
    for key, more_is_faster in MEASURES.items():
        ratios = [t[key] / o[key] for t, o in zip(results["this"], results["other"])]
        speed = statistics.median(ratios if more_is_faster else [1 / x for x in ratios])
        print(f"{key}: this {statistics.median(r[key] for r in results['this']):,.2f}, other "
              f"{statistics.median(r[key] for r in results['other']):,.2f}; this is {speed:.3f}x as fast "
              f"(median of the rounds' paired ratios; range {min(ratios):.3f} to {max(ratios):.3f} of this / other)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
