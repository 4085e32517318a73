import dataclasses
import importlib
import json
import math
import os
import shlex
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch

import sample
import train
from conftest import ROOT, tiny_args
from gpt import checkpoint, figures, integrity
from gpt.config import GPTConfig, TrainConfig
from gpt.config_files import shown
from gpt.errors import UserError
from gpt.data import Batches
from gpt.speed import precision as precision_module
from gpt.speed.attention import attention
# the module, not its function of the same name, which the package exports
speed_hooks = importlib.import_module("gpt.speed.attention")
from gpt.model import GPT
from gpt.speed.precision import cpu_rounds_matmuls, matmul_precision
from gpt.train import loop, resume, runtime
from gpt.train.loop import bpc_columns, lr_at
from gpt.train.outcome import loss_text
from gpt.train.metrics import read_jsonl
from gpt.train.runtime import check_compile
from gpt.train.setup import make_optimizer


def read_metrics(out_dir, kind):
    rows = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r["kind"] == kind]


def test_schedule_warms_up_linearly_then_follows_the_cosine():
    cfg = TrainConfig(learning_rate=1e-3, min_lr=1e-4, warmup_iters=10, lr_decay_iters=110)
    assert [lr_at(i, cfg) for i in range(3)] == pytest.approx([1e-4, 2e-4, 3e-4])
    assert lr_at(9, cfg) == pytest.approx(1e-3)
    assert lr_at(10, cfg) == pytest.approx(1e-3)
    assert lr_at(60, cfg) == pytest.approx(1e-4 + 0.5 * 9e-4)          # half way: cos = 0
    assert lr_at(85, cfg) == pytest.approx(1e-4 + 0.5 * (1 + math.cos(math.pi * 0.75)) * 9e-4)
    assert lr_at(110, cfg) == lr_at(500, cfg) == pytest.approx(1e-4)
    lrs = [lr_at(i, cfg) for i in range(10, 111)]
    assert all(a >= b for a, b in zip(lrs, lrs[1:]))
    flat = TrainConfig(learning_rate=1e-3, min_lr=1e-4, warmup_iters=0, lr_schedule="constant")
    assert lr_at(0, flat) == lr_at(4000, flat) == 1e-3


def test_linear_and_wsd_schedules_fall_to_min_lr_by_their_shapes():
    common = dict(learning_rate=1e-3, min_lr=1e-4, warmup_iters=10, lr_decay_iters=110)
    linear = TrainConfig(**common, lr_schedule="linear")
    assert lr_at(9, linear) == lr_at(10, linear) == pytest.approx(1e-3)
    assert lr_at(35, linear) == pytest.approx(1e-4 + 0.75 * 9e-4)      # a quarter of the way down
    assert lr_at(110, linear) == lr_at(300, linear) == pytest.approx(1e-4)
    wsd = TrainConfig(**common, lr_schedule="wsd", cooldown_frac=0.25)
    # flat for the first 75 of the 100 steps after warmup, then a straight line over the last 25
    assert [lr_at(i, wsd) for i in (10, 50, 85)] == pytest.approx([1e-3] * 3)
    assert lr_at(95, wsd) == pytest.approx(1e-4 + 0.6 * 9e-4)
    assert lr_at(110, wsd) == lr_at(300, wsd) == pytest.approx(1e-4)
    steps = range(10, 111)
    for cfg in (linear, wsd):
        lrs = [lr_at(i, cfg) for i in steps]
        assert all(a >= b for a, b in zip(lrs, lrs[1:]))
    # linear sits below cosine through the first half of the decay, above it through the second
    cosine = TrainConfig(**common)
    assert lr_at(30, linear) < lr_at(30, cosine) and lr_at(90, linear) > lr_at(90, cosine)


def test_weight_decay_applies_to_matrices_and_embeddings_only():
    model = GPT(GPTConfig(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=8))
    opt = make_optimizer(model, TrainConfig(weight_decay=0.1))
    decay, no_decay = opt.param_groups
    names = {id(p): n for n, p in model.named_parameters()}
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert {names[id(p)] for p in decay["params"]} == {
        n for n, p in model.named_parameters() if n.endswith(("wte.weight", "wpe.weight", "c_attn.weight",
                                                               "c_proj.weight", "c_fc.weight"))}
    assert all(names[id(p)].endswith((".bias", "ln_1.weight", "ln_2.weight", "ln_f.weight"))
               for p in no_decay["params"])
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))


@pytest.mark.e2e
def test_train_then_sample_through_the_scripts(data_dir, tmp_path, capsys):
    out = tmp_path / "run"
    assert train.main(tiny_args(data_dir, out, "--max_iters=30", "--eval_interval=10",
                                "--learning_rate=3e-3")) == 0
    said = capsys.readouterr().out
    params = checkpoint.load_for_sampling(out)[0].num_params(non_embedding=False)
    tokens = 4 * 16     # TINY's batch_size and block_size
    assert said.splitlines()[0] == (f"training {params:,} parameters on cpu (float32, 1 thread): 30 steps of "
                                    f"{tokens} tokens into {out}")
    lines = [line for line in said.splitlines() if line.startswith("iter ")]
    assert "tokens/s" not in lines[0] and all(line.endswith(" tokens/s") for line in lines[1:])  # none at 0
    evals = read_metrics(out, "eval")
    assert [e["iter"] for e in evals] == [0, 10, 20, 30]
    for e in evals:
        assert {"train_loss", "val_loss", "lr", "tokens_per_sec", "elapsed_s"} <= e.keys()
    assert all(0 < a["elapsed_s"] < b["elapsed_s"] for a, b in zip(evals, evals[1:]))
    assert evals[-1]["val_loss"] < evals[0]["val_loss"] - 0.5
    assert len(read_metrics(out, "train")) == 30
    [timing] = read_metrics(out, "timing")      # the loop's seconds: in steps what the train lines' ms add up to
    assert timing["iter"] == 30 and timing["steps_s"] == pytest.approx(
        sum(r["ms"] for r in read_metrics(out, "train")) / 1000, rel=1e-6)
    assert 0 < timing["evals_s"] and timing["steps_s"] + timing["evals_s"] <= timing["loop_end"] - timing["loop_start"]
    for name in ("ckpt.pt", "ckpt_best.pt", "config.json", "command.txt"):
        assert (out / name).exists()
    saved = json.loads((out / "config.json").read_text())
    assert saved["model"]["n_layer"] == 2 and saved["train"]["max_iters"] == 30
    capsys.readouterr()

    args = [f"--out_dir={out}", "--start=ROMEO:", "--max_new_tokens=40", "--seed=7", "--num_samples=2"]
    assert sample.main(args) == 0
    first = capsys.readouterr().out
    assert first.startswith("ROMEO:") and first.count("ROMEO:") >= 2
    assert len(first) >= 2 * (len("ROMEO:") + 40)
    assert sample.main(args) == 0
    assert capsys.readouterr().out == first                  # same seed, same text
    assert sample.main(args[:-2] + ["--seed=8", "--num_samples=2"]) == 0
    assert capsys.readouterr().out != first


