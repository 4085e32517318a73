"""Evaluation: the mean loss of each split over the same evenly spaced windows every time."""

from __future__ import annotations

import numpy as np
import torch

from ..data import Batches
from ..model import GPT


@torch.no_grad()
def mean_losses(model: GPT, batches: Batches, splits, n_batches: int, batch_size: int, autocast,
                interrupted=lambda: False, advance=lambda: None) -> dict | None:
    """{split_loss: mean loss} over the evaluation windows, or None once interrupted() is true;
    advance() is called after each batch."""
    model.eval()
    try:
        out = {}
        for split in splits:
            xs, ys = batches.evenly_spaced(split, n_batches, batch_size)
            losses = []
            for x, y in zip(xs, ys):
                if interrupted():
                    return None
                with autocast:
                    losses.append(model(x, y)[1].item())
                advance()
            out[f"{split}_loss"] = float(np.mean(losses))
        return out
    finally:
        model.train()
