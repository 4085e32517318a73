"""A decoder-only GPT whose block parts can be switched on and off for ablations.

Every flag of GPTConfig is resolved once, in __init__, and the parts of a block a setting does
not use are not built. Parameter names follow GPT-2 (transformer.wte, .wpe,
.h.{i}.ln_1/attn.c_attn/attn.c_proj/ln_2/mlp.c_fc/mlp.c_proj, .ln_f, lm_head), so GPT-2
checkpoints load directly (gpt/pretrained.py).
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn

from .model_config import GPTConfig
from .generate import KVCache, generate, generate_stream
from .positions import Rotary, alibi_bias, alibi_slopes, sinusoidal_table

# What one sub-layer f (attention or MLP) with its norms computes, by (norm_placement, residual).
# Plain functions rather than lambdas, so that a whole model pickles (torch.save(model)).
def pre_res(x, f, norm, out):       # GPT-2 and later; the model also applies ln_f before the head
    return x + f(norm(x))


def pre_nores(x, f, norm, out):
    return f(norm(x))


def post_res(x, f, norm, out):      # the 2017 Transformer; no ln_f, the output is already normed
    return norm(x + f(x))


def post_nores(x, f, norm, out):
    return norm(f(x))


def sandwich_res(x, f, norm, out):  # pre-norm plus a norm on the branch's output, so what each
    return x + out(f(norm(x)))      # sub-layer adds has a fixed scale; ln_f as in pre


def sandwich_nores(x, f, norm, out):
    return out(f(norm(x)))


SUBLAYER = {("pre", True): pre_res, ("pre", False): pre_nores, ("post", True): post_res,
            ("post", False): post_nores, ("sandwich", True): sandwich_res,
            ("sandwich", False): sandwich_nores}


class Gated(nn.Module):
    """GLU variants (Shazeer 2020): one half of c_fc's output, through act, scales the other."""

    def __init__(self, act: nn.Module):
        super().__init__()
        self.act = act

    def forward(self, x):
        gate, value = x.chunk(2, dim=-1)                                    # (B, T, hidden) each
        return self.act(gate) * value


class ReLU2(nn.Module):
    """Squared ReLU, relu(x)^2 (Primer, So et al. 2021): sparse like ReLU, smooth at 0."""

    def forward(self, x):
        return F.relu(x).square()


ACTIVATIONS = {
    "gelu": lambda: nn.GELU(),
    "gelu_tanh": lambda: nn.GELU(approximate="tanh"),
    "relu": lambda: nn.ReLU(),
    "relu2": lambda: ReLU2(),
    "swiglu": lambda: Gated(nn.SiLU()),
    "geglu": lambda: Gated(nn.GELU()),
}


def skip(x: torch.Tensor) -> torch.Tensor:
    """Stands in for a part a setting leaves out (dropout 0, no QK-norm) inside the blocks: a
    function call costs less than a module's, which counts in each sampled token's time."""
    return x


def make_norm(config: GPTConfig, width: int | None = None) -> nn.Module:
    width = width or config.n_embd
    if config.norm_type == "rmsnorm":
        return nn.RMSNorm(width, eps=1e-5, elementwise_affine=config.norm_affine)
    return nn.LayerNorm(width, eps=1e-5, elementwise_affine=config.norm_affine, bias=config.bias)



def attend(q, k, v, mask: torch.Tensor | None, dropout_p: float, is_causal: bool) -> torch.Tensor:
    """Softmax attention (F.scaled_dot_product_attention) of q (B, nh, T, hs) over k and v
    (B, nkv, T_k, hs), which may have fewer heads, each shared by a group of q's (grouped-query
    attention); mask is an additive score bias."""
    if mask is not None:
        mask = mask.to(q.dtype)         # float32 as made; SDPA wants the queries' dtype
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal,
                                          enable_gqa=k.size(1) != q.size(1))


