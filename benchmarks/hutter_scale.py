"""A 100 MB benchmark dataset at full size: the preparation's peak memory, and training speed on its
90M-token train split against Tiny Shakespeare's, the same model, measured in the same run.

    python benchmarks/hutter_scale.py [--dataset text8|enwik8] [--rounds 3] [--json FILE]

The text is synthetic, and labelled so in the output: 10^8 random bytes of the dataset's alphabet,
zipped here and prepared from a file:// --data_url. The checks, the cut and the training batches
depend on how many bytes there are, not on what they say. Each round times both datasets with
`python -m gpt.bench` (shakespeare_char_cpu's model), alternating; the ratio is of the medians.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))   # this project's package, also from a clone that is not installed
from gpt.console import Parser, to_json  # noqa: E402
from gpt.datasets import DATASETS, HUTTER  # noqa: E402

BENCH = ["--config", "shakespeare_char_cpu", "--bench_iters=60", "--bench_warmup=10", "--json"]


def write_zip(path: Path, dataset: str, size: int = HUTTER) -> None:
    """size random bytes of the dataset's alphabet (all 256 for enwik8), zipped, made in pieces."""
    alphabet = np.frombuffer((DATASETS[dataset].alphabet or "").encode(), np.uint8)
    rng = np.random.default_rng(0)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as archive, \
            archive.open(DATASETS[dataset].member, "w", force_zip64=True) as member:
        for start in range(0, size, 1 << 22):
            n = min(1 << 22, size - start)
            block = rng.integers(0, 256, n, dtype=np.uint8) if not len(alphabet) else alphabet[rng.integers(0, len(alphabet), n)]
            member.write(block.tobytes())


def prepare_peak(data_dir: Path, dataset: str, url: str, size: int = HUTTER) -> tuple[float, float, float]:
    """(seconds, peak MB, peak MB of the same process importing only) of preparing in a fresh
    process; a size below the real one is cut 90/5/5 as the real one is (for tests)."""
    def peak(code: str) -> tuple[float, float]:
        start = time.perf_counter()
        proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
        if proc.returncode:
            sys.exit(proc.stderr)
        seconds = time.perf_counter() - start
        # wait4 gives the one child's own peak, not the largest of all children so far
        return seconds, float(proc.stdout.split()[-1])
    tail = "; import resource; print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)"
    resize = (f"import dataclasses; d.DATASETS[{dataset!r}] = dataclasses.replace(d.DATASETS[{dataset!r}], "
              f"size={size}, split=({size * 9 // 10}, {size // 20})); " if size != HUTTER else "")
    seconds, mb = peak(f"import gpt.datasets as d; {resize}d.ensure_prepared({str(data_dir)!r}, "
                       f"{dataset!r}, {url!r}){tail}")
    return seconds, mb, peak(f"import gpt.datasets{tail}")[1]


def bench(*extra: str) -> float:
    proc = subprocess.run([sys.executable, "-m", "gpt.bench", *BENCH, *extra], cwd=ROOT, capture_output=True,
                          text=True)
    if proc.returncode:
        sys.exit(proc.stderr)
    return json.loads(proc.stdout)["ms_per_iter"]


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="python benchmarks/hutter_scale.py", description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="text8", choices=("text8", "enwik8"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        zipped = Path(tmp) / f"{args.dataset}.zip"
        write_zip(zipped, args.dataset)
        data_dir = Path(tmp) / "data"
        seconds, peak_mb, import_mb = prepare_peak(data_dir, args.dataset, zipped.as_uri())
        train_tokens = os.path.getsize(data_dir / args.dataset / "train.bin") // 2
        big, small = [], []
        for _ in range(args.rounds):
            big.append(bench(f"--dataset={args.dataset}", f"--data_dir={data_dir}"))
            small.append(bench())
    result = {"data": f"synthetic: {HUTTER:,} random bytes of {args.dataset}'s alphabet",
              "prepare_s": seconds, "prepare_peak_mb": peak_mb, "import_peak_mb": import_mb,
              "train_tokens": train_tokens, f"{args.dataset}_ms_per_iter": statistics.median(big),
              "shakespeare_char_ms_per_iter": statistics.median(small),
              "speed_ratio": statistics.median(small) / statistics.median(big)}
    print(f"{args.dataset} (synthetic text, {HUTTER:,} bytes): prepared in {seconds:.1f} s, peak memory "
          f"{peak_mb:.0f} MB ({import_mb:.0f} MB of it the imports); {train_tokens:,} train tokens")
    print(f"training, shakespeare_char_cpu's model, median of {args.rounds}: {result[f'{args.dataset}_ms_per_iter']:.1f} "
          f"ms/step on {args.dataset}, {result['shakespeare_char_ms_per_iter']:.1f} on Tiny Shakespeare "
          f"(speed ratio {result['speed_ratio']:.2f})")
    if args.json:
        Path(args.json).write_text(to_json(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
