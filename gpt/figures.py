"""Pictures of a trained model and of a run.

    python -m gpt.figures attention --out_dir=DIR --start="ROMEO: ..."   # DIR/attention.png
    python -m gpt.figures run DIR                                         # DIR/dashboard.png

`attention` draws every head of every layer for a prompt, with its characters on the axes and
one colour bar for the attention probabilities.
`run` draws one page from metrics.jsonl: losses against the unigram level, the learning rate, and
per block the gradient norm, update size, residual RMS, position similarity and head entropy.
"""

from __future__ import annotations

from .console import interrupt_quietly_while_loading

interrupt_quietly_while_loading(__name__)      # before torch loads

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from . import checkpoint
from .config import user_path
from .console import Parser, interrupt_in_one_line, output_may_close
from .errors import UserError, say_error
from .sweep.plots import bpc_axis
from .tokenizers import encode_prompt, read_prompt
from .train.metrics import read_metrics

if TYPE_CHECKING:
    from matplotlib.figure import Figure

DEFAULT_PROMPT = "ROMEO: But soft, what light"


def pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def attention_figure(out_dir: Path, prompt: str, out: Path) -> Path:
    model, tok = checkpoint.load_for_sampling(out_dir)
    ids = encode_prompt(tok, read_prompt(prompt), default=prompt == DEFAULT_PROMPT)
    block = model.config.block_size
    if len(ids) > block:
        print(f"note: the prompt has {len(ids)} tokens; the picture shows its last {block} (block_size)")
        ids = ids[-block:]
    if not ids:
        raise UserError("--start is empty; give the prompt whose attention to draw")
    maps = model.attention_maps(torch.tensor([ids]))               # per layer (1, nh, T, T)
    save_figure(attention_maps_figure(maps, [repr(tok.decode([i]))[1:-1] or " " for i in ids]), out)
    return out


def attention_maps_figure(maps: list[torch.Tensor], labels: list[str]) -> Figure:
    """Every head of every layer (maps: per layer (1, n_head, T, T)), its T characters (labels) on
    the axes, and one colour bar: all panels share its 0..1 scale of attention probability."""
    n_layer, n_head, count = len(maps), maps[0].size(1), len(labels)
    plt = pyplot()
    # a panel grows with the prompt, but the figure stays within 48 inches a side: image viewers
    # (and Pillow) refuse pictures of hundreds of megapixels; labels only on panels at full size
    size = min(1.2 + 0.12 * count, 48 / max(n_head, n_layer))
    ticks, tick_labels = (range(count), labels) if size >= 1.2 + 0.12 * count else ([], [])
    fig, axes = plt.subplots(n_layer, n_head, figsize=(size * n_head, size * n_layer), squeeze=False,
                             layout="constrained")
    for layer, weights in enumerate(maps):
        for head in range(n_head):
            ax = axes[layer][head]
            image = ax.imshow(weights[0, head].numpy(), cmap="viridis", vmin=0, vmax=1)
            ax.set_title(f"layer {layer} head {head}", fontsize=8)
            ax.set_xticks(ticks, tick_labels, fontsize=6, rotation=90)
            ax.set_yticks(ticks, tick_labels, fontsize=6)
    # its width and gap sized by one panel, not by the whole row of them
    fig.colorbar(image, ax=axes, fraction=0.15 / n_head, pad=0.05 / n_head, shrink=min(1.0, 4 / n_layer),
                 label="attention probability")
    fig.supxlabel("attended-to character (key)")
    fig.supylabel("attending character (query)")
    return fig


def check_picture_name(out: Path, what: str = "--out") -> None:
    """Refuse a picture's name matplotlib cannot write, or a folder for it that is a file."""
    from matplotlib.figure import Figure
    if out.suffix[1:].lower() not in Figure().canvas.get_supported_filetypes():
        raise UserError(f"{what} {out}: a picture's name must end in a format matplotlib writes, "
                        "such as .png, .pdf or .svg")
    existing = next(p for p in out.absolute().parents if p.exists())
    if not existing.is_dir():
        raise UserError(f"{what} {out}: {existing} is a file, not a folder")


def save_figure(fig, out: Path) -> None:
    """Write fig to out, its folders made, and close it; a disk's refusal as one line."""
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        if fig.get_layout_engine() is None:     # a constrained layout keeps its colour bar in place
            fig.tight_layout()
        fig.savefig(out, dpi=100)
    except OSError as e:
        raise UserError(f"the picture {out} cannot be written ({e.strerror})") from None
    finally:
        pyplot().close(fig)


def _per_block(ax, evals, key, title, log=False):
    iters = [e["iter"] for e in evals if key in e]
    if not iters:
        ax.set_visible(False)
        return
    values = [e[key] for e in evals if key in e]
    for block in range(len(values[0])):
        ax.plot(iters, [v[block] for v in values], label=f"block {block}")
    ax.set_title(title, fontsize=9)
    ax.set_xlabel("iteration", fontsize=8)
    if log:
        ax.set_yscale("log")
    ax.legend(fontsize=6)
    ax.grid(alpha=0.3)