@pytest.mark.e2e
def test_sample_prompt_from_file_and_unknown_characters(data_dir, tmp_path, capsys, monkeypatch):
    out = tmp_path / "run"
    assert train.main(tiny_args(data_dir, out, "--max_iters=2", "--eval_interval=2")) == 0
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("JULIET:")
    capsys.readouterr()
    assert sample.main([f"--out_dir={out}", f"--start=FILE:{prompt}", "--max_new_tokens=5",
                        "--temperature=0"]) == 0
    assert capsys.readouterr().out.startswith("JULIET:")
    assert sample.main([f"--out_dir={out}", "--start=JULIET:", "--max_new_tokens=5", "--device=cpu:0"]) == 0
    assert capsys.readouterr().out.startswith("JULIET:")
    # the best checkpoint, here an older one than the last: its weights are what is sampled
    best = checkpoint.load(out / "ckpt.pt")
    best["model"] = {k: torch.zeros_like(v) for k, v in best["model"].items()}      # uniform logits
    checkpoint.save(best, out / "ckpt_best.pt")
    greedy = ["--start=JULIET:", "--max_new_tokens=8", "--temperature=0"]
    texts = []
    for which in ("latest", "best"):
        assert sample.main([f"--out_dir={out}", f"--ckpt={which}", *greedy]) == 0
        texts.append(capsys.readouterr().out)
    tok_0 = sorted(checkpoint.load(out / "ckpt.pt")["meta"]["chars"])[0]
    assert texts[1] == "JULIET:" + tok_0 * 8 + "\n" != texts[0]      # all logits equal: argmax is id 0
    assert sample.main([f"--out_dir={out}", "--ckpt=3"]) == 2
    assert "ckpt='3' is not allowed; choose one of latest, best" in capsys.readouterr().err
    monkeypatch.setenv("HOME", str(tmp_path))
    assert sample.main([f"--out_dir={out}", "--start=FILE:~/prompt.txt", "--max_new_tokens=5",
                        "--temperature=0"]) == 0
    assert capsys.readouterr().out.startswith("JULIET:")
    assert sample.main([f"--out_dir={out}", "--start=ROMEO: Ω#", "--max_new_tokens=5"]) == 2
    assert "not in the vocabulary: '#Ω'" in capsys.readouterr().err


@pytest.mark.e2e
def test_resume_gives_identical_losses_and_weights(data_dir, tmp_path, capsys):
    extra = ["--max_iters=24", "--eval_interval=8", "--dropout=0.1", "--seed=5"]
    one = tmp_path / "one"
    assert train.main(tiny_args(data_dir, one, *extra)) == 0
    two = tmp_path / "two"
    assert train.main(tiny_args(data_dir, two, *extra[1:], "--max_iters=24", "--eval_interval=8")) == 0
    # train part way (12 steps, the middle of an evaluation interval), then resume to the end
    three = tmp_path / "three"
    assert train.main(tiny_args(data_dir, three, *extra[1:], "--max_iters=12")) == 0
    capsys.readouterr()
    assert train.main([f"--out_dir={three}", "--resume", "--max_iters=24"]) == 0
    said = capsys.readouterr().out
    assert f"resuming {three / 'ckpt.pt'} at iteration 12 of 24" in said
    assert "done: 24 iterations, best val loss" in said and str(three) in said
    # the clock for time-to-quality goes on from where the first part left it
    elapsed = [e["elapsed_s"] for e in read_metrics(three, "eval")]
    assert len(elapsed) == 5 and elapsed == sorted(elapsed) and elapsed[3] > elapsed[2]
    for a, b in ((one, two), (one, three)):
        untimed = [{k: v for k, v in r.items() if k != "ms"} for r in read_metrics(a, "train")]
        assert untimed == [{k: v for k, v in r.items() if k != "ms"} for r in read_metrics(b, "train")]
        evals_b = {e["iter"]: e["val_loss"] for e in read_metrics(b, "eval")}
        assert {e["iter"]: e["val_loss"] for e in read_metrics(a, "eval")}.items() <= evals_b.items()
        wa, wb = checkpoint.load(a / "ckpt.pt"), checkpoint.load(b / "ckpt.pt")
        assert all(torch.equal(wa["model"][k], wb["model"][k]) for k in wa["model"])
        assert wa["best_val_loss"] == wb["best_val_loss"]


# in a fresh process, as train.py runs: train, then count which of a million subnormal floats
# multiply to zero on torch's two threads (the smallest subnormal is the float32 of bit pattern 1)
FLUSH_CHECK = """
import sys
import torch
import train
assert train.main(sys.argv[1:]) == 0
tiny = torch.ones(1_000_000, dtype=torch.int32).view(torch.float32)
print(int((tiny * 1.0 == 0).sum()))
"""


