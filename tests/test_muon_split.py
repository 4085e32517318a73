"""muon_split: Muon's orthogonalisation of c_attn (and a gated c_fc) whole, by query/key/value or
by head; each block orthogonal with its own shape factor, fused as torch.optim.Muon always was."""

import copy
import json
import math

import pytest
import torch

import train
from conftest import V, tiny_args, untimed_metrics as metrics
from gpt import GPTConfig
from gpt.errors import UserError
from gpt import checkpoint
from gpt.config import TrainConfig
from gpt.muon import SplitMuon, muon_update, orthogonalise
from gpt.optim import AdamW, decay_groups, make_optimizer, muon_params
from test_muon import RUN, loss_of, model_of, steps

pytestmark = pytest.mark.usefixtures("one_thread")     # conftest.py: tiny ops pay only for hand-offs

PLAIN = {"n_head": 4, "n_embd": 32}
GQA = {"n_head": 4, "n_kv_head": 2, "n_embd": 32, "pos_encoding": "rope"}
GATED = {"n_head": 2, "n_embd": 32, "activation": "swiglu", "n_kv_head": 1}
NS = {"ns_coefficients": (3.4445, -4.7750, 2.0315), "ns_steps": 5, "eps": 1e-7}   # torch.optim.Muon's


def muon(split: str, **kw) -> TrainConfig:
    return TrainConfig(optimizer="muon", learning_rate=1e-2, muon_split=split, **kw)


def expected_blocks(name: str, p: torch.Tensor, split: str, kw: dict) -> list[int]:
    """The row blocks the option's help promises, worked out here from the model's settings."""
    C, heads = kw["n_embd"], kw["n_head"]
    hs, kv_heads = C // heads, kw.get("n_kv_head") or heads
    if split != "fused" and name.endswith("attn.c_attn.weight"):
        if split == "groups":     # two heads a block, as muon() asks
            return [2 * hs] * ((heads + 2 * kv_heads) // 2)
        return [C, hs * kv_heads, hs * kv_heads] if split == "qkv" else [hs] * (heads + 2 * kv_heads)
    if split != "fused" and name.endswith("mlp.c_fc.weight") and kw.get("activation") == "swiglu":
        return [p.size(0) // 2] * 2
    return [p.size(0)]


@pytest.mark.parametrize("split, kw", [(split, kw) for split in ("fused", "qkv", "heads", "groups")
                                       for kw in (PLAIN, GQA, GATED)
                                       if not (split == "groups" and kw is GATED)],    # one key head: no pair
                         ids=lambda v: v if isinstance(v, str) else {id(PLAIN): "plain", id(GQA): "gqa",
                                                                     id(GATED): "gated"}[id(v)])
def test_each_block_of_the_split_is_orthogonal_at_its_own_shape_factor(split, kw):
    model = model_of(**kw)
    opt = make_optimizer(model, muon(split, muon_lr=1.0, muon_head_group=2))
    torch.manual_seed(1)
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    attn = model.transformer.h[0].attn.c_attn.weight
    q_rows, kv_rows = expected_blocks("attn.c_attn.weight", attn, "qkv", kw)[:2]
    attn.grad[:q_rows + kv_rows] *= 0.01      # queries and keys: a fused update would barely move them
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt.muon.step()     # from zero momentum, at lr 1 and no decay: the update itself
    matrices = {id(p) for p in muon_params(model)}
    checked = 0
    for name, p in model.named_parameters():
        if id(p) not in matrices:
            continue
        cuts = expected_blocks(name, p, split, kw)
        assert opt.rows[id(p)] == tuple(cuts)
        for block in (before[name] - p.detach()).split(cuts):
            factor = math.sqrt(max(1.0, block.size(0) / block.size(1)))
            s = torch.linalg.svdvals(block) / factor
            # five quintic Newton-Schulz steps (in bfloat16) leave most singular values in about
            # [0.68, 1.13], and lift the few smallest of a random square block short of that
            assert 0.2 < s.min() and s.max() < 1.25 and 0.7 < s.median() < 1.1, (name, block.shape, s)
            checked += 1
    assert checked == sum(len(expected_blocks(n, p, split, kw)) for n, p in model.named_parameters()
                          if id(p) in matrices)
    if split == "fused":    # the query rows, orthogonal only with the values beside them, are not
        q = (before["transformer.h.0.attn.c_attn.weight"] - attn.detach())[:kw["n_embd"]]
        assert torch.linalg.svdvals(q).median() < 0.2


def test_fused_takes_torch_muons_steps_to_the_bit_with_adamw_beside_it():
    # torch's iteration is in bfloat16, which auto would not take on a CPU that only emulates it
    cfg = muon("fused", muon_lr=0.05, weight_decay=0.1, muon_weight_decay=0.1, muon_dtype="bfloat16")
    model, twin = model_of(**GATED), model_of(**GATED)
    opt = make_optimizer(model, cfg)
    # the twin built by hand as runs were before muon_split existed
    matrices = muon_params(twin)
    rest = [p for p in twin.parameters() if id(p) not in {id(m) for m in matrices}]
    adamw = AdamW(decay_groups(rest, 0.1), lr=1e-2, betas=(cfg.beta1, cfg.beta2))
    torch_muon = torch.optim.Muon(matrices, lr=0.05, nesterov=True, momentum=0.95, weight_decay=0.1)
    for s in [1, 2, 3]:
        opt.set_lr(1e-2)
        loss_of(model, s).backward()
        opt.step()
        opt.zero_grad()
        loss_of(twin, s).backward()
        adamw.step()
        torch_muon.step()
        adamw.zero_grad()
        torch_muon.zero_grad()
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), twin.state_dict().values()))
    # torch's saved state loads here, and ours saves in torch's layout
    reloaded = make_optimizer(model, cfg)
    reloaded.load_state_dict({**opt.adamw.state_dict(), "muon": torch_muon.state_dict()})
    assert all(torch.equal(reloaded.muon.state[p]["momentum_buffer"], torch_muon.state[q]["momentum_buffer"])
               for p, q in zip(muon_params(model), matrices))
    assert opt.muon.state_dict()["param_groups"][0].keys() == torch_muon.state_dict()["param_groups"][0].keys()


