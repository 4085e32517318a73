"""Measure this project beside nanoGPT on the same machine, in the same run.

    python benchmarks/compare_nanogpt.py --nanogpt PATH [--rounds 3] [--quality_rounds 2] [--compiled] [--medium] [--bf16] [--json FILE]
    python benchmarks/compare_nanogpt.py --whole_val out/NAME/ckpt.pt [...]

PATH is a checkout of github.com/karpathy/nanoGPT (the figures in README.md used commit 3adf61e).
Nothing of it is imported into the project: its train.py runs as a separate process, and its
model.py is loaded from PATH only to time its generate() and to score its checkpoint. The two programs alternate, and medians
and ratios are reported, since timings on a small shared CPU drift by 10% or more.

1. training throughput: nanoGPT's README CPU recipe (4 layers, 4 heads, 128 wide, block 64,
   batch 12, fp32, no bias), median time per iteration after the first 10, evaluation excluded;
2. time to quality: whole processes, start-up and evaluations included: nanoGPT's 2000-iteration
   recipe against configs/shakespeare_char_fast.toml, with the final val loss of each, as each
   program estimates it and over the whole val split;
3. sampling: generate() on the shakespeare_char shape (6 layers, 6 heads, 384 wide, block 256)
   from a one-token prompt up to the block size, and 64 tokens past it, same weights in both;
4. peak memory (max RSS) of the training processes of 1.

--whole_val scores checkpoints of ours on the whole val split, the yardstick of 2.
"""

from __future__ import annotations

import importlib.util
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))   # this project's package, also from a clone that is not installed
from gpt.console import Parser, to_json  # noqa: E402
RECIPE = ["--device=cpu", "--eval_iters=20", "--log_interval=1", "--block_size=64", "--batch_size=12",
          "--n_layer=4", "--n_head=4", "--n_embd=128", "--lr_decay_iters=2000", "--dropout=0.0"]
SKIP = 10   # iterations left out of the median: start-up effects
# the arms of ours that --compiled, --medium and --bf16 add to the throughput comparison
EXTRA_ARMS = {"compiled": "--compile=true", "medium": "--matmul_precision=medium", "bf16": "--dtype=bfloat16"}