@pytest.mark.e2e
@pytest.mark.parametrize("flush, flushed", [("true", 1_000_000), ("false", 0)])
def test_training_on_cpu_flushes_subnormal_floats_in_every_thread(data_dir, tmp_path, flush, flushed):
    argv = tiny_args(data_dir, tmp_path / "run", "--max_iters=1", "--eval_interval=1", "--threads=2",
                     f"--flush_denormal={flush}")
    proc = subprocess.run([sys.executable, "-c", FLUSH_CHECK, *argv], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert int(proc.stdout.split()[-1]) == flushed


@pytest.mark.e2e
def test_a_resume_keeps_the_runs_seed(data_dir, tmp_path, capsys):
    out = tmp_path / "run"
    assert train.main(tiny_args(data_dir, out, "--max_iters=2", "--eval_interval=2", "--seed=3")) == 0
    assert train.main([f"--out_dir={out}", "--resume", "--max_iters=4", "--seed=5"]) == 2
    assert capsys.readouterr().err == ("error: cannot resume with seed=5: the run's batches and dropout "
                                       "follow its seed=3; leave --seed out to continue it, or train with "
                                       "the new seed in another --out_dir\n")
    assert json.loads((out / "config.json").read_text())["train"]["seed"] == 3
    assert train.main([f"--out_dir={out}", "--resume", "--max_iters=4", "--seed=3"]) == 0


def test_dropout_masks_differ_between_seeds_and_micro_batches_on_this_device():
    def mask(seed, micro_batch):
        torch.manual_seed(loop.dropout_seed(seed, micro_batch))
        return torch.nn.functional.dropout(torch.ones(64), 0.5)
    assert torch.equal(mask(1337, 7), mask(1337, 7))
    assert not torch.equal(mask(1337, 7), mask(5, 7))      # a CPU generator keeps 32 bits of a seed
    assert not torch.equal(mask(1337, 7), mask(1337, 8))
    assert not torch.equal(mask(0, 1), mask(1, 0))


@pytest.mark.e2e
def test_the_training_loop_seeds_each_micro_batchs_dropout_by_its_place(data_dir, tmp_path, monkeypatch):
    calls, real = [], loop.dropout_seed
    monkeypatch.setattr(loop, "dropout_seed", lambda seed, place: calls.append((seed, place)) or real(seed, place))
    assert train.main(tiny_args(data_dir, tmp_path / "run", "--max_iters=2", "--eval_interval=2", "--dropout=0.1",
                                "--gradient_accumulation_steps=2", "--seed=9")) == 0
    assert calls == [(9, 0), (9, 1), (9, 2), (9, 3)]


def test_the_rng_state_keeps_the_normal_draw_each_generator_holds_back():
    import random
    import numpy as np
    resume.seed_everything(3)
    random.gauss(0, 1), np.random.standard_normal()     # each now holds its pair's second draw
    state = resume.rng_state("cpu")
    state = torch.load(_saved(state), weights_only=True)
    ahead = random.gauss(0, 1), np.random.standard_normal(), torch.randn(1).item()
    resume.seed_everything(4)
    resume.set_rng_state(state, "cpu")
    assert (random.gauss(0, 1), np.random.standard_normal(), torch.randn(1).item()) == ahead
    # a checkpoint of older code kept no held-back draw: the generators start their next pair
    del state["python_gauss"], state["numpy_gauss"]
    resume.set_rng_state(state, "cpu")
    assert random.getstate()[2] is None and np.random.get_state()[3] == 0


def _saved(obj):
    import io
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    buffer.seek(0)
    return buffer


@pytest.mark.e2e
def test_a_checkpoint_older_than_a_field_resumes_as_it_was_trained(data_dir, tmp_path):
    out = tmp_path / "run"
    assert train.main(tiny_args(data_dir, out, "--max_iters=4", "--eval_interval=4", "--log_interval=1",
                                "--lr_schedule=constant", "--warmup_iters=0")) == 0
    ckpt = checkpoint.load(out / "ckpt.pt")
    for newer in ("parallel", "qk_norm"):
        del ckpt["model_config"][newer]
    assert ckpt["model_config"]["n_kv_head"] == 0
    ckpt["model_config"]["n_kv_head"] = ckpt["model_config"]["n_head"]   # older runs recorded it resolved
    del ckpt["train_config"]["lr_schedule"]             # older runs said decay_lr=false instead
    ckpt["train_config"].update(decay_lr=False, lr_decay_iters=5)
    checkpoint.save(ckpt, out / "ckpt.pt")
    assert train.main([f"--out_dir={out}", "--resume", "--max_iters=7"]) == 0
    assert checkpoint.load(out / "ckpt.pt")["iter"] == 7
    lr = checkpoint.load(out / "ckpt.pt")["train_config"]["learning_rate"]
    assert [r["lr"] for r in read_metrics(out, "train")] == pytest.approx([lr] * 7)   # no decay at 5


@pytest.mark.e2e
def test_a_fresh_run_in_an_old_folder_leaves_none_of_the_old_run(data_dir, tmp_path, capsys):
    out = tmp_path / "run"
    assert train.main(tiny_args(data_dir, out, "--max_iters=4", "--eval_interval=2", "--n_layer=1")) == 0
    assert (out / "ckpt.pt").exists() and (out / "ckpt_best.pt").exists()
    (out / "dashboard.png").write_bytes(b"a picture of the old run")
    capsys.readouterr()
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    second = tiny_args(data_dir, out, "--max_iters=4", "--eval_interval=2", "--learning_rate=1e9",
                       "--warmup_iters=0")
    assert train.main(second) == 2      # not without being told: the earlier run is kept whole
    assert capsys.readouterr().err == (
        f"error: {out} holds an earlier run's ckpt.pt and ckpt_best.pt; continue it with --out_dir={out} "
        "--resume, replace it with --overwrite=true, or choose another --out_dir\n")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    with pytest.raises(UserError, match="resume=true continues the run in out_dir and overwrite=true "
                                        "replaces it; give one of them"):
        TrainConfig(resume=True, overwrite=True)
    # a run started with --overwrite=true resumes like any other
    other = tmp_path / "other"
    assert train.main(tiny_args(data_dir, other, "--max_iters=2", "--eval_interval=2", "--overwrite=true")) == 0
    assert train.main([f"--out_dir={other}", "--resume", "--max_iters=4"]) == 0
    assert checkpoint.load(other / "ckpt.pt")["iter"] == 4
    capsys.readouterr()
    # told, a second run that diverges before its first save: no file of the first may remain
    assert train.main([*second, "--overwrite=true"]) == 3
    said = capsys.readouterr()
    assert f"starting afresh in {out}: removed the earlier run's checkpoints\n" in said.out
    assert "no checkpoint had been saved yet" in said.err
    assert {p.name for p in out.iterdir()} == {"config.json", "command.txt", "metrics.jsonl"}
    assert (out / "command.txt").read_text().startswith("python train.py --data_dir=")
    assert "--learning_rate=1e9" in (out / "command.txt").read_text()
    assert len((out / "command.txt").read_text().splitlines()) == 1
    assert json.loads((out / "config.json").read_text())["model"]["n_layer"] == 2


@pytest.mark.e2e
def test_checkpoint_rebuilds_the_model_alone(data_dir, tmp_path):
    """The model sample.py rebuilds from the checkpoint scores the val windows exactly as the
    trained model did, for flags away from every default."""
    from gpt.data import Batches
    out = tmp_path / "run"
    flags = ["--pos_encoding=rope", "--norm_type=rmsnorm", "--norm_placement=sandwich", "--parallel=true",
             "--qk_norm=true", "--activation=swiglu", "--n_kv_head=1", "--tie_weights=false",
             "--scale_embeddings=true", "--bias=false", "--mlp_ratio=3"]
    assert train.main(tiny_args(data_dir, out, "--max_iters=4", "--eval_interval=4", *flags)) == 0
    ckpt = checkpoint.load(out / "ckpt.pt")
    cfg = checkpoint.model_config(ckpt)
    assert [f"--{f.split('=')[0][2:]}={shown(getattr(cfg, f.split('=')[0][2:]))}" for f in flags] == flags
    model, tok = checkpoint.load_for_sampling(out)
    assert tok.vocab_size == cfg.vocab_size and ckpt["meta"]["tokenizer"] == "char"
    xs, ys = Batches(data_dir / "tiny", 16, 4, "cpu", seed=0).evenly_spaced("val", 2, 4)  # eval_iters=2
    with torch.no_grad():
        loss = sum(model(x, y)[1].item() for x, y in zip(xs, ys)) / 2
    final = [r for r in read_jsonl(out / "metrics.jsonl") if r["kind"] == "eval"][-1]
    assert loss == pytest.approx(final["val_loss"], abs=1e-6)


@pytest.mark.e2e
def test_runs_of_different_batch_size_are_scored_on_the_same_windows_given_eval_batch_size(data_dir, tmp_path):
    # the weights at iteration 0 depend on the seed alone, so equal first evaluations mean equal text
    def first_val(name, *flags):
        out = tmp_path / name
        assert train.main(tiny_args(data_dir, out, "--max_iters=2", "--eval_interval=2", *flags)) == 0
        return [r for r in read_jsonl(out / "metrics.jsonl") if r["kind"] == "eval"][0]["val_loss"]
    four = first_val("b4", "--batch_size=4")
    assert first_val("b2", "--batch_size=2", "--eval_batch_size=4") == four
    assert first_val("b2_own", "--batch_size=2") != four      # by default, its own batch size


def val_on(path, data_dir, n_batches, batch_size):
    """The val loss of the checkpoint at path over n_batches * batch_size evenly spaced windows."""
    model = checkpoint.load_model(checkpoint.load(path)).eval()
    xs, ys = Batches(data_dir / "tiny", 16, 4, "cpu", 0).evenly_spaced("val", n_batches, batch_size)
    with torch.no_grad():
        return sum(model(x, y)[1].item() for x, y in zip(xs, ys)) / n_batches


@pytest.mark.e2e
def test_a_resume_that_scores_other_windows_scores_both_checkpoints_again(data_dir, tmp_path, capsys):
    out = tmp_path / "run"
    assert train.main(tiny_args(data_dir, out, "--max_iters=2", "--eval_interval=2")) == 0
    # the state at iteration 4 made worse than that at 2, which stays ckpt_best.pt
    assert train.main([f"--out_dir={out}", "--resume", "--max_iters=4", "--learning_rate=3",
                       "--warmup_iters=0"]) == 0
    assert checkpoint.load(out / "ckpt_best.pt")["iter"] == 2
    assert train.main([f"--out_dir={out}", "--resume", "--max_iters=5", "--eval_iters=1",
                       "--eval_batch_size=8"]) == 0
    assert "note:" not in capsys.readouterr().out      # 1 batch of 8 windows or 2 of 4: the same text
    same = tmp_path / "same"
    shutil.copytree(out, same)
    best, last = val_on(out / "ckpt_best.pt", data_dir, 2, 8), val_on(out / "ckpt.pt", data_dir, 2, 8)
    assert best < last
    assert train.main([f"--out_dir={out}", "--resume", "--max_iters=7", "--eval_iters=2"]) == 0
    assert (f"note: evaluations now score 16 windows, before 8, so the val losses before and after "
            f"compare other text; on the new ones iteration 2 {best:.4f}, iteration 5 {last:.4f}: "
            f"ckpt_best.pt holds iteration 2, and later evaluations must beat {best:.4f}"
            ) in capsys.readouterr().out
    after = checkpoint.load(out / "ckpt.pt")
    evals = [r["val_loss"] for r in read_jsonl(out / "metrics.jsonl") if r["kind"] == "eval" and r["iter"] > 5]
    assert after["best_val_loss"] == pytest.approx(min([best, *evals]), abs=1e-6)
    # rescoring changes nothing of the training: its steps are those of a resume that did not
    assert train.main([f"--out_dir={same}", "--resume", "--max_iters=7", "--eval_iters=1"]) == 0
    theirs = checkpoint.load(same / "ckpt.pt")
    assert all(torch.equal(after["model"][k], theirs["model"][k]) for k in after["model"])


@pytest.mark.e2e
def test_a_resume_that_scores_other_windows_keeps_the_resumed_state_when_it_scores_better(data_dir, tmp_path, capsys):
    out, bad = tmp_path / "run", tmp_path / "bad"
    assert train.main(tiny_args(data_dir, out, "--max_iters=4", "--eval_interval=2")) == 0
    assert train.main(tiny_args(data_dir, bad, "--max_iters=2", "--eval_interval=2", "--learning_rate=30",
                                "--warmup_iters=0")) == 0
    (out / "ckpt_best.pt").unlink()     # the same file as ckpt.pt: a copy into it would change both
    shutil.copy(bad / "ckpt.pt", out / "ckpt_best.pt")      # worse than iteration 4 on any text
    resumed = torch.load(out / "ckpt.pt", weights_only=False)
    resumed["best_iter"] = 2
    torch.save(resumed, out / "ckpt.pt")
    assert train.main([f"--out_dir={out}", "--resume", "--max_iters=5", "--eval_batch_size=8"]) == 0
    assert "ckpt_best.pt holds iteration 4, and later evaluations must beat" in capsys.readouterr().out
    assert checkpoint.load(out / "ckpt_best.pt")["iter"] in (4, 5)


def save_as_saved(ckpt: dict, path) -> None:
    """An edited checkpoint saved with the hashes of its parts as they now are, as a run would save it."""
    parts = {k: v for k, v in ckpt.items() if k not in ("format", "digests")}
    torch.save({**ckpt, "digests": {k: integrity.digest(v) for k, v in parts.items()}}, path)


@pytest.mark.e2e
def test_a_resume_that_scores_other_windows_never_makes_a_state_that_is_not_finite_the_best(data_dir, tmp_path, capsys):
    out = tmp_path / "run"
    assert train.main(tiny_args(data_dir, out, "--max_iters=4", "--eval_interval=2")) == 0
    resumed = torch.load(out / "ckpt.pt", weights_only=False)
    resumed["best_iter"] = 2
    resumed["model"]["transformer.ln_f.weight"].fill_(float("inf"))    # as a stop saves it unevaluated
    (out / "ckpt.pt").unlink()          # the same file as ckpt_best.pt: writing into it would change both
    save_as_saved(resumed, out / "ckpt.pt")
    shutil.copy(out / "ckpt.pt", out / "bad.pt")
    best = torch.load(out / "ckpt.pt", weights_only=False)
    best["iter"], best["model"] = 2, checkpoint.load(out / "ckpt_best.pt")["model"]
    save_as_saved(best, out / "ckpt_best.pt")
    before = (out / "ckpt_best.pt").read_bytes()
    assert train.main([f"--out_dir={out}", "--resume", "--max_iters=5", "--eval_iters=3",
                       "--skip_nonfinite=true"]) == 0
    said = capsys.readouterr().out
    assert "iteration 4 nan: ckpt_best.pt holds iteration 2, and later evaluations must beat" in said
    assert (out / "ckpt_best.pt").read_bytes() == before


@pytest.mark.e2e
def test_a_resume_that_scores_other_windows_when_no_ckpt_best_was_saved(data_dir, tmp_path, capsys):
    out = tmp_path / "run"      # diverging: iteration 0 is the best, and it is never saved
    assert train.main(tiny_args(data_dir, out, "--max_iters=4", "--eval_interval=2", "--learning_rate=3",
                                "--warmup_iters=0")) == 0
    assert checkpoint.load(out / "ckpt.pt")["best_iter"] == 0 and not (out / "ckpt_best.pt").exists()
    assert train.main([f"--out_dir={out}", "--resume", "--max_iters=5", "--eval_iters=3"]) == 0
    assert "on the new ones iteration 4 " in capsys.readouterr().out
    assert (out / "ckpt_best.pt").exists()


@pytest.mark.e2e
def test_config_json_records_every_code_version_that_trained_the_run(data_dir, tmp_path):
    from gpt.checkpoint import code_version
    out = tmp_path / "run"
    assert train.main(tiny_args(data_dir, out, "--max_iters=2", "--eval_interval=2")) == 0
    record = json.loads((out / "config.json").read_text())
    assert record["code"] == [code_version()] and len(code_version()) == 12
    record["code"] = ["0123456789ab"]              # the first part trained by other code
    (out / "config.json").write_text(json.dumps(record))
    assert train.main([f"--out_dir={out}", "--resume", "--max_iters=4"]) == 0
    assert json.loads((out / "config.json").read_text())["code"] == ["0123456789ab", code_version()]
    del record["code"]                              # a run older than the record
    (out / "config.json").write_text(json.dumps(record))
    assert train.main([f"--out_dir={out}", "--resume", "--max_iters=6"]) == 0
    assert json.loads((out / "config.json").read_text())["code"] == ["unknown", code_version()]


@pytest.mark.e2e
def test_config_json_records_every_way_the_run_ran(data_dir, tmp_path):
    out = tmp_path / "run"
    assert train.main(tiny_args(data_dir, out, "--max_iters=2", "--eval_interval=2", "--dtype=auto")) == 0
    assert json.loads((out / "config.json").read_text())["ran_as"] == ["cpu float32 matmul=highest"]
    assert train.main([f"--out_dir={out}", "--resume", "--max_iters=4", "--matmul_precision=highest"]) == 0
    assert json.loads((out / "config.json").read_text())["ran_as"] == ["cpu float32 matmul=highest"]
    assert train.main([f"--out_dir={out}", "--resume", "--max_iters=6", "--dtype=bfloat16"]) == 0
    assert json.loads((out / "config.json").read_text())["ran_as"] == [
        "cpu float32 matmul=highest", "cpu bfloat16 matmul=highest"]
    record = json.loads((out / "config.json").read_text())
    del record["ran_as"]                            # a run older than the record
    (out / "config.json").write_text(json.dumps(record))
    assert train.main([f"--out_dir={out}", "--resume", "--max_iters=8"]) == 0
    assert json.loads((out / "config.json").read_text())["ran_as"] == ["unknown", "cpu bfloat16 matmul=highest"]


def test_ran_as_names_cuda_medium_as_high_which_torch_makes_it():
    from gpt.train.rundir import ran_as
    torch.set_float32_matmul_precision("medium")
    try:    # what makes the two one way: the same CUDA setting
        medium = torch.backends.cuda.matmul.fp32_precision
        torch.set_float32_matmul_precision("high")
        assert torch.backends.cuda.matmul.fp32_precision == medium == "tf32"
    finally:
        torch.set_float32_matmul_precision("highest")
    assert ran_as("cuda:0", torch.float32, "medium") == ran_as("cuda", torch.float32, "high") == \
        "cuda float32 matmul=high"
    assert ran_as("cpu", torch.float32, "medium") == "cpu float32 matmul=medium"    # AMX rounds
    assert ran_as("cuda", torch.bfloat16, "highest") == "cuda bfloat16 matmul=highest"


def test_the_code_fingerprint_skips_lock_files_and_gives_up_on_unreadable_ones(tmp_path):
    from gpt.checkpoint import fingerprint
    (tmp_path / "model.py").write_text("x = 1\n")
    first = fingerprint(tmp_path)
    (tmp_path / ".#model.py").symlink_to("user@host.1:1")    # an editor's lock: a dangling link
    assert fingerprint(tmp_path) == first
    (tmp_path / "model.py").write_text("x = 2\n")
    assert fingerprint(tmp_path) not in (first, "unknown")
    second = fingerprint(tmp_path)
    (tmp_path / "cpu").mkdir()                  # a subpackage's source counts too
    (tmp_path / "cpu" / "split.py").write_text("y = 1\n")
    assert fingerprint(tmp_path) not in (second, "unknown")
    (tmp_path / "trainer.py").symlink_to(tmp_path / "nowhere")
    assert fingerprint(tmp_path) == "unknown"


@pytest.mark.e2e
def test_a_checkpoint_without_elapsed_time_takes_it_from_the_log(data_dir, tmp_path):
    out = tmp_path / "run"
    assert train.main(tiny_args(data_dir, out, "--max_iters=8", "--eval_interval=4")) == 0
    ckpt = checkpoint.load(out / "ckpt.pt")
    del ckpt["elapsed_s"]                       # as older versions wrote it
    checkpoint.save(ckpt, out / "ckpt.pt")
    assert train.main([f"--out_dir={out}", "--resume", "--max_iters=12"]) == 0
    elapsed = [e["elapsed_s"] for e in read_metrics(out, "eval")]
    assert [e["iter"] for e in read_metrics(out, "eval")] == [0, 4, 8, 12]
    assert elapsed[3] > elapsed[2] > 0


@pytest.mark.e2e
def test_command_txt_repeats_the_command_with_its_quoting(data_dir, tmp_path):
    argv = tiny_args(data_dir, tmp_path / "run", "--max_iters=2", "--eval_interval=2", "--wandb_run_name=my run")
    assert train.main(argv) == 0
    assert shlex.split((tmp_path / "run" / "command.txt").read_text()) == ["python", "train.py", *argv]


def test_train_runs_in_a_thread_other_than_the_main_one(data_dir, tmp_path):
    import threading
    from gpt.cli import parse_argv
    from gpt.train.loop import train as train_in_python
    from gpt.train.resume import configs_for_run
    out = tmp_path / "my runs" / "run"
    values = parse_argv(tiny_args(data_dir, out, "--max_iters=2", "--eval_interval=2",
                                  "--wandb_run_name=a, b")).values
    results = []
    worker = threading.Thread(target=lambda: results.append(train_in_python(*configs_for_run(values))))
    worker.start()
    worker.join(timeout=120)
    assert results and results[0]["iters"] == 2 and results[0]["stopped_by"] is None
    # called from Python, the run's command.txt is still a command that gives the same configs,
    # spaces and commas included
    command = shlex.split((out / "command.txt").read_text())
    assert command[:2] == ["python", "train.py"]
    again = configs_for_run(parse_argv(command[2:]).values)
    ran = configs_for_run(values)
    assert dataclasses.replace(again[0], vocab_size=1) == dataclasses.replace(ran[0], vocab_size=1)
    assert again[1] == ran[1]


@pytest.mark.e2e
@pytest.mark.parametrize("precision, rounds", [("medium", True), ("highest", False)])
def test_a_run_trains_at_its_matmul_precision_and_leaves_the_one_it_found(data_dir, tmp_path, monkeypatch,
                                                                           precision, rounds,
                                                                           cpu_rounds_when_asked):
    seen = []
    # torch.compile's own code reads the level back through torch's getter: it must not raise
    monkeypatch.setattr(speed_hooks, "attention", lambda *a: seen.append(
        (cpu_rounds_matmuls(), torch.get_float32_matmul_precision())) or attention(*a))
    with matmul_precision("medium", "cuda"):      # a caller's own level: CUDA and a CPU rounded
        assert train.main(tiny_args(data_dir, tmp_path / "run", "--max_iters=2", "--eval_interval=2",
                                    f"--matmul_precision={precision}")) == 0
        assert torch.get_float32_matmul_precision() == "medium" and cpu_rounds_matmuls()
    assert seen and set(seen) == {(rounds, "medium" if rounds else "highest")}
    assert checkpoint.load(tmp_path / "run" / "ckpt.pt")["train_config"]["matmul_precision"] == precision
    assert all(math.isfinite(r["loss"]) for r in read_metrics(tmp_path / "run", "train"))


@pytest.mark.e2e
def test_a_run_trains_on_its_thread_count_and_leaves_the_one_it_found(data_dir, tmp_path, monkeypatch):
    seen = []
    monkeypatch.setattr(speed_hooks, "attention", lambda *a: seen.append(torch.get_num_threads())
                        or attention(*a))
    found = torch.get_num_threads()
    try:
        torch.set_num_threads(3)
        assert train.main(tiny_args(data_dir, tmp_path / "run", "--max_iters=1", "--eval_interval=1",
                                    "--threads=1")) == 0
        assert seen and set(seen) == {1}
        assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(found)


@pytest.mark.e2e
def test_a_failing_torch_compile_is_said_in_one_line(data_dir, tmp_path, monkeypatch, capsys):
    class InductorError(RuntimeError):      # as torch._inductor raises it, without a C++ compiler
        __module__ = "torch._inductor.exc"

    class Compiled(torch.nn.Module):       # fails where torch.compile's module does: when first called
        def forward(self, *args, **kwargs):
            raise InductorError("InvalidCxxCompiler: No working C++ compiler found\n  pages more")

    def compiled(model):
        return Compiled()
    monkeypatch.setattr(torch, "compile", compiled)
    assert train.main(tiny_args(data_dir, tmp_path / "run", "--max_iters=2", "--compile=true")) == 2
    line = ("error: torch.compile failed (InvalidCxxCompiler: No working C++ compiler found); run without "
            "--compile, or fix what it names\n")
    assert capsys.readouterr().err == line
    # GPT_TRACEBACK=1: the traceback of the compiler's own error, then the same line
    monkeypatch.setenv("GPT_TRACEBACK", "1")
    assert train.main(tiny_args(data_dir, tmp_path / "again", "--max_iters=2", "--compile=true")) == 2
    err = capsys.readouterr().err
    assert err.startswith("Traceback") and "InductorError: InvalidCxxCompiler" in err and err.endswith("\n" + line)
    with pytest.raises(InductorError):      # not compiling: not torch.compile's, and not hidden
        with runtime.compile_failure_in_one_line(False):
            raise InductorError("x")


def test_the_memory_check_counts_the_diagnostics_backward_pass_at_each_evaluation(monkeypatch):
    monkeypatch.setattr(runtime, "device_memory", lambda device: 4 * 2 ** 30)
    model_cfg = GPTConfig(vocab_size=65, block_size=256, n_layer=8, n_head=4, n_embd=256)
    # per token, float32: logits and log-softmax 2 * 65, a block's stream 256 and c_fc output 1024
    runtime.check_fits(model_cfg, TrainConfig(eval_batch_size=2000, diagnostics=False), "cpu")  # 2.4 GiB
    with pytest.raises(UserError, match=r"^eval_batch_size=2000 needs at least 19.8 GiB"):
        runtime.check_fits(model_cfg, TrainConfig(eval_batch_size=2000, diagnostics=True), "cpu")
    with pytest.raises(UserError, match=r"^batch_size=2000 needs at least 19.8 GiB"):
        runtime.check_fits(model_cfg, TrainConfig(batch_size=2000, eval_batch_size=1, diagnostics=False), "cpu")
    with pytest.raises(UserError, match=r"^eval_batch_size=3500 needs at least 4.3 GiB"):
        runtime.check_fits(model_cfg, TrainConfig(eval_batch_size=3500, diagnostics=False), "cpu")


@pytest.mark.e2e
def test_a_compile_cache_folder_that_cannot_be_made_is_said_in_one_line(data_dir, tmp_path):
    out = tmp_path / "run"
    assert train.main(tiny_args(data_dir, out, "--max_iters=2", "--eval_interval=2")) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    (tmp_path / "file").write_text("not a folder")
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "file" / "cache")}
    proc = subprocess.run([sys.executable, "train.py", f"--out_dir={out}", "--resume", "--max_iters=4",
                           "--compile=true"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr == (f"error: torch.compile failed (Not a directory: {tmp_path / 'file' / 'cache'}); "
                           "run without --compile, or fix what it names\n")
    # a start that never trained is not recorded: a sweep would take its settings for the run's
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_compile_with_medium_is_refused_only_where_attention_would_round(monkeypatch):
    def refused(**settings):
        try:
            check_compile(TrainConfig(compile=True, **settings), "cpu" if "device" not in settings else settings["device"])
        except UserError:
            return True
        return False
    monkeypatch.setattr(precision_module, "cpu_can_round", lambda: False)   # medium is exact there
    assert not refused(matmul_precision="medium")
    monkeypatch.setattr(precision_module, "cpu_can_round", lambda: True)
    assert refused(matmul_precision="medium")
    assert not refused(matmul_precision="high")
    assert refused(matmul_precision="medium", dtype="bfloat16")    # its CPU attention is float32 too
    assert not refused(matmul_precision="medium", device="cuda")
    # the device is resolved only when the answer depends on it: a finished sweep's runs on
    # device=cuda still report on a machine without CUDA
    check_compile(TrainConfig(device="cuda", compile=True))


def test_durations_read_at_a_glance():
    from gpt.progress import duration
    assert [duration(s) for s in (0.2, 40, 54.4, 56, 60, 86, 119, 9 * 60 + 24, 9 * 60 + 35, 25 * 60, 3599,
                                  12 * 3600 + 40 * 60, 46 * 3600 + 52.6 * 60)] == [
        "about 1 s", "about 40 s", "about 54 s", "about 1 min", "about 1 min", "about 1 min 30 s", "about 2 min",
        "about 9 min 20 s", "about 10 min", "about 25 min", "about 1 h 0 min", "about 12 h 40 min",
        "about 46 h 53 min"]


def test_the_evaluations_left_count_the_end_and_skip_one_already_made():
    from gpt.train.estimate import evaluations_left
    every = lambda n, m: TrainConfig(max_iters=m, eval_interval=n, lr_decay_iters=m, warmup_iters=0)
    assert evaluations_left(every(250, 2000), 0, -1) == 9          # 0, 250, ..., 2000
    assert evaluations_left(every(20, 30), 0, -1) == 3             # 0, 20 and the end
    assert evaluations_left(every(250, 2000), 250, 250) == 7       # a resume: 250 was made before it stopped


def test_an_estimate_without_the_train_split_counts_it_at_the_last_evaluation_alone():
    from gpt.train.estimate import evaluation_seconds, run_seconds
    both, val = TrainConfig(eval_iters=10, diagnostics=False), TrainConfig(eval_iters=10, diagnostics=False,
                                                                           eval_train=False)
    assert run_seconds(both, 100, 5, 1.0, 0.1) == 100 + 2 * 5 * 10 * 0.1
    assert run_seconds(val, 100, 5, 1.0, 0.1) == pytest.approx(100 + (5 + 1) * 10 * 0.1)
    assert run_seconds(val, 100, 0, 1.0, 0.1) == 100
    # "an evaluation" as the estimate says it: the ones before the last score val alone
    assert evaluation_seconds(val, 1.0, 0.1) == pytest.approx(1.0) and evaluation_seconds(both, 1.0, 0.1) == 2.0


def test_eval_train_false_scores_the_train_split_at_the_last_evaluation_alone_and_trains_alike(data_dir, tmp_path,
                                                                                               capsys):
    args = ["--max_iters=6", "--eval_interval=2", "--seed=5"]
    assert train.main(tiny_args(data_dir, tmp_path / "both", *args)) == 0
    assert train.main(tiny_args(data_dir, tmp_path / "val", *args, "--eval_train=false")) == 0
    both, val = read_metrics(tmp_path / "both", "eval"), read_metrics(tmp_path / "val", "eval")
    assert [r["iter"] for r in val] == [0, 2, 4, 6]
    assert ["train_loss" in r for r in val] == [False, False, False, True]
    assert [r["val_loss"] for r in val] == [r["val_loss"] for r in both]    # the val windows alike
    assert val[-1]["train_loss"] == both[-1]["train_loss"]
    losses = lambda name: [r["loss"] for r in read_metrics(tmp_path / name, "train")]
    assert len(losses("val")) == 6 and losses("val") == losses("both")
    said = capsys.readouterr().out
    assert "iter 2: val " in said and "iter 6: train " in said
    assert figures.run_figure(tmp_path / "val", tmp_path / "val.png").stat().st_size > 0    # val alone at 0, 2, 4


@pytest.mark.e2e
def test_the_estimate_leaves_the_run_as_it_would_be_untimed(data_dir, tmp_path, capsys, monkeypatch):
    from gpt.train import estimate
    args = ["--max_iters=12", "--eval_interval=6", "--dropout=0.1", "--seed=3"]
    timed, untimed = tmp_path / "timed", tmp_path / "untimed"
    assert train.main(tiny_args(data_dir, timed, *args)) == 0
    said = capsys.readouterr().out.splitlines()
    assert said[1].startswith("estimated time: about ") and " for 12 steps and 3 evaluations (" in said[1]
    assert said[2].startswith("iter 0: ")              # before the first evaluation
    monkeypatch.setattr(estimate, "say", lambda run, all_threads, stopped: None)
    assert train.main(tiny_args(data_dir, untimed, *args)) == 0
    for kind in ("train", "eval"):
        strip = lambda rows: [{k: v for k, v in r.items() if k not in ("ms", "elapsed_s", "tokens_per_sec", "cpu_share")}
                              for r in rows]
        assert strip(read_metrics(timed, kind)) == strip(read_metrics(untimed, kind))
    a, b = checkpoint.load(timed / "ckpt.pt"), checkpoint.load(untimed / "ckpt.pt")
    assert torch.equal(a["rng"]["torch"], b["rng"]["torch"]) and torch.equal(a["batch_rng"], b["batch_rng"])
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])


