"""Speed code, for CPUs above all, kept out of the model and the loop a reader studies.

The model never imports it: the code that builds a model hands it this package's attention with
`attach_attention` (SDPA, kept in float32 and exact on a CPU), and sampling lays its weights out with
`lay_out_weights`; `exact_matmuls` is a block of exact float32 matmuls. The training
run's setup through precision.py (matmul_precision), split.py (thread_split), allocator.py
(glibc's settings) and optim.py (AdamW without torch.optim's start-up, which short CPU runs feel);
sample.py through threads.py (the thread count of one-token steps on a busy machine).
docs/performance.md gives the figures behind each choice.
"""

from .attention import attach_attention, attention
from .layout import lay_out_weights
from .precision import exact_cpu_matmuls as exact_matmuls

__all__ = ["attach_attention", "attention", "exact_matmuls", "lay_out_weights"]
