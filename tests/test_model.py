import dataclasses
import io
import itertools
import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from gpt.config import GPTConfig
from gpt.errors import UserError
from gpt.cpu.attention import attention
from gpt.generate import KVCache
from gpt.model import GPT, CausalSelfAttention
from gpt.cpu.precision import (cpu_can_round, cpu_computes_bfloat16, cpu_rounds_matmuls, exact_cpu_matmuls,
                           lists_bfloat16, matmul_precision)
from gpt.positions import Rotary, alibi_bias, alibi_slopes, sinusoidal_table

POS_ENCODINGS = ("learned", "sinusoidal", "rope", "alibi", "none")
PLACEMENTS = ("pre", "post", "sandwich")
GRID = list(itertools.product(POS_ENCODINGS, PLACEMENTS, (True, False), ("layernorm", "rmsnorm")))
GRID_IDS = [f"{pe}-{place}-{'res' if res else 'nores'}-{norm}" for pe, place, res, norm in GRID]
V, BLOCK = 13, 16


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    # ops this small only pay for thread hand-offs; on a busy 2-core box that cost 10x the runtime
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def tiny_model(seed: int = 0, **overrides) -> GPT:
    settings = dict(vocab_size=V, block_size=BLOCK, n_layer=2, n_head=4, n_embd=16, dropout=0.0)
    torch.manual_seed(seed)
    return GPT(GPTConfig(**{**settings, **overrides})).eval()


def grid_model(pos, place, res, norm) -> GPT:
    return tiny_model(pos_encoding=pos, norm_placement=place, residual=res, norm_type=norm)


def check_causal(model: GPT, t: int = 7) -> None:
    idx = torch.randint(0, V, (2, BLOCK))
    changed = idx.clone()
    changed[:, t] = (idx[:, t] + 1) % V
    with torch.no_grad():
        before, _ = model(idx)
        after, _ = model(changed)
    torch.testing.assert_close(after[:, :t], before[:, :t], atol=1e-6, rtol=0)
    assert (after[:, t:] - before[:, t:]).abs().max() > 1e-4


def check_generate_cache(model: GPT) -> None:
    # at GPT-2's 0.02 init a tiny untrained model has near-flat logits (top-2 gaps down to 2e-6),
    # where float rounding alone could flip a greedy pick; wide random weights separate them
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.5)
    prompt = torch.randint(0, V, (2, 10))
    # 6 new tokens end exactly at block_size; 30 slide the window past it
    for n_new in (6, 30):
        cached = model.generate(prompt, n_new, temperature=0, use_cache=True)
        uncached = model.generate(prompt, n_new, temperature=0, use_cache=False)
        assert cached.shape == (2, 10 + n_new)
        assert torch.equal(cached, uncached)


# ------------------------------------------------------------------ 1. the full ablation grid

@pytest.mark.parametrize("pos,place,res,norm", GRID, ids=GRID_IDS)
def test_forward_loss_and_gradients(pos, place, res, norm):
    model = grid_model(pos, place, res, norm).train()
    idx = torch.randint(0, V, (2, BLOCK))
    targets = torch.randint(0, V, (2, BLOCK))
    logits, loss = model(idx, targets)
    assert logits.shape == (2, BLOCK, V)
    assert torch.isfinite(loss)
    loss.backward()
    # named_parameters lists the tied lm_head/wte once, under transformer.wte.weight
    for name, p in model.named_parameters():
        assert p.grad is not None, name
        assert p.grad.norm() > 0, name


@pytest.mark.parametrize("pos,place,res,norm", GRID, ids=GRID_IDS)
def test_causality(pos, place, res, norm):
    check_causal(grid_model(pos, place, res, norm))


@pytest.mark.parametrize("pos,place,res,norm", GRID, ids=GRID_IDS)
def test_generate_with_cache_equals_without(pos, place, res, norm):
    check_generate_cache(grid_model(pos, place, res, norm))


@pytest.mark.parametrize("pos,place,res,norm", GRID, ids=GRID_IDS)
def test_cached_hidden_states_match_uncached(pos, place, res, norm):
    model = grid_model(pos, place, res, norm)
    idx = torch.randint(0, V, (2, BLOCK))
    cache = KVCache(model.config, 2, "cpu", torch.float32)
    with torch.no_grad():
        full = model.hidden(idx)
        steps = [model.hidden(idx[:, :6], cache)]
        # one chunk of several new tokens too: that is the only path with a mask offset by cache.pos
        steps += [model.hidden(idx[:, 6:9], cache)]
        steps += [model.hidden(idx[:, t:t + 1], cache) for t in range(9, BLOCK)]
    assert cache.pos == BLOCK
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=0)


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

