import json
import math
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import sample
import train
from conftest import ROOT, make_text, tiny_args
from gpt import checkpoint
from gpt.errors import UserError
from gpt.text_dataset import prepare
from gpt.train.metrics import read_jsonl


def train_lines(out_dir):
    rows = [json.loads(x) for x in (out_dir / "metrics.jsonl").read_text().splitlines()]
    return [(r["iter"], r["loss"]) for r in rows if r["kind"] == "train"]


def same_weights(a, b):
    wa, wb = checkpoint.load(a / "ckpt.pt")["model"], checkpoint.load(b / "ckpt.pt")["model"]
    return all(torch.equal(wa[k], wb[k]) for k in wa)


def spawn(args):
    return subprocess.Popen([sys.executable, str(ROOT / "train.py"), *args], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for_iter(out_dir, n, proc, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        path = out_dir / "metrics.jsonl"
        if path.exists() and len(path.read_text().splitlines()) >= n:
            return
        time.sleep(0.05)


RUN = ["--max_iters=60", "--eval_interval=10", "--dropout=0.1", "--seed=11"]


@pytest.mark.e2e
@pytest.mark.parametrize("sig", [getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP")
                                 if hasattr(signal, name)])
def test_a_signal_saves_and_resume_continues_exactly(data_dir, tmp_path, sig):
    ref = tmp_path / "ref"
    assert train.main(tiny_args(data_dir, ref, *RUN)) == 0
    out = tmp_path / "stopped"
    proc = spawn(tiny_args(data_dir, out, *RUN))
    wait_for_iter(out, 15, proc)
    proc.send_signal(sig)
    stdout, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + sig, err      # as a shell reports it: 130 for Ctrl-C, 143
    again = " (a second Ctrl-C stops at once)" if sig == signal.SIGINT else ""   # Ctrl-C only for Ctrl-C
    assert (f"\n{signal.Signals(sig).name}: stopping once the step or evaluation under way is done{again}\n"
            in err)      # said when it came, before the step ends
    stopped_at = checkpoint.load(out / "ckpt.pt")["iter"]
    assert 0 < stopped_at < 60 and f"saved {out / 'ckpt.pt'} at iteration {stopped_at}" in stdout
    assert f"continue with --out_dir={out} --resume" in stdout      # the command that works as given
    assert train.main([f"--out_dir={out}", "--resume"]) == 0
    assert train_lines(out) == train_lines(ref)
    assert same_weights(out, ref)


def _signal_in_evaluation(monkeypatch, at_call: int, sig=signal.SIGINT):
    """Ctrl-C (or sig) to this process in the at_call-th forward pass of an evaluation."""
    from gpt.model import GPT
    real_forward, calls = GPT.forward, []

    def forward(self, idx, targets=None):
        if not self.training and targets is not None:
            calls.append(1)
            if len(calls) == at_call:
                os.kill(os.getpid(), sig)
        return real_forward(self, idx, targets)
    monkeypatch.setattr(GPT, "forward", forward)
    return calls


@pytest.mark.e2e
def test_a_signal_in_an_evaluation_stops_it_there_and_resume_evaluates_again(no_estimate, data_dir, tmp_path,
                                                                              monkeypatch, capsys):
    run = [*RUN, "--eval_iters=50", "--diagnostics=false"]     # its passes are not counted here
    ref = tmp_path / "ref"
    assert train.main(tiny_args(data_dir, ref, *run)) == 0
    out = tmp_path / "stopped"
    calls = _signal_in_evaluation(monkeypatch, 2 * 50 + 10)     # 10 batches into the second one
    capsys.readouterr()
    assert train.main(tiny_args(data_dir, out, *run)) == 130
    assert len(calls) == 2 * 50 + 10        # the rest of the evaluation was not run
    assert f"SIGINT: saved {out / 'ckpt.pt'} at iteration 10; continue with" in capsys.readouterr().out
    assert checkpoint.load(out / "ckpt.pt")["iter"] == 10
    evals = lambda folder: [r["iter"] for r in read_jsonl(folder / "metrics.jsonl") if r["kind"] == "eval"]
    assert evals(out) == [0]
    monkeypatch.undo()
    assert train.main([f"--out_dir={out}", "--resume"]) == 0
    assert evals(out) == evals(ref) and train_lines(out) == train_lines(ref)
    assert same_weights(out, ref)


@pytest.mark.e2e
def test_sigterm_in_the_first_evaluation_is_named_and_says_once_that_nothing_was_saved(no_estimate, data_dir, tmp_path,
                                                                                     monkeypatch, capfd):
    _signal_in_evaluation(monkeypatch, 5, signal.SIGTERM)
    out = tmp_path / "first"
    assert train.main(tiny_args(data_dir, out, *RUN, "--eval_iters=20")) == 143
    said = capfd.readouterr()
    assert "\nSIGTERM: stopping once the step or evaluation under way is done\n" in said.err
    assert "SIGTERM: stopped before the first step; nothing was saved" in said.out
    assert "Ctrl-C" not in said.err + said.out and (said.err + said.out).count("nothing was saved") == 1
    assert not (out / "ckpt.pt").exists()


@pytest.mark.e2e
def test_a_signal_in_the_first_evaluation_saves_nothing_and_in_the_last_is_too_late(no_estimate, data_dir, tmp_path,
                                                                                     monkeypatch, capsys):
    _signal_in_evaluation(monkeypatch, 5)
    out = tmp_path / "first"
    assert train.main(tiny_args(data_dir, out, *RUN, "--eval_iters=20")) == 130
    assert "SIGINT: stopped before the first step; nothing was saved" in capsys.readouterr().out
    assert not (out / "ckpt.pt").exists()
    calls = _signal_in_evaluation(monkeypatch, 2 * 20 + 5)      # 2 iterations: the second is the last
    out = tmp_path / "last"
    assert train.main(tiny_args(data_dir, out, "--max_iters=2", "--eval_interval=2", "--eval_iters=20",
                                "--diagnostics=false")) == 0
    assert len(calls) == 4 * 20 and checkpoint.load(out / "ckpt.pt")["iter"] == 2


@pytest.mark.slow     # over 15 s on 2 AVX2 cores; .ci/run runs the slow tests too
@pytest.mark.e2e
def test_killed_at_random_moments_resumes_to_the_same_end(data_dir, tmp_path):
    run = ["--max_iters=200", "--eval_interval=10", "--dropout=0.1", "--seed=11"]
    ref = tmp_path / "ref"
    assert train.main(tiny_args(data_dir, ref, *run)) == 0
    out = tmp_path / "killed"
    rng = random.Random(0)
    proc = spawn(tiny_args(data_dir, out, *run))
    for kill in range(4):
        # somewhere in training: after a random number of logged lines, plus a random delay
        wait_for_iter(out, rng.randrange(5, 200), proc)
        time.sleep(rng.uniform(0, 0.2))
        proc.kill()
        proc.wait()
        if (out / "ckpt.pt").exists() and checkpoint.load(out / "ckpt.pt")["iter"] == 200:
            break                                  # killed after the final save
        args = [f"--out_dir={out}", "--resume"] if (out / "ckpt.pt").exists() else tiny_args(data_dir, out, *run)
        proc = spawn(args)
    else:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
    assert train_lines(out) == train_lines(ref)
    assert same_weights(out, ref)


class Boom:
    def __reduce__(self):
        return (os.system, ("touch boom-was-run",))


def test_a_pickled_object_is_refused_and_never_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "ckpt.pt"
    torch.save({"format": checkpoint.FORMAT, "model": {}, "x": Boom()}, path)
    with pytest.raises(UserError, match=r"holds a pickled Python object \(.*system\) and was not loaded"):
        checkpoint.load(path)
    assert not (tmp_path / "boom-was-run").exists()


@pytest.mark.e2e
@pytest.mark.parametrize("saves_before", [0, 1])
def test_a_full_disk_while_saving_stops_with_one_line_and_the_run_goes_on(data_dir, tmp_path, monkeypatch,
                                                                          capsys, saves_before):
    out, real, calls = tmp_path / "run", torch.save, []

    def full_disk(obj, f):                  # as torch reports it: an OSError, then a RuntimeError
        calls.append(1)
        if len(calls) <= saves_before:      # 1: ckpt.pt at the first evaluation (ckpt_best.pt is a link)
            return real(obj, f)
        f.write(b"x" * 1000)
        try:
            raise OSError(28, "No space left on device")
        except OSError:
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 64")
    monkeypatch.setattr(torch, "save", full_disk)
    argv = tiny_args(data_dir, out, "--max_iters=8", "--eval_interval=4")
    assert train.main(argv) == 2
    err = capsys.readouterr().err
    kept = "no ckpt.pt was written" if saves_before == 0 else "the ckpt.pt from before is unchanged"
    go_on = "" if saves_before == 0 else f"; once it can be written, continue with --out_dir={out} --resume"
    assert err == f"error: cannot save {out / 'ckpt.pt'} (No space left on device); {kept}{go_on}\n"
    assert not list(out.glob("*.tmp"))
    monkeypatch.setattr(torch, "save", real)
    if saves_before == 0:       # nothing was kept, so nothing stands in the way of the same command
        assert checkpoint.saved_in(out) == []
        assert train.main(argv) == 0
    else:
        assert checkpoint.load(out / "ckpt.pt")["iter"] == 4
        assert train.main([f"--out_dir={out}", "--resume"]) == 0
    assert checkpoint.load(out / "ckpt.pt")["iter"] == 8


@pytest.mark.e2e
def test_a_best_checkpoint_that_could_not_be_copied_is_made_good_on_resuming(data_dir, tmp_path,
                                                                             monkeypatch, capsys):
    out = tmp_path / "run"
    assert train.main(tiny_args(data_dir, out, "--max_iters=4", "--eval_interval=2")) == 0
    assert checkpoint.load(out / "ckpt_best.pt")["iter"] == 4      # the loss fell at each evaluation
    assert (out / "ckpt_best.pt").read_bytes() == (out / "ckpt.pt").read_bytes()

    def no_links(src, dst):     # a file system without hard links: ckpt_best.pt is copied
        raise OSError(1, "Operation not permitted")

    def full_disk(src, dst, length=0):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(os, "link", no_links)
    monkeypatch.setattr(shutil, "copyfileobj", full_disk)
    full = tmp_path / "full"
    capsys.readouterr()
    assert train.main(tiny_args(data_dir, full, "--max_iters=4", "--eval_interval=2")) == 2
    assert capsys.readouterr().err == (
        f"error: cannot save {full / 'ckpt_best.pt'} (No space left on device); no ckpt_best.pt was "
        f"written; once it can be written, continue with --out_dir={full} --resume\n")
    assert checkpoint.load(full / "ckpt.pt")["iter"] == 2 and not list(full.glob("*.tmp"))
    monkeypatch.undo()
    assert train.main([f"--out_dir={full}", "--resume"]) == 0
    assert "ckpt_best.pt did not hold the best iteration, 2: copied it from ckpt.pt" in capsys.readouterr().out
    assert checkpoint.load(full / "ckpt_best.pt")["iter"] == 4
    # the same at the last iteration, where a resume has no step left to take: that is all it does
    (full / "ckpt_best.pt").unlink()
    assert checkpoint.load(full / "ckpt.pt")["best_iter"] == 4
    assert train.main([f"--out_dir={full}", "--resume"]) == 0
    said = capsys.readouterr().out
    assert "copied it from ckpt.pt" in said and "done: the run had already reached iteration 4" in said
    assert checkpoint.load(full / "ckpt_best.pt")["iter"] == 4
    # a ckpt.pt put back from a backup never makes a newer ckpt_best.pt older
    older = full / "older.pt"
    shutil.copy(out / "ckpt_best.pt", older)                       # iteration 4 of another run
    ckpt = checkpoint.load(older)
    ckpt.update(iter=2, best_iter=2)
    checkpoint.save(ckpt, full / "ckpt.pt")
    before = (full / "ckpt_best.pt").read_bytes()
    train.main([f"--out_dir={full}", "--resume", "--max_iters=2"])
    assert (full / "ckpt_best.pt").read_bytes() == before


@pytest.mark.e2e
@pytest.mark.parametrize("error, size", [
    (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity "
                            "of 79.15 GiB of which 3.75 MiB is free."), " (an allocation of 0.02 GiB failed)"),
    (RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate "
                  "memory: you tried to allocate 96000000000 bytes. Error code 12"), " (an allocation of 89.41 GiB failed)"),
    (MemoryError("Unable to allocate 121. GiB for an array with shape (1000000000, 65) and data type uint16"),
     " (an allocation of 121.00 GiB failed)"),
    (MemoryError(), ""),
])
def test_running_out_of_memory_mid_run_stops_with_one_line_and_the_run_resumes(no_estimate, data_dir, tmp_path,
                                                                               monkeypatch, capsys, error, size):
    from gpt.model import GPT
    real_forward, calls = GPT.forward, []

    def fails_once(self, idx, targets=None):
        if self.training:
            calls.append(1)
            if len(calls) == 6:
                raise error
        return real_forward(self, idx, targets)
    monkeypatch.setattr(GPT, "forward", fails_once)
    out = tmp_path / "run"
    assert train.main(tiny_args(data_dir, out, "--max_iters=8", "--eval_interval=4")) == 2
    assert capsys.readouterr().err == (
        f"error: out of memory{size}; lower batch_size (raising gradient_accumulation_steps keeps the "
        "batch per step), eval_iters or eval_batch_size, which --resume may change, or block_size or "
        "the model's size in a new run; checkpoints already saved are whole\n")
    assert checkpoint.load(out / "ckpt.pt")["iter"] == 4
    assert train.main([f"--out_dir={out}", "--resume"]) == 0
    assert checkpoint.load(out / "ckpt.pt")["iter"] == 8


