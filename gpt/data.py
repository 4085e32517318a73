"""Prepared datasets on disk, and the batch sampler that draws windows from them.

A prepared dataset is a folder with train.bin and val.bin (uint16 token ids) and meta.json,
which says how to turn text into ids: {"tokenizer": "char", "vocab_size": N, "chars": [...]},
{"tokenizer": "byte", "vocab_size": 256} or {"tokenizer": "tiktoken", "vocab_size": N,
"encoding": "gpt2"}, in UTF-8. No pickle anywhere. A dataset may also hold test.bin, which
training never reads: only `python -m gpt.evaluate --split=test` does.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import torch

from .errors import UserError


def load_meta(folder: Path) -> dict:
    path = folder / "meta.json"
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:      # ValueError: not JSON, or not UTF-8
        raise UserError(f"cannot read {path}: {e}") from None
    if not valid_meta(meta):
        raise UserError(f"{path} is not a valid dataset description (needs tokenizer, vocab_size and, "
                        "for 'char', its distinct characters, for 'byte', 256, for 'tiktoken', the "
                        "encoding's name); "
                        "prepare the dataset again")
    return meta


def valid_meta(meta) -> bool:
    """Whether meta describes a tokenizer fully: checked where it is read, so that sampling never
    finds out, after training, that the vocabulary cannot decode."""
    if not isinstance(meta, dict):
        return False
    size, kind = meta.get("vocab_size"), meta.get("tokenizer")
    if not (isinstance(size, int) and size > 0):
        return False
    if kind == "char":
        chars = meta.get("chars")
        return (isinstance(chars, list) and len(chars) == size and len(set(chars)) == size
                and all(isinstance(c, str) and len(c) == 1 for c in chars))
    if kind == "byte":
        return size == 256
    return kind == "tiktoken" and isinstance(meta.get("encoding"), str)


def per_character(meta: dict) -> bool:
    """Whether a token is one character (or one byte), so that loss / ln 2 is bits per character,
    the unit of the character-level papers; not for BPE, whose tokens span several characters."""
    return meta.get("tokenizer") in ("char", "byte")


def bpc(loss: float) -> float:
    """Bits per character from a mean loss in nats per character."""
    return loss / math.log(2)


def token_ids(path: Path) -> np.ndarray:
    """A split's uint16 token ids, mapped from disk rather than read: a split may outgrow memory."""
    if not path.is_file():
        raise UserError(f"{path} is not a file; remove it and prepare the dataset again")
    size = path.stat().st_size
    if size % 2:
        raise UserError(f"{path} has an odd number of bytes; it is not uint16 token ids")
    return np.memmap(path, dtype=np.uint16, mode="r") if size else np.zeros(0, np.uint16)


# ---------------------------------------------------------------- batches

class Batches:
    """Random windows of block_size + 1 tokens, drawn by a generator whose state is saved in
    checkpoints. All micro-batches of one optimizer step are drawn at once, so a run split over
    several processes sees exactly the batches of one process accumulating the same steps."""

    def __init__(self, folder: Path, block_size: int, batch_size: int, device, seed: int,
                 vocab_size: int | None = None):
        self.block_size, self.batch_size, self.device = block_size, batch_size, device
        self.data, self.ids = {}, {}
        for split in ("train", "val"):
            path = folder / f"{split}.bin"
            ids = token_ids(path)
            if len(ids) < block_size + 1:
                raise UserError(f"{split} split of {folder} has {len(ids)} tokens, too few for "
                                f"block_size={block_size}; lower block_size or use more text")
            if vocab_size is not None and len(ids) and int(ids.max()) >= vocab_size:
                raise UserError(f"{path} holds token id {int(ids.max())}, outside meta.json's "
                                f"vocabulary of {vocab_size}; prepare the dataset again")
            # a view, not a copy: datasets larger than memory work, and a batch is one gather
            self.data[split] = np.lib.stride_tricks.sliding_window_view(ids, block_size + 1)
            self.ids[split] = ids
        self.generator = torch.Generator().manual_seed(seed)
        self.pin = torch.device(device).type == "cuda"

    def draw(self, split: str, n_batches: int):
        """n_batches micro-batches as (x, y) with shapes (n_batches, B, T)."""
        windows = self.data[split]
        ix = torch.randint(len(windows), (n_batches * self.batch_size,), generator=self.generator)
        batch = self._gather(windows, ix.numpy(), n_batches, self.batch_size)
        if self.pin:
            batch = batch.pin_memory().to(self.device, non_blocking=True)
        elif batch.device != torch.device(self.device):
            batch = batch.to(self.device)
        return batch[..., :-1], batch[..., 1:]

    def evenly_spaced(self, split: str, n_batches: int, batch_size: int):
        """n_batches micro-batches of batch_size windows spread evenly over the split, (n_batches,
        B, T) each for x and y. The windows depend on n_batches * batch_size and block_size alone,
        so every evaluation of every run with those scores the same text, spread from the split's
        start to its end (a sample of it, not all of it: `diagnostics.whole_split_loss` scores
        every token), and the estimate has less variance than random windows."""
        windows = self.data[split]
        ix = np.linspace(0, len(windows) - 1, n_batches * batch_size).astype(np.int64)
        batch = self._gather(windows, ix, n_batches, batch_size).to(self.device)
        return batch[..., :-1], batch[..., 1:]

    def _gather(self, windows: np.ndarray, ix: np.ndarray, n_batches: int, batch_size: int) -> torch.Tensor:
        rows = torch.from_numpy(windows[ix].astype(np.int64))               # (n * B, T + 1)
        return rows.view(n_batches, batch_size, self.block_size + 1)

    def state(self) -> torch.Tensor:
        return self.generator.get_state()

    def set_state(self, state: torch.Tensor) -> None:
        self.generator.set_state(state)
