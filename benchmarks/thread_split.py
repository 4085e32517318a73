"""Time training steps split by rows between CPU threads against unsplit ones, in one process.

    python benchmarks/thread_split.py --config NAME [--rounds 6] [--steps 160] [--name=value ...]

Each round trains the config from scratch twice through train.py's own loop, at
--thread_split=batch and at ops, swapping which goes first each round. It prints each run's
median ms per step, with the first 20 steps left out, then the medians over the rounds, their
ratio and the median of the rounds' ratios. Both arms run in this one process, so a drift of
the machine between processes does not fall on one arm alone; on a small cloud CPU such drift
is 10% or more. Any other --name=value is a training option, given to both arms; those the
script sets itself (SET_HERE) are refused.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))   # this project's package and train.py, also from a clone not installed
import train  # noqa: E402
from gpt.console import Parser  # noqa: E402
from gpt.train.metrics import read_jsonl  # noqa: E402

SKIP = 20   # steps left out of each median: start-up effects
# what each run is given here: the arm, the steps timed, and a scratch folder with its logging
SET_HERE = ("thread_split", "max_iters", "eval_interval", "eval_iters", "out_dir", "overwrite", "resume",
            "log_interval", "diagnostics", "wandb")
NOT_HERE = ("sweep", "seeds", "jobs")     # a sweep is many runs; this times one setting


def median_step_ms(argv: list[str], out_dir: Path) -> float:
    """Train with argv into out_dir; the median ms per step after SKIP. Exits with train.py's
    error line if the run cannot start."""
    said = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(said):
        status = train.main([*argv, f"--out_dir={out_dir}", "--overwrite=true", "--log_interval=1",
                             "--diagnostics=false", "--wandb=false"])
    if status != 0:     # train.py's advice to pick another thread_split is not for this script
        lines = said.getvalue().strip().splitlines() or [f"stopped: training exited with status {status}"]
        print(lines[-1].replace("; pass --thread_split=auto or ops", ": nothing to compare"), file=sys.stderr)
        raise SystemExit(status)
    rows = read_jsonl(out_dir / "metrics.jsonl")
    return statistics.median(r["ms"] for r in rows if r["kind"] == "train" and r["iter"] >= SKIP)


def main(argv: list[str] | None = None) -> int:
    parser = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=6, help="pairs of runs")
    parser.add_argument("--steps", type=int, default=160, help="training steps per run")
    args, training = parser.parse_known_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds={args.rounds} must be at least 1")
    if args.steps <= SKIP:
        parser.error(f"--steps={args.steps} leaves no step to time: give more than {SKIP}")
    names = [arg[2:].partition("=")[0] for arg in training if arg.startswith("--")]   # not the values
    if "config" not in names:       # the default model takes minutes a step on a CPU
        parser.error("give --config NAME, e.g. --config shakespeare_char_cpu")
    for name in names:
        if name in SET_HERE:
            parser.error(f"--{name}: this script sets it for each run")
        if name in NOT_HERE:
            parser.error(f"--{name}: this script times one run's settings, not a sweep")
    # evaluations only at the start and the end, over 2 batches: steps are what is timed
    training = [*training, f"--max_iters={args.steps}", f"--eval_interval={args.steps}", "--eval_iters=2"]
    ms = {"batch": [], "ops": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for arm in (("batch", "ops") if r % 2 == 0 else ("ops", "batch")):
                ms[arm].append(median_step_ms([*training, f"--thread_split={arm}"], Path(tmp) / arm))
            print(f"round {r + 1}: batch {ms['batch'][-1]:.2f} ms, ops {ms['ops'][-1]:.2f} ms", flush=True)
    batch, ops = statistics.median(ms["batch"]), statistics.median(ms["ops"])
    paired = statistics.median(o / b for b, o in zip(ms["batch"], ms["ops"]))
    print(f"median ms per step: batch {batch:.2f}, ops {ops:.2f}; split steps {ops / batch:.3f}x as fast "
          f"(median of the rounds' ratios {paired:.3f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
