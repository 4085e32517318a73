"""Time training steps split by rows between CPU threads against unsplit ones, in one process.

    python benchmarks/thread_split.py --config shakespeare_char_cpu [--rounds 6] [--steps 160] [--name=value ...]

Each round trains the config from scratch twice through train.py's own loop, at
--thread_split=batch and at ops, swapping which goes first each round. It prints each run's
median ms per step, with the first 20 steps left out, then the medians over the rounds and
their ratio. Both arms run in this one process, so a drift of the machine between processes
does not fall on one arm alone; on a small cloud CPU such drift is 10% or more. Any other
--name=value is a training option, given to both arms.
"""

from __future__ import annotations

import contextlib
import io
import json
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))   # this project's package and train.py, also from a clone not installed
import train  # noqa: E402
from gpt.console import Parser  # noqa: E402

SKIP = 20   # steps left out of each median: start-up effects


def median_step_ms(argv: list[str], out_dir: Path) -> float:
    """Train with argv into out_dir; the median ms per step after SKIP. Exits with train.py's
    error line if the run cannot start."""
    said = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(said):
        status = train.main([*argv, f"--out_dir={out_dir}", "--overwrite=true", "--log_interval=1",
                             "--diagnostics=false", "--wandb=false"])
    if status != 0:
        print(said.getvalue().strip().splitlines()[-1], file=sys.stderr)
        raise SystemExit(status)
    rows = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    return statistics.median(r["ms"] for r in rows if r["kind"] == "train" and r["iter"] >= SKIP)


def main(argv: list[str] | None = None) -> int:
    parser = Parser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6, help="pairs of runs")
    parser.add_argument("--steps", type=int, default=160, help="training steps per run")
    args, training = parser.parse_known_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds={args.rounds} must be at least 1")
    if args.steps <= SKIP:
        parser.error(f"--steps={args.steps} leaves no step to time: give more than {SKIP}")
    # evaluations only at the start and the end, over 2 batches: steps are what is timed
    training = [*training, f"--max_iters={args.steps}", f"--eval_interval={args.steps}", "--eval_iters=2"]
    ms = {"batch": [], "ops": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for arm in (("batch", "ops") if r % 2 == 0 else ("ops", "batch")):
                ms[arm].append(median_step_ms([*training, f"--thread_split={arm}"], Path(tmp) / arm))
            print(f"round {r + 1}: batch {ms['batch'][-1]:.2f} ms, ops {ms['ops'][-1]:.2f} ms", flush=True)
    batch, ops = statistics.median(ms["batch"]), statistics.median(ms["ops"])
    print(f"median ms per step: batch {batch:.2f}, ops {ops:.2f}; ops / batch = {ops / batch:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
