"""gpt/diagnostics.py: the measures logged during training, and python -m gpt.diagnostics grad-depth."""

import json
import math
import re

import numpy as np
import pytest
import torch

from gpt import diagnostics
from gpt.config import GPTConfig
from gpt.diagnostics import (aggregate_seeds, attention_entropy, grad_depth, init_measures,
                             main as diagnostics_main, measure, position_similarity, unigram_loss,
                             update_ratios, whole_split_loss)
from gpt.model import GPT
from gpt.speed.optim import AdamW

pytestmark = pytest.mark.usefixtures("one_thread")     # conftest.py


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


def test_aggregate_seeds_gives_mean_min_max_per_setting():
    def row(depth, seed, grad, inp, sim):
        return {"depth": depth, "width": 8, "residual": True, "norm_placement": "pre", "seed": seed,
                "block0_grad_norm": grad, "input_grad_norm": inp, "last_pos_sim": sim}
    rows = [row(2, 0, 1.0, 0.5, 0.25), row(3, 0, 7.0, 7.0, 7.0), row(2, 1, 2.0, 0.25, -0.5),
            row(2, 2, 6.0, 2.25, 1.0)]
    first, second = aggregate_seeds(rows)
    assert {k: first[k] for k in ("depth", "width", "residual", "norm_placement", "seeds")} == {
        "depth": 2, "width": 8, "residual": True, "norm_placement": "pre", "seeds": [0, 1, 2]}
    assert first["block0_grad_norm"] == {"mean": 3.0, "min": 1.0, "max": 6.0, "per_seed": [1.0, 2.0, 6.0]}
    assert first["input_grad_norm"] == {"mean": 1.0, "min": 0.25, "max": 2.25, "per_seed": [0.5, 0.25, 2.25]}
    assert first["last_pos_sim"] == {"mean": 0.25, "min": -0.5, "max": 1.0, "per_seed": [0.25, -0.5, 1.0]}
    assert second["seeds"] == [0] and second["last_pos_sim"] == {"mean": 7.0, "min": 7.0, "max": 7.0,
                                                                 "per_seed": [7.0]}


def test_init_measures_takes_the_gradient_at_block_0s_input_and_the_last_blocks_output():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=8))
    x, y = torch.randint(11, (2, 8)), torch.randint(11, (2, 8))
    got = init_measures(model, x, y)
    # the same model run by hand from a leaf tensor standing for the embeddings
    emb = (model.transformer.wte(x) + model.transformer.wpe(torch.arange(8))).detach().requires_grad_()
    first = model.transformer.h[0](emb)
    last = model.transformer.h[1](first)
    logits = model.lm_head(model.transformer.ln_f(last))
    loss = torch.nn.functional.cross_entropy(logits.view(-1, 11), y.view(-1))
    input_grad, *param_grads = torch.autograd.grad(loss, [emb, *model.transformer.h[0].parameters()])
    assert got["input_grad_norm"] == pytest.approx(input_grad.norm().item(), rel=1e-5)
    assert got["block0_grad_norm"] == pytest.approx(
        math.sqrt(sum(g.pow(2).sum().item() for g in param_grads)), rel=1e-5)
    assert got["last_pos_sim"] == pytest.approx(position_similarity(last.detach()), rel=1e-5)
    assert got["last_pos_sim"] != pytest.approx(position_similarity(first.detach()), rel=1e-3)


def test_grad_depth_without_residuals_starves_block_0_and_makes_positions_alike():
    rows = grad_depth(depths=(2, 12), widths=(16,), head_size=8, seeds=(0,), block_size=8, batch_size=2)
    assert len(rows) == 8
    at = {(r["depth"], r["residual"], r["norm_placement"]): r for r in rows}
    inp = {key: r["input_grad_norm"]["mean"] for key, r in at.items()}
    for placement in ("pre", "post"):
        # the identity path carries the gradient down undiminished; without it, it dies with depth
        assert inp[(12, True, placement)] > 0.5 * inp[(2, True, placement)] > 0
        assert inp[(12, False, placement)] < 1e-3 * inp[(12, True, placement)]
        # the mechanism: without residuals every position ends up with nearly the same vector
        sim = {residual: at[(2, residual, placement)]["last_pos_sim"]["mean"] for residual in (True, False)}
        assert sim[False] > 0.5 > sim[True]


