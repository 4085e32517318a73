"""gpt/model.py: the blocks, attention, MLPs, initialisation and attention maps of the GPT."""

import io
import itertools
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from conftest import (BLOCK, GRID, GRID_IDS, PLACEMENTS, POS_ENCODINGS, V, check_causal, check_generate_cache,
                      tiny_model)
from gpt.config import GPTConfig
from gpt.model import GPT, CausalSelfAttention

pytestmark = pytest.mark.usefixtures("one_thread")     # conftest.py


# ------------------------------------------------------------------ 1. every variant of the block

BLOCK_VARIANTS = [dict(parallel=True), dict(qk_norm=True), dict(qk_norm=True, norm_type="rmsnorm"),
                  dict(parallel=True, qk_norm=True, n_kv_head=2), dict(scale_embeddings=True)]
# the ablation grid; each block variant by position, placement and residual; each activation but the grid's gelu
VARIANTS = ([dict(pos_encoding=pos, norm_placement=place, residual=res, norm_type=norm)
             for pos, place, res, norm in GRID]
            + [dict(flags, pos_encoding=pos, norm_placement=place, residual=res) for flags in BLOCK_VARIANTS
               for pos in ("learned", "rope", "alibi") for place, res in itertools.product(PLACEMENTS, (True, False))]
            + [dict(activation=act) for act in ("gelu_tanh", "relu", "swiglu", "geglu")])
VARIANT_IDS = GRID_IDS + [",".join(f"{k}={v}" for k, v in flags.items()) for flags in VARIANTS[len(GRID):]]


@pytest.mark.parametrize("flags", VARIANTS, ids=VARIANT_IDS)
def test_every_variant_trains_every_parameter_stays_causal_and_generates_alike_with_the_cache(flags):
    model = tiny_model(**flags).train()
    logits, loss = model(torch.randint(0, V, (2, BLOCK)), torch.randint(0, V, (2, BLOCK)))
    assert logits.shape == (2, BLOCK, V)
    assert torch.isfinite(loss)
    loss.backward()
    # named_parameters lists the tied lm_head/wte once, under transformer.wte.weight
    for name, p in model.named_parameters():
        assert p.grad is not None and p.grad.norm() > 0, name
    check_causal(model.eval())
    check_generate_cache(model)


# ------------------------------------------------------------------ 2. grouped-query attention

@pytest.mark.parametrize("pos", POS_ENCODINGS)
def test_grouped_query_attention(pos):
    model = tiny_model(pos_encoding=pos, n_kv_head=2)
    # q is n_embd wide, k and v are 2 heads of 4 channels each
    assert model.transformer.h[0].attn.c_attn.out_features == 16 + 2 * 2 * 4
    check_causal(model)
    check_generate_cache(model)


# ------------------------------------------------------------------ 3. attention vs PyTorch's

def test_attention_equals_torch_multihead_attention():
    config = GPTConfig(vocab_size=V, block_size=BLOCK, n_layer=1, n_head=4, n_embd=16,
                       pos_encoding="none")
    torch.manual_seed(0)
    attn = CausalSelfAttention(config, layer=0).eval()
    mha = nn.MultiheadAttention(16, 4, bias=True, batch_first=True).eval()
    with torch.no_grad():
        mha.in_proj_weight.copy_(attn.c_attn.weight)
        mha.in_proj_bias.copy_(attn.c_attn.bias)
        mha.out_proj.weight.copy_(attn.c_proj.weight)
        mha.out_proj.bias.copy_(attn.c_proj.bias)
    x = torch.randn(3, 10, 16)
    mask = torch.ones(10, 10, dtype=torch.bool).triu(1)
    with torch.no_grad():
        expected, _ = mha(x, x, x, attn_mask=mask, need_weights=False)
        torch.testing.assert_close(attn(x), expected, atol=1e-5, rtol=0)


# ------------------------------------------------------------------ 3b. block layout, QK-norm