def test_split_muon_with_every_matrix_whole_takes_torch_muons_step():
    model, twin = model_of(**PLAIN), model_of(**PLAIN)
    hyper = {"lr": 0.05, "nesterov": True, "momentum": 0.95, "weight_decay": 0.1}
    ours, theirs = SplitMuon(muon_params(model), {}, **hyper), torch.optim.Muon(muon_params(twin), **hyper)
    start = [p.detach().clone() for p in muon_params(twin)]
    for s in [1, 2]:
        for m, opt in ((model, ours), (twin, theirs)):
            loss_of(m, s).backward()
            opt.step()
            opt.zero_grad()
    for a, b, b0 in zip(muon_params(model), muon_params(twin), start):
        # bfloat16 products, summed in another order: on AMD Zen 4 one matrix of eight moved 1% apart
        assert (a - b).norm() < 0.03 * (b - b0).norm()


def test_the_synthetic_example_queries_and_keys_get_their_share_only_when_split():
    """64 wide, query and key gradients 100 times smaller than the values': the fused update (factor
    sqrt 3) gives the values nearly all of it; split, each block is orthogonal on its own."""
    torch.manual_seed(0)
    C = 64
    g = torch.cat([0.01 * torch.randn(C, C), 0.01 * torch.randn(C, C), torch.randn(C, C)])
    group = {"lr": 1.0, "weight_decay": 0.0, **NS}
    rms = {}
    for rows in [(3 * C,), (C, C, C)]:
        exact = muon_update(torch.zeros_like(g), g, group, rows)
        iterated = orthogonalise([g], [rows], group)[0]
        rms[len(rows)] = [[b.pow(2).mean().sqrt().item() for b in u.split(C)] for u in (exact, iterated)]
    (exact_q, exact_k, exact_v), (ns_q, ns_k, ns_v) = rms[1]
    assert max(exact_q, exact_k) < 0.03 and 0.2 < exact_v < 0.22       # 0.024, 0.023 against 0.214
    assert max(ns_q, ns_k) < 0.025 and 0.18 < ns_v < 0.2               # 0.020, 0.019 against 0.190
    assert all(r == pytest.approx(1 / math.sqrt(C), abs=1e-4) for r in rms[3][0])  # 0.125 each
    assert all(0.1 < r < 0.115 for r in rms[3][1])                     # 0.109 each


def test_the_update_ratio_diagnostic_follows_the_split():
    model = model_of(**PLAIN)
    opt = make_optimizer(model, muon("qkv", muon_lr=1.0))
    steps(model, opt, [1, 2])
    w = model.transformer.h[0].attn.c_attn.weight
    group = opt.muon.param_groups[0]
    update = muon_update(w, opt.muon.state[w]["momentum_buffer"], group, opt.rows[id(w)])
    for block in update.split(32):
        assert torch.allclose(torch.linalg.svdvals(block), torch.ones(32), atol=1e-4)


def test_a_state_saved_under_one_split_loads_under_another():
    model = model_of(**GATED)
    opt = make_optimizer(model, muon("fused"))
    steps(model, opt, [1, 2])
    saved = copy.deepcopy(opt.state_dict())
    other = make_optimizer(model, muon("heads"))
    other.load_state_dict(saved)
    w = model.transformer.h[1].mlp.c_fc.weight
    assert torch.equal(other.muon.state[w]["momentum_buffer"], opt.muon.state[w]["momentum_buffer"])
    steps(model, other, [3])


