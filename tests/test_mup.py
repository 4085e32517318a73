"""parametrization=mup: μP's init, learning rates and multipliers at two widths, the sp model at the
base width, its bad values, the export's refusal, and a μP run through resume, sweeps, sampling,
evaluation and --init_from."""

import csv
import dataclasses

import pytest
import torch

import sample
import train
from conftest import BLOCK, V, resumed_as_whole, tiny_args, untimed_metrics
from gpt import GPT, GPTConfig, checkpoint
from gpt.config import TrainConfig
from gpt.optim import make_optimizer

pytestmark = pytest.mark.usefixtures("one_thread")     # conftest.py: tiny ops pay only for hand-offs

BASE = 32
HIDDEN = {"attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight"}


def model_of(width: int, seed: int = 0, **kw) -> GPT:
    torch.manual_seed(seed)
    return GPT(GPTConfig(**{"vocab_size": V, "block_size": BLOCK, "n_layer": 2, "n_head": 2, "n_embd": width,
                            "mup_base_width": BASE, **kw}))


def is_hidden(name: str) -> bool:
    return name.startswith("transformer.h.") and name.split(".", 3)[3] in HIDDEN


@pytest.mark.parametrize("width", [64, 128])
def test_hidden_matrices_start_at_sqrt_base_over_width_of_gpt2s_std_and_the_rest_as_sp(width):
    sp, mup = model_of(width), model_of(width, parametrization="mup")
    theirs = dict(sp.named_parameters())
    scaled = [name for name, p in mup.named_parameters() if is_hidden(name)]
    mine = dict(mup.named_parameters())
    assert len(scaled) == 4 * 2 and [id(p) for p in mup.hidden_matrices()] == [id(mine[n]) for n in scaled]
    for name, p in mup.named_parameters():
        expected = theirs[name] * (BASE / width) ** 0.5 if is_hidden(name) else theirs[name]
        assert torch.equal(p, expected), name
    c_fc = mine["transformer.h.0.mlp.c_fc.weight"]
    assert c_fc.std().item() == pytest.approx(0.02 * (BASE / width) ** 0.5, rel=0.05)


@pytest.mark.parametrize("width", [64, 128])
def test_adamw_trains_the_hidden_matrices_at_base_over_width_of_the_rate_and_the_rest_at_it(width):
    model = model_of(width, parametrization="mup", bias=True, tie_weights=False)
    opt = make_optimizer(model, TrainConfig(learning_rate=1e-2, weight_decay=0.1))
    opt.set_lr(4e-3)
    names = {id(p): n for n, p in model.named_parameters()}
    by_group = [({names[id(p)] for p in g["params"]}, g["lr"], g["weight_decay"]) for g in opt.param_groups]
    assert sorted(n for group, _, _ in by_group for n in group) == sorted(names.values())   # each once
    hidden = {n for n in names.values() if is_hidden(n)}
    assert [(lr, wd) for group, lr, wd in by_group if group == hidden] == [(4e-3 * BASE / width, 0.1)]
    rest = [(group, lr, wd) for group, lr, wd in by_group if group != hidden]
    assert {lr for _, lr, _ in rest} == {4e-3}
    decayed = set().union(*(group for group, _, wd in rest if wd == 0.1))
    assert decayed == {"transformer.wte.weight", "transformer.wpe.weight", "lm_head.weight"}


def test_under_muon_the_matrices_keep_muon_lr_and_adamw_has_no_scaled_group():
    model = model_of(128, parametrization="mup")
    opt = make_optimizer(model, TrainConfig(optimizer="muon", learning_rate=1e-2, muon_lr=0.04))
    opt.set_lr(5e-3)
    assert {g["lr"] for g in opt.adamw.param_groups} == {5e-3}
    assert [g["lr"] for g in opt.muon.param_groups] == [pytest.approx(0.02)]
    assert {id(p) for g in opt.muon.param_groups for p in g["params"]} == {id(p) for p in model.hidden_matrices()}


