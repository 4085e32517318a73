"""nanochat's recipe as options: embed_lr and head_lr for the AdamW part, Muon's momentum warmup."""

import pytest
import torch

import train
from conftest import BLOCK, V, resumed_as_whole, tiny_args, untimed_metrics
from gpt import GPT, GPTConfig
from gpt.config import TrainConfig
from gpt.errors import UserError
from gpt.optim import check_optimizer, make_optimizer, momentum_at

pytestmark = pytest.mark.usefixtures("one_thread")


def model_of(**kw) -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(**{"vocab_size": V, "block_size": BLOCK, "n_layer": 2, "n_head": 2, "n_embd": 16, **kw}))


def rate_of(opt, p: torch.Tensor) -> float:
    return next(g["lr"] for g in opt.param_groups if any(q is p for q in g["params"]))


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_the_embeddings_and_an_untied_head_train_at_their_own_rates_through_the_schedule(optimizer):
    model = model_of(tie_weights=False)
    cfg = TrainConfig(optimizer=optimizer, learning_rate=1e-2, embed_lr=0.2, head_lr=4e-3)
    opt = make_optimizer(model, cfg)
    wte, wpe, head = model.transformer.wte.weight, model.transformer.wpe.weight, model.lm_head.weight
    for lr in (1e-2, 5e-3):     # the peak, then half of it: every rate follows in proportion
        opt.set_lr(lr)
        assert rate_of(opt, wte) == pytest.approx(20 * lr) and rate_of(opt, wpe) == pytest.approx(20 * lr)
        assert rate_of(opt, head) == pytest.approx(0.4 * lr)
        assert rate_of(opt, model.transformer.ln_f.weight) == lr
    # each parameter in exactly one group, the embeddings still decayed and the norms not
    params = [p for g in opt.param_groups for p in g["params"]]
    assert len(params) == len({id(p) for p in params}) == len(list(model.parameters()))
    decay = {id(p): g["weight_decay"] for g in opt.param_groups for p in g["params"]}
    assert decay[id(wte)] == cfg.weight_decay and decay[id(model.transformer.ln_f.weight)] == 0.0


def test_without_them_the_groups_are_as_before():
    model = model_of()
    plain = make_optimizer(model, TrainConfig(learning_rate=1e-2))
    assert [len(g["params"]) for g in plain.param_groups] == [sum(p.dim() >= 2 for p in model.parameters()),
                                                              sum(p.dim() < 2 for p in model.parameters())]
    assert all("lr_scale" not in g for g in plain.param_groups)


def test_under_mup_an_embedding_rate_leaves_the_hidden_matrices_scaled():
    model = model_of(parametrization="mup", mup_base_width=8, tie_weights=False)
    opt = make_optimizer(model, TrainConfig(learning_rate=1e-2, embed_lr=3e-2))
    opt.set_lr(1e-2)
    assert rate_of(opt, model.transformer.wte.weight) == pytest.approx(3e-2)
    assert rate_of(opt, model.transformer.h[0].attn.c_attn.weight) == pytest.approx(1e-2 * 8 / 16)


def test_a_head_rate_with_a_tied_head_is_refused_naming_the_fix():
    check_optimizer(GPTConfig(vocab_size=V, tie_weights=False), TrainConfig(head_lr=1e-3))
    with pytest.raises(UserError, match="head_lr=0.001 sets the rate of an untied head.*--tie_weights=false"):
        check_optimizer(GPTConfig(vocab_size=V), TrainConfig(head_lr=1e-3))


@pytest.mark.parametrize("bad, message", [({"embed_lr": -1.0}, "embed_lr=-1.0 must not be negative"),
                                          ({"muon_momentum_warmup": -3}, "muon_momentum_warmup=-3 must not be negative"),
                                          ({"muon_momentum_start": 1.0}, r"muon_momentum_start=1.0 must be in \[0, 1\)")])
def test_bad_values_are_refused_in_one_line(bad, message):
    with pytest.raises(UserError, match=message):
        TrainConfig(**bad)


def test_muons_momentum_rises_linearly_over_its_warmup_then_holds():
    cfg = TrainConfig(optimizer="muon", muon_momentum_warmup=300)
    assert [momentum_at(it, cfg) for it in (0, 150, 300, 5000)] == pytest.approx([0.85, 0.90, 0.95, 0.95])
    assert momentum_at(0, TrainConfig(optimizer="muon")) == 0.95


RECIPE = ["--optimizer=muon", "--tie_weights=false", "--embed_lr=0.05", "--head_lr=0.004",
          "--muon_momentum_warmup=12", "--beta1=0.8", "--beta2=0.95"]


@pytest.mark.e2e
def test_the_recipe_trains_resumes_to_the_same_bits_and_changes_the_losses(data_dir, tmp_path, capsys):
    a, _ = resumed_as_whole(data_dir, tmp_path, RECIPE, 16, 7)     # the cut inside the warmup
    momentum = [g["momentum"] for g in a["optimizer"]["muon"]["param_groups"]]
    assert momentum == [0.95] * len(momentum)
    plain = tmp_path / "plain"
    assert train.main(tiny_args(data_dir, plain, "--optimizer=muon", "--tie_weights=false", "--max_iters=16")) == 0
    assert untimed_metrics(plain, "train") != untimed_metrics(tmp_path / "whole", "train")
    capsys.readouterr()
    refused = tmp_path / "refused"
    assert train.main(tiny_args(data_dir, refused, "--head_lr=0.004")) == 2
    assert "--tie_weights=false" in capsys.readouterr().err and not refused.exists()
