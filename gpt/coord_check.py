"""μP's coordinate check: each activation's RMS against width over the first training steps, sp and mup.

    python -m gpt.coord_check [--widths 64,128,256,512] [--steps 4] [--seeds 2] [--out runs/coord_check]

Models of each width (n_head fixed, so the head size grows with the width and μP's 1/head_size
scores are at work) train for --steps AdamW steps at a constant --learning_rate, unclipped, on a
dataset's characters (Tiny Shakespeare, prepared on first use); every width and both
parametrizations of a seed start from that seed and see the same batches. The forward pass of each
step records the RMS of the embedding output (tokens plus positions), each layer's attention logits
(q·k times the scale, over the pairs the causal mask keeps, computed from the queries and keys the
attention is handed), each block's output and the logits; step 1 is at initialisation. OUT gets
coord.png (a panel per activation and parametrization: RMS against width, a line per step),
coord.csv (every mean over seeds) and coord.md (the last step, with each activation's flatness: its
RMS at the largest width over that at the smallest). Under μP every flatness stays within
TOLERANCE; under sp the logits and the attention logits grow with width (docs/mup.md).
"""

from __future__ import annotations

from .console import interrupt_quietly_while_loading

interrupt_quietly_while_loading(__name__)      # before torch loads

import csv
import math
import sys
from pathlib import Path

import torch

from .config import GPTConfig, TrainConfig, build, check_seed, user_path
from .console import Parser, interrupt_in_one_line, output_may_close
from .data import Batches, load_meta
from .datasets import ensure_prepared
from .diagnostics import positive_ints
from .errors import UserError
from .model import GPT
from .optim import make_optimizer
from .progress import progress

TOLERANCE = 2.0     # μP: each activation's RMS at the largest width within 2x of that at the smallest
PARAMETRIZATIONS = ("sp", "mup")


def rms(t: torch.Tensor) -> float:
    return t.detach().double().pow(2).mean().sqrt().item()


