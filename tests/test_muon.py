"""optimizer=muon: which tensors Muon takes, its skipped steps, its state across a resume, and a
Muon run through everything an AdamW run goes through."""

import copy
import re
import shutil
import subprocess

import pytest
import torch

import sample
import train
from conftest import BLOCK, ROOT, V, resumed_as_whole, tiny_args, untimed_metrics
from gpt import GPT, GPTConfig
from gpt.speed import optim as speed_optim
from gpt.config import TrainConfig
from gpt.errors import UserError
from gpt.optim import make_optimizer
from gpt.sweep import grid
from test_step_waits import counted_reads  # noqa: F401 (a fixture)

pytestmark = pytest.mark.usefixtures("one_thread")     # conftest.py: tiny ops pay only for hand-offs

MUON = TrainConfig(optimizer="muon", learning_rate=1e-2, muon_lr=0.05, weight_decay=0.1, muon_weight_decay=0.1)


def model_of(seed: int = 0, **kw) -> GPT:
    torch.manual_seed(seed)
    return GPT(GPTConfig(**{"vocab_size": V, "block_size": BLOCK, "n_layer": 2, "n_head": 2, "n_embd": 16, **kw}))


def loss_of(model: GPT, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, V, (4, BLOCK), generator=g)
    return model(idx, idx.roll(-1, 1))[1]


def steps(model: GPT, opt, seeds, lr: float = 1e-2) -> None:
    for s in seeds:
        opt.set_lr(lr)
        loss_of(model, s).backward()
        opt.step(found_inf=torch.tensor(0.0))
        opt.zero_grad()


@pytest.mark.parametrize("kw", [{}, {"bias": False, "tie_weights": False, "pos_encoding": "rope"},
                                {"qk_norm": True, "norm_placement": "sandwich", "embed_norm": True},
                                {"activation": "swiglu", "parallel": True, "n_kv_head": 1}])
def test_muon_takes_the_blocks_matrices_and_adamw_everything_else_once(kw):
    model = model_of(**kw)
    opt = make_optimizer(model, MUON)
    names = {id(p): n for n, p in model.named_parameters()}
    muon = [names[id(p)] for g in opt.muon.param_groups for p in g["params"]]
    adamw = [names[id(p)] for g in opt.adamw.param_groups for p in g["params"]]
    assert muon and all(re.fullmatch(r"transformer\.h\.\d+\.(attn\.c_attn|attn\.c_proj|mlp\.c_fc|mlp\.c_proj)"
                                     r"\.weight", n) for n in muon)
    assert len(muon) == 4 * 2
    assert sorted(muon + adamw) == sorted(names.values())        # every parameter, in exactly one part
    assert "transformer.wte.weight" in adamw
    # AdamW's part decays its matrices (the embeddings, an untied head) alone
    decayed = [names[id(p)] for p in opt.adamw.param_groups[0]["params"]]
    assert set(decayed) == {n for n in adamw if "wte" in n or "wpe" in n or "lm_head" in n}


def test_the_schedule_moves_both_learning_rates_in_proportion():
    opt = make_optimizer(model_of(), MUON)
    opt.set_lr(5e-3)
    assert {g["lr"] for g in opt.adamw.param_groups} == {5e-3}
    assert [g["lr"] for g in opt.muon.param_groups] == [pytest.approx(0.025)]


@pytest.mark.parametrize("read_on", [("cpu", "mps"), ("mps",)], ids=["flag read", "flag left on the device"])
def test_a_skipped_step_leaves_the_weights_and_both_optimizers_state_as_they_were(read_on, monkeypatch):
    monkeypatch.setattr(speed_optim, "READ_FLAG_ON", read_on)
    model = model_of()
    opt = make_optimizer(model, MUON)
    steps(model, opt, [1, 2])
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    state = {k: v.clone() for s in opt.state.values() for k, v in s.items()}
    saved = [{k: v.clone() for k, v in s.items()} for s in opt.state.values()]
    loss_of(model, 3).backward()
    next(model.parameters()).grad.fill_(float("nan"))
    for p in model.parameters():
        p.grad.mul_(float("inf"))           # every part would take a step of nan
    opt.step(found_inf=torch.tensor(1.0))
    assert all(torch.equal(weights[k], v) for k, v in model.state_dict().items())
    for before, now in zip(saved, opt.state.values()):
        assert before.keys() == now.keys() and all(torch.equal(before[k], now[k]) for k in before)
    assert state
    # and a finite step after it goes on as one would have without the skip
    opt.zero_grad()
    twin = model_of()
    twin_opt = make_optimizer(twin, MUON)
    steps(twin, twin_opt, [1, 2, 4])
    steps(model, opt, [4])
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), twin.state_dict().values()))


