"""gpt/speed/split.py: thread_split, each thread on its own rows of a batch, and the runs that split."""

import importlib
import json
import os
import threading
import time

import pytest
import torch

import train
from conftest import tiny_args
from gpt import checkpoint
from gpt.config import GPTConfig, TrainConfig
from gpt.errors import UserError
from gpt.speed.attention import attention
# the module, not its function of the same name, which the package exports
speed_hooks = importlib.import_module("gpt.speed.attention")
from gpt.model import GPT
from gpt.speed.split import AUTO_MAX_THREADS, RowSplit, split_plan
from test_train import read_metrics

two_cpus = pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs 2 CPUs")


@pytest.fixture
def threads_kept():
    found = torch.get_num_threads()
    yield found
    torch.set_num_threads(found)


def tiny_model(seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    return GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=30, dropout=0.0))


def batch(rows: int):
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, 30, (rows, 16), generator=g), torch.randint(0, 30, (rows, 16), generator=g)


def grads_of(params):
    grads = [p.grad.clone() for p in params]
    for p in params:
        p.grad = None
    return grads


def split_grads(model, x, y, parts, scales=(1.0,), dtype=torch.float32):
    params = list(model.parameters())
    split = RowSplit(model, params, parts, dtype, flush_denormal=False)
    try:
        losses = [split.backward(x, y, scale) for scale in scales]
    finally:
        split.close()
    return losses, grads_of(params)


def test_a_split_step_gives_the_whole_batchs_loss_and_gradients(threads_kept):
    model = tiny_model()
    params = list(model.parameters())
    x, y = batch(7)                                 # parts of 3, 2 and 2 rows: weighed by their rows
    _, loss = model(x, y)
    loss.backward()
    whole = grads_of(params)
    (split_loss,), split = split_grads(model, x, y, 3)
    assert split_loss.item() == pytest.approx(loss.item(), rel=1e-6)
    for a, b in zip(whole, split):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-7)
    # accumulated: two micro-batches at 1/2 each add up to one; and the same sums every time
    (_, _), halves = split_grads(model, x, y, 3, scales=(0.5, 0.5))
    for a, b in zip(whole, halves):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-7)
    _, again = split_grads(model, x, y, 3)
    assert all(torch.equal(a, b) for a, b in zip(split, again))
    assert torch.get_num_threads() == threads_kept      # close gives the caller its threads back


def test_each_part_runs_on_one_core_in_the_runs_autocast(threads_kept):
    model = tiny_model()
    seen = []
    model.lm_head.register_forward_hook(lambda m, i, out: seen.append(
        (threading.current_thread().name, torch.get_num_threads(), out.dtype)))
    split = RowSplit(model, list(model.parameters()), 2, torch.bfloat16, flush_denormal=False)
    try:
        split.backward(*batch(4), 1.0)
        assert torch.get_num_threads() == 1     # the rest of a step too: no helper threads spinning
        with split.all_threads():
            assert torch.get_num_threads() == threads_kept
        assert torch.get_num_threads() == 1
    finally:
        split.close()
    # the caller's thread takes one part, a helper the other
    assert sorted(n.startswith("rows") for n, _, _ in seen) == [False, True]
    assert {(t, d) for _, t, d in seen} == {(1, torch.bfloat16)}
    assert torch.get_num_threads() == threads_kept


@pytest.mark.parametrize("failing_rows", [3, 2])      # the caller's part (the first), a helper's
def test_a_part_that_fails_raises_in_the_caller_once_every_part_has_ended(failing_rows, threads_kept):
    model = tiny_model()
    ended = []
    forward = model.forward

    def failing(x, y):
        if len(x) == failing_rows:
            raise ValueError("part failed")
        time.sleep(0.2)         # the other part is still running when this one fails
        out = forward(x, y)
        ended.append(len(x))
        return out
    model.forward = failing
    split = RowSplit(model, list(model.parameters()), 2, torch.float32, flush_denormal=False)
    try:
        with pytest.raises(ValueError, match="part failed"):
            split.backward(*batch(5), 1.0)
        assert ended == [5 - failing_rows]
    finally:
        split.close()


def configs(split="auto", dropout=0.0, batch_size=8, **train):
    return GPTConfig(dropout=dropout), TrainConfig(thread_split=split, batch_size=batch_size, **train)


