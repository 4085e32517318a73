"""Muon's orthogonalisation by row blocks (muon_split): where each matrix is cut, and each block made orthogonal apart.

With muon_split=fused, each matrix is orthogonalised whole, as torch.optim.Muon does (gpt/speed/optim.py). With
qkv or heads, SplitMuon takes the same momentum step but cuts the smoothed update of c_attn into
its query, key and value rows (qkv), into each head's rows of them (heads), or into groups of
muon_head_group heads' rows, queries, keys and values apart (groups; "Group Muon", 2026), and a gated
MLP's c_fc into its gate and up halves (all three; heads have no meaning there). Every block is orthogonalised
on its own, by the same Newton-Schulz iteration, and scaled by the factor of its own shape, so a
block with small gradients (queries and keys, often) gets a step as large as its neighbours'. The
momentum stays one tensor of the matrix's shape: the state and checkpoints keep their form.
"""

from __future__ import annotations

import math
from collections import defaultdict

import torch

from .speed.optim import Muon


def row_blocks(model: torch.nn.Module, split: str, group: int = 1) -> dict[int, tuple[int, ...]]:
    """The row blocks `split` cuts the blocks' c_attn and (gated) c_fc weights into, by id of the
    weight; a matrix left out stays whole. group: heads per block under split=groups."""
    c = model.config
    kv = c.kv_heads * c.head_size
    attn = {"qkv": (c.n_embd, kv, kv), "heads": (c.head_size,) * (c.n_head + 2 * c.kv_heads),
            "groups": (group * c.head_size,) * ((c.n_head + 2 * c.kv_heads) // group)}
    cuts = {}
    if split == "fused":
        return cuts
    for block in model.transformer.h:
        cuts[id(block.attn.c_attn.weight)] = attn[split]
        if c.gated:     # Gated takes the first half as the gate, the second as the value
            cuts[id(block.mlp.c_fc.weight)] = (c.mlp_hidden, c.mlp_hidden)
    return cuts


def shape_factor(rows: int, cols: int) -> float:
    """torch.optim.Muon's default scale of a rows x cols update: an orthogonal matrix taller than
    wide has RMS below 1/sqrt(cols), which this makes up."""
    return math.sqrt(max(1.0, rows / cols))


def newton_schulz(g: torch.Tensor, coefficients: tuple[float, float, float], steps: int,
                  eps: float, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """The orthogonal factor of each (rows <= cols) matrix in the batch g (n, rows, cols), nearly:
    torch.optim.Muon's quintic iteration, in dtype (torch's bfloat16), with batched products."""
    a, b, c = coefficients
    x = g.to(dtype)
    x = x / x.norm(dim=(-2, -1), keepdim=True).clamp(min=eps)      # spectral norm at most 1
    for _ in range(steps):
        gram = x @ x.mT
        x = torch.baddbmm(x, torch.baddbmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x


def wide(block: torch.Tensor) -> torch.Tensor:
    """The block laid with no more rows than columns, so the iteration's Gram matrix is the smaller."""
    return block.mT if block.size(0) > block.size(1) else block


def orthogonalise(updates: list[torch.Tensor], rows: list[tuple[int, ...]], group: dict,
                  dtype: torch.dtype = torch.bfloat16) -> list[torch.Tensor]:
    """Each update cut into its row blocks, every block replaced by its orthogonal factor times its
    own shape factor; the blocks of one shape, over all matrices, in one batched iteration in dtype."""
    steps = [torch.empty_like(u) for u in updates]
    same_shape = defaultdict(list)
    for update, step, cuts in zip(updates, steps, rows):
        for block, out in zip(update.split(cuts), step.split(cuts)):
            same_shape[wide(block).shape].append((block, out))
    for pairs in same_shape.values():
        ortho = newton_schulz(torch.stack([wide(block) for block, _ in pairs]),
                              group["ns_coefficients"], group["ns_steps"], group["eps"], dtype)
        for (block, out), o in zip(pairs, ortho):
            wide(out).copy_(o).mul_(shape_factor(*block.shape))
    return steps


class SplitMuon(Muon):
    """torch.optim.Muon's step (Nesterov momentum, decoupled weight decay) with each matrix's
    update orthogonalised by the row blocks `rows` gives it (by id; whole where absent)."""

    def __init__(self, params: list[torch.Tensor], rows: dict[int, tuple[int, ...]], **options):
        super().__init__(params, **options)
        self.rows = rows

    @torch.no_grad()
    def step(self) -> None:
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            updates = []
            for p in params:
                buf = self.state[p]["momentum_buffer"]
                buf.lerp_(p.grad, 1 - group["momentum"])
                updates.append(p.grad.lerp(buf, group["momentum"]) if group["nesterov"] else buf)
            cuts = [self.rows.get(id(p), (p.size(0),)) for p in params]
            for p, step in zip(params, orthogonalise(updates, cuts, group, self.ns_dtype)):
                p.mul_(1 - group["lr"] * group["weight_decay"])
                p.add_(step, alpha=-group["lr"])


def muon_update(p: torch.Tensor, momentum: torch.Tensor, group: dict,
                rows: tuple[int, ...]) -> torch.Tensor | None:
    """The step Muon's stored momentum makes on p at the group's lr, with the exact orthogonal
    factor U V^T of each row block that its Newton-Schulz iteration approximates; None before its
    first step."""
    if not momentum.any():
        return None
    blocks = []
    for m in momentum.float().split(rows):
        U, _, Vh = torch.linalg.svd(m, full_matrices=False)
        blocks.append(shape_factor(*m.shape) * (U @ Vh))
    return group["lr"] * (torch.cat(blocks) + group["weight_decay"] * p.detach().float())