@pytest.mark.e2e
@pytest.mark.parametrize("step_s, sized_for_a_gpu", [(10.0, True), (0.01, False)])
def test_a_long_estimate_on_a_cpu_names_the_cpu_recipe_and_its_time(step_s, sized_for_a_gpu, data_dir, tmp_path,
                                                                    capsys, monkeypatch):
    from gpt.progress import duration
    from gpt.train import estimate
    monkeypatch.setattr(estimate, "_seconds", lambda work, device: step_s)   # each step and batch
    assert train.main(tiny_args(data_dir, tmp_path / "run", "--max_iters=300", "--eval_interval=100",
                                "--eval_iters=2")) == 0
    said = capsys.readouterr().out
    # 300 steps, and 4 evaluations of 2 batches on each split plus the diagnostics' step
    total = 300 * step_s + 4 * (2 * 2 * step_s + step_s)
    assert f"estimated time: {duration(total)} for 300 steps and 4 evaluations " in said
    assert f"({step_s * 1000:,.0f} ms a step, " in said
    # the recipe's 2000 steps and 9 evaluations of 20 batches a split, at the same made-up speed
    recipe = duration(2000 * step_s + 9 * (2 * 20 * step_s + step_s))
    hint = ("this run is sized for a GPU; on this CPU, python train.py --config shakespeare_char_cpu trains a "
            f"smaller model in {recipe}\n")
    assert (hint in said) == sized_for_a_gpu