def with_random_norm_gains(block: nn.Module) -> nn.Module:
    """Norms that differ from each other, so a formula using the wrong one fails."""
    with torch.no_grad():
        for name, p in block.named_parameters():
            if name.startswith("ln_"):
                p.uniform_(0.5, 2.0)
    return block


@pytest.mark.parametrize("place,res,expected", [
    ("pre", True, lambda x, b: (h := x + b.attn(b.ln_1(x))) + b.mlp(b.ln_2(h))),
    ("pre", False, lambda x, b: b.mlp(b.ln_2(b.attn(b.ln_1(x))))),
    ("post", True, lambda x, b: b.ln_2((h := b.ln_1(x + b.attn(x))) + b.mlp(h))),
    ("post", False, lambda x, b: b.ln_2(b.mlp(b.ln_1(b.attn(x))))),
    ("sandwich", True, lambda x, b: (h := x + b.ln_1_out(b.attn(b.ln_1(x)))) + b.ln_2_out(b.mlp(b.ln_2(h)))),
    ("sandwich", False, lambda x, b: b.ln_2_out(b.mlp(b.ln_2(b.ln_1_out(b.attn(b.ln_1(x))))))),
])
def test_sequential_block_places_its_norms_as_configured(place, res, expected):
    block = with_random_norm_gains(tiny_model(norm_placement=place, residual=res).transformer.h[0])
    assert (block.ln_1_out is not None) == (place == "sandwich")
    x = torch.randn(2, 5, 16)
    with torch.no_grad():
        torch.testing.assert_close(block(x), expected(x, block))


@pytest.mark.parametrize("place,res,expected", [
    ("pre", True, lambda x, b: x + b.attn(b.ln_1(x)) + b.mlp(b.ln_1(x))),
    ("post", True, lambda x, b: b.ln_1(x + b.attn(x) + b.mlp(x))),
    ("pre", False, lambda x, b: b.attn(b.ln_1(x)) + b.mlp(b.ln_1(x))),
    ("sandwich", True, lambda x, b: x + b.ln_1_out(b.attn(b.ln_1(x)) + b.mlp(b.ln_1(x)))),
])
def test_parallel_block_adds_both_branches_of_one_norm(place, res, expected):
    block = with_random_norm_gains(tiny_model(parallel=True, norm_placement=place, residual=res).transformer.h[0])
    assert not hasattr(block, "ln_2")
    x = torch.randn(2, 5, 16)
    with torch.no_grad():
        torch.testing.assert_close(block(x), expected(x, block))


@pytest.mark.parametrize("pos", ["none", "learned", "sinusoidal", "rope"])
def test_scaled_embeddings_enter_the_first_block_times_sqrt_width(pos):
    idx = torch.randint(0, V, (2, 5))
    seen = {}
    for scale in (False, True):     # the same seed: the same weights
        model = tiny_model(pos_encoding=pos, scale_embeddings=scale)
        model.transformer.h[0].register_forward_pre_hook(lambda m, args, s=scale: seen.update({s: args[0]}))
        with torch.no_grad():
            model(idx)
    # tokens and positions together, so their balance is what it is unscaled
    assert seen[False].abs().max() > 0
    torch.testing.assert_close(seen[True], seen[False] * math.sqrt(16))


def test_sandwich_keeps_the_final_norm_and_post_drops_it():
    assert isinstance(tiny_model(norm_placement="sandwich").transformer.ln_f, nn.LayerNorm)
    assert isinstance(tiny_model(norm_placement="post").transformer.ln_f, nn.Identity)