def test_the_state_saved_and_loaded_continues_to_the_same_bits():
    model = model_of()
    opt = make_optimizer(model, MUON)
    steps(model, opt, [1, 2, 3])
    # as a checkpoint holds it: a copy, not the live tensors the next steps change
    saved = copy.deepcopy({"model": model.state_dict(), "opt": opt.state_dict()})
    assert set(saved["opt"]) == {"state", "param_groups", "muon"}
    steps(model, opt, [4, 5])
    other = model_of(seed=9)
    other.load_state_dict(saved["model"])
    other_opt = make_optimizer(other, MUON)
    other_opt.load_state_dict(saved["opt"])
    steps(other, other_opt, [4, 5])
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), other.state_dict().values()))


def test_adamw_state_does_not_load_into_muon():
    model = model_of()
    adamw_state = make_optimizer(model, TrainConfig()).state_dict()
    with pytest.raises(UserError, match="optimizer=adamw; resume it with --optimizer=adamw"):
        make_optimizer(model, MUON).load_state_dict(adamw_state)


def test_a_grid_over_optimizers_trains_adamw_once_for_all_muon_rates(tmp_path):
    runs = grid.expand({"optimizer": ["adamw", "muon"], "learning_rate": [1e-3, 1e-2],
                        "muon_lr": [0.02, 0.05]}, 1, 0, tmp_path)
    assert [r.folder.name for r in runs] == [
        "optimizer=adamw__learning_rate=0.001__seed=0", "optimizer=adamw__learning_rate=0.01__seed=0",
        "optimizer=muon__learning_rate=0.001__muon_lr=0.02__seed=0",
        "optimizer=muon__learning_rate=0.001__muon_lr=0.05__seed=0",
        "optimizer=muon__learning_rate=0.01__muon_lr=0.02__seed=0",
        "optimizer=muon__learning_rate=0.01__muon_lr=0.05__seed=0"]


def test_a_muon_axis_without_muon_is_refused_in_one_line(data_dir, tmp_path, capsys):
    assert train.main(tiny_args(data_dir, tmp_path / "sweep", "--sweep", "muon_lr=0.01,0.02")) == 2
    err = capsys.readouterr().err
    assert "the axis muon_lr: optimizer=adamw does not read it" in err and err.count("\n") == 1


def test_auto_runs_the_iteration_in_bfloat16_only_where_the_device_computes_it(monkeypatch):
    from gpt.speed import precision
    cpu = torch.device("cpu")
    for native, expected in ((True, torch.bfloat16), (False, torch.float32)):
        monkeypatch.setattr(precision, "cpu_computes_bfloat16", lambda: native)
        assert precision.muon_dtype("auto", cpu) == expected
        assert make_optimizer(model_of(), MUON).muon.ns_dtype == expected
        split = make_optimizer(model_of(), TrainConfig(**{**vars(MUON), "muon_split": "qkv"}))
        assert split.muon.ns_dtype == expected
    for choice in ("bfloat16", "float32"):      # given, it is taken on any device
        cfg = TrainConfig(**{**vars(MUON), "muon_dtype": choice})
        assert make_optimizer(model_of(), cfg).muon.ns_dtype == getattr(torch, choice)


@pytest.mark.parametrize("shape", [(48, 16), (16, 16), (16, 64)])
def test_the_iteration_in_float32_is_the_float64_one_and_bfloat16_rounds_it(shape):
    from gpt.muon import newton_schulz
    from gpt.speed.optim import NS_COEFFICIENTS, NS_EPS, NS_STEPS, orthogonal_whole
    g = torch.randn(*shape, generator=torch.Generator().manual_seed(0))
    for iterate, x in ((orthogonal_whole, g), (newton_schulz, g.mT[None] if shape[0] > shape[1] else g[None])):
        ref = iterate(x.double(), NS_COEFFICIENTS, NS_STEPS, NS_EPS, torch.float64)
        apart = [(iterate(x, NS_COEFFICIENTS, NS_STEPS, NS_EPS, dtype).double() - ref).norm() / ref.norm()
                 for dtype in (torch.float32, torch.bfloat16)]
        assert apart[0] < 1e-5 < 1e-3 < apart[1] < 0.05


@pytest.mark.parametrize("split", ["fused", "qkv"])
def test_muon_dtype_sets_the_step_and_the_momentum_is_never_divided_in_place(split):
    def first_step(dtype: str, nesterov: bool = True):
        model = model_of()
        opt = make_optimizer(model, TrainConfig(**{**vars(MUON), "muon_dtype": dtype, "muon_split": split}))
        opt.muon.param_groups[0]["nesterov"] = nesterov
        loss_of(model, 1).backward()
        grads = [p.grad.clone() for p in opt.muon.param_groups[0]["params"]]
        opt.set_lr(1e-2)
        opt.step(found_inf=torch.tensor(0.0))
        return model, opt, grads
    a, b = first_step("bfloat16")[0], first_step("float32")[0]
    assert not all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))
    # without Nesterov the iteration starts from the momentum itself: after one step it is still
    # (1 - momentum) times the gradient, not that divided by its norm
    _, opt, grads = first_step("float32", nesterov=False)
    for p, grad in zip(opt.muon.param_groups[0]["params"], grads):
        assert torch.allclose(opt.muon.state[p]["momentum_buffer"], 0.05 * grad, rtol=1e-5, atol=0)


