"""Rough edges met in a new user's second hour: an exported model's generate, a stopped sweep's
status and logs, the messages for a sweep given as one run, a file given as a sweep's folder and a
config file's key given twice, and a best checkpoint that shares the last one's file."""

import dataclasses
import json
import os
import signal

import pytest
import torch

import train
from conftest import tiny_args
from gpt import checkpoint
from gpt.config_files import read_config_file
from gpt.config import GPTConfig, TrainConfig
from gpt.console import Terminated
from gpt.errors import UserError
from gpt.model import GPT
from gpt.sweep import runner, status
from gpt.train import source


# ---------------------------------------------------------------- export

@pytest.mark.e2e
def test_an_exported_models_generate_stops_at_the_block_size(tmp_path, capsys):
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("safetensors")
    from gpt import export
    chars = sorted(set("ROMEO: what, ho!"))
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=len(chars), block_size=16, n_layer=1, n_head=2, n_embd=8))
    run = tmp_path / "run"
    run.mkdir()
    checkpoint.save({"model": model.state_dict(), "model_config": dataclasses.asdict(model.config),
                     "train_config": dataclasses.asdict(TrainConfig()),
                     "meta": {"tokenizer": "char", "vocab_size": len(chars), "chars": chars}}, run / "ckpt_best.pt")
    assert export.main([f"--out_dir={run}", f"--to={tmp_path / 'hf'}"]) == 0
    assert "generation_config.json" in capsys.readouterr().out
    assert json.loads((tmp_path / "hf" / "generation_config.json").read_text())["max_length"] == 16
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32).eval()
    ids = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")("ROMEO:", return_tensors="pt").input_ids
    # transformers' own default, 20 new tokens, would run past the 16 positions and fail
    assert hf.generate(ids, do_sample=False).shape == (1, 16)


# ---------------------------------------------------------------- a stopped sweep

def sweep_folder(tmp_path):
    """A sweep of two runs, neither with a result: the first stopped with its ckpt.pt saved."""
    out = tmp_path / "sw"
    out.mkdir()
    (out / "sweep.json").write_text(json.dumps({"axes": {"n_layer": [1, 2]}, "seeds": 1, "base_seed": 1337,
                                                "command": "python train.py --sweep n_layer=1,2"}))
    stopped = out / "n_layer=1__seed=1337"
    stopped.mkdir()
    (stopped / "ckpt.pt").write_bytes(b"")
    (stopped / "log.txt").write_text(f"SIGTERM: saved {stopped / 'ckpt.pt'} at iteration 10; the sweep's "
                                     "command, run again, continues it\n")
    return out


def test_status_shows_a_stopped_run_with_a_checkpoint_as_resumable(tmp_path, capsys):
    out = sweep_folder(tmp_path)
    assert status.status(out) == 1      # nothing pending
    said = capsys.readouterr().out.splitlines()
    assert said[0] == "0 done, 0 running, 0 queued, 1 stopped, 0 failed, 1 not submitted"
    assert said[1:] == ["  not submitted: n_layer=2__seed=1337",
                        "  stopped (resumable): n_layer=1__seed=1337: SIGTERM: saved "
                        f"{out / 'n_layer=1__seed=1337' / 'ckpt.pt'} at iteration 10; the sweep's command, "
                        "run again, continues it"]


def test_status_shows_the_runs_of_a_local_sweep_at_work_as_queued_until_they_train(tmp_path, capsys):
    out = sweep_folder(tmp_path)
    with checkpoint.hold_folder(out):       # as the sweep process holds its folder while it runs
        assert status.status(out) == 0
    said = capsys.readouterr().out.splitlines()
    assert said[0] == "0 done, 0 running, 2 queued, 0 failed, 0 not submitted"


class Running:
    """A run the sweep started, still training when the sweep is stopped."""
    stopped = []

    def __init__(self, *args, **kwargs):
        pass

    def poll(self):
        return None

    def terminate(self):
        Running.stopped.append(signal.SIGTERM)

    def wait(self):
        return 128 + signal.SIGTERM


@pytest.mark.e2e
@pytest.mark.parametrize("stop, name, code", [(KeyboardInterrupt(), "SIGINT (Ctrl-C)", 130),
                                              (Terminated(signal.SIGHUP), "SIGHUP", 129)], ids=["SIGINT", "SIGHUP"])
def test_a_stopped_sweep_names_its_signal_in_each_runs_log(data_dir, tmp_path, monkeypatch, stop, name, code):
    def stopped(seconds):
        raise stop
    monkeypatch.setattr(runner.subprocess, "Popen", Running)
    monkeypatch.setattr(runner.time, "sleep", stopped)
    Running.stopped.clear()
    out = tmp_path / "sw"
    # a fresh process each (Popen, stood in for above)
    assert train.main(tiny_args(data_dir, out, "--sweep", "n_layer=1,2", "--jobs=2", "--run_start=fresh")) == code
    assert Running.stopped == [signal.SIGTERM, signal.SIGTERM]
    for run in ("n_layer=1__seed=1337", "n_layer=2__seed=1337"):
        assert (out / run / "log.txt").read_text() == (f"sweep: stopped by {name}; stopping this run with "
                                                       "SIGTERM, which saves its checkpoint\n")