@pytest.mark.e2e
def test_other_runtime_errors_are_not_taken_for_running_out_of_memory(data_dir, tmp_path, monkeypatch):
    from gpt.model import GPT

    def broken(self, idx, targets=None):
        raise RuntimeError("mat1 and mat2 shapes cannot be multiplied")
    monkeypatch.setattr(GPT, "forward", broken)
    with pytest.raises(RuntimeError, match="cannot be multiplied"):
        train.main(tiny_args(data_dir, tmp_path / "run", "--max_iters=2"))


@pytest.mark.e2e
@pytest.mark.parametrize("name", ["metrics.jsonl", "command.txt"])
def test_a_read_only_run_file_is_named_before_anything_changes(data_dir, tmp_path, monkeypatch, capsys, name):
    out = tmp_path / "run"
    assert train.main(tiny_args(data_dir, out, "--max_iters=2", "--eval_interval=2")) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    real_access = os.access      # as a read-only file tells a user who is not root
    monkeypatch.setattr(os, "access", lambda path, mode: real_access(path, mode) and Path(path).name != name)
    capsys.readouterr()
    assert train.main([f"--out_dir={out}", "--resume", "--max_iters=4"]) == 2
    assert capsys.readouterr().err == (f"error: {out / name} is read-only; make it writable (chmod u+w) or "
                                       "choose another --out_dir\n")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_random_bytes_are_called_corrupt(tmp_path):
    path = tmp_path / "ckpt.pt"
    path.write_bytes(bytes(range(256)) * 8)
    with pytest.raises(UserError, match="not a readable checkpoint"):
        checkpoint.load(path)


def test_a_save_leaves_no_temporary_file_and_replaces_atomically(tmp_path):
    checkpoint.save({"a": torch.ones(2)}, tmp_path / "ckpt.pt")
    checkpoint.save({"a": torch.zeros(2)}, tmp_path / "ckpt.pt")
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt.pt"]
    assert torch.equal(checkpoint.load(tmp_path / "ckpt.pt", needs=())["a"], torch.zeros(2))


@pytest.mark.e2e
def test_nonfinite_loss_stops_and_keeps_the_last_good_checkpoint(no_estimate, data_dir, tmp_path, monkeypatch, capsys):
    from gpt.model import GPT
    real_forward = GPT.forward
    calls = {"n": 0}

    def poisoned(self, idx, targets=None):
        logits, loss = real_forward(self, idx, targets)
        if self.training and targets is not None:
            calls["n"] += 1
            if calls["n"] == 15:
                loss = loss * float("nan")
        return logits, loss
    monkeypatch.setattr(GPT, "forward", poisoned)
    out = tmp_path / "run"
    assert train.main(tiny_args(data_dir, out, "--max_iters=30", "--eval_interval=10")) == 3
    err = capsys.readouterr().err
    assert "loss became nan" in err and "at iteration 14" in err and "(iteration 10)" in err
    assert checkpoint.load(out / "ckpt.pt")["iter"] == 10
    calls["n"] = 0
    out2 = tmp_path / "skip"
    assert train.main(tiny_args(data_dir, out2, "--max_iters=30", "--eval_interval=10",
                                "--skip_nonfinite=true")) == 0
    events = [json.loads(x) for x in (out2 / "metrics.jsonl").read_text().splitlines()]
    assert [e["iter"] for e in events if e["kind"] == "event"] == [14]
    assert checkpoint.load(out2 / "ckpt.pt")["iter"] == 30
    said = capsys.readouterr().out
    assert "; 1 non-finite step skipped" in said and "holds iteration" not in said


def poison_evaluations(monkeypatch, is_bad) -> dict:
    """Evaluation forward calls, counted from 1, return a nan loss where is_bad(count); the
    counter is returned so a test can restart it between runs."""
    from gpt.model import GPT
    real_forward = GPT.forward
    calls = {"n": 0}

    def poisoned(self, idx, targets=None):
        logits, loss = real_forward(self, idx, targets)
        if not self.training:
            calls["n"] += 1
            if is_bad(calls["n"]):
                loss = loss * float("nan")
        return logits, loss
    monkeypatch.setattr(GPT, "forward", poisoned)
    return calls


@pytest.mark.e2e
def test_a_nonfinite_evaluation_saves_nothing_over_the_last_good_checkpoint(no_estimate, data_dir, tmp_path, monkeypatch,
                                                                             capsys):
    calls = poison_evaluations(monkeypatch, lambda n: n == 11)  # 4 batches an evaluation: the val
                                                                # part of the one at 20
    args = ["--max_iters=30", "--eval_interval=10", "--diagnostics=false"]
    out = tmp_path / "run"
    assert train.main(tiny_args(data_dir, out, *args)) == 3
    err = capsys.readouterr().err
    assert "evaluation loss became nan at iteration 20" in err and "(iteration 10)" in err
    assert checkpoint.load(out / "ckpt.pt")["iter"] == 10
    assert checkpoint.load(out / "ckpt_best.pt")["iter"] == 10
    calls["n"] = 0
    out2 = tmp_path / "skip"
    assert train.main(tiny_args(data_dir, out2, *args, "--skip_nonfinite=true")) == 0
    events = [json.loads(x) for x in (out2 / "metrics.jsonl").read_text().splitlines()]
    assert [(e["iter"], e["event"]) for e in events if e["kind"] == "event"] == [(20, "nonfinite evaluation")]
    assert checkpoint.load(out2 / "ckpt.pt")["iter"] == 30
    # a non-finite final evaluation, skipped: the closing line says where the checkpoint stands
    calls["n"] = 0
    capsys.readouterr()
    out3 = tmp_path / "skip_last"
    assert train.main(tiny_args(data_dir, out3, "--max_iters=20", "--eval_interval=10",
                                "--diagnostics=false", "--skip_nonfinite=true")) == 0
    assert "ckpt.pt holds iteration 10: the evaluations after it were not finite" in capsys.readouterr().out
    assert checkpoint.load(out3 / "ckpt.pt")["iter"] == 10


@pytest.mark.e2e
def test_a_run_whose_evaluations_all_fail_after_the_first_says_so(data_dir, tmp_path, monkeypatch, capsys):
    poison_evaluations(monkeypatch, lambda n: n > 4)    # the 4 batches of the evaluation at 0 are finite
    out = tmp_path / "run"
    assert train.main(tiny_args(data_dir, out, "--max_iters=4", "--eval_interval=2", "--diagnostics=false",
                                "--skip_nonfinite=true")) == 0
    assert capsys.readouterr().out.splitlines()[-1] == ("done: 4 iterations; no evaluation after the first "
                                                        "was finite, so nothing was saved")
    assert not (out / "ckpt.pt").exists()
    # evaluations that saved nothing are no run to keep: the same command starts afresh
    assert train.main(tiny_args(data_dir, out, "--max_iters=4", "--eval_interval=2", "--diagnostics=false",
                                "--skip_nonfinite=true")) == 0


@pytest.mark.e2e
def test_wandb_failure_warns_once_and_training_goes_on(data_dir, tmp_path, monkeypatch, capsys):
    wandb = pytest.importorskip("wandb")

    def broken(*a, **k):
        raise RuntimeError("no network")
    monkeypatch.setattr(wandb, "init", broken)
    out = tmp_path / "run"
    assert train.main(tiny_args(data_dir, out, "--max_iters=4", "--eval_interval=2", "--wandb=true")) == 0
    err = capsys.readouterr().err
    assert err.count("warning: wandb could not start (no network)") == 1
    assert checkpoint.load(out / "ckpt.pt")["iter"] == 4


# ---------------------------------------------------------------- one-line errors for bad input

def _trained(data_dir, tmp_path):
    out = tmp_path / "good"
    assert train.main(tiny_args(data_dir, out, "--max_iters=2", "--eval_interval=2")) == 0
    return out


def _other_vocab(data_dir):
    prepare("xyz " * 500, data_dir / "other")
    return data_dir


def _resume(**edit):
    """The arguments that resume a copy of the good run's checkpoint, edited as _edited does."""
    return lambda d, t, g: [f"--out_dir={_edited(g(), **edit)}", "--resume", "--max_iters=4"]


