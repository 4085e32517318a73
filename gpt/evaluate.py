"""Score a trained model on a whole split: python -m gpt.evaluate --out_dir=DIR [--split=val|test] [--stride=N] [--json]

Every token of the split after the first is scored once, in windows of block_size. With a stride
below block_size the windows overlap and each scores only its last `stride` tokens, so that every
scored token sees at least block_size - stride tokens of context. Prints the tokens scored, the
loss, bits per character (character and byte data) and perplexity; with --json, one JSON object.
"""

from __future__ import annotations

from .console import interrupt_quietly_while_loading

interrupt_quietly_while_loading(__name__)      # before torch loads

import math
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from . import checkpoint
from .cli import run_command
from .config import _check_choices, _named, check_types, opt, user_path
from .console import interrupt_in_one_line, output_may_close, to_json
from .data import bpc, load_meta, per_character, token_ids
from .errors import UserError
from .memory import out_of_memory_in_one_line
from .progress import progress


@dataclass
class EvaluateConfig:
    out_dir: str = opt("out", "run folder whose checkpoint is scored")
    ckpt: str = opt("best", "best: ckpt_best.pt, the lowest val loss, the one to report; latest: "
                    "ckpt.pt, the last saved", choices=("best", "latest"))
    split: str = opt("val", "the split scored: val.bin, or test.bin where the dataset has one",
                     choices=("val", "test"))
    stride: int = opt(0, "tokens scored per window, from its end; below block_size the windows "
                      "overlap and each token sees more context; 0 means block_size")
    batch_size: int = opt(64, "windows per forward pass")
    data_dir: str = opt("", "where the dataset lives; empty: the run's own data_dir")
    device: str = opt("auto", "auto picks cuda, then mps, then cpu")
    json: bool = opt(False, "print one JSON object (split, tokens, loss, bpc, perplexity), alone on "
                     "standard output")

    def __post_init__(self):
        check_types(self)
        _check_choices(self)
        _named(self, "out_dir")
        if self.data_dir.strip():
            self.data_dir = user_path(self.data_dir, "data_dir")
        if self.stride < 0:
            raise UserError(f"stride={self.stride} must not be negative; give 1 to block_size, "
                            "or 0 for block_size")
        if self.batch_size <= 0:
            raise UserError(f"batch_size={self.batch_size} must be positive")


# ---------------------------------------------------------------- windows

def windows(n: int, block_size: int, stride: int) -> tuple[np.ndarray, np.ndarray, int]:
    """The windows that score targets 1..n-1 of n tokens once each: (starts, first scored
    position in each, window length). Window k reads tokens starts[k]..starts[k]+length and scores
    its targets from position first[k] on: the first window all of them, each later one, `stride`
    further on, its last `stride`, and a last one, ending at the split's end, those left."""
    if n < 2:
        raise ValueError("fewer than two tokens hold no target")
    T = min(block_size, n - 1)
    if T < block_size:      # a split shorter than one window: one shorter window
        return np.zeros(1, np.int64), np.zeros(1, np.int64), T
    regular = (n - 1 - T) // stride + 1
    starts = np.arange(regular, dtype=np.int64) * stride
    first = np.full(regular, T - stride, np.int64)
    first[0] = 0
    left = n - 1 - (starts[-1] + T)     # targets after the last regular window
    if left:
        starts = np.append(starts, n - 1 - T)
        first = np.append(first, T - left)
    return starts, first, T


@torch.no_grad()
def score(model, ids, stride: int, batch_size: int = 64, desc: str = "scoring") -> tuple[float, int]:
    """(total loss in nats, tokens scored) of the model over ids (uint16 token ids, a memmap
    too) in the windows `windows` gives; stride 0 means block_size. The windows are gathered
    batch by batch and the losses summed on the device, read back once at the end."""
    block = model.config.block_size
    starts, first, T = windows(len(ids), block, stride or block)
    rows = np.lib.stride_tricks.sliding_window_view(ids, T + 1)     # a view: nothing is copied
    device = next(model.parameters()).device
    positions = torch.arange(T, device=device)
    vocab = model.config.vocab_size
    sums, scored = [], 0
    with progress(len(ids) - 1, desc, "tokens", unit_scale=True) as bar:
        for i in range(0, len(starts), batch_size):
            batch = rows[starts[i:i + batch_size]]                     # (B, T + 1), a copy
            if int(batch.max()) >= vocab:
                raise UserError(f"the split holds token id {int(batch.max())}, outside the model's "
                                f"vocabulary of {vocab}; prepare the dataset again")
            batch = torch.from_numpy(batch.astype(np.int64)).to(device)
            skip = torch.from_numpy(first[i:i + batch_size]).to(device)
            targets = batch[:, 1:].masked_fill(positions < skip[:, None], -1)    # -1: not scored here
            keep = T - int(first[i:i + batch_size].min())   # only these positions need logits
            logits = model.logits(model.hidden(batch[:, :-1])[:, -keep:])
            sums.append(F.cross_entropy(logits.flatten(0, 1).float(), targets[:, -keep:].flatten(),
                                        ignore_index=-1, reduction="sum"))
            count = T * len(batch) - int(first[i:i + batch_size].sum())
            scored += count
            bar.update(count)
    return torch.stack(sums).cpu().double().sum().item(), scored