# ---------------------------------------------------------------- messages

@pytest.mark.e2e
def test_init_from_a_sweep_says_it_is_one_and_names_a_run(data_dir, tmp_path, capsys):
    sweep = tmp_path / "norm"
    (sweep / "a=1__seed=1").mkdir(parents=True)
    (sweep / "sweep.json").write_text("{}")
    with pytest.raises(UserError, match=r"is a sweep, none of whose runs has saved a checkpoint yet"):
        source.resolve(str(sweep))
    (sweep / "a=1__seed=1" / "ckpt.pt").write_bytes(b"")
    assert train.main(tiny_args(data_dir, tmp_path / "ft", f"--init_from={sweep}/")) == 2
    assert capsys.readouterr().err == (f"error: init_from='{sweep}/': {sweep} is a sweep; give one of its "
                                       f"runs, e.g. {sweep / 'a=1__seed=1'}\n")
    assert not (tmp_path / "ft").exists()


@pytest.mark.e2e
def test_a_sweep_into_a_file_says_it_is_a_file(data_dir, tmp_path, capsys):
    (tmp_path / "notes").write_text("mine")
    assert train.main(tiny_args(data_dir, tmp_path / "notes", "--sweep", "n_layer=1,2")) == 2
    assert capsys.readouterr().err == (f"error: out_dir='{tmp_path / 'notes'}' is a file; give a folder for "
                                       "the sweep's runs\n")
    assert (tmp_path / "notes").read_text() == "mine"


@pytest.mark.parametrize("text, message", [
    ("n_layer = 2\nn_embd = 16\nn_layer = 3\n", "n_layer is set twice (again at line 3); keep one of the two"),
    ("n_layer = 2\nn_layer = 3", "n_layer is set twice (again at line 2); keep one of the two"),    # no last newline
    ('n_layer = 2\n[sweep]\nn_embd = [16]\n"n_embd" = [\n  32,\n]\n',
     '[sweep] "n_embd" is set twice (again at line 4); keep one of the two'),
    ("seeds = 2\n[sweep]\nseeds = 3\n", "seeds = 2 at the top level is replaced by [sweep]'s seeds = 3 in every "
     "run; keep one of the two"),
], ids=["twice", "twice-at-the-end", "twice-in-sweep", "top-and-sweep-option"])
def test_a_config_files_key_given_twice_is_named(tmp_path, text, message):
    path = tmp_path / "mine.toml"
    path.write_text(text)
    with pytest.raises(UserError) as e:
        read_config_file(str(path))
    assert str(e.value) == f"{path}: {message}"


def test_a_top_level_value_no_run_would_use_is_refused(tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text("learning_rate = 1e-3\n[sweep]\nlearning_rate = [3e-4, 3e-3]\n")
    with pytest.raises(UserError) as e:
        read_config_file(str(path))
    assert str(e.value) == (f"{path}: learning_rate = 0.001 at the top level is replaced by [sweep]'s "
                            "learning_rate = [0.0003, 0.003] in every run; keep one of the two")
    # one of the swept values, as configs/sweeps/heads.toml gives, so that the file is valid alone
    path.write_text("n_head = 4\n[sweep]\nn_head = [2, 4]\n")
    assert read_config_file(str(path)) == ({"n_head": 4}, {"n_head": [2, 4]}, {})


# ---------------------------------------------------------------- the best checkpoint

@pytest.mark.e2e
def test_the_best_checkpoint_is_the_last_ones_file_until_a_worse_save_replaces_that(data_dir, tmp_path,
                                                                                   monkeypatch):
    from gpt.train import loop
    out = tmp_path / "run"
    last, best = out / "ckpt.pt", out / "ckpt_best.pt"
    assert train.main(tiny_args(data_dir, out, "--max_iters=4", "--eval_interval=2")) == 0
    assert checkpoint.load(best)["iter"] == 4 == checkpoint.load(last)["best_iter"]    # the loss fell each time
    assert os.stat(best).st_ino == os.stat(last).st_ino
    # made good again, past a temporary file a kill left as a link to ckpt.pt
    best.unlink()
    os.link(last, out / "ckpt_best.pt.tmp")
    assert checkpoint.make_best_good(out, checkpoint.load(last, mmap=True, needs=("iter",))) == 4
    assert os.stat(best).st_ino == os.stat(last).st_ino and not (out / "ckpt_best.pt.tmp").exists()
    assert checkpoint.load(last)["iter"] == 4
    kept = best.read_bytes()
    real = loop.mean_losses

    def worse(*args, **kwargs):
        losses = real(*args, **kwargs)
        return losses and {**losses, "val_loss": losses["val_loss"] + 100}
    monkeypatch.setattr(loop, "mean_losses", worse)
    assert train.main([f"--out_dir={out}", "--resume", "--max_iters=6"]) == 0
    assert checkpoint.load(last)["iter"] == 6 and checkpoint.load(last)["best_iter"] == 4
    assert os.stat(best).st_ino != os.stat(last).st_ino and best.read_bytes() == kept
    assert checkpoint.load(best)["iter"] == 4