ERRORS = [  # (name, script, argv builder (data_dir, tmp_path, the good run's folder as good()), expected message)
    ("unknown config", "train", lambda d, t, g: ["--config", "shakespeare_chr"],
     r"no config named .shakespeare_chr.; did you mean shakespeare_char\? available: "),
    ("unknown field", "train", lambda d, t, g: tiny_args(d, t / "o", "--lerning_rate=1"),
     r"unknown option --lerning_rate; did you mean --learning_rate\?"),
    ("mistyped value", "train", lambda d, t, g: tiny_args(d, t / "o", "--max_iters=ten"),
     r"max_iters='ten' is not a valid int"),
    ("negative lr", "train", lambda d, t, g: tiny_args(d, t / "o", "--learning_rate=-0.1"),
     r"learning_rate=-0.1 must be positive"),
    ("decay before warmup", "train",
     lambda d, t, g: tiny_args(d, t / "o", "--warmup_iters=100", "--lr_decay_iters=100"),
     r"lr_decay_iters=100 is not after the end of warmup_iters=100"),
    ("heads", "train", lambda d, t, g: tiny_args(d, t / "o", "--n_head=3"),
     r"n_embd=16 is not divisible by n_head=3"),
    ("block too long", "train", lambda d, t, g: tiny_args(d, t / "o", "--block_size=100000"),
     r"too few for block_size=100000"),
    # too long for memory as well: the text is what the context outgrows first
    ("block too long for the text and the memory", "train",
     lambda d, t, g: tiny_args(d, t / "o", "--block_size=20000000"), r"too few for block_size=20000000"),
    ("missing dataset", "train", lambda d, t, g: tiny_args(d, t / "o", "--dataset=nosuch"),
     r"dataset 'nosuch' is not prepared"),
    ("a dataset's folder as data_dir", "train",
     lambda d, t, g: [*tiny_args(d, t / "o"), f"--data_dir={d / 'tiny'}", "--dataset=shakespeare_char"],
     r"data_dir='.*tiny' holds a prepared dataset itself \(train.bin, val.bin, meta.json\); to train on "
     r"it, give --data_dir=.*data --dataset=tiny; to prepare shakespeare_char, give a data_dir without "
     r"those files\n$"),

    ("a model too big for the machine", "train", lambda d, t, g: tiny_args(d, t / "o", "--n_layer=1e12"),
     r"the model has [\d,]+ parameters: training needs at least [\d,.]+ GiB .* lower n_layer, n_embd, mlp_ratio or \(for learned "
     r"positions\) block_size$"),
    ("jobs without a sweep", "train", lambda d, t, g: tiny_args(d, t / "o", "--jobs=2"),
     r"jobs=2 runs several runs of a sweep at once, but this is one run; give --sweep name=a,b or "
     r"--seeds=N, or leave --jobs out\n$"),
    ("a batch too big for the machine", "train",
     lambda d, t, g: tiny_args(d, t / "o", "--batch_size=4611686018427387904"),
     r"batch_size=4611686018427387904 needs at least [\d,.]+ GiB for one batch's activations, more than "
     r"the [\d,.]+ GiB here; lower it; raising gradient_accumulation_steps keeps the batch per step\n$"),
    ("an evaluation batch too big for the machine", "train",
     lambda d, t, g: tiny_args(d, t / "o", "--eval_batch_size=4611686018427387904"),
     r"eval_batch_size=4611686018427387904 needs at least [\d,.]+ GiB .* GiB here; lower it\n$"),
    ("unwritable out_dir", "train", lambda d, t, g: tiny_args(d, t / "file.txt" / "o"),
     r"out_dir=.* cannot be written"),
    ("out_dir is a file", "train", lambda d, t, g: tiny_args(d, t / "file.txt"),
     r"out_dir=.*file.txt' is a file; choose another --out_dir"),
    ("sampling a file", "sample", lambda d, t, g: [f"--out_dir={t / 'file.txt'}"],
     r"file.txt is a file, not a run folder"),
    ("nothing to resume", "train", lambda d, t, g: tiny_args(d, t / "empty", "--resume"),
     r"--resume: nothing to resume, .*ckpt.pt does not exist"),
    ("resume other shape", "train", lambda d, t, g: [f"--out_dir={g()}", "--resume", "--n_layer=3",
                                                     "--max_iters=4"],
     r"cannot resume with a different model: n_layer=2 in the checkpoint but 3 now"),
    ("resume other flag", "train", lambda d, t, g: [f"--out_dir={g()}", "--resume", "--qk_norm=true",
                                                    "--max_iters=4"],
     r"cannot resume with a different model: qk_norm=false in the checkpoint but true now. Leave those "
     r"options out to continue the run, or train the new model in another --out_dir\n$"),
    ("resume other vocab", "train", lambda d, t, g: [f"--out_dir={g()}", "--resume", "--dataset=other",
                                                     f"--data_dir={_other_vocab(d)}", "--max_iters=4"],
     r"cannot resume: the dataset's vocabulary \(4 tokens\) differs from the checkpoint's \(37"),
    ("resume finished", "train", lambda d, t, g: [f"--out_dir={g()}", "--resume"],
     r"already at iteration 2; raise --max_iters"),
    ("missing checkpoint", "sample", lambda d, t, g: [f"--out_dir={t / 'none'}"],
     r"no checkpoint at .*none/ckpt.pt; train first \(python train.py --config shakespeare_char_cpu "
     r"--out_dir=.*none\)\n$"),
    ("truncated checkpoint", "sample", lambda d, t, g: [f"--out_dir={_truncate(g())}"],
     r"is not a readable checkpoint \(truncated or corrupt\)"),
    ("foreign checkpoint", "sample", lambda d, t, g: [f"--out_dir={_foreign(t)}"],
     r"is not a checkpoint of this project"),
    ("prompt outside vocab", "sample", lambda d, t, g: [f"--out_dir={g()}", "--start=ROMEO~@"],
     r"characters not in the vocabulary: '@~'"),
    ("bad sampling value", "sample", lambda d, t, g: [f"--out_dir={g()}", "--top_p=2"],
     r"top_p=2.0 must be in \(0, 1\]"),
    ("checkpoint of another version", "sample", lambda d, t, g: [f"--out_dir={_edited(g(), drop='meta')}"],
     r"lacks meta: it was written by another version of this project"),
    ("resume another version", "train", _resume(drop='last_eval_iter'),
     r"lacks last_eval_iter: it was written by another version"),
    ("weights unlike their config", "sample", lambda d, t, g: [f"--out_dir={_edited(g(), n_embd=32)}"],
     r"the checkpoint's weights do not fit its own model config"),
    ("resume weights unlike their config", "train", _resume(n_embd=32),
     r"the checkpoint's weights do not fit its own model config"),
    ("a model option of the wrong type", "sample", lambda d, t, g: [f"--out_dir={_edited(g(), n_head='4')}"],
     r"edited/ckpt.pt cannot be used: its model_config: n_head='4' is not a whole number\n$"),
    ("a model option of a newer version", "sample",
     lambda d, t, g: [f"--out_dir={_edited(g(), attention_sinks=4)}"],
     r"cannot be used: its model_config: it has options this version does not know \(attention_sinks\); "
     r"update the project\n$"),
    ("a model option out of range", "sample", lambda d, t, g: [f"--out_dir={_edited(g(), pos_encoding='xyz')}"],
     r"edited/ckpt.pt cannot be used: its model_config: pos_encoding='xyz' is not allowed"),
    ("a vocabulary cut short", "sample",
     lambda d, t, g: [f"--out_dir={_edited(g(), parts={'meta': {'tokenizer': 'char', 'vocab_size': 37}})}"],
     r"cannot be used: its vocabulary \(meta\) is incomplete or malformed\n$"),
    ("weights that are not tensors", "sample", lambda d, t, g: [f"--out_dir={_edited(g(), parts={'model': [1, 2]})}"],
     r"cannot be used: its weights are not a table of tensors\n$"),
    ("resume with a damaged replaced option", "train", _resume(parts={'train_config': {'decay_lr': 'yes'}}),
     r"cannot be used: its train_config: decay_lr='yes' is not one of its values\n$"),
    # the plain values a resume reads, damaged: named here, not a TypeError far on
    ("resume an iteration that is text", "train", _resume(parts={'iter': '2'}),
     r"cannot be used: its iter='2' is not a count\n$"),
    ("resume a negative iteration", "train", _resume(parts={'iter': -5}),
     r"cannot be used: its iter=-5 is not a count\n$"),
    ("resume a best loss that is not a number", "train", _resume(parts={'best_val_loss': math.nan}),
     r"cannot be used: its best_val_loss=nan is not a number\n$"),
    ("resume an empty optimizer state", "train", _resume(parts={'optimizer': {}}),
     r"cannot be used: its optimizer state is malformed\n$"),
    ("resume without random states", "train", _resume(parts={'rng': None}),
     r"cannot be used: its random states are malformed\n$"),
    ("resume random states missing a part", "train", _resume(parts={'rng': {}}),
     r"edited/ckpt.pt cannot be resumed: damage in its random states \(torch is missing\); no step of training leaves that, so the file is damaged"),
    ("resume an optimizer state missing a part", "train", _resume(optimizer_entry={}),
     r"edited/ckpt.pt cannot be resumed: damage in its optimizer state \(state\[0\]\['step'\] is missing\); no step of training leaves that, so the file is damaged"),
    ("resume an optimizer state of another shape", "train",
     _resume(optimizer_entry={"step": 1, "exp_avg": torch.zeros(3), "exp_avg_sq": torch.zeros(3)}),
     r"damage in its optimizer state \(state\[0\]\['exp_avg'\] has shape \(3,\), not \(37, 16\)\); no step of training leaves that, so the file is damaged"),
    ("resume random states of another type", "train", _resume(parts={'batch_rng': torch.zeros(3)}),
     r"damage in its random states \(batch_rng is not a tensor of integers\); no step of training leaves that, so the file is damaged"),
    # one more: the head tied to the token table
    ("sample weights that hold nan", "sample", lambda d, t, g: [f"--out_dir={_edited(g(), nan_weight=True)}"],
     r"edited/ckpt.pt's weights hold nan or inf \(transformer.wte.weight and 1 more\): the run had diverged when "
     r"it was saved, or the file is damaged\n$"),     # the copy holds no ckpt_best.pt to offer
    ("sample weights that hold nan beside a best checkpoint", "sample",
     lambda d, t, g: [f"--out_dir={_edited(g(), nan_weight=True, best=True)}"],
     r"the file is damaged; --ckpt=best samples ckpt_best.pt\n$"),
    ("sample the best checkpoint of a run that has none", "sample",
     lambda d, t, g: [f"--out_dir={_without_best(g())}", "--ckpt=best"],
     r"ckpt_best.pt does not exist \(no evaluation since iteration 0 has scored better than the untrained "
     r"model did, or it could not be written\); --ckpt=latest"),
    ("sample the latest checkpoint of a run that has only its best", "sample",
     lambda d, t, g: [f"--out_dir={_without_latest(g())}"],
     r"ckpt.pt does not exist; --ckpt=best samples ckpt_best.pt\n$"),
    ("resume with a damaged training config", "train", _resume(parts={'train_config': 'fast'}),
     r"cannot be used: its train_config: not a table of values\n$"),
    ("a checkpoint that is a folder", "sample", lambda d, t, g: [f"--out_dir={_folder_ckpt(t)}"],
     r"ckpt.pt is a folder, not a checkpoint\n$"),
    ("one run into a sweep's folder", "train", lambda d, t, g: tiny_args(d, _sweep_folder(t)),
     r"out_dir=.*sw' holds a sweep; choose another --out_dir"),
    ("a CPU with an index", "sample", lambda d, t, g: [f"--out_dir={g()}", "--device=cpu:1"],
     r"device='cpu:1': the CPU is one device; use --device=cpu"),
    ("resume a truncated checkpoint", "train", lambda d, t, g: [f"--out_dir={_truncate(g())}", "--resume"],
     r"ckpt.pt is not a readable checkpoint \(truncated or corrupt\)\n$"),
    ("resume a truncated checkpoint beside a whole best one", "train",
     lambda d, t, g: [f"--out_dir={_truncate(g(), keep_best=True)}", "--resume"],
     r"truncated/ckpt.pt is not a readable checkpoint \(truncated or corrupt\); .*truncated/ckpt_best.pt may be "
     r"whole: sample it with --ckpt=best, or copy it to ckpt.pt to resume from it\n$"),
    ("resume a truncated checkpoint beside an empty best one", "train",
     lambda d, t, g: [f"--out_dir={_truncate(g(), keep_best=True, best=b'')}", "--resume"],
     r"truncated/ckpt.pt is not a readable checkpoint \(truncated or corrupt\)\n$"),
    # a device torch knows but this project does not run on: refused before the old run is cleared
    ("training on the meta device", "train", lambda d, t, g: tiny_args(d, g(), "--device=meta"),
     r"device='meta' is not supported; use auto, cpu, cuda, cuda:N or mps"),
    ("sampling on a device torch lacks", "sample", lambda d, t, g: [f"--out_dir={g()}", "--device=xpu"],
     r"device='xpu' is not supported"),
    ("more threads than CPUs", "train", lambda d, t, g: tiny_args(d, g(), "--threads=1000000"),
     r"threads=1000000 is more than the \d+ CPUs here; give at most --threads=\d+, or --threads=0 for"),
    ("a sweep with more threads than CPUs", "train",
     lambda d, t, g: tiny_args(d, t / "sw", "--threads=1000000", "--sweep", "residual=true,false"),
     r"threads=1000000 is more than the \d+ CPUs here"),
    ("a batch split with dropout", "train",
     lambda d, t, g: tiny_args(d, g(), "--thread_split=batch", "--dropout=0.1"),
     r"error: thread_split=batch cannot split this run: dropout=0.1 draws masks in the threads' order; "
     r"pass --thread_split=auto or ops\n$"),
    ("a sweep with a batch split and dropout", "train",
     lambda d, t, g: tiny_args(d, t / "sw", "--thread_split=batch", "--sweep", "dropout=0.1,0.2"),
     r"thread_split=batch cannot split this run: dropout=0.1 draws masks"),
    ("compile and medium together on a CPU", "train",
     lambda d, t, g: tiny_args(d, g(), "--compile=true", "--matmul_precision=medium"),
     r"compile=true with matmul_precision=medium makes CPU steps slower .*; use one of the two\n$"),
    ("a value from a config file", "train", lambda d, t, g: ["--config", _toml(t, "n_embd = 16\nn_head = 5")],
     r"^error: n_embd=16 is not divisible by n_head=5; .* \(n_embd, n_head set by --config .*big.toml\)\n$"),
    ("a float too large for a float", "train", lambda d, t, g: ["--config", _toml(t, f"learning_rate = {10**400}")],
     r"big.toml: learning_rate=10{400} is not a valid float; give a number"),
]


