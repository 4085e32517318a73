"""Evaluation: the mean loss of each split over the same evenly spaced windows every time."""

from __future__ import annotations

import numpy as np
import torch

from ..data import Batches
from ..model import GPT


@torch.no_grad()
def mean_losses(model: GPT, batches: Batches, splits, n_batches: int, batch_size: int, autocast,
                interrupted=lambda: False, advance=lambda: None, rank: int = 0, world: int = 1) -> dict | None:
    """{split_loss: mean loss} over the evaluation windows, or None once interrupted() is true;
    advance() is called after each batch. Of `world` processes, each scores every world-th batch
    from its rank on, and all get every batch's loss: the mean is the one process's to the bit.
    The losses stay on the device until the end, so the device is waited for once a split."""
    model.eval()
    try:
        out = {}
        for split in splits:
            xs, ys = batches.evenly_spaced(split, n_batches, batch_size)
            losses = torch.zeros(n_batches, device=xs.device)
            for i in range(rank, n_batches, world):
                if interrupted():
                    return None
                with autocast:
                    losses[i] = model(xs[i], ys[i])[1].float()
                advance()
            if world > 1:       # zeros but at each rank's own batches: the sum is every loss, exactly
                torch.distributed.all_reduce(losses)
            out[f"{split}_loss"] = float(np.mean(losses.tolist()))
        return out
    finally:
        model.train()
