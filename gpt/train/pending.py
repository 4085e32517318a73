"""Each step's loss and gradient norm, kept on the device until the loop reads them all at once.

Reading a number computed on a GPU makes the CPU wait until the GPU gets there, so the CPU can no
longer queue the next step's kernels while the GPU works. The loop reads these every
log_interval steps and before an evaluation or a save, one wait each time, instead of twice a step.
"""

from __future__ import annotations

import torch


class Pending:
    """The steps since the last read: their iterations, and their (loss, gradient norm) on the device."""

    def __init__(self):
        self.iters: list[int] = []
        self.values: list[torch.Tensor] = []

    def add(self, it: int, loss: torch.Tensor, grad_norm: torch.Tensor) -> None:
        self.iters.append(it)
        self.values.append(torch.stack([loss.float(), grad_norm.float()]))

    def read(self) -> list[tuple[int, float, float]]:
        """(iteration, loss, gradient norm) of each step since the last read, oldest first; the
        one place the steps wait for the device."""
        if not self.iters:
            return []
        rows = torch.stack(self.values).tolist()                # (steps, 2)
        read = [(it, loss, norm) for it, (loss, norm) in zip(self.iters, rows)]
        self.iters, self.values = [], []
        return read