BLOCK_VARIANTS = [dict(parallel=True), dict(qk_norm=True), dict(qk_norm=True, norm_type="rmsnorm"),
                  dict(parallel=True, qk_norm=True, n_kv_head=2), dict(scale_embeddings=True)]


@pytest.mark.parametrize("place,res", list(itertools.product(PLACEMENTS, (True, False))))
@pytest.mark.parametrize("pos", ["learned", "rope", "alibi"])
@pytest.mark.parametrize("flags", BLOCK_VARIANTS, ids=lambda f: ",".join(f"{k}={v}" for k, v in f.items()))
def test_block_variants_train_stay_causal_and_cache(flags, pos, place, res):
    model = tiny_model(pos_encoding=pos, norm_placement=place, residual=res, **flags).train()
    _, loss = model(torch.randint(0, V, (2, BLOCK)), torch.randint(0, V, (2, BLOCK)))
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and p.grad.norm() > 0, name
    check_causal(model.eval())
    check_generate_cache(model)


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

@pytest.mark.parametrize("activation", ["gelu", "gelu_tanh", "relu", "swiglu", "geglu"])
def test_every_activation_trains_every_parameter(activation):
    model = tiny_model(activation=activation).train()
    _, loss = model(torch.randint(0, V, (2, BLOCK)), torch.randint(0, V, (2, BLOCK)))
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and p.grad.norm() > 0, name
    check_causal(model.eval())


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


def test_gated_mlp_has_the_weights_of_the_plain_one():
    sizes = {act: GPTConfig(n_embd=48, n_head=4, bias=False, activation=act).num_params()
             for act in ("gelu", "swiglu")}
    assert sizes["gelu"] == sizes["swiglu"]


# ------------------------------------------------------------------ 4-5. position encodings