@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
def test_qk_norm_normalises_each_head_before_rotary(norm):
    model = tiny_model(qk_norm=True, norm_type=norm, pos_encoding="rope", n_layer=1)
    attn = model.transformer.h[0].attn
    with torch.no_grad():   # gains and biases away from 1 and 0, so the order of norm and rotation shows
        for p in (*attn.q_norm.parameters(), *attn.k_norm.parameters()):
            p.uniform_(-2.0, 2.0)
    x = torch.randn(2, BLOCK, 16)
    B, T, hs = 2, BLOCK, 4
    q, k, _ = attn.c_attn(x).split(16, dim=2)
    q = attn.rotary(attn.q_norm(q.view(B, T, 4, hs).transpose(1, 2)), 0)      # (B, nh, T, hs)
    k = attn.rotary(attn.k_norm(k.view(B, T, 4, hs).transpose(1, 2)), 0)
    scores = (q @ k.transpose(-2, -1) / math.sqrt(hs)).masked_fill(
        ~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
    attn.keep_weights = True    # what attention_maps sets, here with the block's input given directly
    with torch.no_grad():
        attn(x)
    torch.testing.assert_close(attn.weights, scores.softmax(dim=-1).detach())


@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
def test_qk_norm_makes_attention_blind_to_the_scale_of_queries_and_keys(norm):
    attn = tiny_model(qk_norm=True, norm_type=norm).transformer.h[0].attn
    plain = tiny_model(norm_type=norm).transformer.h[0].attn
    x = torch.randn(2, 5, 16)
    with torch.no_grad():
        before, plain_before = attn(x), plain(x)
        for a in (attn, plain):
            a.c_attn.weight[:32] *= 10      # the rows that make q and k
            a.c_attn.bias[:32] *= 10
        torch.testing.assert_close(attn(x), before, atol=1e-4, rtol=0)   # only the norm's eps feels it
        assert (plain(x) - plain_before).abs().max() > 1e-3


# ------------------------------------------------------------------ 3c. MLP activations

@pytest.mark.parametrize("activation, act", [("swiglu", F.silu), ("geglu", F.gelu)])
def test_gated_mlp_scales_one_half_by_the_activation_of_the_other(activation, act):
    mlp = tiny_model(activation=activation).transformer.h[0].mlp
    with torch.no_grad():   # wide weights, so the pre-activations reach where GELU's variants differ
        for p in mlp.parameters():
            p.normal_(0.0, 0.5)
    x = torch.randn(2, 5, 16)
    w_gate, w_value = mlp.c_fc.weight.chunk(2, dim=0)      # rows: the gate's units, then the value's
    b_gate, b_value = mlp.c_fc.bias.chunk(2)
    hidden = act(x @ w_gate.T + b_gate) * (x @ w_value.T + b_value)
    assert hidden.shape == (2, 5, 2 * 4 * 16 // 3)
    torch.testing.assert_close(mlp(x), hidden @ mlp.c_proj.weight.T + mlp.c_proj.bias)


# ------------------------------------------------------------------ 4. parameter counts, block_size

def test_gpt2_small_parameter_counts():
    with torch.device("meta"):   # shapes only: no 500 MB of float32 weights to allocate and init
        model = GPT(GPTConfig(vocab_size=50257, block_size=1024, n_layer=12, n_head=12, n_embd=768))
    assert model.num_params() == 124_439_808
    assert sum(p.numel() for p in model.transformer.h[0].parameters()) == 7_087_872
    assert model.num_params(non_embedding=True) == 124_439_808 - 1024 * 768


def test_sequence_longer_than_block_size_raises():
    model = tiny_model()
    with pytest.raises(ValueError, match="block_size"):
        model(torch.zeros(1, BLOCK + 1, dtype=torch.long))


# ------------------------------------------------------------------ 5. initialisation and names

def test_gpt2_init_scales_residual_projections():
    n_layer = 4
    model = tiny_model(vocab_size=256, block_size=64, n_layer=n_layer, n_head=4, n_embd=128)
    checked = 0
    for name, p in model.named_parameters():
        if p.dim() != 2:
            continue
        expected = 0.02 / math.sqrt(2 * n_layer) if name.endswith("c_proj.weight") else 0.02
        assert p.std().item() == pytest.approx(expected, rel=0.1), name
        checked += 1
    assert checked == 2 + 4 * n_layer   # wte (= lm_head), wpe, and four matrices per block


def test_state_dict_uses_gpt2_names():
    keys = set(tiny_model(pos_encoding="learned", norm_placement="pre").state_dict())
    per_block = ["ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias",
                 "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight", "ln_2.bias",
                 "mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias"]
    expected = {"transformer.wte.weight", "transformer.wpe.weight", "transformer.ln_f.weight",
                "transformer.ln_f.bias", "lm_head.weight"}
    expected |= {f"transformer.h.{i}.{name}" for i in range(2) for name in per_block}
    assert keys == expected
    rope_keys = set(tiny_model(pos_encoding="rope").state_dict())
    assert "transformer.wpe.weight" not in rope_keys
    assert rope_keys == expected - {"transformer.wpe.weight"}


PAIRED = [({}, dict(norm_placement="post")), ({}, dict(norm_placement="sandwich")), ({}, dict(residual=False)),
          ({}, dict(parallel=True)), ({}, dict(qk_norm=True)), ({}, dict(norm_type="rmsnorm")),
          ({}, dict(n_head=2)), ({}, dict(scale_embeddings=True)), ({}, dict(dropout=0.1)),
          ({}, dict(activation="relu")), ({}, dict(activation="gelu_tanh")),
          (dict(activation="swiglu"), dict(activation="geglu"))] + [
          (dict(pos_encoding="rope"), dict(pos_encoding=p)) for p in ("sinusoidal", "alibi", "none")]


@pytest.mark.parametrize("one, other", PAIRED, ids=lambda flags: str(flags))
def test_settings_that_keep_the_weights_shapes_start_from_the_same_weights(one, other):
    """What the README promises paired ablations: one seed, the same starting weights."""
    def weights(flags):
        torch.manual_seed(5)
        shape = {**dict(vocab_size=V, block_size=8, n_layer=2, n_head=4, n_embd=16), **flags}
        return GPT(GPTConfig(**shape)).state_dict()
    a, b = weights(one), weights(other)
    common = [k for k in a if k in b and a[k].shape == b[k].shape]
    assert {k for k in a if "weight" in k and "ln" not in k} <= set(common)     # all matrices and tables
    assert all(torch.equal(a[k], b[k]) for k in common)


def test_an_untied_head_changes_the_token_table_alone():
    def weights(tie):
        torch.manual_seed(5)
        return GPT(GPTConfig(vocab_size=V, block_size=8, n_layer=2, n_head=4, n_embd=16,
                             tie_weights=tie)).state_dict()
    tied, untied = weights(True), weights(False)
    assert [k for k in tied if not torch.equal(tied[k], untied[k])] == ["transformer.wte.weight"]


def test_sinusoidal_positions_start_at_the_token_embeddings_scale():
    from gpt.positions import sinusoidal_table
    model = GPT(GPTConfig(vocab_size=13, block_size=16, n_layer=1, n_head=2, n_embd=8,
                          pos_encoding="sinusoidal"))
    torch.testing.assert_close(model.pos_table, sinusoidal_table(16, 8) * 0.02 * math.sqrt(2))
    assert model.pos_table.pow(2).mean().sqrt().item() == pytest.approx(0.02, rel=0.05)


# ------------------------------------------------------------------ 6. attention maps

@pytest.mark.parametrize("pos", POS_ENCODINGS)
def test_attention_maps_are_causal_distributions(pos):
    model = tiny_model(pos_encoding=pos)
    maps = model.attention_maps(torch.randint(0, V, (2, 10)))
    assert len(maps) == 2
    for weights in maps:
        assert weights.shape == (2, 4, 10, 10)
        torch.testing.assert_close(weights.sum(-1), torch.ones(2, 4, 10), atol=1e-5, rtol=0)
        assert torch.all(weights.triu(1) == 0)


@pytest.mark.parametrize("flags", [dict(pos_encoding="none"), dict(pos_encoding="alibi"),
                                   dict(pos_encoding="rope", qk_norm=True), dict(n_kv_head=2)])
def test_attention_maps_are_the_weights_the_model_uses(flags):
    """The maps times the values give each layer's attention output, as the model computes it."""
    model = tiny_model(**flags)
    seen = {}
    for i, block in enumerate(model.transformer.h):
        block.attn.c_attn.register_forward_hook(lambda m, a, out, i=i: seen.__setitem__(("qkv", i), out))
        block.attn.c_proj.register_forward_hook(lambda m, a, out, i=i: seen.__setitem__(("y", i), a[0]))
    idx = torch.randint(0, V, (2, 10))
    maps = model.attention_maps(idx)
    for i, weights in enumerate(maps):
        attn = model.transformer.h[i].attn
        v = seen["qkv", i][..., -attn.n_kv_head * attn.head_size:]
        v = v.view(2, 10, attn.n_kv_head, attn.head_size).transpose(1, 2)      # (B, nkv, T, hs)
        v = v.repeat_interleave(attn.n_head // attn.n_kv_head, dim=1)         # (B, nh, T, hs)
        y = (weights @ v).transpose(1, 2).reshape(2, 10, -1)                   # (B, T, C)
        torch.testing.assert_close(y, seen["y", i], atol=1e-5, rtol=0)


def test_alibi_changes_attention_maps():
    alibi, plain = tiny_model(pos_encoding="alibi"), tiny_model(pos_encoding="none")
    plain.load_state_dict(alibi.state_dict())
    idx = torch.randint(0, V, (2, 10))
    for a, p in zip(alibi.attention_maps(idx), plain.attention_maps(idx)):
        assert (a - p).abs().max() > 1e-2


def test_attention_maps_under_bfloat16_autocast_are_float32_scores_of_its_queries_and_keys():
    model = tiny_model()
    qkv = []
    model.transformer.h[0].attn.c_attn.register_forward_hook(lambda m, a, out: qkv.append(out))
    idx = torch.randint(0, V, (2, 10))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        weights = model.attention_maps(idx)[0]
    q, k, _ = qkv[0].float().split(16, dim=2)
    q, k = (t.view(2, 10, 4, 4).transpose(1, 2) for t in (q, k))                  # (B, nh, T, hs)
    scores = (q @ k.transpose(-2, -1) / 2).masked_fill(torch.ones(10, 10).triu(1).bool(), float("-inf"))
    assert weights.dtype == torch.float32
    torch.testing.assert_close(weights, scores.softmax(dim=-1), atol=1e-6, rtol=0)


# ------------------------------------------------------------------ 7. dropout and pickling

def test_dropout_acts_in_every_block_part_only_when_set():
    idx = torch.randint(0, V, (2, BLOCK))
    model = tiny_model(dropout=0.3).train()
    parts = [model.transformer.drop, *(m for b in model.transformer.h for m in (b.attn.resid_dropout, b.mlp.dropout))]
    assert all(isinstance(m, nn.Dropout) and m.p == 0.3 for m in parts)
    torch.manual_seed(1)
    a, _ = model(idx)
    torch.manual_seed(2)
    b, _ = model(idx)
    assert not torch.allclose(a, b)
    # without dropout or QK-norm the blocks hold no do-nothing modules: sampling pays per call
    model = tiny_model(dropout=0.0).train()
    assert not [m for b in model.transformer.h for m in b.modules() if isinstance(m, (nn.Dropout, nn.Identity))]
    assert torch.equal(model(idx)[0], model.eval()(idx)[0])


@pytest.mark.parametrize("flags", [dict(norm_placement=p, residual=r) for p in PLACEMENTS for r in (True, False)]
                         + [dict(parallel=True, activation="swiglu", pos_encoding="rope", qk_norm=True, dropout=0.1)],
                         ids=lambda f: ",".join(f"{k}={v}" for k, v in f.items()))
def test_a_whole_model_pickles_and_computes_the_same_after(flags):
    model = tiny_model(**flags)
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    idx = torch.randint(0, V, (2, BLOCK))
    with torch.no_grad():
        assert torch.equal(loaded(idx)[0], model(idx)[0])