def test_bad_split_is_one_line(data_dir, tmp_path, capsys):
    assert train.main(tiny_args(data_dir, tmp_path / "run", "--optimizer=muon", "--muon_split=rows")) == 2
    err = capsys.readouterr().err
    assert "muon_split='rows' is not allowed; did you mean groups? choose one of fused, qkv, heads, groups" in err and err.count("\n") == 1


def test_a_split_axis_without_muon_is_refused_in_one_line(data_dir, tmp_path, capsys):
    # a single AdamW run ignores it, as it does muon_lr; a sweep axis over it would train alike
    assert train.main(tiny_args(data_dir, tmp_path / "sweep", "--sweep", "muon_split=qkv,heads")) == 2
    err = capsys.readouterr().err
    assert "the axis muon_split: optimizer=adamw does not read it" in err and err.count("\n") == 1


# ---------------------------------------------------------------- whole runs

@pytest.mark.e2e
def test_a_checkpoint_saved_before_muon_split_resumes_fused_to_the_same_bits(data_dir, tmp_path, capsys):
    """And before muon_dtype: in bfloat16, as it ran, where auto would take float32 (a CPU without it)."""
    whole, old = tmp_path / "whole", tmp_path / "old"
    assert train.main(tiny_args(data_dir, whole, *RUN, "--muon_dtype=bfloat16")) == 0
    assert train.main(tiny_args(data_dir, old, *RUN, "--muon_dtype=bfloat16", "--max_iters=9")) == 0
    # as an older version saved it: no muon_split nor muon_dtype in the checkpoint's config nor in config.json
    ckpt = checkpoint.load(old / "ckpt.pt", needs=checkpoint.RESUME_KEYS)
    del ckpt["train_config"]["muon_split"], ckpt["train_config"]["muon_dtype"]
    checkpoint.save({k: v for k, v in ckpt.items() if k not in ("format", "digests")}, old / "ckpt.pt")
    record = json.loads((old / "config.json").read_text())
    del record["train"]["muon_split"], record["train"]["muon_dtype"]
    (old / "config.json").write_text(json.dumps(record))
    capsys.readouterr()
    assert train.main([f"--out_dir={old}", "--resume", "--max_iters=16"]) == 0
    assert metrics(whole, "train") == metrics(old, "train")
    a, b = checkpoint.load(whole / "ckpt.pt"), checkpoint.load(old / "ckpt.pt")
    assert b["train_config"]["muon_split"] == "fused" and b["train_config"]["muon_dtype"] == "bfloat16"
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])


@pytest.mark.e2e
@pytest.mark.parametrize("split", ["qkv", "heads"])
def test_a_split_run_resumes_to_the_same_bits_and_trains_apart_from_fused(split, data_dir, tmp_path, capsys):
    run = [*RUN, "--activation=swiglu", "--n_kv_head=1", "--pos_encoding=rope"]
    whole, halves, fused = tmp_path / "whole", tmp_path / "halves", tmp_path / "fused"
    assert train.main(tiny_args(data_dir, whole, *run, f"--muon_split={split}")) == 0
    assert train.main(tiny_args(data_dir, halves, *run, f"--muon_split={split}", "--max_iters=9")) == 0
    assert train.main(tiny_args(data_dir, fused, *run, "--max_iters=9")) == 0
    assert metrics(halves, "train")[0] == metrics(fused, "train")[0]      # before any step
    assert metrics(halves, "train")[-1]["loss"] != metrics(fused, "train")[-1]["loss"]
    capsys.readouterr()
    assert train.main([f"--out_dir={halves}", "--resume", "--max_iters=16"]) == 0
    assert metrics(whole, "train") == metrics(halves, "train")
    a, b = checkpoint.load(whole / "ckpt.pt"), checkpoint.load(halves / "ckpt.pt")
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    assert all(min(r["block_update_ratio"]) > 0 for r in metrics(whole, "eval")[1:])


def test_head_groups_that_do_not_divide_the_heads_are_refused_naming_both_counts():
    from gpt.optim import check_optimizer
    check_optimizer(GPTConfig(vocab_size=V, **GQA), muon("groups", muon_head_group=2))
    with pytest.raises(UserError, match="muon_head_group=4 does not divide n_head=4 and the 2 key and value heads"):
        check_optimizer(GPTConfig(vocab_size=V, **GQA), muon("groups", muon_head_group=4))
    check_optimizer(GPTConfig(vocab_size=V, **GQA), TrainConfig(muon_head_group=4))     # AdamW reads no groups
