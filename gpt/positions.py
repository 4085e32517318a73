"""Position information, in the three places a transformer can take it.

- added to the token embeddings: a learned table (GPT-2) or fixed sinusoids (Vaswani et al. 2017);
- rotating queries and keys: RoPE (Su et al. 2021), which makes q.k depend on distance only;
- biasing attention scores: ALiBi (Press et al. 2021), -slope_h * distance for head h.
"""

import math

import torch
from torch import nn

# the wavelength scale of both sinusoids and RoPE, as in their papers
BASE = 10000.0


def sinusoidal_table(n_pos: int, dim: int) -> torch.Tensor:
    """PE[p, 2i] = sin(p / 10000^(2i/dim)), PE[p, 2i+1] = cos(p / 10000^(2i/dim))."""
    pos = torch.arange(n_pos, dtype=torch.float64).unsqueeze(1)       # (P, 1)
    inv = BASE ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    table = torch.zeros(n_pos, dim, dtype=torch.float64)
    table[:, 0::2] = torch.sin(pos * inv)
    table[:, 1::2] = torch.cos(pos * inv[: dim // 2])
    return table.float()


class Rotary(nn.Module):
    """Rotates each pair of channels (2i, 2i+1) of q and k by angle pos * theta_i."""

    def __init__(self, head_size: int, n_pos: int):
        super().__init__()
        inv = BASE ** (-torch.arange(0, head_size, 2, dtype=torch.float64) / head_size)
        angles = torch.arange(n_pos, dtype=torch.float64).unsqueeze(1) * inv   # (P, hs/2)
        # each rotation's (cos, sin), a unit complex number cos + i sin; derived from the config, so
        # it stays out of the state_dict
        self.register_buffer("turn", torch.stack((angles.cos(), angles.sin()), dim=-1).float(), persistent=False)

    def forward(self, x: torch.Tensor, start: int) -> torch.Tensor:
        """x: (B, nh, T, hs) at positions start .. start+T-1; turned in at least float32, returned in x's dtype."""
        T = x.size(2)
        wide = torch.promote_types(x.dtype, torch.float32)
        pairs = x.to(wide).unflatten(-1, (-1, 2))                        # (B, nh, T, hs/2, 2)
        if pairs.storage_offset() % 2:      # a complex view must start on a whole pair
            pairs = pairs.clone()
        turn = self.turn[start:start + T].to(wide)                        # (T, hs/2, 2)
        if torch.compiler.is_compiling() or x.device.type == "mps":
            # the same product in real numbers: torch.compile makes no code for complex ones
            (a, b), (cos, sin) = pairs.unbind(-1), turn.unbind(-1)
            turned = torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1)
        else:   # one complex product turns each pair a + ib whole: one kernel, not several
            turned = torch.view_as_real(torch.view_as_complex(pairs) * torch.view_as_complex(turn))
        return turned.flatten(-2).to(x.dtype)                            # (B, nh, T, hs)


def alibi_slopes(n_head: int) -> torch.Tensor:
    """The geometric slopes of the ALiBi paper; for non-powers of two, its interleaving rule."""
    def powers(n):
        start = 2.0 ** (-8.0 / n)
        return [start ** (i + 1) for i in range(n)]
    if math.log2(n_head).is_integer():
        slopes = powers(n_head)
    else:
        below = 2 ** math.floor(math.log2(n_head))
        slopes = powers(below) + powers(2 * below)[0::2][: n_head - below]
    return torch.tensor(slopes)


def alibi_bias(slopes: torch.Tensor, q_start: int, T_q: int, T_k: int) -> torch.Tensor:
    """Additive scores (nh, T_q, T_k): -slope * (i - j) for keys j <= query i, -inf after it."""
    q_pos = torch.arange(q_start, q_start + T_q, device=slopes.device).unsqueeze(1)
    k_pos = torch.arange(T_k, device=slopes.device).unsqueeze(0)
    distance = (q_pos - k_pos).float()                            # (T_q, T_k)
    bias = -slopes.view(-1, 1, 1) * distance                      # (nh, T_q, T_k)
    return bias.masked_fill(distance < 0, float("-inf"))