def timed(cmd: list[str], cwd: Path) -> tuple[str, float, float]:
    """Run cmd; return its output, wall seconds and peak RSS in MB."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{out[-3000:]}")
    return out, wall, usage.ru_maxrss / 1024


def nanogpt_train(path: Path, iters: int, extra=()) -> tuple[list[float], float, float, str]:
    args = [sys.executable, "train.py", "config/train_shakespeare_char.py", "--compile=False",
            f"--max_iters={iters}", *RECIPE, *extra]
    out, wall, rss = timed(args, path)
    ms = [float(t) for i, t in re.findall(r"iter (\d+): loss [\d.]+, time ([\d.]+)ms", out)
          if int(i) >= SKIP]
    return ms, wall, rss, out


def our_train(out_dir: Path, args: list[str]) -> tuple[list[float], float, float, list[dict]]:
    from gpt.train.metrics import read_jsonl
    _, wall, rss = timed([sys.executable, "train.py", f"--out_dir={out_dir}", *args], ROOT)
    rows = read_jsonl(out_dir / "metrics.jsonl")
    ms = [r["ms"] for r in rows if r["kind"] == "train" and r["iter"] >= SKIP]
    return ms, wall, rss, rows


def throughput(path: Path, rounds: int, iters: int, extra: list[str]) -> dict:
    """nanoGPT's recipe uncompiled, as its README runs it on a CPU; ours as it is and with each
    of the `extra` arms' flags (a compiled arm's compilation, in the first step, is left out)."""
    ours_args = ["--config", "shakespeare_char", *RECIPE, "--bias=false", f"--max_iters={iters}",
                 f"--eval_interval={iters}", "--threads=0"]
    arms = {"ours": ours_args, **{f"ours_{name}": [*ours_args, EXTRA_ARMS[name]] for name in extra}}
    ms_of = {"nanogpt": [], **{arm: [] for arm in arms}}
    rss_of = {name: [] for name in ms_of}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(rounds):
            # who goes first swaps each round, so a machine slowing down or speeding up over a
            # round does not always favour the same program
            order = ["nanogpt", *arms] if r % 2 == 0 else [*arms, "nanogpt"]
            for arm in order:
                if arm == "nanogpt":
                    ms, _, rss, _ = nanogpt_train(path, iters, ["--eval_interval=100000"])
                else:
                    ms, _, rss, _ = our_train(Path(tmp) / f"{arm}{r}", arms[arm])
                ms_of[arm].append(statistics.median(ms))
                rss_of[arm].append(rss)
    med = {name: statistics.median(values) for name, values in ms_of.items()}
    tokens = 12 * 64        # the recipe's batch x block
    result = {"nanogpt_ms_per_iter": med["nanogpt"], "nanogpt_tokens_per_sec": tokens / med["nanogpt"] * 1000,
              "nanogpt_peak_rss_mb": max(rss_of["nanogpt"]), "rounds_ms": ms_of}
    for arm in arms:
        result.update({f"{arm}_ms_per_iter": med[arm], f"{arm}_tokens_per_sec": tokens / med[arm] * 1000,
                       f"{arm}_peak_rss_mb": max(rss_of[arm]),
                       f"throughput_ratio{arm.removeprefix('ours')}": med["nanogpt"] / med[arm],
                       # the ratio within each round, whose runs were seconds apart, then its median:
                       # steadier than the ratio of medians when the machine's speed drifts for minutes
                       f"paired_ratio{arm.removeprefix('ours')}": statistics.median(
                           n / m for n, m in zip(ms_of["nanogpt"], ms_of[arm]))})
    return result


def val_ids(data_dir: Path = ROOT / "data", dataset: str = "shakespeare_char"):
    import numpy as np
    from gpt.datasets import ensure_prepared
    return np.fromfile(ensure_prepared(str(data_dir), dataset) / "val.bin", dtype=np.uint16)


def nanogpt_model(path: Path):
    spec = importlib.util.spec_from_file_location("nanogpt_model", path / "model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def time_to_quality(path: Path, rounds: int) -> dict:
    import torch
    from gpt import checkpoint
    from gpt.diagnostics import whole_split_loss
    theirs_mod = nanogpt_model(path)
    ids = val_ids()
    walls_theirs, walls_mine, vals_theirs, vals_mine, whole_theirs, whole_mine = [], [], [], [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(rounds):
            out_theirs = Path(tmp) / f"nanogpt{r}"
            _, wall, _, out = nanogpt_train(path, 2000, [f"--out_dir={out_theirs}"])
            walls_theirs.append(wall)
            vals_theirs.append(float(re.findall(r"step 2000: train loss [\d.]+, val loss ([\d.]+)", out)[-1]))
            ckpt = torch.load(out_theirs / "ckpt.pt", map_location="cpu", weights_only=False)
            if ckpt["iter_num"] != 2000:    # it saves only when its val loss improves
                print(f"note: nanoGPT's best checkpoint is from iteration {ckpt['iter_num']}", file=sys.stderr)
            model = theirs_mod.GPT(theirs_mod.GPTConfig(**ckpt["model_args"]))
            model.load_state_dict({k.removeprefix("_orig_mod."): v for k, v in ckpt["model"].items()})
            whole_theirs.append(whole_split_loss(model, ids))

            out_mine = Path(tmp) / f"fast{r}"
            _, wall, _, rows = our_train(out_mine, ["--config", "shakespeare_char_fast"])
            walls_mine.append(wall)
            vals_mine.append([row for row in rows if row["kind"] == "eval"][-1]["val_loss"])
            model = checkpoint.load_model(checkpoint.load(out_mine / "ckpt.pt"))
            whole_mine.append(whole_split_loss(model, ids))
    med = statistics.median
    return {"nanogpt_2000_iter_wall_s": med(walls_theirs), "ours_fast_wall_s": med(walls_mine),
            "wall_ratio": med(walls_mine) / med(walls_theirs),
            "nanogpt_val_loss": med(vals_theirs), "ours_fast_val_loss": med(vals_mine),
            "nanogpt_whole_val_loss": med(whole_theirs), "ours_fast_whole_val_loss": med(whole_mine),
            "rounds": {"nanogpt_wall_s": walls_theirs, "ours_wall_s": walls_mine}}


def sampling(path: Path, rounds: int) -> dict:
    import torch
    from gpt import GPT, GPTConfig
    theirs_mod = nanogpt_model(path)
    shape = dict(n_layer=6, n_head=6, n_embd=384, block_size=256, vocab_size=65, bias=False, dropout=0.0)
    torch.manual_seed(0)
    ours = GPT(GPTConfig(**shape)).eval()
    theirs = theirs_mod.GPT(theirs_mod.GPTConfig(**shape)).eval()
    missing = theirs.load_state_dict(ours.state_dict(), strict=False)
    assert not missing.unexpected_keys, missing
    results = {}
    for label, prompt_len, new in (("to_block", 1, 255), ("past_block", 256, 64)):
        t_theirs, t_mine = [], []
        idx = torch.zeros((1, prompt_len), dtype=torch.long)
        for _ in range(rounds):
            torch.manual_seed(1)
            t = time.perf_counter()
            a = theirs.generate(idx, new, temperature=1.0, top_k=1)
            t_theirs.append(new / (time.perf_counter() - t))
            t = time.perf_counter()
            b = ours.generate(idx, new, temperature=0)
            t_mine.append(new / (time.perf_counter() - t))
        results[label] = {"nanogpt_tokens_per_sec": statistics.median(t_theirs),
                          "ours_tokens_per_sec": statistics.median(t_mine),
                          "ratio": statistics.median(t_mine) / statistics.median(t_theirs),
                          "same_tokens": bool(torch.equal(a, b))}
    return results


def main() -> int:
    parser = Parser(description=__doc__.splitlines()[0])
    parser.add_argument("--nanogpt", type=Path, help="a nanoGPT checkout")
    parser.add_argument("--whole_val", type=Path, nargs="+", metavar="CKPT",
                        help="only print the whole-split val loss of these checkpoints of ours")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quality_rounds", type=int, default=1, help="pairs of time-to-quality runs")
    parser.add_argument("--iters", type=int, default=300, help="iterations per throughput run")
    parser.add_argument("--compiled", action="store_true",
                        help="throughput: also time ours with --compile=true")
    parser.add_argument("--medium", action="store_true",
                        help="throughput: also time ours with --matmul_precision=medium")
    parser.add_argument("--bf16", action="store_true", help="throughput: also time ours with --dtype=bfloat16")
    parser.add_argument("--skip", default="", help="comma-separated parts to skip: "
                                                   "throughput,quality,sampling")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    if args.json and (args.json.is_dir() or not args.json.parent.is_dir()):    # checked before hours of runs
        parser.error(f"--json {args.json}: give a file in a folder that exists")
    if args.whole_val:
        from gpt import checkpoint
        from gpt.errors import UserError
        from gpt.diagnostics import whole_split_loss
        losses = {}
        for path in args.whole_val:
            try:
                ckpt = checkpoint.load(path, needs=(*checkpoint.MODEL_KEYS, "train_config"))
                model = checkpoint.load_model(ckpt)
                cfg = ckpt["train_config"]      # its own dataset; a relative data_dir is from here
                ids = val_ids(Path(cfg["data_dir"]), cfg["dataset"])
            except UserError as e:
                sys.exit(f"error: {e}")
            losses[str(path)] = whole_split_loss(model, ids)
            print(f"{path}: {losses[str(path)]:.4f}")
        return write_json(args.json, {"whole_val": losses})
    if args.nanogpt is None:
        parser.error("--nanogpt PATH is required")
    if not all((args.nanogpt / name).is_file() for name in ("train.py", "model.py")):
        sys.exit(f"error: {args.nanogpt} is not a nanoGPT checkout (it needs train.py and model.py)")
    data = args.nanogpt / "data" / "shakespeare_char"
    if not (data / "train.bin").exists():
        sys.exit(f"prepare nanoGPT's data first: python {data / 'prepare.py'}")
    skip = set(filter(None, args.skip.split(",")))
    if skip - {"throughput", "quality", "sampling"}:
        parser.error(f"--skip {args.skip!r}: the parts are throughput, quality and sampling")
    if args.rounds < 1 or args.quality_rounds < 1 or args.iters <= SKIP:
        parser.error(f"--rounds and --quality_rounds must be at least 1, --iters above {SKIP} "
                     "(the first iterations are left out of the median)")
    result = {}
    if "throughput" not in skip:
        extra = [name for name in EXTRA_ARMS if getattr(args, name)]
        result["throughput"] = throughput(args.nanogpt, args.rounds, args.iters, extra)
    if "quality" not in skip:
        result["quality"] = time_to_quality(args.nanogpt, args.quality_rounds)
    if "sampling" not in skip:
        result["sampling"] = sampling(args.nanogpt, args.rounds)
    print(to_json(result, indent=1))
    return write_json(args.json, result)


def write_json(path: Path | None, result: dict) -> int:
    if path is not None:
        try:
            path.write_text(to_json(result, indent=1))
        except OSError as e:
            sys.exit(f"error: cannot write {path} ({e.strerror}); the results are above")
    return 0


if __name__ == "__main__":
    from gpt.console import interrupt_in_one_line, output_may_close
    with interrupt_in_one_line(), output_may_close(product=True):
        sys.exit(main())