def attention_scores(model: GPT, idx: torch.Tensor) -> torch.Tensor:
    """Layer 0's scores before the softmax, computed here from its weights, times scale."""
    attn, C = model.transformer.h[0].attn, model.config.n_embd
    x = model.transformer.wte(idx) + model.transformer.wpe(torch.arange(idx.size(1)))
    q, k, _ = attn.c_attn(model.transformer.h[0].ln_1(x)).split(C, dim=2)
    q, k = (t.view(*idx.shape, 2, C // 2).transpose(1, 2) for t in (q, k))
    return q.double() @ k.double().transpose(-2, -1)


@pytest.mark.parametrize("width", [64, 128])
def test_the_logits_carry_base_over_width_and_the_scores_sqrt_base_head_size_over_head_size(width):
    model = model_of(width, parametrization="mup").eval()
    idx = torch.randint(0, V, (2, BLOCK))
    with torch.no_grad():
        h = model.hidden(idx)
        assert torch.equal(model.logits(h), model.lm_head(h) * (BASE / width))
        head, base_head = width // 2, BASE // 2
        scores = attention_scores(model, idx) * (base_head ** 0.5 / head)
        mask = torch.ones(BLOCK, BLOCK, dtype=torch.bool).tril()
        weights = scores.masked_fill(~mask, float("-inf")).softmax(-1)
        torch.testing.assert_close(model.attention_maps(idx)[0].double(), weights, atol=1e-6, rtol=0)
        # and not sp's 1/sqrt(head size), which differs above the base
        sp_weights = (attention_scores(model, idx) / head ** 0.5).masked_fill(~mask, float("-inf")).softmax(-1)
        assert (model.attention_maps(idx)[0].double() - sp_weights).abs().max() > 1e-4


def steps_of(model: GPT, cfg: TrainConfig, n: int = 3) -> list[float]:
    opt = make_optimizer(model, cfg)
    gen = torch.Generator().manual_seed(5)
    losses = []
    for _ in range(n):
        idx = torch.randint(0, V, (4, BLOCK), generator=gen)
        opt.set_lr(cfg.learning_rate)
        _, loss = model(idx, idx.roll(-1, 1))
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_at_the_base_width_mup_is_sp_bit_for_bit(optimizer):
    cfg = TrainConfig(optimizer=optimizer, learning_rate=1e-2, weight_decay=0.1)
    sp, mup = model_of(BASE, bias=True), model_of(BASE, bias=True, parametrization="mup")
    assert steps_of(sp, cfg) == steps_of(mup, cfg)
    idx = torch.randint(0, V, (2, BLOCK))
    assert all(torch.equal(a, b) for a, b in zip(sp.state_dict().values(), mup.state_dict().values()))
    assert torch.equal(sp(idx)[0], mup(idx)[0])
    # a width away from the base, they part
    assert steps_of(model_of(64), cfg) != steps_of(model_of(64, parametrization="mup"), cfg)


@pytest.mark.parametrize("argv, message", [
    (["--parametrization=ntk"], "error: parametrization='ntk' is not allowed; choose one of sp, mup"),
    (["--mup_base_width=0"], "error: mup_base_width=0 must be positive"),
    (["--parametrization=mup", "--mup_base_width=15"],
     "error: mup_base_width=15 is not divisible by n_head=2; the base model has the same heads: pick a "
     "multiple of 2, e.g. mup_base_width=16"),
])
def test_a_bad_value_is_one_line(data_dir, tmp_path, capsys, argv, message):
    assert train.main(tiny_args(data_dir, tmp_path / "run", *argv)) == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1, err
    assert not (tmp_path / "run").exists()


def save_run(out, model: GPT):
    out.mkdir()
    meta = {"tokenizer": "char", "vocab_size": V, "chars": [chr(ord("a") + i) for i in range(V)]}
    checkpoint.save({"model": model.state_dict(), "model_config": dataclasses.asdict(model.config),
                     "train_config": dataclasses.asdict(TrainConfig()), "meta": meta}, out / "ckpt_best.pt")
    return out


def test_export_refuses_mup_in_one_line_but_writes_it_at_the_base_width(tmp_path, capsys):
    pytest.importorskip("safetensors")
    pytest.importorskip("tokenizers")
    from gpt import export
    from gpt.pretrained import from_pretrained
    run = save_run(tmp_path / "wide", model_of(64, parametrization="mup"))
    assert export.main([f"--out_dir={run}", f"--to={tmp_path / 'hf'}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {run}'s model cannot be written as GPT-2: parametrization=mup (GPT-2 has "
                          "the standard parametrization") and err.count("\n") == 1
    assert not (tmp_path / "hf").exists()
    base = model_of(BASE, parametrization="mup").eval()
    assert export.main([f"--out_dir={save_run(tmp_path / 'base', base)}", f"--to={tmp_path / 'hf'}"]) == 0
    idx = torch.randint(0, V, (2, BLOCK))
    with torch.no_grad():
        torch.testing.assert_close(from_pretrained(str(tmp_path / "hf")).eval()(idx)[0], base(idx)[0],
                                   atol=1e-5, rtol=0)


# ---------------------------------------------------------------- the coordinate check

SMALL = ["--widths=32,128", "--steps=2", "--seeds=1", "--n_head=2", "--mup_base_width=32", "--block_size=16",
         "--batch_size=8"]


def test_the_coordinate_check_finds_mup_flat_and_sp_growing(data_dir, tmp_path, capsys):
    from gpt import coord_check
    out = tmp_path / "coord"
    assert coord_check.main([f"--data_dir={data_dir}", "--dataset=tiny", *SMALL, f"--out={out}"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["coord.csv", "coord.md", "coord.png"]
    with open(out / "coord.csv", newline="") as f:
        rows = [{**r, "width": int(r["width"]), "step": int(r["step"]), "rms": float(r["rms"])} for r in csv.DictReader(f)]
    assert {(r["parametrization"], r["width"], r["step"]) for r in rows} == {
        (p, w, s) for p in ("sp", "mup") for w in (32, 128) for s in (1, 2)}
    ratios = coord_check.flatness(rows)
    assert [name for p, name in ratios if p == "mup"] == ["embedding", "attention logits 0", "block 0 output",
                                                          "attention logits 1", "block 1 output", "logits"]
    assert all(coord_check.flat(r) for (p, _), r in ratios.items() if p == "mup"), ratios
    assert ratios[("sp", "logits")] > coord_check.TOLERANCE
    assert ratios[("sp", "attention logits 0")] > coord_check.TOLERANCE
    said = capsys.readouterr().out
    assert "| logits | mup | " in said and "mup: flat within 2x" in said


@pytest.mark.parametrize("argv, message", [
    (["--widths=64"], "--widths needs two widths or more to compare"),
    (["--widths=64,x"], "--widths '64,x' should be integers separated by commas"),
    (["--widths=30,64"], "--widths: width 30 is not divisible by --n_head=4"),
    (["--mup_base_width=30"], "mup_base_width=30 is not divisible by n_head=4"),
    (["--steps=0"], "--steps must be positive"),
])
def test_a_bad_coordinate_check_option_is_one_line(data_dir, tmp_path, capsys, argv, message):
    from gpt import coord_check
    with pytest.raises(SystemExit) as stop:
        coord_check.main([f"--data_dir={data_dir}", "--dataset=tiny", f"--out={tmp_path / 'coord'}", *argv])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.startswith(f"error: {message}") and err.count("\n") == 1, err
    assert not (tmp_path / "coord").exists()


# ---------------------------------------------------------------- whole runs

MUP = ["--parametrization=mup", "--mup_base_width=8", "--learning_rate=3e-3", "--max_iters=10",
       "--eval_interval=4", "--gradient_accumulation_steps=2", "--seed=4"]


@pytest.mark.e2e
def test_a_mup_run_resumes_to_the_same_bits(data_dir, tmp_path, capsys):
    a, _ = resumed_as_whole(data_dir, tmp_path, MUP, 10, 5)
    halves = tmp_path / "halves"
    capsys.readouterr()
    saved = checkpoint.model_config(a)
    assert (saved.parametrization, saved.mup_base_width, saved.n_embd) == ("mup", 8, 16)
    # a resume as the other parametrization is one line
    assert train.main([f"--out_dir={halves}", "--resume", "--max_iters=12", "--parametrization=sp"]) == 2
    err = capsys.readouterr().err
    assert "cannot resume with a different model: parametrization=mup in the checkpoint but sp now" in err
    assert err.count("\n") == 1


@pytest.mark.e2e
def test_a_sweep_over_parametrizations_then_sampling_evaluation_and_init_from(data_dir, tmp_path, capsys):
    sweep = tmp_path / "sweep"
    assert train.main(tiny_args(data_dir, sweep, "--sweep", "parametrization=sp,mup", "--mup_base_width=8",
                                "--max_iters=4", "--eval_interval=4")) == 0
    runs = {p: sweep / f"parametrization={p}__seed=1337" for p in ("sp", "mup")}
    assert all((run / "ckpt.pt").exists() for run in runs.values())
    assert untimed_metrics(runs["sp"], "train") != untimed_metrics(runs["mup"], "train")
    capsys.readouterr()
    assert sample.main([f"--out_dir={runs['mup']}", "--max_new_tokens=12", "--start=to"]) == 0
    assert capsys.readouterr().out.startswith("to")
    from gpt import evaluate
    assert evaluate.main([f"--out_dir={runs['mup']}", "--split=val"]) == 0
    follow = tmp_path / "follow"
    assert train.main(tiny_args(data_dir, follow, f"--init_from={runs['mup']}", "--max_iters=1",
                                "--eval_interval=1")) == 0
    assert checkpoint.model_config(checkpoint.load(follow / "ckpt.pt")).parametrization == "mup"
    trained = untimed_metrics(runs["mup"], "eval")[-1]["val_loss"]
    assert untimed_metrics(follow, "eval")[0]["val_loss"] == pytest.approx(trained, abs=1e-6)