class Recorder:
    """Forward hooks on a GPT that keep the RMS of each tracked activation of its last forward
    pass, in the order the pass makes them; the attention logits from the queries and keys each
    layer's attention is handed (SDPA never materialises them)."""

    def __init__(self, model: GPT):
        self.rms: dict[str, float] = {}
        model.transformer.drop.register_forward_hook(self.keep("embedding"))
        for i, block in enumerate(model.transformer.h):
            block.attn.attend = self.scores(f"attention logits {i}", block.attn.attend)
            block.register_forward_hook(self.keep(f"block {i} output"))

    def keep(self, name: str):
        def hook(module, args, output):
            self.rms[name] = rms(output)
        return hook

    def scores(self, name: str, attend):
        def recording(q, k, v, mask, dropout_p, is_causal):
            with torch.no_grad():
                keys = k.repeat_interleave(q.size(1) // k.size(1), dim=1)     # grouped-query heads
                # SDPA's 1/sqrt(head size); μP's further factor is already in q (gpt/model.py)
                s = q.double() @ keys.double().transpose(-2, -1) / math.sqrt(q.size(-1))
                T, T_k = s.shape[-2:]
                self.rms[name] = rms(s[..., torch.ones(T, T_k, dtype=torch.bool).tril(T_k - T)])
            return attend(q, k, v, mask, dropout_p, is_causal)
        return recording


def trajectory(model: GPT, batches: list, learning_rate: float) -> list[dict[str, float]]:
    """The RMS of each tracked activation in the forward pass of each step, training model on
    batches at a constant rate, unclipped."""
    recorder = Recorder(model)
    optimizer = make_optimizer(model, TrainConfig(learning_rate=learning_rate, lr_schedule="constant"))
    steps = []
    for x, y in batches:
        recorder.rms = {}
        logits, loss = model(x, y)
        steps.append({**recorder.rms, "logits": rms(logits)})
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return steps


def shapes(widths: list[int], n_head: int, n_layer: int, block_size: int, vocab_size: int,
           base: int) -> dict[tuple[str, int], GPTConfig]:
    """Each (parametrization, width)'s model config; a bad one refused in one line before any trains."""
    for width in widths:
        if width % n_head:
            raise UserError(f"--widths: width {width} is not divisible by --n_head={n_head}; pick widths "
                            "that are, or another n_head")
    return {(p, w): build(GPTConfig, dict(vocab_size=vocab_size, block_size=block_size, n_layer=n_layer,
                                          n_head=n_head, n_embd=w, parametrization=p, mup_base_width=base))
            for p in PARAMETRIZATIONS for w in widths}


def coord_check(folder: Path, widths: list[int], steps: int = 4, seeds: list[int] = (0,), n_head: int = 4,
                n_layer: int = 2, block_size: int = 64, batch_size: int = 16, learning_rate: float = 5e-3,
                base: int = 64) -> list[dict]:
    """Rows of (parametrization, width, step, activation, rms: the mean over seeds) for models
    trained on the dataset in folder; step 1 is the forward pass at initialisation."""
    meta = load_meta(folder)
    configs = shapes(widths, n_head, n_layer, block_size, meta["vocab_size"], base)
    sums: dict[tuple, float] = {}
    with progress(len(configs) * len(seeds), "training each width for the coordinate check", "models") as bar:
        for seed in seeds:
            data = Batches(folder, block_size, batch_size, "cpu", seed, meta["vocab_size"])
            batches = [tuple(t[0] for t in data.draw("train", 1)) for _ in range(steps)]
            for (p, width), config in configs.items():
                torch.manual_seed(seed)
                for step, measured in enumerate(trajectory(GPT(config), batches, learning_rate), 1):
                    for name, value in measured.items():
                        key = (p, width, step, name)
                        sums[key] = sums.get(key, 0.0) + value / len(seeds)
                bar.update()
    return [{"parametrization": p, "width": w, "step": s, "activation": a, "rms": v}
            for (p, w, s, a), v in sums.items()]


def activations(rows: list[dict]) -> list[str]:
    return list(dict.fromkeys(r["activation"] for r in rows))


def table(rows: list[dict]) -> dict[tuple[str, str], dict[int, float]]:
    """(parametrization, activation) -> {width: RMS} at the last step."""
    last = max(r["step"] for r in rows)
    out: dict[tuple[str, str], dict[int, float]] = {}
    for r in rows:
        if r["step"] == last:
            out.setdefault((r["parametrization"], r["activation"]), {})[r["width"]] = r["rms"]
    return out


def flatness(rows: list[dict]) -> dict[tuple[str, str], float]:
    """(parametrization, activation) -> RMS at the largest width over RMS at the smallest, at the
    last step: 1 is flat; within TOLERANCE either way counts as flat."""
    return {key: by_width[max(by_width)] / by_width[min(by_width)] for key, by_width in table(rows).items()}


def flat(ratio: float) -> bool:
    return 1 / TOLERANCE <= ratio <= TOLERANCE


def markdown(rows: list[dict]) -> str:
    """coord.md: each activation's RMS at the last step at every width, and its flatness."""
    widths = sorted({r["width"] for r in rows})
    ratios = flatness(rows)
    lines = [f"RMS at step {max(r['step'] for r in rows)} (mean over seeds); flatness: RMS at width "
             f"{widths[-1]} over width {widths[0]}, flat within {TOLERANCE:g}x either way", "",
             "| activation | parametrization | " + " | ".join(f"width {w}" for w in widths)
             + " | flatness | flat |",
             "|---|---|" + "---:|" * len(widths) + "---:|---|"]
    for name in activations(rows):
        for p in PARAMETRIZATIONS:
            by_width, ratio = table(rows)[(p, name)], ratios[(p, name)]
            lines.append(f"| {name} | {p} | " + " | ".join(f"{by_width[w]:.3g}" for w in widths)
                         + f" | {ratio:.2f} | {'yes' if flat(ratio) else 'no'} |")
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], path: Path) -> None:
    """coord.png: a row of panels per activation, sp and mup side by side on a shared y axis; RMS
    against width (log axes), a line per step."""
    from matplotlib import colormaps
    from matplotlib.figure import Figure
    names = activations(rows)
    steps, widths = sorted({r["step"] for r in rows}), sorted({r["width"] for r in rows})
    fig = Figure(figsize=(8, 2.4 * len(names)), layout="constrained")
    axes = fig.subplots(len(names), 2, squeeze=False, sharey="row")
    colours = colormaps["viridis"].resampled(max(2, len(steps)))
    for row, name in zip(axes, names):
        for ax, p in zip(row, PARAMETRIZATIONS):
            for i, step in enumerate(steps):
                points = sorted((r["width"], r["rms"]) for r in rows
                                if (r["parametrization"], r["activation"], r["step"]) == (p, name, step))
                ax.plot(*zip(*points), "o-", ms=3, color=colours(i), label=f"step {step}")
            ax.set_xscale("log", base=2)
            ax.set_xticks(widths, labels=[str(w) for w in widths])
            ax.set_yscale("log")
            ax.set_title(f"{p}: {name}", fontsize=9)
            ax.grid(alpha=0.3, which="both")
        row[0].set_ylabel("RMS")
    for ax in axes[-1]:
        ax.set_xlabel("width (n_embd)")
    axes[0][0].legend(fontsize=7)
    fig.savefig(path, dpi=110)


