"""The model's configuration: GPTConfig, each architecture option with its default, help and check.

A reader of gpt/model.py needs this file and nothing else of the package. A bad value raises a plain
ValueError that names it and the fix (the commands print it as one line). The field helpers here
(opt, check_types, check_choices) serve the other configs too (gpt/config.py).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import numbers
import types
import typing
from dataclasses import dataclass, field


def opt(default, help: str, choices: tuple[str, ...] | None = None, given_by: str | None = None):
    """A config field; `given_by` names where its value comes from when no command may set it."""
    meta = {"help": help}
    if choices:
        meta["choices"] = choices
    if given_by:
        meta["given_by"] = given_by
    return field(default=default, metadata=meta)


def positive(obj, *names: str, error: type[Exception] = ValueError) -> None:
    for name in names:
        value = getattr(obj, name)
        if value <= 0:
            raise error(f"{name}={value} must be positive")


def check_types(obj, error: type[Exception] = ValueError) -> None:
    """Each value of the field's own type, for configs built in Python: "false" would be true.
    Other kinds of numbers and strings (numpy's, from np.arange) become Python's own."""
    for f in dataclasses.fields(obj):
        value, kind = getattr(obj, f.name), field_type(type(obj), f)
        if type(value) not in (bool, int, float, str):
            if kind is int and isinstance(value, numbers.Integral):
                object.__setattr__(obj, f.name, int(value))
            elif kind is float and isinstance(value, numbers.Real):
                object.__setattr__(obj, f.name, float(value))
            elif kind is bool and str(getattr(value, "dtype", "")) == "bool":   # numpy's bool
                object.__setattr__(obj, f.name, bool(value))
            elif kind is str and isinstance(value, str):    # numpy's: a checkpoint could not hold it
                object.__setattr__(obj, f.name, str(value))
        problem = type_problem(type(obj), f, getattr(obj, f.name))
        if problem:
            raise error(problem)


def type_problem(cls, f, value) -> str | None:
    kind = field_type(cls, f)
    if isinstance(value, bool) != (kind is bool) or not isinstance(value, (int, float) if kind is float else kind):
        return f"{f.name}={value!r} is not {SPELLED.get(kind, kind.__name__)}"
    if kind is float and not math.isfinite(value):     # nan passes every comparison check after
        return f"{f.name}={value!r} is not a finite number"
    return None


def check_choices(obj, error: type[Exception] = ValueError) -> None:
    for f in dataclasses.fields(obj):
        choices = f.metadata.get("choices")
        value = getattr(obj, f.name)
        if choices and value not in choices:
            close = difflib.get_close_matches(str(value).lower(), choices, n=1)
            hint = f"did you mean {close[0]}? " if close else ""
            raise error(f"{f.name}={value!r} is not allowed; {hint}choose one of {', '.join(choices)}")


def field_type(cls, f) -> type:
    hint = type_hints(cls)[f.name]
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if isinstance(hint, types.UnionType) else hint


@functools.cache
def type_hints(cls) -> dict:
    """cls's annotations as types, read once: each reading evaluates every annotation's text."""
    return typing.get_type_hints(cls)


SPELLED = {bool: "true or false", int: "a whole number", float: "a number", str: "text"}


@dataclass
class GPTConfig:
    """The model: its shape and every switch of its block; gpt/model.py builds it from this alone."""

    vocab_size: int = opt(50304, "number of token ids", given_by="the dataset (its meta.json)")
    block_size: int = opt(256, "longest context the model sees, in tokens")
    n_layer: int = opt(6, "number of transformer blocks")
    n_head: int = opt(6, "attention heads per block")
    n_embd: int = opt(384, "width of the residual stream")
    n_kv_head: int = opt(0, "key/value heads; 0 means n_head, fewer gives grouped-query attention")
    dropout: float = opt(0.0, "dropout on the embeddings, the attention weights and each residual branch "
                         "(sandwich: before the branch's output norm)")
    bias: bool = opt(True, "biases in Linear layers (not the output head, as in GPT-2) and LayerNorms")
    pos_encoding: str = opt("learned", "how positions enter: learned table, fixed sinusoids "
                            "(Vaswani 2017), rotary (Su 2021), ALiBi bias (Press 2021), or none",
                            ("learned", "sinusoidal", "rope", "alibi", "none"))
    norm_placement: str = opt("pre", "pre: x + f(norm(x)) plus a final norm; post: norm(x + f(x)) "
                              "as in the 2017 Transformer; sandwich: x + norm(f(norm(x))) plus a "
                              "final norm (CogView, Gemma 2; Peri-LN)", ("pre", "post", "sandwich"))
    residual: bool = opt(True, "add each sub-layer's input back to its output (x + f(...))")
    norm_type: str = opt("layernorm", "LayerNorm (Ba 2016) or RMSNorm (Zhang 2019)",
                         ("layernorm", "rmsnorm"))
    parallel: bool = opt(False, "attention and MLP read the same input and their outputs are "
                         "summed (GPT-J, PaLM): one norm per block, not one per sub-layer (sandwich: "
                         "and one on the sum)")
    qk_norm: bool = opt(False, "normalise each head's queries and keys (norm_type) before their dot "
                        "product, which bounds the attention logits (Dehghani 2023)")
    activation: str = opt("gelu", "MLP non-linearity; gelu_tanh is GPT-2's approximation; relu2 is "
                          "relu(x)^2 (Primer, So 2021); swiglu and geglu are gated (Shazeer 2020), at "
                          "2/3 the hidden width so the MLP keeps about its weight count",
                          ("gelu", "gelu_tanh", "relu", "relu2", "swiglu", "geglu"))
    mlp_ratio: int = opt(4, "MLP hidden width as a multiple of n_embd (2/3 of that when gated)")
    tie_weights: bool = opt(True, "share the token embedding with the output head")
    scale_embeddings: bool = opt(False, "multiply the embeddings (tokens plus positions) by sqrt(n_embd) "
                                 "on the way in, as the 2017 Transformer and Gemma do for tokens")
    embed_norm: bool = opt(False, "a norm (norm_type) right after the embeddings, tokens plus positions "
                           "(modded-nanogpt, nanochat)")
    norm_affine: bool = opt(True, "norms with a learnable gain (and a bias where bias=true); false: "
                            "plain normalisation, no norm parameters (nanochat)")
    zero_init: bool = opt(False, "the projections that write into the residual stream (attention's "
                          "and the MLP's c_proj) start at exactly zero, not GPT-2's scaled "
                          "N(0, 0.02/sqrt(2 n_layer)) (modded-nanogpt, nanochat)")
    logit_softcap: float = opt(0.0, "soft-cap the head's logits to C*tanh(logits/C) in training, "
                               "evaluation and sampling (Gemma 2); 0: off")
    parametrization: str = opt("sp", "sp: GPT-2's init and one learning rate; mup: the Maximal Update "
                               "Parametrization (Tensor Programs V, Yang 2022): hidden matrices' init and "
                               "AdamW rate, the logits and the attention scores scaled with width, so a rate "
                               "tuned at mup_base_width carries to wider models (docs/options.md)",
                               ("sp", "mup"))
    mup_base_width: int = opt(64, "parametrization=mup: the n_embd at which mup and sp are the same "
                              "model; n_head must divide it (the base model has the same heads)")

    def __post_init__(self):
        check_types(self)
        positive(self, "vocab_size", "block_size", "n_layer", "n_head", "n_embd", "mlp_ratio")
        if self.n_kv_head < 0:
            raise ValueError(f"n_kv_head={self.n_kv_head} must be positive, or 0 for as many as n_head")
        if self.n_kv_head == self.n_head:
            # 0 whichever way it was given, so records of one model compare equal, and never
            # resolved, so dataclasses.replace(cfg, n_head=8) does not keep cfg's count (GQA)
            self.n_kv_head = 0
        check_choices(self)
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd={self.n_embd} is not divisible by n_head={self.n_head}; "
                            f"pick n_head among the divisors of {self.n_embd}")
        if self.n_head % self.kv_heads:
            raise ValueError(f"n_head={self.n_head} is not divisible by n_kv_head={self.n_kv_head}")
        if self.pos_encoding == "rope" and (self.n_embd // self.n_head) % 2:
            raise ValueError(f"pos_encoding='rope' needs an even head size, but n_embd/n_head = "
                            f"{self.n_embd // self.n_head}")
        if self.qk_norm and self.norm_type == "layernorm" and self.head_size == 1:
            raise ValueError("qk_norm with norm_type='layernorm' needs a head size above 1 (a LayerNorm "
                            "of one channel is always 0); use fewer heads or norm_type='rmsnorm'")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout={self.dropout} must be in [0, 1)")
        if self.logit_softcap < 0:
            raise ValueError(f"logit_softcap={self.logit_softcap} must be positive (the logits' bound, "
                            "e.g. 15), or 0 for no capping")
        if self.mup_base_width <= 0:
            raise ValueError(f"mup_base_width={self.mup_base_width} must be positive: the width at which "
                             "parametrization=mup equals sp, e.g. 64")
        if self.parametrization == "mup" and self.mup_base_width % self.n_head:
            near = self.n_head * max(1, round(self.mup_base_width / self.n_head))
            raise ValueError(f"mup_base_width={self.mup_base_width} is not divisible by n_head={self.n_head}; "
                             f"the base model has the same heads: pick a multiple of {self.n_head}, "
                             f"e.g. mup_base_width={near}")
        if self.mlp_hidden < 1:
            raise ValueError(f"activation={self.activation!r} leaves the MLP no hidden units at "
                            f"mlp_ratio={self.mlp_ratio} and n_embd={self.n_embd}; raise mlp_ratio")

    @property
    def head_size(self) -> int:
        return self.n_embd // self.n_head

    @property
    def mup_ratio(self) -> float:
        """base/width under parametrization=mup, 1 at the base width; 1 under sp."""
        return self.mup_base_width / self.n_embd if self.parametrization == "mup" else 1.0

    @property
    def kv_heads(self) -> int:
        """Key/value heads: n_kv_head, or n_head for its 0."""
        return self.n_kv_head or self.n_head

    @property
    def gated(self) -> bool:
        """Whether c_fc makes two halves, one gating the other (GLU variants)."""
        return self.activation in ("swiglu", "geglu")

    @property
    def mlp_hidden(self) -> int:
        """MLP hidden units; gated MLPs have three matrices, so 2/3 the width matches two."""
        width = self.mlp_ratio * self.n_embd
        return 2 * width // 3 if self.gated else width

    def num_params(self, non_embedding: bool = False) -> int:
        """Parameters of the model this describes, shared ones once, without building it;
        non_embedding leaves out the position table and the token table unless it is tied to the
        head (as GPT.num_params does)."""
        C, H, kv = self.n_embd, self.mlp_hidden, self.kv_heads * self.head_size
        fc = H * (2 if self.gated else 1)
        per_width = (2 if self.norm_type == "layernorm" and self.bias else 1) * self.norm_affine
        norm = C * per_width
        sublayers = 1 if self.parallel else 2
        norms = sublayers * (2 if self.norm_placement == "sandwich" else 1)
        block = C * (C + 2 * kv) + C * C + C * fc + H * C + norms * norm
        if self.qk_norm:
            block += 2 * self.head_size * per_width
        if self.bias:
            block += (C + 2 * kv) + C + fc + C
        tables = 0 if non_embedding else (self.vocab_size * C * (not self.tie_weights)
                                          + (self.block_size * C if self.pos_encoding == "learned" else 0))
        return (self.n_layer * block + self.vocab_size * C + tables
                + (norm if self.norm_placement != "post" else 0) + (norm if self.embed_norm else 0))

    def flops_per_token(self) -> float:
        """Training FLOPs per token: 6 per non-embedding weight (forward and backward) plus
        attention's 12 * n_layer * block_size * n_embd (the PaLM appendix estimate)."""
        return 6 * self.num_params(non_embedding=True) + 12 * self.n_layer * self.block_size * self.n_embd
