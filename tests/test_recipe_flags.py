"""The block flags of today's recipes (relu2, logit_softcap, zero_init, embed_norm, norm_affine):
each one's formula, where it reaches, and its bad values."""

import pytest
import torch
import torch.nn.functional as F

import train
from conftest import BLOCK, V
from gpt import GPT, GPTConfig, from_pretrained
from gpt.export import refusals

pytestmark = pytest.mark.usefixtures("one_thread")


def tiny(**kw) -> GPTConfig:
    return GPTConfig(vocab_size=V, block_size=BLOCK, n_layer=2, n_head=2, n_embd=16, **kw)


def test_relu2_is_the_square_of_relu_at_the_weight_count_of_gelu():
    torch.manual_seed(0)
    model = GPT(tiny(activation="relu2"))
    x = torch.randn(3, 5, 16) * 3
    mlp = model.transformer.h[0].mlp
    expected = mlp.c_proj(torch.relu(mlp.c_fc(x)) ** 2)
    assert torch.equal(mlp(x), expected)
    assert model.num_params() == GPT(tiny(activation="gelu")).num_params() == tiny(activation="relu2").num_params()


def test_soft_capped_logits_are_c_tanh_of_the_plain_ones_and_bounded_by_c():
    torch.manual_seed(0)
    capped, plain = GPT(tiny(logit_softcap=2.0)), GPT(tiny())
    plain.load_state_dict(capped.state_dict())
    with torch.no_grad():
        capped.transformer.wte.weight.mul_(200)      # the head is tied: logits far past the cap
        plain.transformer.wte.weight.mul_(200)
    idx = torch.randint(0, V, (2, BLOCK))
    raw, _ = plain(idx)
    logits, loss = capped(idx, idx)
    assert raw.abs().max() > 20
    assert logits.abs().max() <= 2.0      # tanh rounds to 1 in float32 far out
    assert torch.allclose(logits, 2.0 * torch.tanh(raw / 2.0))
    assert torch.allclose(loss, F.cross_entropy(logits.view(-1, V), idx.view(-1)))


def test_sampling_and_evaluation_see_the_capped_logits(monkeypatch):
    torch.manual_seed(0)
    model = GPT(tiny(logit_softcap=1.5))
    with torch.no_grad():
        model.transformer.wte.weight.mul_(300)
    seen = []
    real = model.logits
    monkeypatch.setattr(model, "logits", lambda h: seen.append(real(h)) or seen[-1])
    model.generate(torch.zeros(1, 1, dtype=torch.long), 4)
    assert len(seen) == 4 and all(s.abs().max() <= 1.5 for s in seen)


def test_zero_init_starts_every_residual_projection_at_zero_and_nothing_else():
    model = GPT(tiny(zero_init=True))
    for name, p in model.named_parameters():
        if name.endswith("c_proj.weight"):
            assert not p.any(), name
        elif name.endswith("weight") and p.dim() == 2:
            assert p.std() > 0.01, name
    scaled = GPT(tiny())
    assert all(p.any() for n, p in scaled.named_parameters() if n.endswith("c_proj.weight"))
    # each block then starts as the identity: the stream leaving the blocks is the embeddings
    idx = torch.randint(0, V, (1, BLOCK))
    embedded = model.transformer.wte(idx) + model.transformer.wpe(torch.arange(BLOCK))
    assert torch.allclose(model.hidden(idx), model.transformer.ln_f(embedded), atol=1e-6)


@pytest.mark.parametrize("norm_type", ["layernorm", "rmsnorm"])
def test_norm_affine_false_leaves_no_norm_parameters(norm_type):
    config = tiny(norm_affine=False, norm_type=norm_type, qk_norm=True, embed_norm=True, norm_placement="sandwich")
    model = GPT(config)
    norms = [m for m in model.modules() if isinstance(m, (torch.nn.LayerNorm, torch.nn.RMSNorm))]
    assert len(norms) == 2 * (4 + 2) + 2     # per block 4 (sandwich) + q and k; ln_e, ln_f
    assert all(not list(m.parameters()) for m in norms)
    assert model.num_params() == config.num_params()
    with_gains = GPT(tiny(norm_type=norm_type, qk_norm=True, embed_norm=True, norm_placement="sandwich"))
    assert with_gains.num_params() > model.num_params()


def test_embed_norm_normalises_the_embeddings_before_the_blocks():
    torch.manual_seed(0)
    model = GPT(tiny(embed_norm=True, norm_affine=False))
    seen = []
    model.transformer.h[0].register_forward_pre_hook(lambda m, args: seen.append(args[0]))
    idx = torch.randint(0, V, (2, BLOCK))
    model(idx)
    embedded = model.transformer.wte(idx) + model.transformer.wpe(torch.arange(BLOCK))
    assert torch.allclose(seen[0], F.layer_norm(embedded, (16,), eps=1e-5), atol=1e-6)
    assert embedded.std() < 0.1 and torch.allclose(seen[0].std(-1), torch.ones(2, BLOCK), atol=0.05)
    assert GPT(tiny(embed_norm=True)).num_params() == tiny(embed_norm=True).num_params() == tiny().num_params() + 32


def test_export_refuses_what_gpt2_cannot_compute_and_takes_the_rest():
    assert [s for s, _ in refusals(tiny(logit_softcap=15.0, embed_norm=True))] == ["embed_norm=true",
                                                                                   "logit_softcap=15.0"]
    assert refusals(tiny(activation="relu2", norm_affine=False, zero_init=True)) == []


@pytest.mark.parametrize("flag, value, named", [
    ("logit_softcap", "-1", "logit_softcap=-1.0 must be positive"),
    ("optimizer", "sgd", "optimizer='sgd' is not allowed"),
    ("muon_lr", "0", "muon_lr=0.0 must be positive"),
    ("muon_momentum", "1", "muon_momentum=1.0 must be in [0, 1)"),
    ("activation", "relu3", "choose one of gelu, gelu_tanh, relu, relu2,"),
])
def test_a_bad_value_is_one_line_naming_it(flag, value, named, capsys):
    assert train.main([f"--{flag}={value}"]) == 2
    err = capsys.readouterr().err
    assert named in err and len(err.strip().splitlines()) == 1


def test_bad_values_are_refused_where_the_config_is_built():
    with pytest.raises(ValueError, match="logit_softcap"):
        tiny(logit_softcap=-0.5)


def test_a_relu2_model_without_norm_gains_exports_to_the_same_logits(tmp_path, capsys):
    pytest.importorskip("transformers")
    from test_export import CHARS, export_ok, hf_model, save_run, wide_model
    model = wide_model(activation="relu2", norm_affine=False, bias=False)
    export_ok(capsys, save_run(tmp_path / "run", model), tmp_path / "hf")
    idx = torch.randint(0, len(CHARS), (2, 16))
    with torch.no_grad():
        ours = model(idx)[0]
        assert (ours - hf_model(tmp_path / "hf")(idx).logits).abs().max() <= 1e-4
    back = from_pretrained(str(tmp_path / "hf")).eval()     # with gains of 1, as written
    assert back.config.activation == "relu2"
    torch.testing.assert_close(back(idx)[0], ours, atol=1e-4, rtol=0)
