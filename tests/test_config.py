"""gpt/config.py: the settings' dataclasses, their validation, and build."""

import dataclasses
import math
import re

import pytest

from conftest import V
from gpt.cli import parse_argv
from gpt.config import GPTConfig, SampleConfig, TrainConfig, build
from gpt.errors import UserError
from gpt.model import GPT


@pytest.mark.parametrize("cls, values, message", [
    (TrainConfig, {"learning_rate": -1.0}, r"learning_rate=-1.0 must be positive"),
    (TrainConfig, {"grad_clip": math.nan}, r"grad_clip=nan is not a finite number"),
    (TrainConfig, {"out_dir": ""}, r"out_dir is empty"),
    (TrainConfig, {"dataset": " "}, r"dataset is empty"),
    (TrainConfig, {"data_dir": ""}, r"data_dir is empty"),
    (TrainConfig, {"out_dir": "runs/" + "é" * 128}, r"out_dir has a name of 256 bytes \(é+\.\.\.\)"),
    (SampleConfig, {"out_dir": ""}, r"out_dir is empty"),
    (TrainConfig, {"learning_rate": math.inf}, r"learning_rate=inf is not a finite number"),
    (SampleConfig, {"top_p": math.nan}, r"top_p=nan is not a finite number"),
    (TrainConfig, {"min_lr": 1.0, "learning_rate": 0.1}, r"min_lr=1.0 is above learning_rate"),
    (TrainConfig, {"batch_size": 0}, r"batch_size=0 must be positive"),
    (TrainConfig, {"dtype": "fp8"}, r"dtype='fp8' is not allowed; choose one of auto, fast, float32, bfloat16"),
    (GPTConfig, {"activation": "SwiGLU"}, r"activation='SwiGLU' is not allowed; did you mean swiglu\? choose one of"),
    (TrainConfig, {"beta2": 1.0}, r"beta2=1.0 must be in \[0, 1\)"),
    (GPTConfig, {"n_embd": 100, "n_head": 3}, r"n_embd=100 is not divisible by n_head=3"),
    (GPTConfig, {"dropout": 1.5}, r"dropout=1.5"),
    (SampleConfig, {"top_p": 0.0}, r"top_p=0.0 must be in \(0, 1\]"),
    (SampleConfig, {"temperature": -1.0}, r"temperature=-1.0 must be 0 \(greedy\) or at least 0.001"),
    (SampleConfig, {"temperature": 1e-39}, r"temperature=1e-39 must be 0 \(greedy\) or at least"),
    (TrainConfig, {"seed": -1}, r"seed=-1 must be in \[0, 2\*\*32\)"),
    (TrainConfig, {"warmup_iters": 0, "lr_decay_iters": 0},
     r"lr_decay_iters=0 is not after the end of warmup_iters=0.*lower warmup_iters, or pass "
     r"--lr_schedule=constant"),
    (TrainConfig, {"lr_schedule": "cos"}, r"lr_schedule='cos' is not allowed; did you mean cosine\?"),
    (TrainConfig, {"lr_schedule": "wsd", "cooldown_frac": 0.0}, r"cooldown_frac=0.0 must be in \(0, 1\]"),
    (GPTConfig, {"n_head": 4, "n_kv_head": 3}, r"n_head=4.*n_kv_head=3"),
    (GPTConfig, {"pos_encoding": "rotary"}, r"pos_encoding='rotary'"),
    (GPTConfig, {"norm_placement": "middle"}, r"norm_placement='middle'"),
    (GPTConfig, {"norm_type": "batchnorm"}, r"norm_type='batchnorm'"),
    (GPTConfig, {"n_embd": 1, "n_head": 1, "mlp_ratio": 1, "activation": "swiglu"},
     r"no hidden units.*raise mlp_ratio"),
    (GPTConfig, {"n_embd": 4, "n_head": 4, "qk_norm": True},
     r"qk_norm with norm_type='layernorm' needs a head size above 1"),
    (GPTConfig, {"n_kv_head": -1}, r"n_kv_head=-1 must be positive, or 0 for as many as n_head"),
    (GPTConfig, {"n_embd": 12, "n_head": 4, "pos_encoding": "rope"}, r"pos_encoding='rope'.*head size.* 3"),
    (GPTConfig, {"n_layer": 0}, r"n_layer=0"),
    (GPTConfig, {"n_embd": -1}, r"n_embd=-1"),
    (GPTConfig, {"block_size": 0}, r"block_size=0"),
    (GPTConfig, {"vocab_size": 0}, r"vocab_size=0"),
])
def test_bad_values_fail_where_they_enter(cls, values, message):
    with pytest.raises(UserError, match=message):
        build(cls, values)


