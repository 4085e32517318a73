"""Speed code, for CPUs above all, kept out of the model and the loop a reader studies.

The model reaches it through three names: `attention` (SDPA, kept in float32 and exact on a
CPU), `exact_matmuls` (a block of exact float32 matmuls) and `lay_out_weights`; the training
run's setup through precision.py (matmul_precision), split.py (thread_split), allocator.py
(glibc's settings) and optim.py (AdamW without torch.optim's start-up, which short CPU runs feel);
sample.py through threads.py (the thread count of one-token steps on a busy machine).
docs/performance.md gives the figures behind each choice.
"""

from .attention import attention
from .layout import lay_out_weights
from .precision import exact_cpu_matmuls as exact_matmuls

__all__ = ["attention", "exact_matmuls", "lay_out_weights"]
