"""A decoder-only GPT whose block parts can be switched on and off for ablations.

Every flag of GPTConfig is resolved once, in __init__, and the parts of a block a setting does
not use are not built. Parameter names follow GPT-2 (transformer.wte, .wpe,
.h.{i}.ln_1/attn.c_attn/attn.c_proj/ln_2/mlp.c_fc/mlp.c_proj, .ln_f, lm_head), so GPT-2
checkpoints load directly (see from_pretrained).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from .config import GPTConfig
from .errors import UserError, first_line
from .positions import Rotary, alibi_bias, alibi_slopes, sinusoidal_table
from .precision import cpu_rounds_matmuls, exact_cpu_matmuls

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


ACTIVATIONS = {
    "gelu": lambda: nn.GELU(),
    "gelu_tanh": lambda: nn.GELU(approximate="tanh"),
    "relu": lambda: nn.ReLU(),
    "swiglu": lambda: Gated(nn.SiLU()),
    "geglu": lambda: Gated(nn.GELU()),
}


def skip(x: torch.Tensor) -> torch.Tensor:
    """Stands in for a part a setting leaves out (dropout 0, no QK-norm) inside the blocks: a
    function call costs less than a module's, 2% of a sampled token's time on a CPU."""
    return x


def make_norm(config: GPTConfig, width: int | None = None) -> nn.Module:
    width = width or config.n_embd
    if config.norm_type == "rmsnorm":
        return nn.RMSNorm(width, eps=1e-5)
    return nn.LayerNorm(width, eps=1e-5, bias=config.bias)


class KVCache:
    """Keys and values of the tokens seen so far, for every layer; `pos` tokens are filled."""

    def __init__(self, config: GPTConfig, batch: int, device, dtype):
        shape = (config.n_layer, batch, config.kv_heads, config.block_size, config.head_size)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.pos = 0


class _ExactAttention(torch.autograd.Function):
    """F.scaled_dot_product_attention, forward and backward, with exact float32 CPU matmuls.

    With matmul_precision=medium a CPU with AMX rounds float32 matmul inputs to bfloat16, which
    makes the linear layers about 2x faster, but SDPA's CPU kernel sends its many small block
    products down the same path and gets about 10x slower (0.9 against 9.9 ms forward and
    backward for a layer of the CPU recipe). So attention builds its own small graph with exact
    matmuls in forward and goes back through it, again exact, in backward. The setting is
    process-wide: another thread's matmuls would be exact meanwhile.
    """

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
        # through a scalar: handing autograd.grad a gradient tensor imports sympy (35 MB, 0.3 s);
        # a backward called under inference_mode hands over a gradient autograd may not save
        with torch.inference_mode(False), torch.enable_grad(), exact_cpu_matmuls():
            grad_y = grad_y.clone() if grad_y.is_inference() else grad_y
            grads = iter(torch.autograd.grad((y * grad_y).sum(), wanted))
        return (*(next(grads) if t.requires_grad else None for t in inputs), None, None, None)


def attention(q, k, v, attn_mask, dropout_p: float, is_causal: bool) -> torch.Tensor:
    if q.device.type == "cpu":
        if q.dtype in (torch.bfloat16, torch.float16):
            # SDPA's CPU kernel in bfloat16 took 3.3x as long as in float32 going backward (1.42
            # against 0.43 ms for a layer of the fast config), more than the linear layers gain;
            # compiled too, its bfloat16 attention cost the fast config 13-47% a step
            with torch.autocast("cpu", enabled=False):
                y = attention(q.float(), k.float(), v.float(), attn_mask, dropout_p, is_causal)
            return y.to(q.dtype)
        # torch.compile cannot trace the check; it makes its own attention kernels anyway
        if not torch.compiler.is_compiling() and cpu_rounds_matmuls():
            return _ExactAttention.apply(q, k, v, attn_mask, dropout_p, is_causal)
    if attn_mask is not None:
        attn_mask = attn_mask.to(q.dtype)       # float32 as made; SDPA wants the queries' dtype
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p,
                                          is_causal=is_causal)


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
        if config.pos_encoding == "alibi":
            self.register_buffer("slopes", alibi_slopes(config.n_head), persistent=False)
        else:
            self.slopes = None
        self.keep_weights = False   # set by GPT.attention_maps; then self.weights holds (B, nh, T, T)
        self.weights = None

    def _bias(self, start: int, T: int, device) -> torch.Tensor | None:
        """Additive score bias for queries at start..start+T-1 over keys 0..start+T-1."""
        if self.slopes is not None:
            return alibi_bias(self.slopes, start, T, start + T)               # (nh, T, T_k)
        if start == 0 or T > 1:
            allowed = torch.ones(T, start + T, dtype=torch.bool, device=device).tril(start)
            return torch.zeros(allowed.shape, device=device).masked_fill(~allowed, float("-inf"))
        return None     # one new query may see every cached key

    def forward(self, x: torch.Tensor, start: int = 0, cache: KVCache | None = None) -> torch.Tensor:
        B, T, C = x.size()
        kv = self.n_kv_head * self.head_size
        q, k, v = self.c_attn(x).split([C, kv, kv], dim=2)
        q = q.view(B, T, self.n_head, self.head_size).transpose(1, 2)      # (B, nh, T, hs)
        k = k.view(B, T, self.n_kv_head, self.head_size).transpose(1, 2)   # (B, nkv, T, hs)
        v = v.view(B, T, self.n_kv_head, self.head_size).transpose(1, 2)   # (B, nkv, T, hs)
        q, k = self.q_norm(q), self.k_norm(k)
        if self.rotary is not None:
            q, k = self.rotary(q, start), self.rotary(k, start)
        if cache is not None:
            cache.k[self.layer, :, :, start:start + T] = k
            cache.v[self.layer, :, :, start:start + T] = v
            k = cache.k[self.layer, :, :, :start + T]                      # (B, nkv, T_k, hs)
            v = cache.v[self.layer, :, :, :start + T]
        if self.n_kv_head != self.n_head:
            k = k.repeat_interleave(self.n_head // self.n_kv_head, dim=1)  # (B, nh, T_k, hs)
            v = v.repeat_interleave(self.n_head // self.n_kv_head, dim=1)
        dropout = self.dropout if self.training else 0.0
        # without ALiBi or cached keys, SDPA's causal kernel needs no mask and is the fastest path
        fast_causal = self.slopes is None and start == 0
        bias = None if fast_causal else self._bias(start, T, x.device)
        y = attention(q, k, v, bias, dropout, fast_causal)
        if self.keep_weights:   # inspection only: the same scores, materialised, kept off the graph
            # at least float32, with autocast off, as a CPU's attention runs (a GPU's rounds more)
            with torch.no_grad(), exact_cpu_matmuls(), torch.autocast(x.device.type, enabled=False):
                bias = self._bias(start, T, x.device) if fast_causal else bias
                wide = torch.promote_types(q.dtype, torch.float32)
                q, k = q.to(wide), k.to(wide)
                scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_size)
                self.weights = (scores if bias is None else scores + bias).softmax(dim=-1)
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

    def forward(self, x, start: int = 0, cache: KVCache | None = None):
        x = self.sublayer(x, lambda h: self.attn(h, start, cache), self.ln_1, self.ln_1_out)
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

    def forward(self, x, start: int = 0, cache: KVCache | None = None):
        return self.sublayer(x, lambda h: self.attn(h, start, cache) + self.mlp(h), self.ln_1,
                             self.ln_1_out)


class GPT(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        parts = dict(wte=nn.Embedding(config.vocab_size, config.n_embd))
        if config.pos_encoding == "learned":
            parts["wpe"] = nn.Embedding(config.block_size, config.n_embd)
        parts["drop"] = nn.Dropout(config.dropout)
        block = ParallelBlock if config.parallel else Block
        parts["h"] = nn.ModuleList(block(config, i) for i in range(config.n_layer))
        # post-norm blocks already end in a norm, so the final one is a no-op there
        parts["ln_f"] = make_norm(config) if config.norm_placement != "post" else nn.Identity()
        self.transformer = nn.ModuleDict(parts)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        if config.tie_weights:
            self.lm_head.weight = self.transformer.wte.weight
        if config.pos_encoding == "sinusoidal":
            # The paper's table has RMS 1/sqrt(2) against token embeddings scaled up to match it;
            # here the token embeddings start at std 0.02 (GPT-2), so the table is scaled to that
            # same size, as a learned table would start. Unscaled, it drowns the tokens.
            table = sinusoidal_table(config.block_size, config.n_embd) * (0.02 * math.sqrt(2))
            self.register_buffer("pos_table", table, persistent=False)
        self._init_weights()
        self._lay_out_weights()

    def _init_weights(self):
        # GPT-2: N(0, 0.02) everywhere; the projections that write into the residual stream are
        # scaled by 1/sqrt(2 * n_layer) so the stream's variance does not grow with depth.
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * self.config.n_layer))

    def _lay_out_weights(self):
        # A Linear's weight is (out, in) and multiplies as its transpose. The layers that widen
        # (c_attn, c_fc, an untied head over more tokens than n_embd) keep it stored as that
        # transpose, contiguous: a one-token sampling step, a matrix-vector product per layer,
        # then reads memory in order, about twice as fast on a CPU (a 384-to-1536 c_fc, 250 against
        # 128 us); a narrowing layer is faster as it is. Values, training speed and gradients do
        # not change (a weight's gradient takes its layout), and state dicts load either way; code
        # that wants contiguous tensors (safetensors' save_file, .view) needs .contiguous() first.
        for module in self.modules():
            if (isinstance(module, nn.Linear) and module.out_features > module.in_features
                    and module.weight is not self.transformer.wte.weight):
                module.weight.data = module.weight.data.t().contiguous().t()

    def num_params(self, non_embedding: bool = False) -> int:
        """Parameters, shared ones counted once; non_embedding leaves out the position table and
        the token table (unless it is tied to the head, where it does real work)."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding:
            if "wpe" in self.transformer:
                n -= self.transformer.wpe.weight.numel()
            if not self.config.tie_weights:
                n -= self.transformer.wte.weight.numel()
        return n

    def hidden(self, idx: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        """Final hidden states (B, T, C) for tokens idx (B, T) that follow cache.pos cached ones."""
        B, T = idx.size()
        start = cache.pos if cache is not None else 0
        if start + T > self.config.block_size:
            raise UserError(f"sequence of {start + T} tokens is longer than block_size="
                            f"{self.config.block_size}; crop it to the last {self.config.block_size}")
        x = self.transformer.wte(idx)                                       # (B, T, C)
        if "wpe" in self.transformer:
            x = x + self.transformer.wpe(torch.arange(start, start + T, device=idx.device))
        elif self.config.pos_encoding == "sinusoidal":
            x = x + self.pos_table[start:start + T]
        if self.config.scale_embeddings:    # tokens and positions alike: they keep their balance
            x = x * math.sqrt(self.config.n_embd)
        x = self.transformer.drop(x)
        for block in self.transformer.h:
            x = block(x, start, cache)
        if cache is not None:
            cache.pos += T
        return self.transformer.ln_f(x)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        """Logits (B, T, vocab) and, given targets (B, T), the mean cross-entropy (-1 ignored)."""
        logits = self.lm_head(self.hidden(idx))
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

    # ------------------------------------------------------------------ generation

    @torch.inference_mode()     # 7% faster than no_grad when sampling on a CPU: no view or version tracking
    def generate_stream(self, idx: torch.Tensor, max_new_tokens: int, temperature: float = 1.0,
                        top_k: int | None = None, top_p: float | None = None,
                        use_cache: bool = True, generator: torch.Generator | None = None
                        ) -> Iterator[torch.Tensor]:
        """Yield each new token (B, 1), an inference tensor, as it is chosen. With the KV cache a
        step processes one token; once the text outgrows block_size the window slides and each
        step re-reads the last block_size tokens, exactly as without the cache."""
        if idx.dim() != 2 or idx.size(1) == 0:
            raise UserError(f"idx has shape {tuple(idx.shape)}; give (batch, tokens), at least one token")
        for bad, message in ((max_new_tokens < 0, f"max_new_tokens={max_new_tokens} is negative"),
                             (temperature < 0, f"temperature={temperature} is negative; 0 is greedy"),
                             (top_k is not None and top_k <= 0, f"top_k={top_k} must be positive, or None"),
                             (top_p is not None and not 0 < top_p <= 1, f"top_p={top_p} must be in (0, 1]")):
            if bad:
                raise UserError(message)
        block = self.config.block_size
        cache = None
        for _ in range(max_new_tokens):
            if use_cache and idx.size(1) <= block:
                if cache is None:
                    param = self.lm_head.weight
                    cache = KVCache(self.config, idx.size(0), param.device, param.dtype)
                    h = self.hidden(idx, cache)
                else:
                    h = self.hidden(idx[:, -1:], cache)
            else:
                h = self.hidden(idx[:, -block:])
            logits = self.lm_head(h[:, -1, :])                               # (B, vocab)
            next_token = pick_token(logits, temperature, top_k, top_p, generator)
            idx = torch.cat((idx, next_token), dim=1)
            yield next_token

    def generate(self, idx: torch.Tensor, max_new_tokens: int, temperature: float = 1.0,
                 top_k: int | None = None, top_p: float | None = None, use_cache: bool = True,
                 generator: torch.Generator | None = None) -> torch.Tensor:
        """idx (B, T) followed by max_new_tokens sampled tokens; temperature 0 is greedy."""
        new = list(self.generate_stream(idx, max_new_tokens, temperature, top_k, top_p,
                                        use_cache, generator))
        return torch.cat([idx, *new], dim=1)

    # ------------------------------------------------------------------ GPT-2 weights

    @classmethod
    def from_pretrained(cls, path: str) -> "GPT":
        """Load a Hugging Face GPT-2 checkpoint: a local folder with config.json and
        model.safetensors or pytorch_model.bin, or a hub name such as "gpt2" (needs network)."""
        folder = Path(path)
        if not folder.is_dir():
            try:
                from huggingface_hub import snapshot_download
            except ImportError:
                raise UserError(f"{path!r} is not a folder, and fetching it from the hub needs "
                                "huggingface_hub: pip install huggingface_hub") from None
            try:
                folder = Path(snapshot_download(path, allow_patterns=["config.json", "*.safetensors",
                                                                      "pytorch_model.bin"]))
            except Exception as e:      # the hub's errors have no common base worth naming
                raise UserError(f"{path!r} is not a folder, and the hub could not give it: {first_line(e)}") from None
        config = gpt2_config(folder / "config.json")
        if not any((folder / name).is_file() for name in ("model.safetensors", "pytorch_model.bin")):
            raise UserError(f"{folder} has no model.safetensors or pytorch_model.bin to load")
        file, weights = read_weights(folder)
        model = cls(config)
        state = {}
        for key, value in weights.items():
            key = key.removeprefix("transformer.")
            if key.endswith((".attn.bias", ".attn.masked_bias")):    # causal-mask buffers
                continue
            if key.endswith(("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight",
                             "mlp.c_proj.weight")):
                value = value.t()       # GPT-2's Conv1D stores (in, out); Linear wants (out, in)
            state[key if key.startswith("lm_head") else f"transformer.{key}"] = value
        if "transformer.wte.weight" in state:
            state.setdefault("lm_head.weight", state["transformer.wte.weight"])
        problem = weights_mismatch(state, model.state_dict())
        if problem:
            raise UserError(f"the weights in {file} do not fit {folder / 'config.json'}: {problem}")
        model.load_state_dict(state)
        return model


def weights_mismatch(state: dict, expected: dict) -> str:
    """How state differs from the state_dict `expected`: the first few tensors missing, unexpected
    or of another shape, each named; empty when it fits. torch's own message lists every key."""
    problems = {
        "missing": [k for k in expected if k not in state],
        "unexpected": [k for k in state if k not in expected],
        "of another shape": [f"{k} {tuple(v.shape)}, not {tuple(expected[k].shape)}"
                             for k, v in state.items() if k in expected and v.shape != expected[k].shape],
    }
    return "; ".join(f"{len(names)} {kind} ({', '.join(names[:3])}{', ...' * (len(names) > 3)})"
                     for kind, names in problems.items() if names)


def read_weights(folder: Path) -> tuple[Path, dict]:
    """The tensors of a Hugging Face folder's model.safetensors, else of its pytorch_model.bin."""
    file = folder / "model.safetensors"
    if file.exists():
        try:
            from safetensors.torch import load_file as read
        except ImportError:
            raise UserError("reading model.safetensors needs: pip install safetensors") from None
    else:
        file, read = folder / "pytorch_model.bin", partial(torch.load, map_location="cpu", weights_only=True)
    try:
        return file, read(file)
    except Exception as e:      # safetensors, pickle and zip each raise their own kinds
        raise UserError(f"cannot read {file} ({type(e).__name__}); it is damaged or not a weights "
                        "file, download it again") from None


HF_ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu", "relu": "relu"}
# GPT-2 options this model has no counterpart for, at the values it matches
HF_FIXED = {"layer_norm_epsilon": 1e-5, "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False}


def gpt2_config(path: Path) -> GPTConfig:
    """Our config for a Hugging Face GPT-2 config.json; any option we cannot honour is refused,
    since loading the weights anyway would give other logits."""
    try:
        hf = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise UserError(f"cannot read {path} ({e}); give a Hugging Face GPT-2 folder") from None
    if not isinstance(hf, dict) or hf.get("model_type") != "gpt2":
        kind = hf.get("model_type") if isinstance(hf, dict) else None
        raise UserError(f"{path} describes a {kind!r} model, not 'gpt2'; only GPT-2 loads here")
    activation = hf.get("activation_function", "gelu_new")
    unsupported = [f"{k}={hf[k]!r}" for k, v in HF_FIXED.items() if hf.get(k, v) != v]
    if activation not in HF_ACTIVATIONS:
        unsupported.append(f"activation_function={activation!r}")
    if hf.get("n_inner") not in (None, 4 * hf.get("n_embd", 0)):
        unsupported.append(f"n_inner={hf['n_inner']!r}")
    if unsupported:
        raise UserError(f"{path}: {', '.join(unsupported)} has no counterpart here; this model "
                        f"would give other logits")
    try:
        return GPTConfig(vocab_size=hf["vocab_size"], block_size=hf.get("n_positions", 1024),
                         n_layer=hf["n_layer"], n_head=hf["n_head"], n_embd=hf["n_embd"], bias=True,
                         activation=HF_ACTIVATIONS[activation], tie_weights=hf.get("tie_word_embeddings", True))
    except KeyError as e:
        raise UserError(f"{path} lacks {e.args[0]}") from None


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