def test_configs_saved_with_decay_lr_keep_their_schedule():
    # runs saved before lr_schedule recorded decay_lr; a resume or a sweep must read them as run
    assert build(TrainConfig, {}, base={"decay_lr": False, "warmup_iters": 0,
                                        "lr_decay_iters": 0}).lr_schedule == "constant"
    assert build(TrainConfig, {}, base={"decay_lr": True}).lr_schedule == "cosine"
    assert build(TrainConfig, {"lr_schedule": "wsd"}, base={"decay_lr": False}).lr_schedule == "wsd"


def test_a_constant_schedule_may_run_below_min_lr():
    assert build(TrainConfig, {"lr_schedule": "constant", "learning_rate": 1e-5}).min_lr == 1e-4


@pytest.mark.parametrize("make, message", [
    (lambda: TrainConfig(compile="false"), "compile='false' is not true or false"),   # a str would be true
    (lambda: TrainConfig(batch_size=4.5), "batch_size=4.5 is not a whole number"),
    (lambda: GPTConfig(n_head="4", n_embd=128), "n_head='4' is not a whole number"),
    (lambda: SampleConfig(top_k=True), "top_k=True is not a whole number"),
])
def test_configs_built_in_python_check_their_types(make, message):
    # the model's GPTConfig raises a plain ValueError (it imports nothing of the commands' errors)
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        make()
    assert TrainConfig(learning_rate=1).learning_rate == 1      # a whole number is a number


def test_numpy_numbers_become_pythons_own():
    np = pytest.importorskip("numpy")
    cfg = GPTConfig(n_layer=np.int64(2), dropout=np.float64(0.25), bias=np.bool_(False),
                    pos_encoding=np.array(["rope"])[0])
    assert (cfg.n_layer, cfg.dropout, cfg.bias, cfg.pos_encoding) == (2, 0.25, False, "rope")
    assert [type(v) for v in (cfg.n_layer, cfg.dropout, cfg.bias, cfg.pos_encoding)] == [int, float, bool, str]
    assert [TrainConfig(learning_rate=lr).learning_rate for lr in np.linspace(1e-3, 3e-3, 3)] == \
        pytest.approx([1e-3, 2e-3, 3e-3])
    with pytest.raises(ValueError, match=r"^n_layer=np.float64\(2.5\) is not a whole number$"):
        GPTConfig(n_layer=np.float64(2.5))


def test_a_folder_given_with_a_tilde_is_in_the_home_folder(tmp_path, monkeypatch):
    """bash leaves --out_dir=~/runs as it is; a folder named ~ would appear in the current one."""
    from gpt.config import SampleConfig
    monkeypatch.setenv("HOME", str(tmp_path))
    cfg = TrainConfig(out_dir="~/runs/a", data_dir="~/data")
    assert (cfg.out_dir, cfg.data_dir) == (str(tmp_path / "runs" / "a"), str(tmp_path / "data"))
    assert SampleConfig(out_dir="~/runs/a").out_dir == str(tmp_path / "runs" / "a")
    assert TrainConfig(out_dir="~nosuchuser/a").out_dir == "~nosuchuser/a"
    # as typed on a command line, where every command reads it: --resume finds the run there
    assert parse_argv(["--out_dir=~/runs/a", "--data_dir=~/data"]).values == {
        "out_dir": str(tmp_path / "runs" / "a"), "data_dir": str(tmp_path / "data")}


# ------------------------------------------------------------------ the model's settings (GPTConfig)

def test_gated_mlp_has_the_weights_of_the_plain_one():
    sizes = {act: GPTConfig(n_embd=48, n_head=4, bias=False, activation=act).num_params()
             for act in ("gelu", "swiglu")}
    assert sizes["gelu"] == sizes["swiglu"]


def test_n_kv_head_follows_a_replaced_n_head_unless_it_was_given_apart():
    cfg = GPTConfig(vocab_size=V, n_head=4, n_embd=32)
    assert dataclasses.replace(cfg, n_head=8).kv_heads == 8      # not grouped-query attention by stealth
    assert GPTConfig(vocab_size=V, n_head=4, n_kv_head=4, n_embd=32) == cfg     # one model, one record
    gqa = GPTConfig(vocab_size=V, n_head=4, n_kv_head=2, n_embd=32)
    assert (gqa.kv_heads, dataclasses.replace(gqa, n_head=8).kv_heads) == (2, 2)


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