def write(rows: list[dict], out: Path) -> None:
    """coord.csv, coord.md and coord.png in out, made if missing."""
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "coord.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    (out / "coord.md").write_text(markdown(rows))
    plot(rows, out / "coord.png")


def verdict(rows: list[dict]) -> str:
    """One line per parametrization: flat or not, and its largest flatness."""
    lines = []
    for p in PARAMETRIZATIONS:
        ratios = {name: r for (q, name), r in flatness(rows).items() if q == p}
        worst = max(ratios, key=lambda name: abs(math.log(ratios[name])))
        unflat = [name for name, r in ratios.items() if not flat(r)]
        said = f"not flat: {', '.join(unflat)}" if unflat else f"flat within {TOLERANCE:g}x"
        lines.append(f"{p}: {said} (furthest from flat: {worst}, {ratios[worst]:.2f}x)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="python -m gpt.coord_check", description=__doc__.split("\n")[0])
    parser.add_argument("--widths", default="64,128,256,512", help="widths (n_embd), comma-separated")
    parser.add_argument("--n_head", type=int, default=4, help="heads at every width: head size grows")
    parser.add_argument("--n_layer", type=int, default=2, help="blocks")
    parser.add_argument("--block_size", type=int, default=64, help="tokens per sequence")
    parser.add_argument("--batch_size", type=int, default=16, help="sequences per step")
    parser.add_argument("--steps", type=int, default=4, help="steps recorded, the first at initialisation")
    parser.add_argument("--seeds", type=int, default=2, help="seeds averaged over, from --seed upward")
    parser.add_argument("--seed", type=int, default=0, help="the first seed")
    parser.add_argument("--learning_rate", type=float, default=5e-3,
                        help="AdamW's constant rate (sp's, and mup's at the base width)")
    parser.add_argument("--mup_base_width", type=int, default=64, help="the width at which mup is sp")
    parser.add_argument("--data_dir", default="data", help="where datasets live")
    parser.add_argument("--dataset", default="shakespeare_char", help="folder under data_dir (train split)")
    parser.add_argument("--out", default="runs/coord_check", help="folder for coord.png, coord.csv, coord.md")
    args = parser.parse_args(argv)
    widths = sorted(set(positive_ints(parser, "--widths", args.widths)))
    if len(widths) < 2:
        parser.error("--widths needs two widths or more to compare")
    for option in ("n_head", "n_layer", "block_size", "batch_size", "steps", "seeds"):
        if getattr(args, option) < 1:
            parser.error(f"--{option} must be positive")
    if not (math.isfinite(args.learning_rate) and args.learning_rate > 0):
        parser.error("--learning_rate must be a positive number")
    seeds = list(range(args.seed, args.seed + args.seeds))
    try:
        check_seed(seeds[0])
        check_seed(seeds[-1])
        out = Path(user_path(args.out, "--out"))
        folder = ensure_prepared(args.data_dir, args.dataset)
        rows = coord_check(folder, widths, args.steps, seeds, args.n_head, args.n_layer, args.block_size,
                           args.batch_size, args.learning_rate, args.mup_base_width)
        write(rows, out)
    except UserError as e:
        parser.error(str(e))
    except OSError as e:    # the --out folder or a file in it cannot be written
        parser.error(f"cannot write {e.filename or args.out}: {e.strerror}")
    print(markdown(rows), end="")
    print(verdict(rows))
    print(f"wrote {out / 'coord.png'}, coord.csv and coord.md")
    return 0


if __name__ == "__main__":
    # | head: no traceback for the reader going away; Ctrl-C: one line
    with interrupt_in_one_line(), output_may_close(product=True):
        sys.exit(main())