def run_figure(run_dir: Path, out: Path) -> Path:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        if checkpoint.is_sweep(run_dir):
            raise UserError(f"{run_dir} is a sweep: its curves are in {run_dir / 'curves.png'} "
                            f"(python -m gpt.sweep report {run_dir}); or give one of its runs")
        raise UserError(f"{path} does not exist; is {run_dir} a training run's out_dir?")
    log = read_metrics(path)
    rows = log.rows
    if not rows and path.stat().st_size:    # bytes, but not one line a run writes
        raise UserError(f"{path} holds no line of a training run's; is it damaged or another program's?")
    for problem in log.problems():
        print(problem, file=sys.stderr)
    # lines without the losses (another program's) are left out; the values are taken as written
    evals = [r for r in rows if r["kind"] == "eval" and "val_loss" in r]
    scored = [e for e in evals if "train_loss" in e]    # eval_train=false scores it at the end alone
    steps = [r for r in rows if r["kind"] == "train" and {"loss", "lr"} <= r.keys()]
    if not evals:
        raise UserError(f"{path} has no evaluation yet")
    plt = pyplot()
    fig, axes = plt.subplots(2, 4, figsize=(18, 8))
    ax = axes[0][0]
    if steps:
        ax.plot([r["iter"] for r in steps], [r["loss"] for r in steps], alpha=0.3, label="train (step)")
    ax.plot([e["iter"] for e in scored], [e["train_loss"] for e in scored], "o-", label="train (eval)")
    ax.plot([e["iter"] for e in evals], [e["val_loss"] for e in evals], "o-", label="val")
    if "unigram_loss" in evals[-1]:
        ax.axhline(evals[-1]["unigram_loss"], color="gray", ls="--", label="unigram level")
    ax.set_title("loss", fontsize=9)
    if "val_bpc" in evals[-1]:
        bpc_axis(ax)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    ax = axes[0][1]
    # train lines come every log_interval; eval lines carry the rate too, up to the last step
    lrs = sorted({r["iter"]: r["lr"] for r in steps + [e for e in evals if "lr" in e]}.items())
    ax.plot([it for it, _ in lrs], [lr for _, lr in lrs])
    ax.set_title("learning rate", fontsize=9)
    ax.grid(alpha=0.3)
    _per_block(axes[0][2], evals, "block_grad_norm", "gradient norm per block", log=True)
    _per_block(axes[0][3], evals, "block_update_ratio", "update / weight per block", log=True)
    _per_block(axes[1][0], evals, "block_rms", "residual stream RMS after each block", log=True)
    _per_block(axes[1][1], evals, "block_pos_sim", "position similarity after each block (1 = all alike)")
    ax = axes[1][2]
    last = evals[-1].get("head_entropy")
    if last:
        import numpy as np
        image = ax.imshow(np.array(last), cmap="magma", aspect="auto")
        ax.set_xticks(range(len(last[0])))
        ax.set_yticks(range(len(last)))
        ax.set_xlabel("head", fontsize=8)
        ax.set_ylabel("layer", fontsize=8)
        ax.set_title(f"attention entropy (nats) at iteration {evals[-1]['iter']}", fontsize=9)
        fig.colorbar(image, ax=ax)
    else:
        ax.set_visible(False)
    axes[1][3].set_visible(False)
    fig.suptitle(str(run_dir))
    save_figure(fig, out)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="python -m gpt.figures")
    sub = parser.add_subparsers(dest="command", required=True)
    att = sub.add_parser("attention", help="attention maps of a checkpoint for a prompt")
    run = sub.add_parser("run", help="one-page dashboard of a run's metrics")
    for command, holding, picture in ((att, "ckpt.pt", "attention.png"), (run, "metrics.jsonl", "dashboard.png")):
        # the folder either way: as train.py and sample.py take it, or as gpt.sweep report does
        command.add_argument("run_dir", nargs="?", help=f"run folder holding {holding}")
        command.add_argument("--out_dir", help="the same, given as train.py and sample.py take it")
        command.add_argument("--out", help=f"PNG to write (default RUN_DIR/{picture})")
    att.add_argument("--start", default=DEFAULT_PROMPT,
                     help="the prompt, or FILE:path to read it from a file")
    args = parser.parse_args(argv)
    if (args.run_dir is None) == (args.out_dir is None):
        (att if args.command == "attention" else run).error(
            "give the run folder once, as RUN_DIR or as --out_dir=RUN_DIR")
    try:
        folder = Path(user_path(*((args.out_dir, "--out_dir") if args.out_dir is not None
                                  else (args.run_dir, "RUN_DIR"))))
        if folder.is_file():    # a checkpoint or metrics.jsonl given for the folder holding it
            raise UserError(f"{folder} is a file, not a run folder; give {folder.parent}")
        out = Path(user_path(args.out, "--out") if args.out else
                   folder / ("attention.png" if args.command == "attention" else "dashboard.png"))
        check_picture_name(out)        # before loading or drawing anything
        if args.command == "attention":
            path = attention_figure(folder, args.start, out)
        else:
            path = run_figure(folder, out)
    except UserError as e:
        say_error(e)
        return 2
    print(path)
    return 0


if __name__ == "__main__":
    # the picture is the product, the path printed a courtesy; Ctrl-C: one line
    with interrupt_in_one_line(), output_may_close():
        sys.exit(main())
