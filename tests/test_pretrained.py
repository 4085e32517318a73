"""gpt/pretrained.py: from_pretrained, Hugging Face GPT-2 configs and weights."""

import json

import pytest
import torch

from gpt.errors import UserError
from gpt.pretrained import from_pretrained

pytestmark = pytest.mark.usefixtures("one_thread")     # conftest.py


@pytest.mark.e2e
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
    model = from_pretrained(str(tmp_path)).eval()
    assert model.config.block_size == 64 and model.config.activation == "gelu_tanh"
    idx = torch.randint(0, 100, (2, 20))
    with torch.no_grad():
        expected = hf(idx).logits
        logits, _ = model(idx)
    torch.testing.assert_close(logits, expected, atol=1e-4, rtol=0)


@pytest.mark.parametrize("change, message", [
    (dict(layer_norm_epsilon=1e-6), r"layer_norm_epsilon=1e-06 has no counterpart here"),
    (dict(scale_attn_by_inverse_layer_idx=True), r"scale_attn_by_inverse_layer_idx=True has no counterpart"),
    (dict(activation_function="silu"), r"activation_function='silu' has no counterpart"),
    (dict(n_inner=44), r"n_inner=44 \(not a multiple of n_embd=8\) has no counterpart"),
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
        from_pretrained(str(tmp_path))


def test_a_key_error_in_our_own_code_is_not_blamed_on_the_config_file(tmp_path, monkeypatch):
    from gpt import pretrained
    (tmp_path / "config.json").write_text(json.dumps(
        {"model_type": "gpt2", "vocab_size": 10, "n_positions": 8, "n_layer": 1, "n_head": 2, "n_embd": 8}))
    torch.save({}, tmp_path / "pytorch_model.bin")

    def buggy(*args, **kwargs):
        raise KeyError("a bug of ours")
    monkeypatch.setattr(pretrained, "build", buggy)
    with pytest.raises(KeyError, match="a bug of ours"):
        from_pretrained(str(tmp_path))


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
        from_pretrained(str(tmp_path))


def test_from_pretrained_names_a_path_that_is_neither_folder_nor_hub_model(tmp_path):
    pytest.importorskip("huggingface_hub")
    with pytest.raises(UserError, match="is not a folder, and the hub could not give it"):
        from_pretrained(str(tmp_path / "no" / "such" / "folder"))