@pytest.mark.e2e
def test_the_cpu_recipe_is_timed_on_its_own_model_with_the_random_state_put_back(monkeypatch):
    from gpt.train import estimate
    sizes = []
    real_forward = GPT.forward

    def forward(self, idx, targets=None):
        sizes.append((self.config.n_layer, self.config.n_embd, tuple(idx.shape)))
        return real_forward(self, idx, targets)
    monkeypatch.setattr(GPT, "forward", forward)
    monkeypatch.setattr(estimate, "WARM_S", float("inf"))     # every piece timed twice
    before = torch.get_rng_state()
    assert estimate.cpu_recipe_seconds("cpu") > 0
    assert set(sizes) == {(4, 128, (12, 64))} and len(sizes) == 4      # its step and batch, twice each
    assert torch.equal(torch.get_rng_state(), before)      # its weights were drawn from a stream of its own


def test_the_cpu_recipe_named_is_the_datasets_own_where_there_is_one():
    from gpt.train import estimate
    assert estimate.cpu_recipe("enwik8", 256) == ("enwik8_cpu", 256)
    assert estimate.cpu_recipe("text8", 27) == ("text8_cpu", 27)
    assert estimate.cpu_recipe("shakespeare_char", 65) == ("shakespeare_char_cpu", 65)
    assert estimate.cpu_recipe("shakespeare", 50257) == ("shakespeare_char_cpu", 65)    # BPE: none of its own
    assert estimate.cpu_recipe("mine", 80) == ("shakespeare_char_cpu", 65)