def _toml(tmp_path, text):
    path = tmp_path / "big.toml"
    path.write_text(text + "\n")
    return str(path)


def _edited(good, drop=None, parts=None, optimizer_entry=None, nan_weight=False, best=False, **model_config):
    """A copy of good's checkpoint without the key `drop`, with other model_config values, with
    other top-level parts, with the optimizer state of the first weight replaced, or with a nan
    in the token table; best: beside a copy of good's ckpt_best.pt."""
    ckpt = checkpoint.load(good / "ckpt.pt", needs=checkpoint.RESUME_KEYS)
    ckpt.pop(drop, None)
    if nan_weight:
        ckpt["model"]["transformer.wte.weight"][0, 0] = math.nan
    if optimizer_entry is not None:
        ckpt["optimizer"]["state"][0] = optimizer_entry
    ckpt["model_config"].update(model_config)
    ckpt.update(parts or {})
    folder = good.parent / "edited"
    folder.mkdir()
    checkpoint.save(ckpt, folder / "ckpt.pt")
    if best:
        shutil.copy(good / "ckpt_best.pt", folder)
    return folder


def _without_best(good):
    folder = _edited(good)
    (folder / "ckpt_best.pt").unlink(missing_ok=True)
    return folder


def _without_latest(good):
    folder = _edited(good)
    (folder / "ckpt.pt").rename(folder / "ckpt_best.pt")
    return folder


def _sweep_folder(tmp_path):
    (tmp_path / "sw").mkdir()
    (tmp_path / "sw" / "sweep.json").write_text("{}")
    return tmp_path / "sw"


def _folder_ckpt(tmp_path):
    (tmp_path / "odd" / "ckpt.pt").mkdir(parents=True)
    return tmp_path / "odd"


