"""How a run ends, as others read it: train.py's exit statuses, the status a sweep records, a loss as printed.

The loop and train.py write these and the sweep reads them, so the sweep needs no part of the loop.
"""

from __future__ import annotations

from ..data import bpc

DIVERGED_EXIT = 3       # train.py's exit status for Diverged, so a sweep can tell it from a failure
PRUNED_EXIT = 4         # and for Hopeless: stopped by stop_hopeless, above the unigram level
PAUSED_EXIT = 5         # ended at pause_at, saved, with steps left for --resume


def run_status(returncode: int) -> str:
    """The status a sweep records for a run that ended with returncode: finished, diverged, pruned,
    paused or failed."""
    return {0: "finished", DIVERGED_EXIT: "diverged", PRUNED_EXIT: "pruned",
            PAUSED_EXIT: "paused"}.get(returncode, "failed")


def loss_text(loss: float, in_bpc: bool) -> str:
    """A loss as a run's lines show it, with in_bpc its bits per character beside it."""
    return f"{loss:.4f} ({bpc(loss):.3f} bpc)" if in_bpc else f"{loss:.4f}"