def test_a_bad_muon_dtype_is_one_line(data_dir, tmp_path, capsys):
    assert train.main(tiny_args(data_dir, tmp_path / "run", "--optimizer=muon", "--muon_dtype=float16")) == 2
    err = capsys.readouterr().err
    assert "muon_dtype" in err and "float32" in err and err.count("\n") == 1


# ---------------------------------------------------------------- whole runs

RUN = ["--optimizer=muon", "--muon_lr=0.05", "--learning_rate=3e-3", "--max_iters=16", "--eval_interval=6",
       "--gradient_accumulation_steps=2", "--grad_clip=0.05", "--dropout=0.1", "--seed=4",
       "--muon_weight_decay=0.1"]


@pytest.mark.e2e
def test_a_muon_run_resumes_to_the_same_bits(data_dir, tmp_path, capsys):
    a, b = resumed_as_whole(data_dir, tmp_path, RUN, 16, 9)
    whole, halves = tmp_path / "whole", tmp_path / "halves"
    capsys.readouterr()
    momentum = [s["momentum_buffer"] for s in a["optimizer"]["muon"]["state"].values()]
    assert len(momentum) == 8 and all(m.any() for m in momentum)
    assert all(torch.equal(x["momentum_buffer"], y["momentum_buffer"])
               for x, y in zip(a["optimizer"]["muon"]["state"].values(), b["optimizer"]["muon"]["state"].values()))
    # Muon moved the blocks' matrices, and its update ratio is logged per block
    assert all(r["grad_norm"] > 0.05 for r in untimed_metrics(whole, "train"))      # clipping was on
    assert all(len(r["block_update_ratio"]) == 2 and min(r["block_update_ratio"]) > 0
               for r in untimed_metrics(whole, "eval")[1:])
    # a resume with the other optimizer is one line, and leaves the run as it was
    assert train.main([f"--out_dir={halves}", "--resume", "--max_iters=20", "--optimizer=adamw"]) == 2
    err = capsys.readouterr().err
    assert "cannot resume with optimizer=adamw: ckpt.pt holds the state of optimizer=muon" in err
    assert err.count("\n") == 1


@pytest.mark.e2e
def test_muon_steps_never_wait_for_the_device(no_estimate, data_dir, tmp_path, counted_reads):  # noqa: F811
    assert train.main(tiny_args(data_dir, tmp_path / "run", "--optimizer=muon", "--max_iters=12",
                                "--eval_interval=8", "--log_interval=5", "--grad_clip=0.01")) == 0
    assert counted_reads["steps"] == []
    assert counted_reads["read"]


@pytest.mark.e2e
def test_a_muon_run_samples_evaluates_and_exports(data_dir, tmp_path, capsys):
    out = tmp_path / "run"
    assert train.main(tiny_args(data_dir, out, "--optimizer=muon", "--max_iters=6", "--eval_interval=6",
                                "--dtype=bfloat16", "--activation=relu2", "--zero_init=true")) == 0
    capsys.readouterr()
    assert sample.main([f"--out_dir={out}", "--max_new_tokens=12", "--start=to"]) == 0
    assert capsys.readouterr().out.startswith("to")
    from gpt import evaluate
    assert evaluate.main([f"--out_dir={out}", "--split=val"]) == 0
    assert "val" in capsys.readouterr().out
    pytest.importorskip("transformers")
    from gpt import export
    assert export.main([f"--out_dir={out}", f"--to={tmp_path / 'hf'}"]) == 0
    assert (tmp_path / "hf" / "config.json").exists()
    # and a new run starts from its weights, with either optimizer
    for optimizer in ("muon", "adamw"):
        follow = tmp_path / f"from_{optimizer}"
        assert train.main(tiny_args(data_dir, follow, f"--init_from={out}", f"--optimizer={optimizer}",
                                    "--max_iters=1", "--eval_interval=1")) == 0
        trained, untrained = untimed_metrics(out, "eval")[-1]["val_loss"], untimed_metrics(out, "eval")[0]["val_loss"]
        first = untimed_metrics(follow, "eval")[0]      # the same weights, scored in float32 rather than bfloat16
        assert first["iter"] == 0 and abs(first["val_loss"] - trained) < 0.01 < untrained - trained


@pytest.mark.e2e
@pytest.mark.skipif(shutil.which("torchrun") is None, reason="torchrun is not installed")
def test_two_processes_under_muon_match_one_process(data_dir, tmp_path):
    args = [*RUN, "--max_iters=6", "--eval_interval=6"]
    single, ddp = tmp_path / "single", tmp_path / "ddp"
    assert train.main(tiny_args(data_dir, single, *args)) == 0
    proc = subprocess.run(["torchrun", "--standalone", "--nproc_per_node=2", str(ROOT / "train.py"),
                           *tiny_args(data_dir, ddp, *args)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    a, b = untimed_metrics(single, "train"), untimed_metrics(ddp, "train")
    assert len(a) == len(b) == 6
    assert max(abs(x["loss"] - y["loss"]) for x, y in zip(a, b)) < 1e-4