@pytest.mark.parametrize("how, device, world, threads, parts", [
    (configs(), "cpu", 1, 2, 2),
    (configs(), "cpu", 1, AUTO_MAX_THREADS, AUTO_MAX_THREADS),
    (configs(), "cpu", 1, AUTO_MAX_THREADS + 1, 1),        # not measured with more: torch splits ops
    (configs("batch"), "cpu", 1, AUTO_MAX_THREADS + 1, AUTO_MAX_THREADS + 1),
    (configs(batch_size=3), "cpu", 1, 4, 3),                # no part without rows
    (configs("ops"), "cpu", 1, 2, 1),
    (configs(), "cpu", 1, 1, 1),
    (configs(dropout=0.1), "cpu", 1, 2, 1),
    (configs(compile=True), "cpu", 1, 2, 1),
    (configs(), "cpu", 2, 2, 1),
    (configs(batch_size=1), "cpu", 1, 2, 1),
    (configs(), "cuda", 1, 2, 1),                           # a GPU runs each op on itself
])
def test_a_run_is_split_where_it_can_be(how, device, world, threads, parts):
    assert split_plan(*how, device, world, threads) == parts


@pytest.mark.parametrize("how, world, threads, why", [
    (configs("batch", dropout=0.1), 1, 2, "dropout=0.1 draws masks in the threads' order"),
    (configs("batch", compile=True), 1, 2, "compile=true: a compiled model is not called from several"),
    (configs("batch"), 2, 2, "a run over 2 processes splits its batch between them already"),
    (configs("batch"), 1, 1, r"the run gets one CPU thread \(--threads sets the count, and a sweep's "
                             r"--jobs divides the CPUs between its runs\)"),
    (configs("batch", batch_size=1), 1, 2, "batch_size=1 has one row"),
])
def test_a_split_asked_for_that_cannot_be_is_refused(how, world, threads, why):
    with pytest.raises(UserError, match=f"^thread_split=batch cannot split this run: {why}.*; pass "
                                        "--thread_split=auto or ops$"):
        split_plan(*how, "cpu", world, threads)


def test_a_split_asked_for_on_a_gpu_is_refused():
    with pytest.raises(UserError, match="^thread_split=batch cannot split this run: device=cuda:1 runs "
                                        "each op on the device; the split is for CPU runs; pass"):
        split_plan(*configs("batch"), "cuda:1", 1, 2)


def test_medium_on_a_cpu_that_rounds_does_not_split(cpu_rounds_when_asked):
    assert split_plan(*configs(matmul_precision="medium"), "cpu", 1, 2) == 1
    with pytest.raises(UserError, match="matmul_precision=medium on this CPU makes attention flip"):
        split_plan(*configs("batch", matmul_precision="medium"), "cpu", 1, 2)


def untimed(out_dir):
    return [{k: v for k, v in r.items() if k != "ms"} for r in read_metrics(out_dir, "train")]


@pytest.mark.e2e
@two_cpus
def test_a_split_run_trains_as_an_unsplit_one_and_resumes_exactly(data_dir, tmp_path, capsys, threads_kept,
                                                                  monkeypatch):
    seen = []
    monkeypatch.setattr(speed_hooks, "attention", lambda *a: seen.append(
        (threading.current_thread().name.startswith("rows"), torch.get_num_threads())) or attention(*a))
    extra = ["--threads=2", "--max_iters=12", "--eval_interval=6", "--seed=5"]
    split, ops = tmp_path / "split", tmp_path / "ops"
    assert train.main(tiny_args(data_dir, split, *extra)) == 0
    assert "(float32, 2 threads, each batch split by rows between them)" in capsys.readouterr().out
    assert json.loads((split / "config.json").read_text())["ran_as"] == ["cpu float32 matmul=highest split=2"]
    # steps on one core in each of the two threads; evaluations on the main thread, on both cores
    assert {(True, 1), (False, 1), (False, 2)} == set(seen)
    assert torch.get_num_threads() == threads_kept
    assert train.main(tiny_args(data_dir, ops, *extra, "--thread_split=ops")) == 0
    assert "(float32, 2 threads): " in capsys.readouterr().out
    assert json.loads((ops / "config.json").read_text())["ran_as"] == ["cpu float32 matmul=highest"]
    a, b = read_metrics(split, "train"), read_metrics(ops, "train")
    assert [r["iter"] for r in a] == [r["iter"] for r in b]
    assert [r["loss"] for r in a] == pytest.approx([r["loss"] for r in b], rel=1e-4)
    # stopped half way and resumed, a split run retraces itself to the bit
    half = tmp_path / "half"
    assert train.main(tiny_args(data_dir, half, *extra[:-3], "--max_iters=7", "--eval_interval=6",
                                "--seed=5")) == 0
    assert train.main([f"--out_dir={half}", "--resume", "--max_iters=12"]) == 0
    assert untimed(half) == untimed(split)
    wa, wb = checkpoint.load(split / "ckpt.pt"), checkpoint.load(half / "ckpt.pt")
    assert all(torch.equal(wa["model"][k], wb["model"][k]) for k in wa["model"])