@pytest.mark.parametrize("n_pos,dim", [(7, 6), (9, 8), (4, 5)])
def test_sinusoidal_table_matches_paper_formula(n_pos, dim):
    expected = [[math.sin(p / 10000 ** (2 * (j // 2) / dim)) if j % 2 == 0
                 else math.cos(p / 10000 ** (2 * (j // 2) / dim))
                 for j in range(dim)] for p in range(n_pos)]
    torch.testing.assert_close(sinusoidal_table(n_pos, dim), torch.tensor(expected), atol=1e-6, rtol=0)


def test_rope_scores_depend_only_on_relative_position():
    torch.manual_seed(0)
    rotary = Rotary(head_size=8, n_pos=32)
    q, k = torch.randn(2, 3, 10, 8), torch.randn(2, 3, 10, 8)
    at_0 = rotary(q, start=0) @ rotary(k, start=0).transpose(-2, -1)
    at_5 = rotary(q, start=5) @ rotary(k, start=5).transpose(-2, -1)
    # the rotation itself depends on absolute position, so the invariance is not vacuous
    assert not torch.allclose(rotary(q, start=0), rotary(q, start=5), atol=1e-3)
    torch.testing.assert_close(at_5, at_0, atol=1e-5, rtol=0)


def test_rope_rotates_each_pair_by_its_position_times_its_frequency():
    torch.manual_seed(0)
    hs, start, T = 8, 3, 4
    x = torch.randn(1, 1, T, hs)
    expected = torch.empty_like(x)
    for t in range(T):
        for i in range(hs // 2):
            angle = (start + t) * 10000 ** (-2 * i / hs)
            a, b = x[0, 0, t, 2 * i].item(), x[0, 0, t, 2 * i + 1].item()
            expected[0, 0, t, 2 * i] = a * math.cos(angle) - b * math.sin(angle)
            expected[0, 0, t, 2 * i + 1] = a * math.sin(angle) + b * math.cos(angle)
    torch.testing.assert_close(Rotary(hs, n_pos=16)(x, start), expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("n_head, slopes", [
    # the ALiBi paper's rule for head counts that are not powers of two: the slopes of the power
    # of two below, then every other slope of the power of two above
    (6, [2 ** -2, 2 ** -4, 2 ** -6, 2 ** -8, 2 ** -1, 2 ** -3]),
    (12, [2.0 ** -k for k in range(1, 9)] + [2 ** -0.5, 2 ** -1.5, 2 ** -2.5, 2 ** -3.5]),
])
def test_alibi_slopes_for_head_counts_that_are_not_powers_of_two(n_head, slopes):
    torch.testing.assert_close(alibi_slopes(n_head), torch.tensor(slopes))


def test_alibi_slopes_and_bias():
    slopes = alibi_slopes(8)
    torch.testing.assert_close(slopes, torch.tensor([2.0 ** -i for i in range(1, 9)]))
    T = 6
    bias = alibi_bias(slopes, 0, T, T)
    assert bias.shape == (8, T, T)
    for h in range(8):
        for i in range(T):
            for j in range(T):
                if j > i:
                    assert bias[h, i, j] == float("-inf")
                else:
                    assert bias[h, i, j].item() == pytest.approx(-slopes[h].item() * (i - j))


# ------------------------------------------------------------------ 6. GPT-2 checkpoints

@pytest.mark.parametrize("serialization", ["safetensors", "bin"])
def test_from_pretrained_matches_transformers(tmp_path, serialization):
    transformers = pytest.importorskip("transformers")
    hf_config = transformers.GPT2Config(n_layer=2, n_head=4, n_embd=32, n_positions=64,
                                        vocab_size=100, resid_pdrop=0.0, embd_pdrop=0.0,
                                        attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(hf_config).eval()
    # HF starts biases at 0 and norm weights at 1; perturb everything so a mis-mapped tensor shows
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(0.05 * torch.randn_like(p))
    hf.save_pretrained(tmp_path)
    if serialization == "bin":   # the older format; recent transformers no longer writes it
        state = {k: v for k, v in hf.state_dict().items() if k != "lm_head.weight"}
        torch.save(state, tmp_path / "pytorch_model.bin")
        (tmp_path / "model.safetensors").unlink()
    model = GPT.from_pretrained(str(tmp_path)).eval()
    assert model.config.block_size == 64 and model.config.activation == "gelu_tanh"
    idx = torch.randint(0, 100, (2, 20))
    with torch.no_grad():
        expected = hf(idx).logits
        logits, _ = model(idx)
    torch.testing.assert_close(logits, expected, atol=1e-4, rtol=0)


# ------------------------------------------------------------------ 7. parameter counts

def test_gpt2_small_parameter_counts():
    with torch.device("meta"):   # shapes only: no 500 MB of float32 weights to allocate and init
        model = GPT(GPTConfig(vocab_size=50257, block_size=1024, n_layer=12, n_head=12, n_embd=768))
    assert model.num_params() == 124_439_808
    assert sum(p.numel() for p in model.transformer.h[0].parameters()) == 7_087_872
    assert model.num_params(non_embedding=True) == 124_439_808 - 1024 * 768


# ------------------------------------------------------------------ 8. config validation

BAD_CONFIGS = [
    (dict(n_embd=10, n_head=3), r"n_embd=10.*n_head=3"),
    (dict(n_head=4, n_kv_head=3), r"n_head=4.*n_kv_head=3"),
    (dict(pos_encoding="rotary"), r"pos_encoding='rotary'"),
    (dict(norm_placement="middle"), r"norm_placement='middle'"),
    (dict(norm_type="batchnorm"), r"norm_type='batchnorm'"),
    (dict(activation="swish"), r"activation='swish'"),
    (dict(n_embd=1, n_head=1, mlp_ratio=1, activation="swiglu"), r"no hidden units.*raise mlp_ratio"),
    (dict(n_embd=4, n_head=4, qk_norm=True), r"qk_norm with norm_type='layernorm' needs a head size above 1"),
    (dict(n_kv_head=-1), r"n_kv_head=-1 must be positive, or 0 for as many as n_head"),
    (dict(n_embd=12, n_head=4, pos_encoding="rope"), r"pos_encoding='rope'.*head size.* 3"),
    (dict(n_layer=0), r"n_layer=0"),
    (dict(n_embd=-1), r"n_embd=-1"),
    (dict(block_size=0), r"block_size=0"),
    (dict(vocab_size=0), r"vocab_size=0"),
]


def test_n_kv_head_follows_a_replaced_n_head_unless_it_was_given_apart():
    cfg = GPTConfig(vocab_size=V, n_head=4, n_embd=32)
    assert dataclasses.replace(cfg, n_head=8).kv_heads == 8      # not grouped-query attention by stealth
    assert GPTConfig(vocab_size=V, n_head=4, n_kv_head=4, n_embd=32) == cfg     # one model, one record
    gqa = GPTConfig(vocab_size=V, n_head=4, n_kv_head=2, n_embd=32)
    assert (gqa.kv_heads, dataclasses.replace(gqa, n_head=8).kv_heads) == (2, 2)


@pytest.mark.parametrize("overrides,message", BAD_CONFIGS,
                         ids=[",".join(f"{k}={v}" for k, v in o.items()) for o, _ in BAD_CONFIGS])
def test_bad_config_raises(overrides, message):
    settings = dict(vocab_size=V, block_size=BLOCK, n_layer=2, n_head=4, n_embd=16)
    with pytest.raises(ValueError, match=message) as info:
        GPTConfig(**{**settings, **overrides})
    assert isinstance(info.value, UserError)


def test_sequence_longer_than_block_size_raises():
    model = tiny_model()
    with pytest.raises(ValueError, match="block_size"):
        model(torch.zeros(1, BLOCK + 1, dtype=torch.long))


# ------------------------------------------------------------------ 9. initialisation and names

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


# ------------------------------------------------------------------ 10. attention maps

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


# ------------------------------------------------------------------ 11. sampling

def test_greedy_is_deterministic_and_picks_the_argmax():
    model = tiny_model()
    prompt = torch.randint(0, V, (2, 5))
    # uncached, so each step runs exactly the forward pass it is compared with below
    out = model.generate(prompt, 8, temperature=0, use_cache=False)
    assert torch.equal(out, model.generate(prompt, 8, temperature=0, use_cache=False))
    with torch.no_grad():
        for t in range(5, out.size(1)):
            logits, _ = model(out[:, :t])
            assert torch.equal(out[:, t], logits[:, -1].argmax(-1))


@pytest.mark.parametrize("truncation", [dict(top_k=1), dict(top_p=1e-9)], ids=["top_k=1", "top_p=1e-9"])
def test_truncated_sampling_equals_greedy(truncation):
    model = tiny_model()
    prompt = torch.randint(0, V, (2, 5))
    greedy = model.generate(prompt, 20, temperature=0)
    sampled = model.generate(prompt, 20, temperature=1.0, generator=torch.Generator().manual_seed(1),
                             **truncation)
    assert torch.equal(sampled, greedy)


@pytest.mark.parametrize("temperature, top_k, top_p, expected", [
    (1.0, None, None, [0.5, 0.3, 0.15, 0.05]),
    (1.0, 2, None, [0.625, 0.375, 0, 0]),               # the two most likely, renormalised
    (1.0, 3, 0.6, [0.625, 0.375, 0, 0]),                # 0.5 < 0.6: the second token is needed
    (1.0, None, 0.8, [0.625, 0.375, 0, 0]),             # 0.5 + 0.3 reaches 0.8 exactly
    (1.0, None, 0.81, [0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0]),
    (0.5, None, None, [p * p / 0.365 for p in (0.5, 0.3, 0.15, 0.05)]),   # p^2, renormalised
    (1.0, None, 1e-300, [1, 0, 0, 0]),                  # 0 in float32: the likeliest token is kept
])
def test_sampling_draws_from_the_truncated_tempered_distribution(temperature, top_k, top_p, expected):
    from gpt.generate import pick_token
    logits = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log().expand(40_000, 4)
    tokens = pick_token(logits, temperature, top_k, top_p, torch.Generator().manual_seed(0))
    freq = torch.bincount(tokens.flatten(), minlength=4) / tokens.numel()
    assert freq.tolist() == pytest.approx(expected, abs=0.01)
    assert all(f == 0 for f, e in zip(freq.tolist(), expected) if e == 0)


@pytest.mark.parametrize("top_k, top_p", [(1, None), (None, 0.3)])
def test_truncation_keeps_tokens_tied_at_its_edge(top_k, top_p):
    from gpt.generate import pick_token
    logits = torch.tensor([[0.2, 0.4, 0.4]]).log().expand(40_000, 3)
    tokens = pick_token(logits, 1.0, top_k, top_p, torch.Generator().manual_seed(0))
    freq = torch.bincount(tokens.flatten(), minlength=3) / tokens.numel()
    assert freq.tolist() == pytest.approx([0, 0.5, 0.5], abs=0.01) and freq[0] == 0


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


def test_sampling_seed_reproduces_tokens():
    model = tiny_model()
    prompt = torch.randint(0, V, (2, 5))

    def sample(seed):
        return model.generate(prompt, 20, temperature=1.0, generator=torch.Generator().manual_seed(seed))

    assert torch.equal(sample(7), sample(7))
    # a near-uniform 13-way choice 40 times over: another seed agreeing would mean the seed is ignored
    assert not torch.equal(sample(7), sample(8))


def test_sinusoidal_positions_start_at_the_token_embeddings_scale():
    from gpt.positions import sinusoidal_table
    model = GPT(GPTConfig(vocab_size=13, block_size=16, n_layer=1, n_head=2, n_embd=8,
                          pos_encoding="sinusoidal"))
    torch.testing.assert_close(model.pos_table, sinusoidal_table(16, 8) * 0.02 * math.sqrt(2))
    assert model.pos_table.pow(2).mean().sqrt().item() == pytest.approx(0.02, rel=0.05)


@pytest.mark.parametrize("change, message", [
    (dict(layer_norm_epsilon=1e-6), r"layer_norm_epsilon=1e-06 has no counterpart here"),
    (dict(scale_attn_by_inverse_layer_idx=True), r"scale_attn_by_inverse_layer_idx=True has no counterpart"),
    (dict(activation_function="silu"), r"activation_function='silu' has no counterpart"),
    (dict(n_inner=48), r"n_inner=48 has no counterpart"),
    (dict(model_type="llama"), r"describes a 'llama' model, not 'gpt2'"),
    (dict(n_layer=None), r"lacks n_layer"),
    ("no weights", r"has no model.safetensors or pytorch_model.bin"),
    ("no config", r"cannot read .*config.json"),
])
def test_from_pretrained_refuses_what_it_cannot_load_faithfully(change, message, tmp_path):
    config = {"model_type": "gpt2", "vocab_size": 10, "n_positions": 8, "n_layer": 1, "n_head": 2,
              "n_embd": 8, "activation_function": "gelu_new"}
    if isinstance(change, dict):
        config.update(change)
        config = {k: v for k, v in config.items() if v is not None}
    if change != "no config":
        (tmp_path / "config.json").write_text(json.dumps(config))
    if change != "no weights":
        torch.save({}, tmp_path / "pytorch_model.bin")
    with pytest.raises(UserError, match=message):
        GPT.from_pretrained(str(tmp_path))


@pytest.mark.parametrize("weights, message", [
    ("model.safetensors", r"cannot read .*model.safetensors \(SafetensorError\); it is damaged"),
    ("pytorch_model.bin", r"cannot read .*pytorch_model.bin \(\w+\); it is damaged"),
    ({}, r"weights in .*pytorch_model.bin do not fit .*config.json: \d+ missing \(transformer.wte.weight, "),
    ({"wte.weight": torch.zeros(10, 4)}, r"15 missing .*; 2 of another shape \(transformer.wte.weight \(10, 4\), not \(10, 8\), lm_head"),
])
def test_from_pretrained_names_damaged_or_mismatched_weights(weights, message, tmp_path):
    if weights == "model.safetensors":
        pytest.importorskip("safetensors")
    (tmp_path / "config.json").write_text(json.dumps(
        {"model_type": "gpt2", "vocab_size": 10, "n_positions": 8, "n_layer": 1, "n_head": 2, "n_embd": 8}))
    if isinstance(weights, str):
        (tmp_path / weights).write_bytes(b"\x00\x01 not weights" * 10)
    else:
        torch.save(weights, tmp_path / "pytorch_model.bin")
    with pytest.raises(UserError, match=message):
        GPT.from_pretrained(str(tmp_path))


def test_from_pretrained_names_a_path_that_is_neither_folder_nor_hub_model(tmp_path):
    pytest.importorskip("huggingface_hub")
    with pytest.raises(UserError, match="is not a folder, and the hub could not give it"):
        GPT.from_pretrained(str(tmp_path / "no" / "such" / "folder"))


@pytest.mark.parametrize("flags", [dict(), dict(bias=False, norm_type="rmsnorm"), dict(norm_placement="post"),
                                   dict(tie_weights=False, pos_encoding="rope", n_kv_head=1, mlp_ratio=3),
                                   dict(activation="swiglu"), dict(activation="geglu", bias=False),
                                   dict(parallel=True, qk_norm=True), dict(qk_norm=True, bias=False),
                                   dict(parallel=True, qk_norm=True, norm_type="rmsnorm", norm_placement="post"),
                                   dict(norm_placement="sandwich"),
                                   dict(norm_placement="sandwich", parallel=True, norm_type="rmsnorm")])
def test_the_config_counts_the_parameters_of_its_model(flags):
    cfg = GPTConfig(vocab_size=37, block_size=16, n_layer=2, n_head=2, n_embd=16, **flags)
    assert cfg.num_params() == GPT(cfg).num_params()


@pytest.mark.parametrize("kwargs, message", [
    (dict(top_p=0.0), r"top_p=0.0 must be in \(0, 1\]"), (dict(top_k=-3), r"top_k=-3 must be positive"),
    (dict(temperature=-1.0), r"temperature=-1.0 is negative"), (dict(max_new_tokens=-1), r"max_new_tokens=-1"),
    (dict(idx=torch.zeros((1, 0), dtype=torch.long)), r"idx has shape \(1, 0\)"),
])
def test_generate_refuses_bad_arguments_in_one_line(kwargs, message):
    args = {"idx": torch.zeros((1, 1), dtype=torch.long), "max_new_tokens": 3, **kwargs}
    with pytest.raises(UserError, match=message):
        tiny_model().generate(**args)


@pytest.fixture
def medium(cpu_rounds_when_asked):
    with matmul_precision("medium", "cpu"):
        yield


def test_cpu_rounds_matmuls_says_whether_medium_rounds_linear_layers():
    # torch rounds only on CPUs with AMX; elsewhere medium is not asked for: SDPA slows down under it
    torch.manual_seed(0)
    x, w = torch.randn(64, 128), torch.randn(256, 128)
    with matmul_precision("medium", "cpu"):
        rounded = F.linear(x, w)
        with exact_cpu_matmuls():
            exact = F.linear(x, w)
            assert not cpu_rounds_matmuls()
        assert cpu_rounds_matmuls() == (not torch.equal(rounded, exact))
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists() and "amx_bf16" in cpuinfo.read_text():
        assert cpu_can_round()      # where torch does round, medium must ask for it


def test_cpus_computing_bfloat16_are_read_from_their_flags():
    assert lists_bfloat16("processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16 avx512_vnni\n")
    assert lists_bfloat16("flags\t\t: avx512f amx_bf16 amx_tile\n")
    assert not lists_bfloat16("flags\t\t: fpu avx2 avx512f avx512bw\n")          # AVX-512 without BF16
    assert not lists_bfloat16("model name\t: avx512_bf16 lookalike\nflags\t\t: avx2\n")
    assert not lists_bfloat16("Features\t: fp asimd bf16\n")     # Arm's bfloat16: not measured, so float32
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        words = cpuinfo.read_text().split()
        avx512 = torch.backends.cpu.get_cpu_capability().startswith("AVX512")
        assert cpu_computes_bfloat16() == (avx512 and ("avx512_bf16" in words or "amx_bf16" in words))


@pytest.mark.parametrize("masked", [False, True], ids=["causal", "bias"])
@pytest.mark.parametrize("grads", ["qkv", "q", "none"])
def test_attention_at_medium_precision_equals_exact_sdpa(medium, masked, grads):
    # SDPA's CPU kernel slows 10x when its products are rounded: attention stays exact, to the
    # bit, forward and backward, and the setting is medium again afterwards
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 32, 16, requires_grad=name in grads) for name in "qkv")
    bias = torch.randn(4, 32, 32) if masked else None
    y = attention(q, k, v, bias, 0.0, not masked)
    wanted = [t for t in (q, k, v) if t.requires_grad]
    with exact_cpu_matmuls():
        expected = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, is_causal=not masked)
        expected_grads = torch.autograd.grad(expected.square().sum(), wanted) if wanted else []
    assert torch.equal(y, expected)
    assert y.requires_grad == bool(wanted)
    if wanted:
        for got, want in zip(torch.autograd.grad(y.square().sum(), wanted), expected_grads, strict=True):
            assert torch.equal(got, want)
    assert cpu_rounds_matmuls()


def test_attention_backward_leaves_the_precision_it_found_and_frees_its_graph(medium):
    q = torch.randn(1, 2, 8, 4, requires_grad=True)
    y = attention(q, q, q, None, 0.0, True)
    with matmul_precision("highest", "cpu"):   # a caller that changed it between forward and backward
        y.sum().backward(retain_graph=True)
        assert not cpu_rounds_matmuls()
    assert y.grad_fn.graph is None      # held until the loss is dropped, it cost 0.5 GB at batch 64
    with pytest.raises(RuntimeError, match="goes backward once; for retain_graph use matmul_precision=high"):
        y.sum().backward()


def test_attention_goes_backward_inside_inference_mode(medium):
    q = torch.randn(1, 2, 8, 4, requires_grad=True)
    loss = attention(q, q, q, None, 0.0, True).sum()
    with torch.inference_mode():
        (grad,) = torch.autograd.grad(loss, q)
    with exact_cpu_matmuls():
        (expected,) = torch.autograd.grad(F.scaled_dot_product_attention(q, q, q, is_causal=True).sum(), q)
    assert torch.equal(grad, expected)


def test_attention_leaves_the_precision_it_found_when_sdpa_fails(medium):
    q = torch.randn(1, 2, 8, 4, requires_grad=True)
    with pytest.raises(RuntimeError):
        attention(q, torch.randn(1, 2, 8, 5), torch.randn(1, 2, 8, 4), None, 0.0, True)
    assert cpu_rounds_matmuls()


@pytest.fixture
def sdpa_calls(monkeypatch):
    """The dtypes of q, k, v and the mask of each call of SDPA."""
    calls, sdpa = [], F.scaled_dot_product_attention

    def recording(q, k, v, attn_mask=None, **kwargs):
        calls.append((q.dtype, k.dtype, v.dtype, None if attn_mask is None else attn_mask.dtype))
        return sdpa(q, k, v, attn_mask=attn_mask, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", recording)
    return calls


@pytest.mark.parametrize("pos", ["learned", "alibi"])
def test_cpu_attention_under_bfloat16_autocast_runs_in_float32(sdpa_calls, pos):
    # SDPA's CPU kernel in bfloat16 took 3.3x as long going backward: the linear layers take
    # bfloat16, attention float32, ALiBi's bias unrounded; the gradients still reach every weight
    calls = sdpa_calls
    model = tiny_model(pos_encoding=pos).train()
    idx = torch.randint(0, V, (2, BLOCK))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits, loss = model(idx, idx)
        assert model.transformer.h[0].attn.c_attn(torch.randn(1, 16)).dtype == torch.bfloat16
    loss.backward()
    mask = torch.float32 if pos == "alibi" else None
    assert calls == [(torch.float32, torch.float32, torch.float32, mask)] * 2
    assert logits.dtype == torch.bfloat16
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())
    with torch.no_grad():
        exact = tiny_model(pos_encoding=pos)(idx)[0]
    assert (logits.float() - exact).abs().max() < 0.05     # the same model, rounded


@pytest.mark.parametrize("pos", ["learned", "alibi"])
def test_a_bfloat16_model_runs_and_samples_on_cpu(sdpa_calls, pos):
    # attention computes in float32 on a CPU and hands back the dtype it was given
    model = tiny_model(pos_encoding=pos).to(torch.bfloat16)
    idx = torch.randint(0, V, (2, BLOCK))
    logits, _ = model(idx)
    assert logits.dtype == torch.bfloat16
    assert {call[:3] for call in sdpa_calls} == {(torch.float32,) * 3}
    reference = tiny_model(pos_encoding=pos)(idx)[0]
    assert (logits.float() - reference).abs().max() < 0.1
    assert model.generate(idx[:, :3], max_new_tokens=BLOCK, temperature=0.0).shape == (2, BLOCK + 3)


def test_cpu_attention_keeps_float64_exact():
    # only bfloat16 and float16 go through float32: a float64 model stays float64, for gradcheck
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 8, 4, dtype=torch.float64, requires_grad=True) for _ in range(3))
    y = attention(q, k, v, None, 0.0, True)
    assert y.dtype == torch.float64 and torch.equal(y, F.scaled_dot_product_attention(q, k, v, is_causal=True))
    assert torch.autograd.gradcheck(lambda *t: attention(*t, None, 0.0, True), (q, k, v))


def test_bfloat16_autocast_attention_at_medium_precision_is_exact_float32(medium):
    # on a CPU that rounds, the float32 detour of bfloat16 attention takes the exact path too
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 32, 16).bfloat16() for _ in range(3))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = attention(q, k, v, None, 0.0, True)
    with exact_cpu_matmuls():
        expected = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True)
    assert y.dtype == torch.bfloat16 and torch.equal(y, expected.bfloat16())


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


def _precision_state():
    def read(get):
        try:
            return get()
        except RuntimeError:        # torch's level getters raise when the backends contradict it
            return "raises"
    return (read(torch.get_float32_matmul_precision), read(lambda: torch.backends.cuda.matmul.allow_tf32),
            torch.backends.cuda.matmul.fp32_precision, torch.backends.mkldnn.matmul.fp32_precision)


CALLER_SETTINGS = {
    "nothing": [],
    "level high": [("level", "high")],
    "level medium": [("level", "medium")],
    "medium, CPU exact": [("level", "medium"), ("mkldnn", "ieee")],
    "high, CPU exact": [("level", "high"), ("mkldnn", "ieee")],
    "medium, CUDA exact": [("level", "medium"), ("cuda", "ieee")],
    "CUDA tf32 only": [("cuda", "tf32")],
    "CPU bf16 only": [("mkldnn", "bf16")],
}


@pytest.mark.parametrize("caller", CALLER_SETTINGS)
def test_runs_put_back_every_precision_setting_they_found(caller, cpu_rounds_when_asked):
    try:
        for what, value in CALLER_SETTINGS[caller]:
            if what == "level":
                torch.set_float32_matmul_precision(value)
            else:
                getattr(torch.backends, what).matmul.fp32_precision = value
        found = _precision_state()
        for level in ("highest", "high", "medium", "medium"):
            for device_type in ("cpu", "cuda"):
                with matmul_precision(level, device_type):
                    assert cpu_rounds_matmuls() == (level == "medium")
                assert _precision_state() == found
    finally:        # torch's own start: level highest, no backend set
        torch.set_float32_matmul_precision("highest")
        torch.backends.cuda.matmul.fp32_precision = torch.backends.mkldnn.matmul.fp32_precision = "none"


def test_medium_changes_a_models_loss_and_gradients_by_rounding_only(medium):
    model = tiny_model(n_layer=2, n_embd=32)
    idx = torch.randint(0, V, (4, BLOCK))
    _, loss = model(idx, idx)
    grads = torch.autograd.grad(loss, list(model.parameters()))
    with exact_cpu_matmuls():
        _, exact_loss = model(idx, idx)
        exact_grads = torch.autograd.grad(exact_loss, list(model.parameters()))
    assert loss.item() == pytest.approx(exact_loss.item(), rel=1e-2)
    for got, want in zip(grads, exact_grads):
        assert (got - want).norm() <= 0.05 * want.norm() + 1e-6


def test_the_model_runs_after_torchs_own_precision_settings_are_used():
    # torch's legacy precision getter raises once these are set; the model must not need it
    before = torch.backends.cuda.matmul.fp32_precision
    torch.backends.cuda.matmul.fp32_precision = "tf32"
    try:
        model = tiny_model()
        model(torch.randint(0, V, (1, 4)))
        assert model.generate(torch.zeros(1, 1, dtype=torch.long), 3).shape == (1, 4)
    finally:
        torch.backends.cuda.matmul.fp32_precision = before


def test_torch_compile_traces_attention_at_medium_precision_without_a_break(medium):
    model = tiny_model()
    explanation = torch._dynamo.explain(model)(torch.randint(0, V, (2, 8)))
    assert explanation.graph_break_count == 0, explanation.break_reasons


def test_torch_compile_keeps_cpu_attention_in_float32_under_bfloat16_autocast():
    # compiled, bfloat16 attention made the fast config's steps 11.6-14.9 ms against 10.1-10.2
    seen = []

    def recording_backend(gm, example_inputs):
        seen.extend(tuple(a.meta["example_value"].dtype for a in node.args[:3])
                    for node in gm.graph.nodes if node.target is F.scaled_dot_product_attention)
        return gm.forward

    model = tiny_model().train()
    idx = torch.randint(0, V, (2, 8))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits, loss = torch.compile(model, backend=recording_backend)(idx, idx)
    loss.backward()
    assert seen == [(torch.float32,) * 3] * 2 and logits.dtype == torch.bfloat16


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


def test_widening_weights_are_stored_transposed_and_no_result_changes():
    # a layout for sampling speed: the weights' values, outputs and gradients are those of
    # row-major weights, a weight's gradient has its layout, and row-major state dicts load
    model = tiny_model(tie_weights=False, vocab_size=40)          # a head that widens 16 to 40
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    widening = [m.weight for m in linears if m.out_features > m.in_features]
    assert len(widening) == 5 and all(w.t().is_contiguous() for w in widening)
    assert all(m.weight.is_contiguous() for m in linears if m.out_features <= m.in_features)
    plain = tiny_model(tie_weights=False, vocab_size=40)
    for m in plain.modules():
        if isinstance(m, nn.Linear):
            m.weight.data = m.weight.data.contiguous()
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), plain.parameters()))
    idx = torch.randint(0, 40, (3, BLOCK))
    (_, loss), (_, plain_loss) = model.train()(idx, idx), plain.train()(idx, idx)
    loss.backward()
    plain_loss.backward()
    torch.testing.assert_close(loss, plain_loss)
    for p, q in zip(model.parameters(), plain.parameters()):
        torch.testing.assert_close(p.grad, q.grad)
        assert p.grad.stride() == p.stride()
    fresh = tiny_model(seed=1, tie_weights=False, vocab_size=40)
    fresh.load_state_dict(plain.state_dict())
    assert all(m.weight.t().is_contiguous() for m in fresh.modules()
               if isinstance(m, nn.Linear) and m.out_features > m.in_features)
    torch.testing.assert_close(fresh(idx)[0], model(idx)[0])


def test_generated_text_can_be_trained_on():
    # tokens are chosen under inference_mode; what generate returns must be an ordinary tensor,
    # which a training step may save for backward and a caller may change in place
    model = tiny_model()
    out = model.generate(torch.zeros(2, 1, dtype=torch.long), 6)
    out[:, 0] = 1
    _, loss = model.train()(out[:, :-1], out[:, 1:])
    loss.backward()
    assert model.transformer.wte.weight.grad is not None


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