@pytest.mark.e2e
def test_a_stop_during_the_estimate_says_nothing_of_it_and_saves_nothing(data_dir, tmp_path, capsys, monkeypatch):
    import os
    import signal

    from gpt.train import estimate
    real = estimate.step_seconds

    def interrupted(run):
        took = real(run)
        os.kill(os.getpid(), signal.SIGINT)
        return took
    monkeypatch.setattr(estimate, "step_seconds", interrupted)
    out = tmp_path / "run"
    assert train.main(tiny_args(data_dir, out, "--max_iters=10")) == 130
    said = capsys.readouterr().out
    assert "estimated time" not in said and "iter 0" not in said
    assert "SIGINT: stopped before the first step; nothing was saved" in said
    assert not (out / "ckpt.pt").exists()


@pytest.mark.e2e
def test_a_char_run_gives_bits_per_character_beside_its_losses(data_dir, tmp_path, capsys, no_estimate):
    out = tmp_path / "run"
    assert train.main(tiny_args(data_dir, out, "--max_iters=4", "--eval_interval=2")) == 0
    said = capsys.readouterr().out
    evals = read_metrics(out, "eval")
    assert len(evals) == 3
    for e in evals:     # right after the losses, in bits: loss / ln 2
        assert list(e)[2:6] == ["train_loss", "val_loss", "train_bpc", "val_bpc"]
        assert e["train_bpc"] == pytest.approx(e["train_loss"] / math.log(2), rel=1e-12)
        assert e["val_bpc"] == pytest.approx(e["val_loss"] / math.log(2), rel=1e-12)
        assert (f"iter {e['iter']}: train {e['train_loss']:.4f} ({e['train_bpc']:.3f} bpc), "
                f"val {e['val_loss']:.4f} ({e['val_bpc']:.3f} bpc) (unigram level {e['unigram_loss']:.2f}), ") in said
    best = min(e["val_loss"] for e in evals[1:])
    assert f"done: 4 iterations, best val loss {best:.4f} ({best / math.log(2):.3f} bpc); " in said