# ---------------------------------------------------------------- the command

def load_for_scoring(cfg: EvaluateConfig, device: str) -> tuple[torch.nn.Module, dict]:
    """(model in eval mode on device, its checkpoint's plain values) for cfg's run and ckpt."""
    name, otherwise = checkpoint.chosen(Path(cfg.out_dir), cfg.ckpt, "evaluates")
    model, ckpt = checkpoint.load_for_inference(cfg.out_dir, device, name, otherwise,
                                                (*checkpoint.MODEL_KEYS, "train_config"))
    return model, {k: ckpt[k] for k in ("meta", "train_config")}


def dataset_folder(cfg: EvaluateConfig, saved: dict) -> Path:
    """The run's dataset folder, under --data_dir if given, checked to hold the run's vocabulary."""
    train = saved["train_config"]
    dataset, data_dir = train.get("dataset", ""), cfg.data_dir or train.get("data_dir", "")
    folder = Path(data_dir) / dataset
    if not folder.is_dir():
        where = "" if cfg.data_dir else f" (the run's data_dir, {data_dir})"
        raise UserError(f"no dataset folder {folder}{where}: the run trained on {dataset}; give "
                        f"--data_dir=FOLDER holding it")
    meta, ours = load_meta(folder), saved["meta"]
    keys = ("tokenizer", "vocab_size", "chars", "encoding")
    if [meta.get(k) for k in keys] != [ours.get(k) for k in keys]:
        raise UserError(f"{folder}'s vocabulary ({meta['tokenizer']}, {meta['vocab_size']} tokens) is not "
                        f"the run's ({ours['tokenizer']}, {ours['vocab_size']} tokens); give the "
                        "--data_dir holding the dataset the run trained on")
    return folder


def read_split(folder: Path, split: str) -> np.ndarray:
    """The split's token ids, mapped from disk rather than read."""
    path = folder / f"{split}.bin"
    if split == "test" and not path.exists():
        raise UserError(f"{folder} has no test.bin: this dataset has no test split; give --split=val")
    ids = token_ids(path)
    if len(ids) < 2:
        raise UserError(f"{path} holds {len(ids)} token{'s' * (len(ids) != 1)}; scoring needs at least 2")
    return ids


def evaluate(cfg: EvaluateConfig) -> dict:
    """The command's result: split, tokens, loss (mean nats per token), bpc (None for BPE data),
    perplexity, and what was scored (folder, window, stride) for the plain report."""
    from .train.runtime import resolve_device
    device = resolve_device(cfg.device)
    model, saved = load_for_scoring(cfg, device)
    block = model.config.block_size
    if cfg.stride > block:
        raise UserError(f"stride={cfg.stride} is more than the model's block_size={block}: tokens "
                        f"between windows would go unscored; give --stride from 1 to {block} "
                        f"(0 means {block})")
    folder = dataset_folder(cfg, saved)
    ids = read_split(folder, cfg.split)
    stride = cfg.stride or block
    with out_of_memory_in_one_line("lower --batch_size"):
        total, tokens = score(model, ids, stride, cfg.batch_size, f"scoring {cfg.split}")
    loss = total / tokens
    try:
        perplexity = math.exp(loss)
    except OverflowError:
        perplexity = math.inf
    return {"split": cfg.split, "tokens": tokens, "loss": loss,
            "bpc": bpc(loss) if per_character(saved["meta"]) else None, "perplexity": perplexity,
            "folder": str(folder), "window": min(block, len(ids) - 1), "stride": min(stride, len(ids) - 1)}


def score_text(result: dict) -> str:
    bits = f", {result['bpc']:.4f} bpc" if result["bpc"] is not None else ""
    return (f"{result['split']} split of {result['folder']}: {result['tokens']:,} tokens scored in windows "
            f"of {result['window']}, stride {result['stride']}\n"
            f"loss {result['loss']:.4f} nats{bits}, perplexity {result['perplexity']:.2f}")


JSON_KEYS = ("split", "tokens", "loss", "bpc", "perplexity")


def main(argv: list[str] | None = None) -> int:
    return run_command("-m gpt.evaluate", EvaluateConfig, argv, evaluate,
                       lambda cfg, result: (to_json({k: result[k] for k in JSON_KEYS}) if cfg.json
                                            else score_text(result)))


if __name__ == "__main__":
    # the numbers are the product; | head: no traceback; Ctrl-C: one line
    with interrupt_in_one_line(), output_may_close(product=True):
        sys.exit(main())