def _truncate(good, keep_best=False, best=None):
    """A copy of the run with ckpt.pt cut in half; with keep_best, ckpt_best.pt too (or these bytes)."""
    bad = good.parent / "truncated"
    bad.mkdir()
    data = (good / "ckpt.pt").read_bytes()
    (bad / "ckpt.pt").write_bytes(data[: len(data) // 2])
    if keep_best:
        (bad / "ckpt_best.pt").write_bytes((good / "ckpt_best.pt").read_bytes() if best is None else best)
    return bad


def _foreign(tmp_path):
    folder = tmp_path / "foreign"
    folder.mkdir()
    torch.save({"state_dict": {"w": torch.ones(1)}}, folder / "ckpt.pt")
    return folder


@pytest.mark.e2e
@pytest.mark.parametrize("name, script, argv, message", ERRORS, ids=[e[0] for e in ERRORS])
def test_bad_input_gets_one_line_and_loses_nothing(name, script, argv, message, data_dir, tmp_path, capsys,
                                                   cpu_rounds_when_asked):
    (tmp_path / "file.txt").write_text("not a folder")
    trained = []

    def good():     # trained only for the cases that use it
        if not trained:
            trained.append(_trained(data_dir, tmp_path))
        return trained[0]
    args = argv(data_dir, tmp_path, good)
    before = {p: p.read_bytes() for run in trained for p in run.iterdir()}
    capsys.readouterr()
    main = train.main if script == "train" else sample.main
    assert main(args) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and err.startswith("error: "), err
    assert re.search(message, err), err
    assert before == {p: p.read_bytes() for run in trained for p in run.iterdir()}
    assert not (tmp_path / "o").exists()        # a start that fails leaves no folder behind


@pytest.mark.e2e
def test_only_a_damaged_checkpoint_is_reported_as_damage(data_dir, tmp_path, monkeypatch, capsys):
    good = _trained(data_dir, tmp_path)
    garbled = good.parent / "garbled"
    shutil.copytree(good, garbled)
    data = bytearray((garbled / "ckpt.pt").read_bytes())
    data[100:4000] = bytes(3900)      # the zip's end is whole, its records are not
    (garbled / "ckpt.pt").write_bytes(bytes(data))
    capsys.readouterr()
    assert train.main([f"--out_dir={garbled}", "--resume", "--max_iters=4"]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and f"{garbled / 'ckpt.pt'} is not a readable checkpoint" in err, err
    # a fault of the restoring code, on a whole file, is no damage: its own error surfaces
    from gpt.train import resume

    def broken(state, device):
        raise TypeError("a fault of the code")
    monkeypatch.setattr(resume, "set_rng_state", broken)
    with pytest.raises(TypeError, match="a fault of the code"):
        train.main([f"--out_dir={good}", "--resume", "--max_iters=4"])
    assert "error:" not in capsys.readouterr().err


@pytest.mark.parametrize("switch", ["", "0", "1"])
def test_gpt_traceback_shows_what_is_behind_a_one_line_error(switch, tmp_path, monkeypatch, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text("n_layer = = 2\n")
    monkeypatch.setenv("GPT_TRACEBACK", switch)
    for argv, behind in ((["--config", str(bad)], "TOMLDecodeError"), (["--n_layer=0"], "UserError")):
        assert train.main(argv) == 2
        err = capsys.readouterr().err
        line = err.splitlines()[-1]
        assert line.startswith("error: ") and ("bad.toml" in line or "n_layer=0" in line), err
        if switch == "1":   # the exception a `from None` hid is shown too
            assert err.startswith("Traceback") and f"{behind}:" in err, err
        else:
            assert err == line + "\n"


@pytest.mark.e2e
def test_the_scripts_exit_2_without_a_traceback():
    proc = subprocess.run([sys.executable, "train.py", "--n_layer=0"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2
    assert len(proc.stderr.splitlines()) == 1 and proc.stderr.startswith("error: n_layer=0 "), proc.stderr


@pytest.mark.e2e
def test_wandb_gets_every_metric_as_numbers(data_dir, tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb")
    logged = []

    class FakeRun:
        def log(self, row, step):
            logged.append((step, row))
    monkeypatch.setattr(wandb, "init", lambda **kwargs: FakeRun())
    out = tmp_path / "run"
    assert train.main(tiny_args(data_dir, out, "--max_iters=2", "--eval_interval=2", "--wandb=true")) == 0
    evals = [row for _, row in logged if "val_loss" in row]
    assert len(evals) == 2
    assert {"block_grad_norm/0", "block_grad_norm/1", "block_rms/1", "head_entropy/1/1",
            "unigram_loss", "train_loss", "lr"} <= evals[-1].keys()
    assert all(isinstance(v, (int, float)) for _, row in logged for v in row.values())


@pytest.mark.e2e
def test_a_stop_in_the_last_step_still_finishes_with_the_evaluation(data_dir, tmp_path, monkeypatch):
    from gpt.data import Batches
    real_draw = Batches.draw
    steps = {"n": 0}

    def draw_then_signal(self, split, n):
        steps["n"] += 1
        if steps["n"] == 4:                     # during the last of 4 steps
            signal.raise_signal(signal.SIGINT)
        return real_draw(self, split, n)
    monkeypatch.setattr(Batches, "draw", draw_then_signal)
    out = tmp_path / "run"
    assert train.main(tiny_args(data_dir, out, "--max_iters=4", "--eval_interval=2")) == 0
    evals = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [e["iter"] for e in evals if e["kind"] == "eval"] == [0, 2, 4]


@pytest.mark.e2e
def test_a_stop_just_before_an_evaluation_resumes_to_the_same_diagnostics(data_dir, tmp_path, monkeypatch):
    # the resumed run evaluates iteration 4 with a fresh optimizer: its update ratios must still
    # use iteration 4's learning rate, as the uninterrupted run's do
    from gpt.data import Batches
    run = ["--max_iters=8", "--eval_interval=4", "--learning_rate=1e-2", "--lr_decay_iters=8"]
    ref = tmp_path / "ref"
    assert train.main(tiny_args(data_dir, ref, *run)) == 0
    real_draw = Batches.draw
    steps = {"n": 0}

    def draw_then_signal(self, split, n):
        steps["n"] += 1
        if steps["n"] == 4:                     # during step 3: the stop saves iteration 4
            signal.raise_signal(signal.SIGINT)
        return real_draw(self, split, n)
    monkeypatch.setattr(Batches, "draw", draw_then_signal)
    out = tmp_path / "stopped"
    assert train.main(tiny_args(data_dir, out, *run)) == 130
    assert checkpoint.load(out / "ckpt.pt")["iter"] == 4
    monkeypatch.setattr(Batches, "draw", real_draw)
    assert train.main([f"--out_dir={out}", "--resume"]) == 0

    def evals(path):
        rows = [json.loads(x) for x in (path / "metrics.jsonl").read_text().splitlines()]
        return [{k: v for k, v in r.items() if k not in ("tokens_per_sec", "elapsed_s", "cpu_share")}
                for r in rows if r["kind"] == "eval"]
    assert evals(out) == evals(ref)
    assert evals(ref)[1]["block_update_ratio"] != evals(ref)[2]["block_update_ratio"]


@pytest.mark.e2e
def test_token_ids_outside_the_vocabulary_are_refused(data_dir, tmp_path, capsys):
    meta = json.loads((data_dir / "tiny" / "meta.json").read_text())
    meta["chars"], meta["vocab_size"] = meta["chars"][:5], 5
    (data_dir / "tiny" / "meta.json").write_text(json.dumps(meta))
    assert train.main(tiny_args(data_dir, tmp_path / "o")) == 2
    assert "outside meta.json's vocabulary of 5; prepare the dataset again" in capsys.readouterr().err


@pytest.mark.e2e
def test_a_prompt_file_that_is_not_text(data_dir, tmp_path, capsys):
    out = _trained(data_dir, tmp_path)
    (tmp_path / "bin.dat").write_bytes(b"\xff\xfe\x00\x81")
    assert sample.main([f"--out_dir={out}", f"--start=FILE:{tmp_path / 'bin.dat'}"]) == 2
    assert "the file is not UTF-8 text" in capsys.readouterr().err


def test_a_second_signal_waits_for_the_checkpoint_being_written():
    from gpt.train.signals import StopRequest
    done = []
    with StopRequest() as stop:
        signal.raise_signal(signal.SIGINT)
        assert stop.signal == "SIGINT"              # the first one is a request, nothing more
        with pytest.raises(KeyboardInterrupt):
            with stop.hold():
                signal.raise_signal(signal.SIGINT)
                done.append("written")              # the block runs to its end
        assert done == ["written"]
        with pytest.raises(KeyboardInterrupt):      # outside a hold, a second one stops at once
            signal.raise_signal(signal.SIGINT)


@pytest.mark.e2e
def test_an_interrupt_ends_train_with_one_line(data_dir, tmp_path, monkeypatch, capsys):
    from gpt.train import loop

    def interrupted(*args):
        raise KeyboardInterrupt
    monkeypatch.setattr(loop, "train", interrupted)
    assert train.main(tiny_args(data_dir, tmp_path / "o")) == 130
    err = capsys.readouterr().err
    assert err.startswith("interrupted;") and len(err.strip().splitlines()) == 1


@pytest.mark.e2e
def test_sampling_into_a_closed_pipe_stops_quietly(data_dir, tmp_path):
    out = _trained(data_dir, tmp_path)
    proc = subprocess.run(f"{sys.executable} sample.py --out_dir={out} --max_new_tokens=20000 | head -c 5",
                          shell=True, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert len(proc.stdout) == 5 and proc.stderr == ""


def shell(command, buffered, **kwargs):
    """Run a bash command line with Python's stdout buffered as it is by default, or unbuffered."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    if not buffered:
        env["PYTHONUNBUFFERED"] = "1"
    return subprocess.run(command, shell=True, executable="/bin/bash", cwd=ROOT, env=env, text=True,
                          timeout=120, **kwargs)


@pytest.mark.e2e
@pytest.mark.parametrize("buffered", [True, False])
@pytest.mark.parametrize("redirect, message", [
    (">&-", "error: standard output is closed: there is nowhere to write the samples"),
    ("> /dev/full", "error: cannot write the samples to standard output (No space left on device)"),
])
def test_sampling_to_an_unusable_stdout_gets_one_line(redirect, message, buffered, data_dir, tmp_path):
    out = _trained(data_dir, tmp_path)
    proc = shell(f"{sys.executable} sample.py --out_dir={out} {redirect}", buffered, stderr=subprocess.PIPE)
    assert proc.returncode == 2 and proc.stderr == message + "\n"


@pytest.mark.e2e
@pytest.mark.parametrize("buffered", [True, False])
@pytest.mark.parametrize("sink", ["| head -1", "> /dev/full"])
def test_training_into_an_unwritable_stdout_trains_to_the_end(sink, buffered, data_dir, tmp_path):
    out = tmp_path / "run"
    args = " ".join(tiny_args(data_dir, out, "--max_iters=100", "--eval_interval=10"))
    proc = shell(f"{sys.executable} train.py {args} {sink}; exit ${{PIPESTATUS[0]}}", buffered,
                 capture_output=True)
    assert proc.returncode == 0 and proc.stderr == ""
    assert proc.stdout.startswith("training ") if "head" in sink else proc.stdout == ""
    assert checkpoint.load(out / "ckpt.pt")["iter"] == 100


# a kill, or a closed terminal (SIGHUP): the sweep stops, its runs save, and it exits as that signal
@pytest.mark.e2e
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_a_signalled_sweep_stops_its_runs_and_exits_as_the_signal(data_dir, tmp_path, sig):
    out = tmp_path / "sw"
    proc = spawn(tiny_args(data_dir, out, "--max_iters=100000", "--eval_interval=10", "--sweep", "n_layer=1,2"))
    wait_for_iter(out / "n_layer=1__seed=1337", 15, proc)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + sig, err
    assert err.endswith("sweep interrupted; run the same command again to continue\n")
    assert checkpoint.load(out / "n_layer=1__seed=1337" / "ckpt.pt")["iter"] > 0
    # the run's own log gives the sweep's advice, not a --resume of its folder
    assert "the sweep's command, run again, continues it" in (out / "n_layer=1__seed=1337" / "log.txt").read_text()


@pytest.mark.e2e
@pytest.mark.skipif(sys.platform != "linux", reason="the parent-death signal is Linux's")
def test_a_killed_sweep_takes_its_runs_with_it(data_dir, tmp_path):
    """SIGKILL leaves the sweep no time to stop its runs: each is stopped by Linux as its parent
    dies, and saves; the sweep run again continues it, never beside a still-running copy."""
    out = tmp_path / "sw"
    argv = tiny_args(data_dir, out, "--max_iters=100000", "--eval_interval=10", "--sweep", "n_layer=1")
    proc = spawn(argv)
    run = out / "n_layer=1__seed=1337"
    wait_for_iter(run, 15, proc)
    proc.kill()
    proc.communicate(timeout=60)
    deadline = time.time() + 60
    while time.time() < deadline:   # Linux may signal it more than once (per thread of the sweep)
        try:
            with checkpoint.hold_folder(run):   # free once the run has ended
                break
        except UserError:
            time.sleep(0.1)
    log = (run / "log.txt").read_text()
    assert "SIGTERM: saved" in log and "interrupted" not in log, log[-500:]
    with checkpoint.hold_folder(run):       # no orphan holds the run's folder any more
        pass


@pytest.mark.e2e
def test_two_processes_never_train_in_one_folder(data_dir, tmp_path, capsys):
    out = tmp_path / "run"
    assert train.main(tiny_args(data_dir, out, "--max_iters=2", "--eval_interval=2")) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with checkpoint.hold_folder(out):       # as a run still training there would
        assert train.main(tiny_args(data_dir, out, "--max_iters=2", "--eval_interval=2")) == 2
        assert train.main([f"--out_dir={out}", "--resume", "--max_iters=4"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [f"error: another process (a run or a sweep) is using {out}; let it finish or stop it "
                   "first, or choose another folder"] * 2
    assert before == {p.name: p.read_bytes() for p in out.iterdir()}
    sweep = tmp_path / "sw"
    sweep.mkdir()
    with checkpoint.hold_folder(sweep):
        assert train.main(tiny_args(data_dir, sweep, "--max_iters=2", "--sweep", "n_layer=1")) == 2
    assert f"another process (a run or a sweep) is using {sweep}" in capsys.readouterr().err
    assert train.main([f"--out_dir={out}", "--resume", "--max_iters=4"]) == 0     # free again
    early = tmp_path / "early"                  # a run before its first checkpoint
    early.mkdir()
    with checkpoint.hold_folder(early):
        assert train.main([f"--out_dir={early}", "--resume"]) == 2
    assert f"another process (a run or a sweep) is using {early}" in capsys.readouterr().err


@pytest.mark.e2e
def test_a_folder_with_ckpt_best_alone_says_how_to_continue_from_it(data_dir, tmp_path, capsys):
    out = tmp_path / "run"
    assert train.main(tiny_args(data_dir, out, "--max_iters=2", "--eval_interval=2")) == 0
    (out / "ckpt.pt").unlink()                  # as a full disk at the first save used to leave it
    assert train.main(tiny_args(data_dir, out, "--max_iters=2", "--eval_interval=2")) == 2
    assert capsys.readouterr().err == (
        f"error: {out} holds an earlier run's ckpt_best.pt; continue it by copying it to ckpt.pt and "
        "passing --resume, replace it with --overwrite=true, or choose another --out_dir\n")
    assert train.main([f"--out_dir={out}", "--resume", "--max_iters=4"]) == 2
    assert capsys.readouterr().err == (f"error: --resume: nothing to resume, {out / 'ckpt.pt'} does not "
                                       "exist (ckpt_best.pt is: copy it to ckpt.pt to continue from it)\n")
    shutil.copy(out / "ckpt_best.pt", out / "ckpt.pt")
    assert train.main([f"--out_dir={out}", "--resume", "--max_iters=4"]) == 0


@pytest.mark.e2e
def test_a_second_interrupt_says_whether_a_checkpoint_was_kept(data_dir, tmp_path, monkeypatch, capsys):
    from gpt.train import loop

    def interrupted(*args):
        raise KeyboardInterrupt
    monkeypatch.setattr(loop, "train", interrupted)
    out = tmp_path / "o"
    assert train.main(tiny_args(data_dir, out)) == 130
    assert capsys.readouterr().err == "interrupted; no checkpoint was saved\n"
    out.mkdir()
    (out / "ckpt.pt").write_bytes(b"")
    assert train.main(tiny_args(data_dir, out)) == 130
    assert capsys.readouterr().err == ("interrupted; a checkpoint already saved is whole, and --resume "
                                       "continues from it\n")


@pytest.mark.e2e
def test_a_folder_that_cannot_be_locked_is_trained_in_anyway(data_dir, tmp_path, monkeypatch):
    fcntl = pytest.importorskip("fcntl")

    def nfs(fd, how):       # what flock on a folder gives on NFS
        raise OSError(9, "Bad file descriptor")
    monkeypatch.setattr(fcntl, "flock", nfs)
    assert train.main(tiny_args(data_dir, tmp_path / "run", "--max_iters=2", "--eval_interval=2")) == 0


@pytest.mark.e2e
@pytest.mark.skipif(not hasattr(signal, "SIGHUP"), reason="no SIGHUP")
def test_a_run_started_under_nohup_ignores_sighup(data_dir, tmp_path):
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, str(ROOT / "train.py"), *tiny_args(data_dir, out, "--max_iters=100000")],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN))   # as nohup
    wait_for_iter(out, 15, proc)
    proc.send_signal(signal.SIGHUP)
    time.sleep(1)
    assert proc.poll() is None                      # still training
    proc.send_signal(signal.SIGTERM)
    stdout, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err
    assert "SIGTERM: saved" in stdout


def test_only_a_second_ctrl_c_stops_at_once():
    """Linux may deliver a dying sweep's SIGTERM once per thread of the sweep: the run must still
    stop after its step and save, as for one."""
    from gpt.train.signals import StopRequest
    with StopRequest() as stop:
        stop._handle(signal.SIGTERM, None)
        stop._handle(signal.SIGTERM, None)
        assert stop.signal == "SIGTERM"
        with pytest.raises(KeyboardInterrupt):
            stop._handle(signal.SIGINT, None)


@pytest.mark.e2e
def test_an_interrupted_sweep_says_how_to_continue(data_dir, tmp_path, monkeypatch, capsys):
    from gpt.sweep import runner

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(runner, "run", interrupted)
    assert train.main(tiny_args(data_dir, tmp_path / "sw", "--sweep", "n_layer=1,2")) == 130
    assert capsys.readouterr().err == "sweep interrupted; run the same command again to continue\n"


@pytest.mark.parametrize("command, argv, message", [
    ("figures", ["attention", "--bogus"], "unrecognized arguments: --bogus (see python -m gpt.figures --help)"),
    ("figures", ["run"], "give the run folder once, as RUN_DIR or as --out_dir=RUN_DIR "
                         "(see python -m gpt.figures run --help)"),
    ("figures", ["attention", "a", "--out_dir=b"], "give the run folder once, as RUN_DIR or as "
                                                   "--out_dir=RUN_DIR (see python -m gpt.figures attention --help)"),
    ("diagnostics", ["grad-depth", "--depths=x"], "--depths 'x' should be integers separated by commas"),
    ("diagnostics", ["grad-depth", "--seed=-1"], "seed=-1 must be in [0, 2**32)"),
    ("diagnostics", ["grad-depth", "--widths=100000000", "--head_size=1", "--depths=1", "--seeds=1"],
     "out of memory (an allocation of 2.00 GiB failed); lower --widths or the --depths"),
    ("prepare", ["--nope"], "unrecognized arguments: --nope (see python data/shakespeare_char/prepare.py --help)"),
])
def test_the_helper_commands_refuse_bad_arguments_in_one_line(command, argv, message, capsys, monkeypatch):
    from gpt import datasets, diagnostics, figures

    def too_big(*args, **kwargs):       # as a CPU or GPU allocator fails, without trying
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    monkeypatch.setattr(diagnostics, "grad_depth", too_big)
    main = {"figures": figures.main, "diagnostics": diagnostics.main,
            "prepare": lambda argv: datasets.prepare_main("shakespeare_char", argv)}[command]
    with pytest.raises(SystemExit) as stop:
        main(argv)
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.startswith(f"error: {message}") and err.count("\n") == 1, err


@pytest.mark.e2e
def test_sampling_to_an_output_that_cannot_encode_the_text_gets_one_line(tmp_path):
    prepare("Café au lait, s'il vous plaît. " * 300, tmp_path / "data" / "fr")
    out = tmp_path / "run"
    assert train.main(tiny_args(tmp_path / "data", out, "--dataset=fr", "--max_iters=2",
                                "--eval_interval=2")) == 0
    proc = subprocess.run([sys.executable, "sample.py", f"--out_dir={out}", "--start=Café",
                           "--max_new_tokens=5"], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "PYTHONIOENCODING": "ascii"})
    assert proc.returncode == 2
    assert proc.stderr == ("error: standard output's encoding (ascii) cannot write '\\xe9'; "  # stderr's too
                           "set PYTHONIOENCODING=utf-8\n")


def test_bpe_files_out_of_reach_get_one_line(monkeypatch, tmp_path):
    tiktoken = pytest.importorskip("tiktoken")
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))       # a folder without the files

    def offline(name):      # what requests raises with no network, as long
        raise OSError("HTTPSConnectionPool(host='openaipublic.blob.core.windows.net', port=443): Max retries "
                      "exceeded with url: /gpt-2/encodings/main/vocab.bpe (Caused by NameResolutionError("
                      "\"HTTPSConnection(host='openaipublic.blob.core.windows.net', port=443): Failed\"))")
    monkeypatch.setattr(tiktoken, "get_encoding", offline)
    from gpt.tokenizers import TiktokenTokenizer
    with pytest.raises(UserError) as e:
        TiktokenTokenizer("gpt2")
    assert str(e.value) == ("tiktoken could not load the 'gpt2' BPE files (HTTPSConnectionPool(host='openaipublic."
                            "blob.core.windows.net', port=443): Max retries exceeded with url: /gpt-2/encodings/"
                            "main/vocab.bpe (Caused by ...); connect to the internet once, or put vocab.bpe "
                            f"and encoder.json in a writable folder and set TIKTOKEN_CACHE_DIR to it (looked in "
                            f"{tmp_path} for vocab.bpe and encoder.json)")
    monkeypatch.delenv("TIKTOKEN_CACHE_DIR")
    with pytest.raises(UserError, match=r"set TIKTOKEN_CACHE_DIR to it$"):     # no folder to name
        TiktokenTokenizer("gpt2")


def test_gpt2_bpe_files_by_their_published_names_load_offline(monkeypatch, tmp_path):
    """A folder holding encoder.json and vocab.bpe, as GPT-2 published them, is enough: the
    tokenizer fills tiktoken's cache there under the names it looks for."""
    tiktoken = pytest.importorskip("tiktoken")
    import hashlib
    import os

    import tiktoken.load
    import tiktoken.registry

    from gpt.tokenizers import BPE_FILES, TiktokenTokenizer
    cache = Path(os.environ.get("TIKTOKEN_CACHE_DIR", "/nonexistent"))
    held = {name: next((p for p in (cache / name, cache / hashlib.sha1(url.encode()).hexdigest()) if p.is_file()), None)
            for name, url in BPE_FILES["gpt2"].items()}    # by either name
    if None in held.values():
        pytest.skip("GPT-2 BPE files are not at hand: set TIKTOKEN_CACHE_DIR to a folder holding "
                    "vocab.bpe and encoder.json")
    plain = tmp_path / "gpt2-bpe"
    plain.mkdir()
    for name, path in held.items():
        (plain / name).write_bytes(path.read_bytes())
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(plain))
    monkeypatch.setattr(tiktoken.registry, "ENCODINGS", {})     # loaded afresh, from this folder

    def offline(*args, **kwargs):
        raise OSError("no network")
    monkeypatch.setattr(tiktoken.load, "read_file", offline)   # what the cache does not hold fails
    tok = TiktokenTokenizer("gpt2")
    assert tok.encode("Hello world") == [15496, 995] and tok.vocab_size == 50257


def test_a_long_error_is_cut_between_words_and_a_long_word_kept_in_part():
    from gpt.errors import first_line
    assert first_line(OSError("short\nand more")) == "short" and first_line(OSError()) == "OSError"
    words = first_line(OSError("word " * 50))
    assert words.endswith("word ...") and len(words) <= 164
    path = first_line(OSError("[Errno 2] No such file or directory: '/home/user/.cache/" + "abcdefghij/" * 15
                              + "vocab.bpe'"))
    assert path.startswith("[Errno 2] No such file or directory: '/home/user/.cache/abcdefghij/") and len(path) == 164


@pytest.mark.e2e
@pytest.mark.parametrize("command", ["train.py --help", "sample.py --help",
                                     "-m gpt.diagnostics grad-depth --depths=1 --widths=16 --seeds=1"])
def test_a_command_whose_output_is_its_product_says_when_it_cannot_write_it(command):
    proc = shell(f"{sys.executable} {command} > /dev/full", buffered=True, stderr=subprocess.PIPE)
    assert proc.returncode == 1
    assert proc.stderr == "error: the output could not be written (No space left on device)\n"


@pytest.mark.e2e
@pytest.mark.parametrize("closed", ["2>&-", "2>&- >&-"])
def test_training_with_stderr_closed_trains_and_keeps_its_checkpoints(closed, data_dir, tmp_path):
    out = tmp_path / "run"
    args = " ".join(tiny_args(data_dir, out, "--max_iters=20", "--eval_interval=10"))
    proc = shell(f"exec {sys.executable} train.py {args} {closed}", buffered=True, stdout=subprocess.PIPE)
    assert proc.returncode == 0 and checkpoint.load(out / "ckpt.pt")["iter"] == 20


@pytest.mark.e2e
def test_an_error_of_the_command_keeps_its_status_when_the_output_also_failed():
    code = ("import sys; sys.path.insert(0, {root!r}); from gpt.console import output_may_close\n"
            "with output_may_close(product=True):\n    print('x' * 100000); sys.exit(2)").format(root=str(ROOT))
    proc = shell(f"{sys.executable} -c \"{code}\" > /dev/full", buffered=True, stderr=subprocess.PIPE)
    assert proc.returncode == 2 and proc.stderr == ""


@pytest.mark.e2e
@pytest.mark.parametrize("script", ["train.py", "data/shakespeare_char/prepare.py", "data/shakespeare/prepare.py",
                                    "gpt.sweep", "gpt.figures", "gpt.diagnostics", "gpt.bench"])
def test_a_ctrl_c_while_torch_loads_gets_one_line(script):
    # a real SIGINT, sent as the command starts importing torch, where it spends its seconds; the
    # prepare scripts load no torch, and are sent it as they import numpy, their slowest import
    run = (f"runpy.run_path({script!r}, run_name='__main__')" if script.endswith(".py") else
           f"runpy.run_module({script!r}, run_name='__main__', alter_sys=True)")
    heavy = "numpy" if script.endswith("prepare.py") else "torch"
    code = ("import builtins, os, runpy, signal, sys\n"
            "real = builtins.__import__\n"
            "def importing(name, *args, **kwargs):\n"
            f"    if name == {heavy!r}:\n"
            "        os.kill(os.getpid(), signal.SIGINT)\n"
            "    return real(name, *args, **kwargs)\n"
            "builtins.__import__ = importing\n"
            f"sys.argv = [{script!r}, '--help']\n{run}\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert (proc.returncode, proc.stderr, proc.stdout) == (130, "interrupted\n", "")


@pytest.mark.e2e
def test_sample_py_loads_torch_only_once_it_samples():
    proc = subprocess.run([sys.executable, "-c", "import runpy, sys; sys.argv = ['sample.py', '--help']; "
                           "runpy.run_path('sample.py', run_name='not_main'); print('torch' in sys.modules)"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.stdout == "False\n", proc.stderr     # a Ctrl-C before sample() has nothing slow to cut


@pytest.mark.e2e
def test_a_path_given_as_the_dataset_is_named_and_a_stray_meta_json_stops_nothing(data_dir, tmp_path,
                                                                                    monkeypatch, capsys):
    from gpt.datasets import ensure_prepared
    monkeypatch.chdir(tmp_path)                     # data/tiny is prepared here
    assert train.main([*tiny_args(Path("elsewhere"), tmp_path / "o"), "--dataset=data/tiny"]) == 2
    assert capsys.readouterr().err == ("error: dataset='data/tiny' is a name under data_dir, not a path; "
                                       "give --data_dir=data --dataset=tiny\n")
    # a data_dir that also holds a dataset's files (prepared there by mistake) still serves its datasets
    (data_dir / "meta.json").write_text((data_dir / "tiny" / "meta.json").read_text())
    (data_dir / "train.bin").write_bytes(b"")
    (data_dir / "val.bin").write_bytes(b"")
    assert ensure_prepared(str(data_dir), "tiny") == data_dir / "tiny"
    with pytest.raises(UserError, match=r"is not prepared: .*; data_dir=.* holds a prepared dataset "
                                        r"itself .*; to train on it, give --data_dir=.* --dataset=data$"):
        ensure_prepared(str(data_dir), "other")         # a missing one: both are said


@pytest.mark.e2e
def test_torchrun_on_an_apple_gpu_is_refused_before_it_starts(data_dir, tmp_path, monkeypatch, capsys):
    from gpt.train import loop
    monkeypatch.setattr(loop, "resolve_device", lambda name: "mps")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert train.main(tiny_args(data_dir, tmp_path / "o", "--gradient_accumulation_steps=2")) == 2
    assert capsys.readouterr().err == ("error: torchrun on an Apple GPU (mps) is not supported; run one "
                                       "process, or pass --device=cpu\n")
    assert not (tmp_path / "o").exists()


@pytest.mark.e2e
def test_a_default_prompt_the_runs_text_cannot_spell_asks_for_one(tmp_path, capsys):
    from gpt import figures
    from gpt.text_dataset import prepare
    prepare("ab" * 3000, tmp_path / "data" / "ab")       # one line: no newline, no ROMEO
    out = tmp_path / "run"
    assert train.main(tiny_args(tmp_path / "data", out, "--dataset=ab", "--max_iters=2", "--eval_interval=2")) == 0
    capsys.readouterr()
    assert sample.main([f"--out_dir={out}"]) == 2
    assert capsys.readouterr().err == ("error: the default prompt '\\n' has characters that this run's text "
                                       "lacks ('\\n'); give a prompt with --start=TEXT\n")
    assert figures.main(["attention", f"--out_dir={out}"]) == 2
    assert capsys.readouterr().err == ("error: the default prompt 'ROMEO: But soft, what light' has characters "
                                       "that this run's text lacks (' ,:BEMORfghilostuw'); give a prompt "
                                       "with --start=TEXT\n")
    assert sample.main([f"--out_dir={out}", "--start=ba", "--max_new_tokens=4"]) == 0
    assert capsys.readouterr().out.startswith("ba")


def test_the_loading_handler_gives_ctrl_c_back_and_never_takes_an_ignored_one():
    from gpt.console import interrupt_in_one_line, interrupt_quietly_while_loading
    before = signal.getsignal(signal.SIGINT)
    try:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        interrupt_quietly_while_loading("gpt.sweep")            # imported, not run: nothing changes
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        interrupt_quietly_while_loading("__main__")
        assert signal.getsignal(signal.SIGINT) is not signal.default_int_handler
        with pytest.raises(SystemExit) as stop, interrupt_in_one_line():
            signal.raise_signal(signal.SIGINT)      # once the command runs: Python's own Ctrl-C
        assert stop.value.code == 130
        signal.signal(signal.SIGINT, signal.SIG_IGN)    # started in the background of a script
        interrupt_quietly_while_loading("__main__")
        with interrupt_in_one_line():
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, before)


@pytest.mark.e2e
@pytest.mark.parametrize("module", ["gpt.sweep", "gpt.figures", "gpt.diagnostics",
                                    "data/shakespeare_char/prepare.py"])
def test_a_ctrl_c_in_a_module_command_gets_one_line(module, tmp_path):
    # the Ctrl-C lands once the command runs: in the first file it opens, or its first model
    code = ("import builtins, io, runpy, sys, torch\n"
            "def interrupted(*args, **kwargs):\n"
            "    raise KeyboardInterrupt\n"
            "builtins.open = io.open = interrupted\n"
            "torch.manual_seed = interrupted\n"
            f"sys.argv = [{module!r}, *{{'gpt.sweep': ['report', {str(tmp_path)!r}], "
            f"'gpt.figures': ['run', {str(tmp_path)!r}], 'gpt.diagnostics': ['grad-depth'], "
            f"'data/shakespeare_char/prepare.py': ['--input', {str(tmp_path / 'sweep.json')!r}, "
            f"'--out_dir', {str(tmp_path / 'out')!r}]}}[{module!r}]]\n"
            + (f"runpy.run_path({module!r}, run_name='__main__')\n" if module.endswith(".py") else
               f"runpy.run_module({module!r}, run_name='__main__', alter_sys=True)\n"))
    (tmp_path / "sweep.json").write_text("{}")
    (tmp_path / "metrics.jsonl").write_text("")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert (proc.returncode, proc.stderr, proc.stdout) == (130, "interrupted\n", "")


@pytest.mark.e2e
def test_resume_checks_given_values_against_the_runs_own_settings(data_dir, tmp_path):
    out = tmp_path / "run"
    assert train.main(tiny_args(data_dir, out, "--max_iters=2", "--eval_interval=2", "--min_lr=1e-5",
                                "--lr_decay_iters=100")) == 0
    # against the defaults (warmup_iters=100, min_lr=1e-4) both would be refused; the run has 2 and 1e-5
    assert train.main([f"--out_dir={out}", "--resume", "--max_iters=4", "--lr_decay_iters=50",
                       "--learning_rate=5e-5"]) == 0
    saved = checkpoint.load(out / "ckpt.pt")["train_config"]
    assert (saved["lr_decay_iters"], saved["learning_rate"], saved["warmup_iters"]) == (50, 5e-5, 2)
    # settings older versions accepted and this one refuses can be mended on the resume itself
    ckpt = checkpoint.load(out / "ckpt.pt", needs=checkpoint.RESUME_KEYS)
    ckpt["train_config"].update(warmup_iters=100, lr_decay_iters=20)
    checkpoint.save(ckpt, out / "ckpt.pt")
    assert train.main([f"--out_dir={out}", "--resume", "--max_iters=6", "--lr_decay_iters=200"]) == 0


@pytest.mark.e2e
def test_a_resume_that_cannot_rewrite_its_log_keeps_it_whole(data_dir, tmp_path, capsys):
    out = tmp_path / "run"
    assert train.main(tiny_args(data_dir, out, "--max_iters=4", "--eval_interval=2")) == 0
    checkpoint.save({**checkpoint.load(out / "ckpt.pt", needs=checkpoint.RESUME_KEYS), "iter": 2},
                    out / "ckpt.pt")    # the log now runs past the checkpoint, so it must be cut
    before = (out / "metrics.jsonl").read_text()
    (out / "metrics.jsonl.tmp").mkdir()         # where the new log would be written: not writable
    capsys.readouterr()
    assert train.main([f"--out_dir={out}", "--resume", "--max_iters=6"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: cannot write") and "it is unchanged" in err and err.count("\n") == 1
    assert (out / "metrics.jsonl").read_text() == before


@pytest.mark.e2e
@pytest.mark.parametrize("name", ["metrics.jsonl", "command.txt", "config.json"])
def test_a_run_file_that_cannot_be_written_stops_the_run_in_one_line(name, data_dir, tmp_path, capsys, monkeypatch):
    out = tmp_path / "run"
    (out / name).mkdir(parents=True)        # a folder of the file's name: it cannot be replaced
    assert train.main(tiny_args(data_dir, out, "--max_iters=2", "--eval_interval=2", "--overwrite=true")) == 2
    err = capsys.readouterr().err
    said = (f"error: cannot write {out / name} (Is a directory)" if name == "config.json" else
            f"error: {out / name} cannot be replaced (Is a directory); remove it, or choose another --out_dir")
    assert err.startswith(said) and err.count("\n") == 1
    if name != "metrics.jsonl":
        return
    (out / name).rmdir()
    real_open = open

    def full(path, *args, **kwargs):        # a disk that fills after the first checkpoint
        if Path(path).name == name and (out / "ckpt.pt").exists():
            raise OSError(28, "No space left on device")
        return real_open(path, *args, **kwargs)
    monkeypatch.setattr("builtins.open", full)
    assert train.main(tiny_args(data_dir, out, "--max_iters=4", "--eval_interval=2")) == 2
    assert capsys.readouterr().err == (f"error: cannot write {out / name} (No space left on device); the "
                                       f"run stopped, and ckpt.pt is whole: once the file can be written, "
                                       f"continue with --out_dir={out} --resume\n")
    assert checkpoint.load(out / "ckpt.pt")["iter"] == 2


def test_lines_of_another_shape_in_metrics_jsonl_are_skipped(tmp_path):
    from gpt.train.metrics import read_jsonl
    good = [{"kind": "train", "iter": 1, "loss": 2.5}, {"kind": "eval", "iter": 2, "train_loss": 2.0, "val_loss": 2.1}]
    odd = [{"kind": "eval", "iter": "x"}, {"kind": "train", "iter": None}, {"kind": "eval", "iter": 3},
           {"kind": "eval", "iter": 4, "train_loss": 2.0, "val_loss": None}, {"kind": 1, "iter": 5}, [1, 2]]
    (tmp_path / "m.jsonl").write_text("".join(json.dumps(row) + "\n" for row in [*odd, *good]))
    assert read_jsonl(tmp_path / "m.jsonl") == good


def test_metrics_lines_are_strict_json_and_read_back_as_numbers(tmp_path):
    from gpt.train.metrics import Metrics, read_jsonl
    metrics = Metrics(tmp_path / "metrics.jsonl")
    metrics.log({"kind": "eval", "iter": 3, "val_loss": float("nan"), "grad": [1.5, float("inf")],
                 "low": float("-inf")})
    line = (tmp_path / "metrics.jsonl").read_text()

    def refuse(constant):
        raise ValueError(f"{constant} is not JSON")
    json.loads(line, parse_constant=refuse)     # what jq and JavaScript accept
    [row] = read_jsonl(tmp_path / "metrics.jsonl")
    assert math.isnan(row["val_loss"]) and row["grad"] == [1.5, math.inf] and row["low"] == -math.inf


def test_every_json_we_write_is_strict():
    """result.json, config.json, gpt.bench --json and the gradient-depth table share one encoder."""
    from gpt.console import to_json

    def refuse(constant):
        raise ValueError(f"{constant} is not JSON")
    data = {"mfu": float("nan"), "rows": [{"grad_norm": float("inf")}, (1.0, float("-inf"))], "ok": 2.5}
    assert json.loads(to_json(data), parse_constant=refuse) == {
        "mfu": "nan", "rows": [{"grad_norm": "inf"}, [1.0, "-inf"]], "ok": 2.5}


@pytest.mark.e2e
def test_a_sweep_never_replaces_a_runs_only_checkpoint(data_dir, tmp_path, capsys):
    """A run folder with ckpt_best.pt alone (its ckpt.pt deleted as unreadable): the sweep's run
    says what to do, rather than starting afresh over the one good checkpoint."""
    out = tmp_path / "sw"
    argv = tiny_args(data_dir, out, "--max_iters=2", "--eval_interval=2", "--sweep", "n_layer=1")
    assert train.main(argv) == 0
    run = out / "n_layer=1__seed=1337"
    (run / "ckpt.pt").unlink()
    (run / "result.json").unlink()
    best = (run / "ckpt_best.pt").read_bytes()
    assert train.main(argv) == 1
    assert "1 of 1 runs failed" in "".join(capsys.readouterr())
    assert (run / "ckpt_best.pt").read_bytes() == best
    assert (f"error: {run} holds ckpt_best.pt but no ckpt.pt; copy it to ckpt.pt to continue the run "
            "from there, or delete the folder to train it afresh, then run the sweep's command again"
            ) in (run / "log.txt").read_text()
    shutil.copy(run / "ckpt_best.pt", run / "ckpt.pt")
    assert train.main(argv) == 0


@pytest.mark.e2e
def test_a_run_of_ones_own_in_a_sweeps_folder_is_not_told_the_sweep_continues_it(data_dir, tmp_path, monkeypatch):
    from gpt.train.rundir import how_to_continue
    from gpt.train.signals import SWEEP_PID
    out = tmp_path / "sw"
    assert train.main(tiny_args(data_dir, out, "--max_iters=2", "--eval_interval=2", "--sweep", "n_layer=1")) == 0
    monkeypatch.delenv(SWEEP_PID, raising=False)
    assert how_to_continue(out / "mine") == f"continue with --out_dir={out / 'mine'} --resume"
    monkeypatch.setenv(SWEEP_PID, "1")      # as for the runs the sweep starts
    assert how_to_continue(out / "mine") == "the sweep's command, run again, continues it"


def test_a_kill_while_a_dataset_is_prepared_leaves_no_temporary_files(tmp_path, monkeypatch, capsys):
    """SIGTERM and SIGHUP, like Ctrl-C, end the prepare scripts through their clean-up."""
    from gpt import datasets, text_dataset
    from gpt.console import interrupt_in_one_line
    src = tmp_path / "a.txt"
    src.write_text(make_text(300))
    read = text_dataset.text_pieces

    def pieces(path):
        yield from read(path)
        if list((tmp_path / "out").glob("*.tmp*")):     # the second pass, its files begun
            os.kill(os.getpid(), signal.SIGTERM)
    monkeypatch.setattr(text_dataset, "text_pieces", pieces)
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(SystemExit) as stop:
        with interrupt_in_one_line(terminate=True):
            datasets.prepare_main("shakespeare_char", ["--input", str(src), "--out_dir", str(tmp_path / "out")])
    assert stop.value.code == 143 and capsys.readouterr().err == "interrupted\n"    # as a shell says it
    assert not (tmp_path / "out").exists()        # the folder it made is gone again
    assert signal.getsignal(signal.SIGTERM) == before


@pytest.mark.e2e
def test_a_fresh_run_never_deletes_files_of_the_users_that_share_a_runs_names(data_dir, tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "command.txt").write_text("my notes\n")
    (out / "dashboard.png").write_bytes(b"x")
    assert train.main(tiny_args(data_dir, out, "--max_iters=2", "--eval_interval=2")) == 2
    assert capsys.readouterr().err == (f"error: {out} holds command.txt, dashboard.png but no run of this "
                                       "project (no config.json); remove them, replace them with "
                                       "--overwrite=true, or choose another --out_dir\n")
    assert (out / "command.txt").read_text() == "my notes\n" and (out / "dashboard.png").exists()
    assert train.main(tiny_args(data_dir, out, "--max_iters=2", "--eval_interval=2", "--overwrite=true")) == 0
    assert not (out / "dashboard.png").exists()
    assert train.main(tiny_args(data_dir, out, "--max_iters=2", "--eval_interval=2", "--overwrite=true")) == 0


@pytest.mark.e2e
def test_a_fresh_run_never_replaces_another_programs_config_json(data_dir, tmp_path, capsys):
    out = tmp_path / "hf"
    out.mkdir()
    (out / "config.json").write_text('{"model_type": "gpt2"}')     # a Hugging Face model's folder
    assert train.main(tiny_args(data_dir, out, "--max_iters=2", "--eval_interval=2")) == 2
    assert capsys.readouterr().err == (f"error: {out} holds a config.json that no run of this project "
                                       "wrote; replace it with --overwrite=true, or choose another --out_dir\n")
    assert (out / "config.json").read_text() == '{"model_type": "gpt2"}'
    assert train.main(tiny_args(data_dir, out, "--max_iters=2", "--eval_interval=2", "--overwrite=true")) == 0


@pytest.mark.e2e
def test_a_fresh_run_keeps_the_evaluations_of_a_run_whose_checkpoints_were_removed(data_dir, tmp_path, capsys):
    out = tmp_path / "run"      # its one evaluation past 0 is the last line
    argv = tiny_args(data_dir, out, "--max_iters=4", "--eval_interval=4")
    assert train.main(argv) == 0
    for name in ("ckpt.pt", "ckpt_best.pt"):     # to free the disk, say
        (out / name).unlink()
    kept = (out / "metrics.jsonl").read_text()
    capsys.readouterr()
    assert train.main(argv) == 2
    assert capsys.readouterr().err == (f"error: {out} holds an earlier run's metrics.jsonl, evaluated up to "
                                       "iteration 4, but not its checkpoints; replace the run with "
                                       "--overwrite=true, or choose another --out_dir\n")
    assert (out / "metrics.jsonl").read_text() == kept
    assert train.main([*argv, "--overwrite=true"]) == 0


def test_a_full_disk_at_the_write_test_leaves_no_probe_file(tmp_path, monkeypatch):
    from gpt.train import rundir

    def full(self, *args, **kwargs):        # the file is made, its bytes do not fit
        open(self, "w").close()
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(Path, "write_text", full)
    with pytest.raises(UserError, match=r"cannot be written \(No space left on device\); choose another --out_dir$"):
        rundir.writable(tmp_path / "run")
    assert list((tmp_path / "run").iterdir()) == []


@pytest.mark.e2e
@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no named pipes here")
@pytest.mark.parametrize("command", [["train.py", "--resume", "--max_iters=4"], ["-m", "gpt.figures", "run"]])
def test_a_named_pipe_for_metrics_jsonl_is_refused_not_waited_on(command, data_dir, tmp_path):
    good = _trained(data_dir, tmp_path)
    (good / "metrics.jsonl").unlink()
    os.mkfifo(good / "metrics.jsonl")
    argv = [*command, f"--out_dir={good}"] if command[0] == "train.py" else [*command, str(good)]
    proc = subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr == f"error: {good / 'metrics.jsonl'} is not a regular file (a pipe or a device); " \
                          "move it away\n"


@pytest.mark.e2e
@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no named pipes here")
def test_a_named_pipe_for_command_txt_is_refused_before_the_run_records_its_start(data_dir, tmp_path):
    good = _trained(data_dir, tmp_path)
    (good / "command.txt").unlink()
    os.mkfifo(good / "command.txt")
    config = (good / "config.json").read_bytes()
    proc = subprocess.run([sys.executable, "train.py", f"--out_dir={good}", "--resume", "--max_iters=4",
                           "--learning_rate=5e-3"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr == f"error: {good / 'command.txt'} is not a regular file (a pipe or a device); " \
                          "move it away\n"
    assert (good / "config.json").read_bytes() == config


@pytest.mark.e2e
def test_a_ctrl_c_while_train_py_exits_prints_no_traceback(data_dir, tmp_path):
    late = tmp_path / "late.py"      # train.py run as a script, sent Ctrl-C by an exit hook
    late.write_text("import atexit, os, runpy, signal, sys\n"
                    "atexit.register(lambda: os.kill(os.getpid(), signal.SIGINT))\n"
                    "sys.argv = ['train.py', *sys.argv[1:]]\n"
                    "runpy.run_path('train.py', run_name='__main__')\n")
    proc = subprocess.run([sys.executable, str(late), *tiny_args(data_dir, tmp_path / "run", "--max_iters=2")],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr and "KeyboardInterrupt" not in proc.stderr
    assert proc.stdout.splitlines()[-1].startswith("done: 2 iterations")


def test_the_train_first_hint_names_the_config_whose_folder_it_is(tmp_path):
    from gpt.checkpoint import train_command
    assert train_command(Path("out/shakespeare_char_cpu")) == "python train.py --config shakespeare_char_cpu"
    assert train_command(Path("out/shakespeare_char_fast")) == "python train.py --config shakespeare_char_fast"
    assert train_command(tmp_path / "my run") == ("python train.py --config shakespeare_char_cpu "
                                                  f"--out_dir='{tmp_path / 'my run'}'")


@pytest.mark.e2e
def test_loading_for_sampling_reads_the_weights_alone_into_a_model_built_where_it_runs(tmp_path):
    """The optimizer's moments, twice the weights, are mapped from the file and never read: the
    load's peak is about twice the weights (the model, and the file's pages of weights it read),
    where reading the whole checkpoint and building the model apart took more than four times."""
    code = ("import dataclasses, resource, sys, torch\n"
            "from gpt import checkpoint\nfrom gpt.config import GPTConfig\nfrom gpt.model import GPT\n"
            "m = GPT(GPTConfig(vocab_size=65, block_size=64, n_layer=4, n_head=4, n_embd=384))\n"
            "moments = {k: torch.randn_like(v) for k, v in m.state_dict().items()}\n"
            "checkpoint.save({'model': m.state_dict(), 'model_config': dataclasses.asdict(m.config), 'meta': "
            "{'tokenizer': 'char', 'vocab_size': 65, 'chars': [chr(32 + i) for i in range(65)]}, "
            "'optimizer': {'exp_avg': moments, "
            "'exp_avg_sq': {k: v.clone() for k, v in moments.items()}}}, sys.argv[1] + '/ckpt.pt')\n"
            "del m, moments\n")
    subprocess.run([sys.executable, "-c", code, str(tmp_path)], cwd=ROOT, check=True, timeout=120)
    load = ("import resource, sys\nfrom gpt import checkpoint\n"
            "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
            "model, _ = checkpoint.load_for_sampling(sys.argv[1])\n"
            "grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before\n"
            "print(grown / 1024, sum(p.numel() * 4 for p in model.parameters()) / 2 ** 20)\n")
    proc = subprocess.run([sys.executable, "-c", load, str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, check=True)
    grown_mb, weights_mb = map(float, proc.stdout.split())
    assert weights_mb > 20 and grown_mb < 3 * weights_mb, (grown_mb, weights_mb)


def test_a_stale_temporary_checkpoint_is_removed_as_the_run_starts_not_at_its_next_save(data_dir, tmp_path, capsys):
    """A SIGKILL mid-save leaves ckpt.pt.tmp as large as a checkpoint; the next start of the run,
    holding the folder, removes it, even where that start saves nothing."""
    out = tmp_path / "run"
    assert train.main(tiny_args(data_dir, out, "--max_iters=4", "--eval_interval=2")) == 0
    stale = out / "ckpt.pt.tmp"
    stale.write_bytes((out / "ckpt.pt").read_bytes()[:100_000])
    assert train.main(tiny_args(data_dir, out, "--max_iters=4", "--eval_interval=2", "--resume")) == 2
    assert "already at iteration 4" in capsys.readouterr().err      # a start that saves nothing
    assert not stale.exists() and (out / "ckpt.pt").exists()
