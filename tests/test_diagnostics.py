"""gpt/diagnostics.py: the measures logged during training, and python -m gpt.diagnostics grad-depth."""

import json
import math
import re

import numpy as np
import pytest
import torch

from gpt import diagnostics
from gpt.config import GPTConfig
from gpt.diagnostics import (attention_entropy, grad_depth, main as diagnostics_main, measure,
                             position_similarity, unigram_loss, update_ratios, whole_split_loss)
from gpt.model import GPT
from gpt.cpu.optim import AdamW


def test_identical_positions_have_similarity_one_and_orthogonal_zero():
    same = torch.randn(1, 1, 8).expand(3, 5, 8)
    assert position_similarity(same) == pytest.approx(1.0)
    orthogonal = torch.eye(4).unsqueeze(0)                      # 4 positions, 4 orthogonal vectors
    assert position_similarity(orthogonal) == pytest.approx(0.0, abs=1e-7)
    opposite = torch.tensor([[[1.0, 0.0], [-1.0, 0.0]]])
    assert position_similarity(opposite) == pytest.approx(-1.0)


def test_uniform_causal_attention_has_entropy_log_of_visible_keys():
    T = 6
    weights = torch.tril(torch.ones(T, T))
    weights = (weights / weights.sum(-1, keepdim=True)).expand(2, 3, T, T)
    expected = sum(math.log(t + 1) for t in range(T)) / T
    assert attention_entropy(weights) == pytest.approx([expected] * 3)
    sharp = torch.eye(T).expand(1, 2, T, T)
    assert attention_entropy(sharp) == pytest.approx([0.0, 0.0], abs=1e-6)


def test_unigram_loss_of_a_two_character_text():
    train_ids = [0, 1] * 50
    assert unigram_loss(train_ids, [0, 1, 1, 0], 2) == pytest.approx(math.log(2))
    # 3 a's to 1 b: val of b's only costs -log(1/4), smoothed by add-one
    assert unigram_loss([0, 0, 0, 1] * 25, [1, 1], 2) == pytest.approx(-math.log(26 / 102))


def test_measure_leaves_grads_and_rng_alone_and_reports_every_block():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=11, block_size=8, n_layer=3, n_head=2, n_embd=8, dropout=0.1))
    model.train()
    x, y = torch.randint(11, (2, 8)), torch.randint(11, (2, 8))
    rng = torch.get_rng_state()
    out = measure(model, x, y)
    assert torch.equal(rng, torch.get_rng_state())
    assert all(p.grad is None for p in model.parameters()) and model.training
    assert len(out["block_grad_norm"]) == len(out["block_rms"]) == len(out["block_pos_sim"]) == 3
    assert [len(h) for h in out["head_entropy"]] == [2, 2, 2]
    assert all(0 <= h <= math.log(8) + 1e-6 for row in out["head_entropy"] for h in row)
    # the reported block grad norm is the norm of that block's true gradient
    model.eval()
    _, loss = model(x, y)
    loss.backward()
    block1 = math.sqrt(sum(p.grad.pow(2).sum().item() for p in model.transformer.h[1].parameters()))
    assert out["block_grad_norm"][1] == pytest.approx(block1, rel=1e-4)


def test_update_ratio_after_one_adam_step():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=8))
    opt = AdamW([{"params": model.parameters(), "weight_decay": 0.0}], lr=1e-2, betas=(0.9, 0.999), eps=1e-12)
    _, loss = model(torch.randint(11, (2, 8)), torch.randint(11, (2, 8)))
    loss.backward()
    opt.step()
    # after one step m_hat = g and v_hat = g^2: each update entry is lr * g / (|g| + eps)
    block = model.transformer.h[0]
    update = math.sqrt(sum((p.grad / (p.grad.abs() + 1e-12)).pow(2).sum().item() for p in block.parameters()))
    weights = math.sqrt(sum(p.detach().pow(2).sum().item() for p in block.parameters()))
    assert update_ratios([block], opt)[0] == pytest.approx(1e-2 * update / weights, rel=1e-4)


def test_grad_depth_rows_and_the_residual_path():
    rows = grad_depth(depths=(2, 12), n_embd=16, block_size=8, batch_size=2)
    assert len(rows) == 8 and all(r["grad_norm"] > 0 for r in rows)
    norm = {(r["depth"], r["residual"], r["norm_placement"]): r["grad_norm"] for r in rows}
    # with residuals and pre-norm, the identity path carries the gradient down undiminished
    assert norm[(12, True, "pre")] > 0.1 * norm[(2, True, "pre")]


def test_grad_depth_command_prints_json(capsys):
    assert diagnostics_main(["grad-depth", "--depths=2,3", "--n_embd=16", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {(r["depth"], r["residual"], r["norm_placement"]) for r in rows} == {
        (d, r, p) for d in (2, 3) for r in (True, False) for p in ("pre", "post")}
    # the heads the error names are an option of the command
    assert diagnostics_main(["grad-depth", "--depths=2", "--n_embd=18", "--n_head=3", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)) == 4
    with pytest.raises(SystemExit):
        diagnostics_main(["grad-depth", "--depths=2", "--n_embd=18"])
    assert "n_embd=18 is not divisible by n_head=4" in capsys.readouterr().err


def test_grad_depth_refuses_a_depth_beyond_memory_before_building_any_model(monkeypatch, capsys):
    built = []
    monkeypatch.setattr(diagnostics, "GPT", lambda cfg: built.append(cfg))
    with pytest.raises(SystemExit):
        diagnostics_main(["grad-depth", "--depths=2,1000000000"])
    assert re.fullmatch(r"error: --depths: a model of depth 1000000000 needs at least 372,409.8 GiB \(8 "
                        r"bytes a parameter\), more than the [\d,.]+ GiB here; lower it or --n_embd "
                        r"\(see python -m gpt.diagnostics grad-depth --help\)\n", capsys.readouterr().err)
    assert built == []


def test_whole_split_loss_covers_every_window_once():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=8)).train()
    ids = np.random.default_rng(0).integers(0, 11, size=8 * 5 + 3).astype(np.uint16)
    model.eval()
    with torch.no_grad():
        windows = [model(torch.tensor(ids[i:i + 8], dtype=torch.long)[None],
                         torch.tensor(ids[i + 1:i + 9], dtype=torch.long)[None])[1].item()
                   for i in range(0, 40, 8)]
    model.train()
    assert whole_split_loss(model, ids, batch=2) == pytest.approx(sum(windows) / 5, rel=1e-5)
    assert model.training
