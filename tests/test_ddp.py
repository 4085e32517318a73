import json
import math
import os
import socket
import re
import shutil
import subprocess

import pytest

import train
from gpt import checkpoint
from conftest import ROOT, make_text, tiny_args


def losses(out_dir):
    rows = [json.loads(x) for x in (out_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in rows if r["kind"] == "train"]


@pytest.mark.e2e
@pytest.mark.skipif(shutil.which("torchrun") is None, reason="torchrun is not installed")
def test_two_processes_match_one_process_accumulating_two_steps(data_dir, tmp_path):
    # dropout too: each micro-batch's masks must follow it to whichever process runs it
    args = ["--max_iters=8", "--eval_interval=8", "--gradient_accumulation_steps=2", "--seed=3",
            "--dropout=0.1"]
    single = tmp_path / "single"
    assert train.main(tiny_args(data_dir, single, *args)) == 0
    ddp = tmp_path / "ddp"
    proc = subprocess.run(
        ["torchrun", "--standalone", "--nproc_per_node=2", str(ROOT / "train.py"),
         *tiny_args(data_dir, ddp, *args)],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    # the ranks' own lines, without the launcher's log lines (W/E/I + date) that would bury them
    ranks = [line for line in proc.stderr.splitlines() if not re.match(r"[WEI]\d{4} ", line)]
    assert proc.returncode == 0, "\n".join(ranks)[-3000:]
    assert (ddp / "command.txt").read_text().startswith("torchrun --nproc_per_node=2 train.py --data_dir=")
    a, b = losses(single), losses(ddp)
    assert len(a) == len(b) == 8
    assert max(abs(x - y) for x, y in zip(a, b)) < 1e-5
    assert a[-1] < a[0]
    # each rank scores half the evaluation batches; all-reduced, the mean is one process's to the bit
    evals = [[json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()] for d in (single, ddp)]
    (first_single, last_single), (first_ddp, last_ddp) = ([r for r in rows if r["kind"] == "eval"] for rows in evals)
    assert (first_ddp["train_loss"], first_ddp["val_loss"]) == (first_single["train_loss"], first_single["val_loss"])
    assert abs(last_ddp["val_loss"] - last_single["val_loss"]) < 1e-5


@pytest.mark.e2e
@pytest.mark.skipif(shutil.which("torchrun") is None, reason="torchrun is not installed")
def test_every_rank_ends_alike_when_a_resume_at_the_end_only_mends_the_best_copy(data_dir, tmp_path):
    out = tmp_path / "run"
    assert train.main(tiny_args(data_dir, out, "--max_iters=4", "--eval_interval=2",
                                "--gradient_accumulation_steps=2")) == 0
    (out / "ckpt_best.pt").unlink()                 # as a failed copy at the last save left it
    proc = subprocess.run(["torchrun", "--standalone", "--nproc_per_node=2", str(ROOT / "train.py"),
                           f"--out_dir={out}", "--resume", "--threads=1"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    ranks = [line for line in proc.stderr.splitlines() if not re.match(r"[WEI]\d{4} ", line)]
    assert proc.returncode == 0, "\n".join(ranks)[-3000:]
    assert proc.stdout.count("done: the run had already reached iteration 4") == 1     # rank 0 alone
    assert (out / "ckpt_best.pt").read_bytes() == (out / "ckpt.pt").read_bytes()


# rank 1 alone gets a nan loss at iteration 2 and a stop signal at iteration 5
ONE_RANK_HIT = """
import os, signal, sys
sys.path.insert(0, {root!r})
from gpt.model import GPT
from gpt.train.loop import Loop
forward, step, calls = GPT.forward, Loop.step, [0]

def poisoned(self, idx, targets=None):
    logits, loss = forward(self, idx, targets)
    if self.training and targets is not None and os.environ["RANK"] == "1":
        calls[0] += 1
        loss = loss * float("nan") if calls[0] == 3 else loss
    return logits, loss

def signalled(self, it):
    if it == 5 and os.environ["RANK"] == "1":
        os.kill(os.getpid(), signal.SIGTERM)
    step(self, it)
GPT.forward, Loop.step = poisoned, signalled
import train
sys.exit(train.main(sys.argv[1:]))
"""


@pytest.mark.e2e
@pytest.mark.skipif(shutil.which("torchrun") is None, reason="torchrun is not installed")
def test_the_ranks_skip_the_same_nonfinite_step_and_stop_together_at_the_next_read(data_dir, tmp_path):
    script = tmp_path / "hit.py"
    script.write_text(ONE_RANK_HIT.format(root=str(ROOT)))
    out = tmp_path / "run"
    proc = subprocess.run(["torchrun", "--standalone", "--nproc_per_node=2", str(script),
                           *tiny_args(data_dir, out, "--max_iters=12", "--eval_interval=12", "--log_interval=4",
                                      "--gradient_accumulation_steps=2", "--skip_nonfinite=true")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    # a stopped run exits as stopped by a signal, so torchrun reports it as failed
    assert "a signal to another process: saved" in proc.stdout, proc.stderr[-3000:]
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    # the step after the log at 8 is the first the ranks agree to stop after
    assert [(r["iter"], r["event"]) for r in rows if r["kind"] == "event"] == [
        (2, "nonfinite"), (9, "stopped by a signal to another process")]
    assert [r["iter"] for r in rows if r["kind"] == "train"] == [0, 4, 8]
    assert all(math.isfinite(r["loss"]) for r in rows if r["kind"] == "train")
    assert checkpoint.load(out / "ckpt.pt")["iter"] == 9


# each rank writes at exit how often it measured diagnostics, and the all-reduces of its evaluations
COUNTED = """
import atexit, json, os, sys
sys.path.insert(0, {root!r})
import torch.distributed
from gpt.train import loop
measure, evaluate, all_reduce = loop.measure_diagnostics, loop.Loop.evaluate, torch.distributed.all_reduce
counts = {{"measured": 0, "evaluations": 0, "all_reduces": 0, "evaluating": False}}

def counted_measure(*args, **kwargs):
    counts["measured"] += 1
    return measure(*args, **kwargs)

def counted_all_reduce(*args, **kwargs):
    counts["all_reduces"] += counts["evaluating"]
    return all_reduce(*args, **kwargs)

def counted_evaluate(self, it, lr):
    counts["evaluations"] += 1
    counts["evaluating"] = True
    try:
        return evaluate(self, it, lr)
    finally:
        counts["evaluating"] = False
loop.measure_diagnostics, loop.Loop.evaluate, torch.distributed.all_reduce = (counted_measure, counted_evaluate,
                                                                              counted_all_reduce)
atexit.register(lambda: open({counts!r} + os.environ["RANK"], "w").write(json.dumps(counts)))
import train
sys.exit(train.main(sys.argv[1:]))
"""


@pytest.mark.e2e
@pytest.mark.skipif(shutil.which("torchrun") is None, reason="torchrun is not installed")
def test_rank_0_alone_measures_diagnostics_and_an_evaluation_all_reduces_its_two_losses_only(data_dir, tmp_path):
    script = tmp_path / "counted.py"
    script.write_text(COUNTED.format(root=str(ROOT), counts=str(tmp_path / "counts")))
    out = tmp_path / "run"
    proc = subprocess.run(["torchrun", "--standalone", "--nproc_per_node=2", str(script),
                           *tiny_args(data_dir, out, "--max_iters=4", "--eval_interval=2",
                                      "--gradient_accumulation_steps=2")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    ranks = [line for line in proc.stderr.splitlines() if not re.match(r"[WEI]\d{4} ", line)]
    assert proc.returncode == 0, "\n".join(ranks)[-3000:]
    counts = [json.loads((tmp_path / f"counts{rank}").read_text()) for rank in (0, 1)]
    assert [c["evaluations"] for c in counts] == [3, 3]     # iterations 0, 2 and 4
    assert [c["measured"] for c in counts] == [3, 0]
    assert [c["all_reduces"] for c in counts] == [6, 6]     # the train and val losses of each
    evals = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert all("block_grad_norm" in r for r in evals if r["kind"] == "eval"), evals


@pytest.mark.e2e
@pytest.mark.skipif(shutil.which("torchrun") is None or not hasattr(os, "mkfifo"),
                    reason="torchrun or named pipes are missing")
def test_a_start_that_rank_0_refuses_gives_its_line_and_no_other_ranks_traceback(data_dir, tmp_path):
    out = tmp_path / "run"
    assert train.main(tiny_args(data_dir, out, "--max_iters=2", "--eval_interval=2",
                                "--gradient_accumulation_steps=2")) == 0
    (out / "command.txt").unlink()
    os.mkfifo(out / "command.txt")      # refused by rank 0 alone, after the others got going
    proc = subprocess.run(["torchrun", "--standalone", "--nproc_per_node=2", str(ROOT / "train.py"),
                           f"--out_dir={out}", "--resume", "--max_iters=4", "--threads=1"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    ranks = [line for line in proc.stderr.splitlines() if not re.match(r"[WEI]\d{4} ", line)]
    assert proc.returncode != 0
    assert f"error: {out / 'command.txt'} is not a regular file (a pipe or a device); move it away" in ranks
    assert not any("gloo" in line or "Connection closed" in line for line in ranks), "\n".join(ranks)[-3000:]


@pytest.mark.e2e
@pytest.mark.skipif(shutil.which("torchrun") is None, reason="torchrun is not installed")
def test_each_machine_prepares_the_shipped_dataset_on_its_own_disk(tmp_path):
    """Two one-process nodes whose data folders differ, as machines without a shared disk: each
    prepares its own copy from the text that is there."""
    text = (ROOT / "tests" / "conftest.py").read_text() * 20
    nodes = [tmp_path / "node0", tmp_path / "node1"]
    for node in nodes:
        (node / "data" / "shakespeare_char").mkdir(parents=True)
        (node / "data" / "shakespeare_char" / "input.txt").write_text(text)
    with socket.socket() as free:       # a port no other test's torchrun uses
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    args = ["--dataset=shakespeare_char", "--data_dir=data", "--out_dir=run", "--device=cpu",
            "--n_layer=1", "--n_head=2", "--n_embd=16", "--block_size=16", "--batch_size=2",
            "--max_iters=2", "--eval_interval=2", "--eval_iters=1", "--threads=1", "--wandb=false",
            "--gradient_accumulation_steps=2"]
    procs = [subprocess.Popen(["torchrun", "--nnodes=2", f"--node_rank={i}", "--nproc_per_node=1",
                               "--master_addr=127.0.0.1", f"--master_port={port}",
                               str(ROOT / "train.py"), *args],
                              cwd=node, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for i, node in enumerate(nodes)]
    outs = [proc.communicate(timeout=300)[0] for proc in procs]
    for proc, out in zip(procs, outs):
        assert proc.returncode == 0, out[-3000:]
    for node in nodes:
        assert (node / "data" / "shakespeare_char" / "meta.json").exists()
    assert (nodes[0] / "run" / "ckpt.pt").exists() and not (nodes[1] / "run").exists()


@pytest.mark.e2e
def test_a_single_process_prepares_whatever_local_rank_its_environment_holds(tmp_path, monkeypatch):
    """LOCAL_RANK left over from a launcher or a job script: without RANK and WORLD_SIZE the run
    is one process, and it prepares its data."""
    (tmp_path / "data" / "shakespeare_char").mkdir(parents=True)
    (tmp_path / "data" / "shakespeare_char" / "input.txt").write_text(make_text(2000))
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert train.main(tiny_args(tmp_path / "data", tmp_path / "run", "--dataset=shakespeare_char",
                                "--max_iters=2", "--eval_interval=2")) == 0
    assert (tmp_path / "data" / "shakespeare_char" / "meta.json").exists()


@pytest.mark.e2e
@pytest.mark.parametrize("env, message", [
    ({"RANK": "x", "WORLD_SIZE": "2"}, "RANK='x' in the environment is not a whole number of at least 0; "
                                       "torchrun sets it: unset it to run one process"),
    ({"RANK": "0", "WORLD_SIZE": "0"}, "WORLD_SIZE='0' in the environment is not a whole number of at "
                                       "least 1; torchrun sets it: unset it to run one process"),
    ({"RANK": "2", "WORLD_SIZE": "2"}, "RANK=2 in the environment is not below WORLD_SIZE=2; torchrun sets "
                                       "both: unset them to run one process"),
])
def test_a_stray_torchrun_variable_stops_the_run_with_one_line(env, message, data_dir, tmp_path, monkeypatch,
                                                               capsys):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert train.main(tiny_args(data_dir, tmp_path / "run", "--max_iters=2")) == 2
    assert capsys.readouterr().err == f"error: {message}\n"
    assert not (tmp_path / "run").exists()


@pytest.mark.e2e
def test_stray_torchrun_variables_that_parse_stop_the_run_with_one_line_or_mean_one_process(
        data_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert train.main(tiny_args(data_dir, tmp_path / "two", "--max_iters=2",
                                "--gradient_accumulation_steps=2")) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: RANK=0 and WORLD_SIZE=2 in the environment make this one of 2 processes, but "
                          "they could not connect (") and err.count("\n") == 1
    assert err.endswith("); start the run with torchrun, or unset RANK and WORLD_SIZE to run one process\n")
    monkeypatch.setenv("WORLD_SIZE", "1")      # one process of one: trained as one, no process group
    assert train.main(tiny_args(data_dir, tmp_path / "one", "--max_iters=2", "--eval_interval=2")) == 0


def test_nccl_gets_its_gpu_first_and_a_local_rank_past_the_visible_gpus_is_one_line(monkeypatch):
    import torch

    from gpt.errors import UserError
    from gpt.train import runtime
    calls = []
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: calls.append(("set_device", str(d))))
    monkeypatch.setattr(torch.distributed, "init_process_group",
                        lambda backend, device_id=None: calls.append(("init", backend, str(device_id))))
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert runtime.join_processes("cuda", 1, 2) == "cuda:1"
    assert calls == [("set_device", "cuda:1"), ("init", "nccl", "cuda:1")]
    monkeypatch.setenv("LOCAL_RANK", "2")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    with pytest.raises(UserError, match=r"^LOCAL_RANK=2, but this machine shows 2 GPUs \(CUDA_VISIBLE_DEVICES=0,1\); "
                                        r"give torchrun --nproc_per_node=2 or fewer, or make more GPUs visible$"):
        runtime.join_processes("cuda", 2, 3)
    calls.clear()
    assert runtime.join_processes("cpu", 1, 2) == "cpu" and calls == [("init", "gloo", "None")]
