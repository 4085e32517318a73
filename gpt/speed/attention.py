"""Attention on a CPU: F.scaled_dot_product_attention kept in float32, and exact where the CPU rounds.

Two of SDPA's CPU kernels are slower than the model around them: in bfloat16 (autocast) it is
slower going backward than float32 attention, and with matmul_precision=medium on a CPU with AMX
its many small block products are rounded to bfloat16 like the linear layers, which makes it
slower, not faster. So on a CPU attention runs in float32, and under rounding it builds its own
small graph with exact matmuls forward and backward. docs/performance.md gives the figures.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .precision import cpu_rounds_matmuls, exact_cpu_matmuls


class _ExactAttention(torch.autograd.Function):
    """F.scaled_dot_product_attention, forward and backward, with exact float32 CPU matmuls: its
    own small graph, built exact in forward and gone back through, again exact, in backward. The
    setting is process-wide: another thread's matmuls would be exact meanwhile."""

    @staticmethod
    def forward(ctx, q, k, v, attn_mask, dropout_p, is_causal):
        inputs = [t.detach().requires_grad_(t.requires_grad) for t in (q, k, v)]
        with torch.enable_grad(), exact_cpu_matmuls():
            y = F.scaled_dot_product_attention(*inputs, attn_mask=attn_mask, dropout_p=dropout_p,
                                               is_causal=is_causal)
        ctx.graph = (inputs, y)
        return y.detach()

    @staticmethod
    def backward(ctx, grad_y):
        if ctx.graph is None:
            raise RuntimeError("attention at matmul_precision=medium goes backward once; for "
                               "retain_graph use matmul_precision=high")
        (inputs, y), ctx.graph = ctx.graph, None    # freed now, not with the loss a step later
        wanted = [t for t in inputs if t.requires_grad]
        # through a scalar: handing autograd.grad a gradient tensor imports sympy, slow to load;
        # a backward called under inference_mode hands over a gradient autograd may not save
        with torch.inference_mode(False), torch.enable_grad(), exact_cpu_matmuls():
            grad_y = grad_y.clone() if grad_y.is_inference() else grad_y
            grads = iter(torch.autograd.grad((y * grad_y).sum(), wanted))
        return (*(next(grads) if t.requires_grad else None for t in inputs), None, None, None)


def attention(q, k, v, attn_mask, dropout_p: float, is_causal: bool) -> torch.Tensor:
    """F.scaled_dot_product_attention, the same arguments; on a CPU in float32, and exact there.
    k and v may have fewer heads than q (grouped-query attention), each shared by a group of q's."""
    if q.device.type == "cpu":
        if q.dtype in (torch.bfloat16, torch.float16):
            # its bfloat16 kernel is slower backward than the linear layers gain (compiled too)
            with torch.autocast("cpu", enabled=False):
                y = attention(q.float(), k.float(), v.float(), attn_mask, dropout_p, is_causal)
            return y.to(q.dtype)
        # torch.compile cannot trace the check; it makes its own attention kernels anyway
        if not torch.compiler.is_compiling() and cpu_rounds_matmuls():
            k, v = _repeat_kv(k, q.size(1)), _repeat_kv(v, q.size(1))     # its matmuls want every head
            return _ExactAttention.apply(q, k, v, attn_mask, dropout_p, is_causal)
    if attn_mask is not None:
        attn_mask = attn_mask.to(q.dtype)       # float32 as made; SDPA wants the queries' dtype
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p,
                                          is_causal=is_causal, enable_gqa=k.size(1) != q.size(1))


def _repeat_kv(x: torch.Tensor, n_head: int) -> torch.Tensor:
    """Keys or values (B, nkv, T, hs) with each head repeated for its group of queries: (B, nh, T, hs)."""
    return x if x.size(1) == n_head else x.repeat_interleave(n_head // x.size(1), dim=1)



def attach_attention(model: torch.nn.Module) -> torch.nn.Module:
    """Give each attention layer of model (a GPT) this file's `attention` in place of its own plain
    SDPA: the same results in float32, kept in float32 and exact on a CPU. Returns model."""
    for module in model.modules():
        if hasattr(module, "attend"):
            module.attend = attention
    return model