class Transposed(torch.nn.Module):
    """A weight stored transposed: its gradient comes back from autograd.grad in another layout."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(5, 3).t())                 # (3, 5), strides (1, 3)
        self.s = torch.nn.Parameter(torch.ones(2, 5))       # reached through a sum: its gradient an
        self.frozen = torch.nn.Parameter(torch.ones(3), requires_grad=False)   # expanded (0, 0) view

    def forward(self, x, y):
        out = (x.float() * self.frozen) @ self.w * self.s.sum()
        return None, (out - y.float()).square().mean()


def test_split_gradients_take_their_parameters_layout_and_skip_frozen_ones(threads_kept):
    model = Transposed()
    x, y = torch.randn(4, 3), torch.randn(4, 5)
    model(x, y)[1].backward()
    whole = [model.w.grad, model.s.grad]
    model.w.grad = model.s.grad = None
    split = RowSplit(model, list(model.parameters()), 2, torch.float32, flush_denormal=False)
    try:
        split.backward(x, y, 1.0)
    finally:
        split.close()
    for p, g in zip((model.w, model.s), whole):
        assert p.grad.stride() == p.stride() == g.stride()
        torch.testing.assert_close(p.grad, g)
    assert model.frozen.grad is None


def test_closing_gives_the_threads_back_when_a_ctrl_c_cuts_the_wait(threads_kept, monkeypatch):
    model = tiny_model()
    split = RowSplit(model, list(model.parameters()), 2, torch.float32, flush_denormal=False)
    assert torch.get_num_threads() == 1
    shutdown = split.pool.shutdown

    def interrupted():
        shutdown()
        raise KeyboardInterrupt
    monkeypatch.setattr(split.pool, "shutdown", interrupted)
    with pytest.raises(KeyboardInterrupt):
        split.close()
    assert torch.get_num_threads() == threads_kept


@pytest.mark.e2e
def test_a_run_saved_before_the_split_resumes_unsplit(data_dir, tmp_path):
    out = tmp_path / "run"
    assert train.main(tiny_args(data_dir, out, "--max_iters=2", "--eval_interval=2")) == 0
    ckpt = checkpoint.load(out / "ckpt.pt")
    del ckpt["train_config"]["thread_split"]
    torch.save(ckpt, out / "ckpt.pt")
    assert train.main([f"--out_dir={out}", "--resume", "--max_iters=3"]) == 0
    assert json.loads((out / "config.json").read_text())["train"]["thread_split"] == "ops"
    assert train.main([f"--out_dir={out}", "--resume", "--max_iters=4", "--thread_split=auto"]) == 0
    assert json.loads((out / "config.json").read_text())["train"]["thread_split"] == "auto"


@pytest.mark.e2e
@two_cpus
def test_a_sweep_checks_the_thread_count_its_runs_will_get(data_dir, tmp_path, capsys, monkeypatch):
    # --threads=0 goes to each run as it is, so each gets torch's count, not the CPUs over --jobs
    monkeypatch.setattr(os, "cpu_count", lambda: 2)         # --jobs=2 then gives a run 1 thread
    args = tiny_args(data_dir, tmp_path / "sw", "--max_iters=2", "--eval_interval=2", "--thread_split=batch",
                     "--jobs=2", "--sweep", "learning_rate=0.001,0.002")
    assert train.main([*args, "--threads=0"]) == (0 if torch.get_num_threads() >= 2 else 2)
    assert train.main([*args, "--threads=1"]) == 2
    assert "the run gets one CPU thread" in capsys.readouterr().err


@pytest.mark.e2e
@two_cpus
def test_the_bench_says_when_its_steps_were_split(data_dir, tmp_path, capsys, threads_kept):
    from gpt import bench
    argv = tiny_args(data_dir, tmp_path / "unused", "--bench_iters=3", "--bench_warmup=1", "--sample_tokens=2",
                     "--json")
    for threads, parts in (("--threads=2", 2), ("--threads=1", 1)):
        assert bench.main([*argv, threads]) == 0
        result = json.loads(capsys.readouterr().out)
        assert result["split_parts"] == parts
        assert ("each batch split by rows over 2 threads" in bench.format_table(result)) == (parts == 2)


@pytest.mark.e2e
@two_cpus
def test_the_start_line_names_what_the_user_chose_and_no_reason_of_auto(data_dir, tmp_path, capsys, threads_kept):
    assert train.main(tiny_args(data_dir, tmp_path / "run", "--max_iters=1", "--eval_interval=1", "--threads=2",
                                "--dropout=0.1")) == 0      # auto leaves a run with dropout unsplit
    first = capsys.readouterr().out.splitlines()[0]
    assert " parameters on cpu (float32, 2 threads): 1 step of " in first
    assert "split" not in first and "dropout" not in first
