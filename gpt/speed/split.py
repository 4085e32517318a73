"""CPU training steps whose micro-batch is split by rows between threads (`thread_split`).

torch runs each op of a step on all its threads, which meet at the end of every op; on the small
models a CPU trains, a step is a few hundred short ops, and the threads spend much of it waiting
for each other (docs/performance.md). Here each thread takes its own rows of the micro-batch
through the whole forward and backward on one core, and the threads meet once, when their
gradients are added. The gradients are the batch's, summed in a fixed order, so a run is as
repeatable as before; they differ from an unsplit step's in rounding alone.

Dropout draws its masks from torch's one generator, in whatever order the threads reach it, so a
run with dropout does not split; nor does a compiled model, whose compiler is not made for being
called from several threads at once, a run over several processes, or a CPU that rounds matmul
inputs (AMX at matmul_precision=medium), whose exact attention flips a process-wide setting.
"""

from __future__ import annotations

import contextlib
from concurrent.futures import ThreadPoolExecutor, wait

import torch

from ..config import GPTConfig, TrainConfig
from ..errors import UserError
from .precision import torch_level

# Each part's Python code holds the interpreter lock while it calls its ops, so parts queue for it
# as they grow in number, so auto splits only up to this many threads (docs/performance.md says
# which counts were measured).
AUTO_MAX_THREADS = 4


def split_plan(model_cfg: GPTConfig, cfg: TrainConfig, device: str, world: int, threads: int) -> int:
    """How many row parts each micro-batch is split into (1 runs it whole, as torch splits ops).
    Where `batch` was asked for and cannot be, says why; `auto` decides without a word."""
    if cfg.thread_split == "ops":
        return 1
    why_not = [why for why, holds in (
        (f"device={device} runs each op on the device; the split is for CPU runs",
         torch.device(device).type != "cpu"),
        (f"dropout={model_cfg.dropout} draws masks in the threads' order", model_cfg.dropout > 0),
        ("compile=true: a compiled model is not called from several threads", cfg.compile),
        (f"a run over {world} processes splits its batch between them already", world > 1),
        ("matmul_precision=medium on this CPU makes attention flip a process-wide setting",
         torch_level(cfg.matmul_precision, "cpu") == "medium"),
        ("the run gets one CPU thread (--threads sets the count, and a sweep's --jobs divides "
         "the CPUs between its runs)", threads < 2),
        (f"batch_size={cfg.batch_size} has one row", cfg.batch_size < 2)) if holds]
    if cfg.thread_split == "batch" and why_not:
        raise UserError(f"thread_split=batch cannot split this run: {why_not[0]}; pass "
                        "--thread_split=auto or ops")
    if cfg.thread_split == "auto" and (why_not or threads > AUTO_MAX_THREADS):
        return 1
    return min(threads, cfg.batch_size)


class RowSplit:
    """Forward and backward of a micro-batch in `parts` threads of one core each (this one and
    parts - 1 helpers), the gradients added into the parameters' .grad in the parts' order."""

    def __init__(self, model: torch.nn.Module, params: list[torch.Tensor], parts: int,
                 autocast_dtype: torch.dtype, flush_denormal: bool):
        self.model, self.parts = model, parts
        self.params = [p for p in params if p.requires_grad]    # as .backward() leaves frozen ones
        self.dtype = autocast_dtype
        self.threads = torch.get_num_threads()
        # this thread takes the first part itself
        self.pool = ThreadPoolExecutor(parts - 1, thread_name_prefix="rows",
                                       initializer=_one_core, initargs=(flush_denormal,))
        # The rest of a step (clipping, the optimizer) on this thread's one core too: a thread
        # that runs parallel ops keeps its helper threads spinning a while after each, on the
        # cores the parts need, which made steps slower than unsplit ones
        torch.set_num_threads(1)

    @contextlib.contextmanager
    def all_threads(self):
        """For what runs outside the steps (evaluation): this thread's ops on all the threads."""
        torch.set_num_threads(self.threads)
        try:
            yield
        finally:
            torch.set_num_threads(1)

    def _part(self, x: torch.Tensor, y: torch.Tensor, share: float, scale: float):
        # autocast is per thread, and its context object keeps state: one per call
        autocast = (torch.autocast("cpu", dtype=self.dtype) if self.dtype != torch.float32
                    else contextlib.nullcontext())
        with autocast:
            _, loss = self.model(x, y)
        # allow_unused: a parameter no path reaches gets None, as .backward() leaves its .grad
        grads = torch.autograd.grad(loss * (share * scale), self.params, allow_unused=True)
        return loss.detach() * share, grads

    def backward(self, x: torch.Tensor, y: torch.Tensor, scale: float) -> torch.Tensor:
        """Adds the gradients of `scale` times the mean loss over x's rows into .grad, and returns
        that mean loss, detached. Every target of a training batch is scored (none is -1), so a
        part's loss weighs by its share of the rows."""
        rows = len(x)
        (x0, *xs), (y0, *ys) = x.tensor_split(self.parts), y.tensor_split(self.parts)
        futures = [self.pool.submit(self._part, xi, yi, len(xi) / rows, scale) for xi, yi in zip(xs, ys)]
        try:
            first = self._part(x0, y0, len(x0) / rows, scale)
        finally:
            wait(futures)       # all of them, so none runs on once one has failed
        results = [first, *(f.result() for f in futures)]
        for _, grads in results:
            for p, g in zip(self.params, grads):
                if g is None:
                    continue
                if p.grad is None:
                    # in the parameter's layout, as .backward() leaves it: the fused AdamW kernel
                    # reads both as flat memory, and a weight may be stored transposed
                    p.grad = g if g.stride() == p.stride() else torch.empty_like(p).copy_(g)
                else:
                    p.grad.add_(g)
        return sum(loss for loss, _ in results)

    def close(self) -> None:
        try:
            self.pool.shutdown()    # a Ctrl-C while a part finishes must not cost the caller threads
        finally:
            torch.set_num_threads(self.threads)


def _one_core(flush_denormal: bool) -> None:
    torch.set_num_threads(1)        # OpenMP keeps a count per thread: a helper's own ops on one core
    torch.set_flush_denormal(flush_denormal)    # a thread's float state is its own
