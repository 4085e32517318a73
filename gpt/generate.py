"""Sampling from a GPT: the KV cache, one token at a time, with temperature, top-k and top-p."""

from __future__ import annotations

from collections.abc import Iterator

import torch

from .model_config import GPTConfig


class KVCache:
    """Keys and values of the tokens seen so far, for every layer; `pos` tokens are filled."""

    def __init__(self, config: GPTConfig, batch: int, device, dtype):
        shape = (config.n_layer, batch, config.kv_heads, config.block_size, config.head_size)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.pos = 0


@torch.inference_mode()     # faster than no_grad: no view or version tracking
def generate_stream(model, idx: torch.Tensor, max_new_tokens: int, temperature: float = 1.0,
                    top_k: int | None = None, top_p: float | None = None,
                    use_cache: bool = True, generator: torch.Generator | None = None
                    ) -> Iterator[torch.Tensor]:
    """Yield each new token (B, 1), an inference tensor, as it is chosen. With the KV cache a
    step processes one token; once the text outgrows block_size the window slides and each
    step re-reads the last block_size tokens, exactly as without the cache."""
    if idx.dim() != 2 or idx.size(1) == 0:
        raise ValueError(f"idx has shape {tuple(idx.shape)}; give (batch, tokens), at least one token")
    for bad, message in ((max_new_tokens < 0, f"max_new_tokens={max_new_tokens} is negative"),
                         (temperature < 0, f"temperature={temperature} is negative; 0 is greedy"),
                         (top_k is not None and top_k <= 0, f"top_k={top_k} must be positive, or None"),
                         (top_p is not None and not 0 < top_p <= 1, f"top_p={top_p} must be in (0, 1]")):
        if bad:
            raise ValueError(message)
    block = model.config.block_size
    cache = None
    for _ in range(max_new_tokens):
        if use_cache and idx.size(1) <= block:
            if cache is None:
                param = model.lm_head.weight
                cache = KVCache(model.config, idx.size(0), param.device, param.dtype)
                h = model.hidden(idx, cache)
            else:
                h = model.hidden(idx[:, -1:], cache)
        else:
            h = model.hidden(idx[:, -block:])
        logits = model.logits(h[:, -1, :])                                # (B, vocab)
        next_token = pick_token(logits, temperature, top_k, top_p, generator)
        idx = torch.cat((idx, next_token), dim=1)
        yield next_token


def generate(model, idx: torch.Tensor, max_new_tokens: int, temperature: float = 1.0,
             top_k: int | None = None, top_p: float | None = None, use_cache: bool = True,
             generator: torch.Generator | None = None) -> torch.Tensor:
    """idx (B, T) followed by max_new_tokens sampled tokens; temperature 0 is greedy."""
    new = list(generate_stream(model, idx, max_new_tokens, temperature, top_k, top_p,
                               use_cache, generator))
    return torch.cat([idx, *new], dim=1)



def pick_token(logits: torch.Tensor, temperature: float, top_k: int | None, top_p: float | None,
               generator: torch.Generator | None = None) -> torch.Tensor:
    """Choose one token per row of logits (B, vocab): greedy at temperature 0, else sample from
    the softmax restricted to the top_k tokens and to the top_p probability mass."""
    if temperature == 0:
        return logits.argmax(dim=-1, keepdim=True)
    logits = logits.float() / temperature
    if top_k:
        kth = torch.topk(logits, min(top_k, logits.size(-1))).values[:, [-1]]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits = torch.sort(logits, descending=True).values
        sorted_probs = sorted_logits.softmax(dim=-1)
        drop = sorted_probs.cumsum(dim=-1) - sorted_probs >= top_p
        drop[:, 0] = False      # the likeliest token, also for a top_p that rounds to 0 in float32
        # tokens tied with the least likely one kept stay too, as with top_k: not one picked by sort order
        least = sorted_logits.masked_fill(drop, float("inf")).amin(dim=-1, keepdim=True)
        logits = logits.masked_fill(logits < least, float("-inf"))
    probs = logits.softmax(dim=-1)
    return torch.multinomial(probs, num_samples=1, generator=generator)