def score_bias(slopes: torch.Tensor | None, start: int, T: int, device) -> torch.Tensor | None:
    """Additive score bias for queries at start..start+T-1 over keys 0..start+T-1: ALiBi's (nh,
    T, T_k) where slopes are given, else the causal mask, which one new query does not need."""
    if slopes is not None:
        return alibi_bias(slopes, start, T, start + T)                     # (nh, T, T_k)
    if start == 0 or T > 1:
        allowed = torch.ones(T, start + T, dtype=torch.bool, device=device).tril(start)
        return torch.zeros(allowed.shape, device=device).masked_fill(~allowed, float("-inf"))
    return None     # one new query may see every cached key


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig, layer: int):
        super().__init__()
        self.layer = layer
        self.n_head, self.n_kv_head, self.head_size = config.n_head, config.kv_heads, config.head_size
        kv_width = 2 * config.kv_heads * config.head_size
        self.c_attn = nn.Linear(config.n_embd, config.n_embd + kv_width, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout) if config.dropout else skip
        self.dropout = config.dropout
        self.rotary = Rotary(config.head_size, config.block_size) if config.pos_encoding == "rope" else None
        # one norm over the head size, shared by the heads, before rotary (as Qwen 3 does)
        self.q_norm = make_norm(config, config.head_size) if config.qk_norm else skip
        self.k_norm = make_norm(config, config.head_size) if config.qk_norm else skip
        self.alibi = config.pos_encoding == "alibi"
        # μP (Tensor Programs V): scores times sqrt(base head size) / head size, so 1/d as the heads
        # widen; SDPA divides by sqrt(d), so q carries the rest, sqrt(base/width) (1 at the base)
        self.q_mult = math.sqrt(config.mup_ratio) if config.parametrization == "mup" else None
        self.attend = attend        # a platform's own kernel may stand in (gpt/speed, attention.py)
        self.keep_weights = False   # set by GPT.attention_maps; then self.weights holds (B, nh, T, T)
        self.weights = None

    def forward(self, x: torch.Tensor, start: int = 0, cache: KVCache | None = None,
                bias: torch.Tensor | None = None) -> torch.Tensor:
        """bias: score_bias for this forward's queries, built once by GPT.hidden for every layer."""
        B, T, C = x.size()
        kv = self.n_kv_head * self.head_size
        q, k, v = self.c_attn(x).split([C, kv, kv], dim=2)
        q = q.view(B, T, self.n_head, self.head_size).transpose(1, 2)      # (B, nh, T, hs)
        k = k.view(B, T, self.n_kv_head, self.head_size).transpose(1, 2)   # (B, nkv, T, hs)
        v = v.view(B, T, self.n_kv_head, self.head_size).transpose(1, 2)   # (B, nkv, T, hs)
        q, k = self.q_norm(q), self.k_norm(k)
        if self.rotary is not None:
            q, k = self.rotary(q, start), self.rotary(k, start)
        if self.q_mult is not None:
            q = q * self.q_mult
        if cache is not None:
            cache.k[self.layer, :, :, start:start + T] = k
            cache.v[self.layer, :, :, start:start + T] = v
            k = cache.k[self.layer, :, :, :start + T]                      # (B, nkv, T_k, hs)
            v = cache.v[self.layer, :, :, :start + T]
        dropout = self.dropout if self.training else 0.0
        fast_causal = not self.alibi and start == 0
        y = self.attend(q, k, v, bias, dropout, fast_causal)               # (B, nh, T, hs)
        if self.keep_weights:   # inspection only: the same scores, materialised, kept off the graph
            # in float64, with autocast off: no setting of a CPU or GPU rounds its matmuls
            with torch.no_grad(), torch.autocast(x.device.type, enabled=False):
                bias = score_bias(None, start, T, x.device) if fast_causal else bias
                k = k.repeat_interleave(self.n_head // self.n_kv_head, dim=1)    # (B, nh, T_k, hs)
                scores = q.double() @ k.double().transpose(-2, -1) / math.sqrt(self.head_size)
                weights = (scores if bias is None else scores + bias).softmax(dim=-1)
                self.weights = weights.to(torch.promote_types(q.dtype, torch.float32))
        y = y.transpose(1, 2).contiguous().view(B, T, C)                   # (B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        hidden = config.mlp_hidden
        self.c_fc = nn.Linear(config.n_embd, 2 * hidden if config.gated else hidden, bias=config.bias)
        self.act = ACTIVATIONS[config.activation]()
        self.c_proj = nn.Linear(hidden, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout) if config.dropout else skip

    def forward(self, x):
        return self.dropout(self.c_proj(self.act(self.c_fc(x))))


def output_norm(config: GPTConfig) -> nn.Module | None:
    """The norm on a sub-layer's output, which only the sandwich placement has."""
    return make_norm(config) if config.norm_placement == "sandwich" else None


class Block(nn.Module):
    def __init__(self, config: GPTConfig, layer: int):
        super().__init__()
        self.ln_1 = make_norm(config)
        self.attn = CausalSelfAttention(config, layer)
        self.ln_1_out = output_norm(config)
        self.ln_2 = make_norm(config)
        self.mlp = MLP(config)
        self.ln_2_out = output_norm(config)
        self.sublayer = SUBLAYER[(config.norm_placement, config.residual)]

    def forward(self, x, start: int = 0, cache: KVCache | None = None, bias: torch.Tensor | None = None):
        x = self.sublayer(x, lambda h: self.attn(h, start, cache, bias), self.ln_1, self.ln_1_out)
        return self.sublayer(x, self.mlp, self.ln_2, self.ln_2_out)


class ParallelBlock(nn.Module):
    """GPT-J and PaLM: attention and MLP both read the block's input and their outputs are added,
    so the MLP no longer waits on attention; being one sub-layer, it needs one norm (and
    sandwich one more, on the sum)."""

    def __init__(self, config: GPTConfig, layer: int):
        super().__init__()
        self.ln_1 = make_norm(config)
        self.attn = CausalSelfAttention(config, layer)
        self.mlp = MLP(config)
        self.ln_1_out = output_norm(config)
        self.sublayer = SUBLAYER[(config.norm_placement, config.residual)]

    def forward(self, x, start: int = 0, cache: KVCache | None = None, bias: torch.Tensor | None = None):
        return self.sublayer(x, lambda h: self.attn(h, start, cache, bias) + self.mlp(h), self.ln_1,
                             self.ln_1_out)


class GPT(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        parts = dict(wte=nn.Embedding(config.vocab_size, config.n_embd))
        if config.pos_encoding == "learned":
            parts["wpe"] = nn.Embedding(config.block_size, config.n_embd)
        if config.embed_norm:
            parts["ln_e"] = make_norm(config)
        parts["drop"] = nn.Dropout(config.dropout)
        block = ParallelBlock if config.parallel else Block
        parts["h"] = nn.ModuleList(block(config, i) for i in range(config.n_layer))
        # post-norm blocks already end in a norm, so the final one is a no-op there
        parts["ln_f"] = make_norm(config) if config.norm_placement != "post" else nn.Identity()
        self.transformer = nn.ModuleDict(parts)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        if config.tie_weights:
            self.lm_head.weight = self.transformer.wte.weight
        # μP's readout (Tensor Programs V, Table 8; microsoft/mup's MuReadout): logits times
        # base/width, the head (tied or not) keeping its init and learning rate
        self.output_mult = config.mup_ratio if config.parametrization == "mup" else None
        if config.pos_encoding == "sinusoidal":
            # The paper's table has RMS 1/sqrt(2) against token embeddings scaled up to match it;
            # here the token embeddings start at std 0.02 (GPT-2), so the table is scaled to that
            # same size, as a learned table would start. Unscaled, it drowns the tokens.
            table = sinusoidal_table(config.block_size, config.n_embd) * (0.02 * math.sqrt(2))
            self.register_buffer("pos_table", table, persistent=False)
        # ALiBi's per-head slopes, the same in every layer: one bias serves them all
        self.register_buffer("slopes", alibi_slopes(config.n_head) if config.pos_encoding == "alibi" else None,
                             persistent=False)
        self._init_weights()

    @torch.no_grad()
    def _init_weights(self):
        # GPT-2: N(0, 0.02) everywhere; the projections that write into the residual stream are
        # scaled by 1/sqrt(2 * n_layer) so the stream's variance does not grow with depth.
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):     # zero_init: each block starts as the identity
                std = 0.0 if self.config.zero_init else 0.02 / math.sqrt(2 * self.config.n_layer)
                nn.init.normal_(p, mean=0.0, std=std)
        # μP: the hidden matrices' variance goes as 1/fan_in, GPT-2's std at the base width
        if (hidden := math.sqrt(self.config.mup_ratio)) != 1.0:
            torch._foreach_mul_(self.hidden_matrices(), hidden)

    def hidden_matrices(self) -> list[nn.Parameter]:
        """The blocks' weight matrices (attention's c_attn and c_proj, the MLP's c_fc and c_proj):
        the hidden weights, whose init and AdamW rate μP scales with width."""
        return [p for name, p in self.named_parameters()
                if name.startswith("transformer.h.") and p.dim() == 2]

    def num_params(self, non_embedding: bool = False) -> int:
        """Parameters, shared ones counted once; non_embedding leaves out the position table and
        the token table (unless it is tied to the head, where it does real work). The config counts
        them (GPTConfig.num_params), so a model need not be built to know its size."""
        return self.config.num_params(non_embedding)

    def hidden(self, idx: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        """Final hidden states (B, T, C) for tokens idx (B, T) that follow cache.pos cached ones."""
        B, T = idx.size()
        start = cache.pos if cache is not None else 0
        if start + T > self.config.block_size:
            raise ValueError(f"sequence of {start + T} tokens is longer than block_size="
                            f"{self.config.block_size}; crop it to the last {self.config.block_size}")
        x = self.transformer.wte(idx)                                       # (B, T, C)
        if "wpe" in self.transformer:
            x = x + self.transformer.wpe(torch.arange(start, start + T, device=idx.device))
        elif self.config.pos_encoding == "sinusoidal":
            x = x + self.pos_table[start:start + T]
        if self.config.scale_embeddings:    # tokens and positions alike: they keep their balance
            x = x * math.sqrt(self.config.n_embd)
        if "ln_e" in self.transformer:
            x = self.transformer.ln_e(x)
        x = self.transformer.drop(x)
        # one mask (or ALiBi bias) for all layers; none where SDPA's causal kernel serves, the fastest
        bias = None if self.slopes is None and start == 0 else score_bias(self.slopes, start, T, idx.device)
        for block in self.transformer.h:
            x = block(x, start, cache, bias)
        if cache is not None:
            cache.pos += T
        return self.transformer.ln_f(x)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """The head's logits (..., vocab) for final hidden states h (..., C), times μP's output
        multiplier, soft-capped to (-C, C) by C * tanh(logits / C) where logit_softcap is C (Gemma 2)."""
        logits = self.lm_head(h)
        if self.output_mult is not None:
            logits = logits * self.output_mult
        cap = self.config.logit_softcap
        return cap * torch.tanh(logits / cap) if cap else logits

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        """Logits (B, T, vocab) and, given targets (B, T), the mean cross-entropy (-1 ignored)."""
        logits = self.logits(self.hidden(idx))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1),
                                   ignore_index=-1)
        return logits, loss

    @torch.no_grad()
    def attention_maps(self, idx: torch.Tensor) -> list[torch.Tensor]:
        """Attention weights of every layer for idx (B, T): a list of (B, nh, T, T)."""
        attns = [block.attn for block in self.transformer.h]
        for a in attns:
            a.keep_weights = True
        try:
            self.hidden(idx)
            return [a.weights for a in attns]
        finally:
            for a in attns:
                a.keep_weights, a.weights = False, None

    def generate_stream(self, idx: torch.Tensor, max_new_tokens: int, temperature: float = 1.0,
                        top_k: int | None = None, top_p: float | None = None,
                        use_cache: bool = True, generator: torch.Generator | None = None
                        ) -> Iterator[torch.Tensor]:
        """Each new token (B, 1) as it is chosen (gpt/generate.py)."""
        return generate_stream(self, idx, max_new_tokens, temperature, top_k, top_p, use_cache, generator)

    def generate(self, idx: torch.Tensor, max_new_tokens: int, temperature: float = 1.0,
                 top_k: int | None = None, top_p: float | None = None, use_cache: bool = True,
                 generator: torch.Generator | None = None) -> torch.Tensor:
        """idx (B, T) followed by max_new_tokens sampled tokens; temperature 0 is greedy."""
        return generate(self, idx, max_new_tokens, temperature, top_k, top_p, use_cache, generator)