def test_grad_depth_command_aggregates_over_widths_and_seeds(capsys):
    argv = ["grad-depth", "--depths=1,2", "--widths=8,16", "--head_size=4", "--seeds=2"]
    assert diagnostics_main(argv + ["--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["depth"], r["width"], r["residual"], r["norm_placement"]) for r in rows] == [
        (d, w, r, p) for d in (1, 2) for w in (8, 16) for r in (True, False) for p in ("pre", "post")]
    for r in rows:
        assert r["seeds"] == [0, 1]
        for key in ("block0_grad_norm", "input_grad_norm", "last_pos_sim"):
            m = r[key]
            assert len(m["per_seed"]) == 2 and m["min"] <= m["mean"] <= m["max"]
            assert m["min"] == min(m["per_seed"]) and m["max"] == max(m["per_seed"])
    # seeds differ, and a seed alone fixes its measures, whatever the other seeds run
    one = rows[0]["block0_grad_norm"]["per_seed"]
    assert one[0] != one[1]
    assert diagnostics_main(["grad-depth", "--depths=1", "--widths=8", "--head_size=4", "--seed=1",
                             "--seeds=1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["block0_grad_norm"]["per_seed"] == [one[1]]


def test_grad_depth_table_has_a_row_per_setting_with_mean_and_range(capsys):
    assert diagnostics_main(["grad-depth", "--depths=1", "--widths=8", "--head_size=4", "--seed=3",
                             "--seeds=2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "at initialisation, mean (min..max) over 2 seeds (3..4); head size 4 (heads = width / 4)"
    assert lines[1].split()[:4] == ["depth", "width", "residual", "norm"] and len(lines) == 2 + 4
    sci, fixed = r"\d\.\d\de[+-]\d\d", r"-?\d\.\d\d"
    for line in lines[2:]:
        assert re.fullmatch(rf" +1 +8 +(True|False) +(pre|post)( +{sci} \({sci}\.\.{sci}\)){{2}} +"
                            rf"{fixed} \({fixed}\.\.{fixed}\)", line), line


@pytest.mark.parametrize("argv, message", [
    (["--widths=64,18", "--head_size=16"],
     "--widths: width 18 is not a multiple of --head_size=16; pick widths that are, or another head size"),
    (["--n_embd=64"], "--n_embd is replaced by --widths, a comma-separated list of widths"),
    (["--n_head=4"], "--n_head is replaced by --head_size (heads = width / head_size)"),
    (["--widths=8,x"], "--widths '8,x' should be integers separated by commas"),
    (["--seeds=0"], "--seeds must be positive"),
    (["--head_size=0"], "--head_size must be positive"),
    (["--seed=4294967295", "--seeds=2"], "seed=4294967296 must be in [0, 2**32)"),
])
def test_grad_depth_refuses_bad_options_in_one_line_before_building_any_model(argv, message, monkeypatch,
                                                                              capsys):
    built = []
    monkeypatch.setattr(diagnostics, "GPT", lambda cfg: built.append(cfg))
    with pytest.raises(SystemExit):
        diagnostics_main(["grad-depth", "--depths=1", *argv])
    assert capsys.readouterr().err == f"error: {message} (see python -m gpt.diagnostics grad-depth --help)\n"
    assert built == []


def test_grad_depth_refuses_a_depth_beyond_memory_before_building_any_model(monkeypatch, capsys):
    built = []
    monkeypatch.setattr(diagnostics, "GPT", lambda cfg: built.append(cfg))
    with pytest.raises(SystemExit):
        diagnostics_main(["grad-depth", "--depths=2,1000000000"])
    # the largest model is the deepest at the widest of the default widths, 256
    assert re.fullmatch(r"error: --depths, --widths: the largest model \(depth 1000000000, width 256\) needs at "
                        r"least 5,884,170.5 GiB \(8 bytes a parameter\), more than the [\d,.]+ GiB here; lower "
                        r"them \(see python -m gpt.diagnostics grad-depth --help\)\n", capsys.readouterr().err)
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