@pytest.mark.e2e
def test_a_bpe_run_has_no_bits_per_character(tmp_path, capsys, monkeypatch, no_estimate):
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "empty"))    # training decodes nothing
    folder = tmp_path / "data" / "bpe"
    folder.mkdir(parents=True)
    (folder / "meta.json").write_text(json.dumps({"tokenizer": "tiktoken", "vocab_size": 50, "encoding": "gpt2"}))
    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        rng.integers(0, 50, 400).astype(np.uint16).tofile(folder / f"{split}.bin")
    out = tmp_path / "run"
    args = tiny_args(tmp_path / "data", out, "--dataset=bpe", "--max_iters=2", "--eval_interval=2")
    assert train.main(args) == 0
    said = capsys.readouterr().out
    evals = read_metrics(out, "eval")
    assert len(evals) == 2 and not any(key.endswith("_bpc") for e in evals for key in e)
    assert f"iter 2: train {evals[1]['train_loss']:.4f}, val {evals[1]['val_loss']:.4f} (unigram level " in said
    assert "bpc" not in said


def test_bits_per_character_are_for_char_and_byte_data_alone():
    losses = {"train_loss": 2.0, "val_loss": 3.0}
    for tokenizer in ("char", "byte"):
        assert bpc_columns(losses, {"tokenizer": tokenizer}) == {"train_bpc": 2.0 / math.log(2),
                                                                "val_bpc": 3.0 / math.log(2)}
    assert bpc_columns(losses, {"tokenizer": "tiktoken"}) == {}
    assert loss_text(2.0, True) == "2.0000 (2.885 bpc)" and loss_text(2.0, False) == "2.0000"


def test_an_evaluation_waits_for_the_device_once_a_split_and_scores_what_one_batch_at_a_time_did(data_dir,
                                                                                               monkeypatch):
    import contextlib
    from pathlib import Path

    from gpt.data import Batches
    from gpt.train.evaluate import mean_losses
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=40, block_size=16, n_layer=1, n_head=2, n_embd=16))
    batches = Batches(Path(data_dir) / "tiny", 16, 4, "cpu", 0)
    xs, ys = batches.evenly_spaced("val", 3, 4)
    with torch.no_grad():
        expected = sum(model.eval()(x, y)[1].item() for x, y in zip(xs, ys)) / 3
    reads = []
    for name in ("item", "tolist", "cpu"):
        real = getattr(torch.Tensor, name)
        monkeypatch.setattr(torch.Tensor, name, lambda self, *a, _real=real, _name=name, **k: (
            reads.append(_name), _real(self, *a, **k))[1])
    losses = mean_losses(model, batches, ("train", "val"), 3, 4, contextlib.nullcontext())
    assert reads == ["tolist", "tolist"]        # one read of each split's losses
    assert losses["val_loss"] == pytest.approx(expected, abs=1e-7)
