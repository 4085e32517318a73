"""gpt/evaluate.py: python -m gpt.evaluate, the whole split scored in strided windows."""

import dataclasses
import json
import math
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from conftest import ROOT
from gpt import checkpoint
from gpt.config import GPTConfig, TrainConfig
from gpt.data import load_meta
from gpt.evaluate import main, score, windows
from gpt.model import GPT

pytestmark = pytest.mark.usefixtures("one_thread")     # conftest.py


def wide_model(vocab_size: int, block_size: int, seed: int = 0) -> GPT:
    """A tiny untrained model whose weights are wide enough that context changes its predictions."""
    torch.manual_seed(seed)
    model = GPT(GPTConfig(vocab_size=vocab_size, block_size=block_size, n_layer=2, n_head=2, n_embd=16))
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3)
    return model.eval()


def save_run(out, data_dir, model: GPT, meta: dict, name: str = "ckpt_best.pt", dataset: str = "tiny"):
    out.mkdir(exist_ok=True)
    checkpoint.save({"model": model.state_dict(), "model_config": dataclasses.asdict(model.config),
                     "train_config": dataclasses.asdict(TrainConfig(data_dir=str(data_dir), dataset=dataset)),
                     "meta": meta}, out / name)
    return out


@pytest.fixture
def run(data_dir, tmp_path):
    """(run folder, its model, the val ids) of an untrained tiny model of block_size 16 on 'tiny'."""
    meta = load_meta(data_dir / "tiny")
    model = wide_model(meta["vocab_size"], 16)
    ids = np.fromfile(data_dir / "tiny" / "val.bin", dtype=np.uint16)
    return save_run(tmp_path / "run", data_dir, model, meta), model, ids


def per_token(model, x: list[int], y: list[int]) -> torch.Tensor:
    with torch.no_grad():
        logits, _ = model(torch.tensor([x]))
    return F.cross_entropy(logits[0].double(), torch.tensor(y), reduction="none")


def json_of(capsys, argv) -> dict:
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert len(out.splitlines()) == 1
    return json.loads(out)


def error_of(capsys, argv) -> str:
    assert main(argv) == 2
    said = capsys.readouterr()
    assert said.out == "" and said.err.startswith("error: ") and said.err.count("\n") == 1
    return said.err


# ---------------------------------------------------------------- the windows

@pytest.mark.parametrize("n,block,stride", [(50, 8, 3), (50, 8, 8), (49, 8, 8), (57, 8, 8), (41, 8, 4),
                                            (9, 8, 3), (5, 8, 3), (2, 8, 8), (50, 8, 1), (1000, 16, 7)])
def test_the_windows_score_every_target_once_each_with_its_windows_context(n, block, stride):
    starts, first, T = windows(n, block, stride)
    assert T == min(block, n - 1) and starts[0] == 0 and first[0] == 0
    assert starts[-1] + T == n - 1                                  # the last ends at the split's end
    scored = np.concatenate([np.arange(s + f + 1, s + T + 1) for s, f in zip(starts, first)])
    assert scored.tolist() == list(range(1, n))
    if T == block:  # every token scored after the first window sees at least block - stride others
        assert all(f >= block - stride for f in first[1:])


def test_stride_of_block_size_matches_the_plain_sum_over_side_by_side_windows(run):
    _, model, ids = run
    T, n = 16, len(ids)
    assert (n - 1) % T, "the last window should overlap the one before it"
    total, count = 0.0, 0
    for start in range(0, n - T, T):
        window = ids[start:start + T + 1].tolist()
        total += per_token(model, window[:-1], window[1:]).sum().item()
        count += T
    last = ids[n - 1 - T:].tolist()                                 # ends at the split's end,
    left = n - 1 - count                                            # scoring what is left
    total += per_token(model, last[:-1], last[1:])[-left:].sum().item()
    got, tokens = score(model, ids, 0, batch_size=5)
    assert tokens == n - 1
    assert got / tokens == pytest.approx(total / (n - 1), abs=1e-5)


@pytest.mark.parametrize("n,stride", [(50, 3), (50, 8), (6, 3), (41, 4)])
def test_each_target_is_scored_with_the_context_its_window_gives_it(n, stride):
    block = 8
    model = wide_model(13, block, seed=1)
    ids = np.random.default_rng(0).integers(0, 13, n).astype(np.uint16)
    # the windows, as the docs say, written out: the first scores all its targets, each next one,
    # stride further on, its last stride, and one ending at the split's end what is left
    context_start = {}
    start, end = 0, min(block, n - 1)
    for i in range(1, end + 1):
        context_start[i] = 0
    while end < n - 1:
        start = min(start + stride, n - 1 - block)
        for i in range(end + 1, start + block + 1):
            assert i not in context_start
            context_start[i] = start
        end = start + block
    assert sorted(context_start) == list(range(1, n))
    reference = sum(per_token(model, ids[context_start[i]:i].tolist(), ids[context_start[i] + 1:i + 1].tolist())[-1].item()
                    for i in range(1, n))
    for batch_size in (1, 4, 64):
        got, tokens = score(model, ids, stride, batch_size)
        assert tokens == n - 1
        assert got == pytest.approx(reference, rel=1e-5)


def test_the_stride_changes_the_context_tokens_are_scored_with(run):
    _, model, ids = run
    assert score(model, ids, 4)[0] != pytest.approx(score(model, ids, 16)[0], rel=1e-9)


# ---------------------------------------------------------------- the command

def test_the_plain_report_names_the_split_tokens_loss_bpc_and_perplexity(run, data_dir, capsys):
    out, model, ids = run
    assert main([f"--out_dir={out}", "--stride=4", "--device=cpu"]) == 0
    said = capsys.readouterr()
    total, tokens = score(model, ids, 4)
    loss = total / tokens
    assert said.out == (f"val split of {data_dir / 'tiny'}: {len(ids) - 1:,} tokens scored in windows of 16, "
                        f"stride 4\nloss {loss:.4f} nats, {loss / math.log(2):.4f} bpc, perplexity "
                        f"{math.exp(loss):.2f}\n")


def test_json_is_one_object_alone_on_stdout(run, capsys):
    out, model, ids = run
    result = json_of(capsys, [f"--out_dir={out}", "--json", "--batch_size=3"])
    assert list(result) == ["split", "tokens", "loss", "bpc", "perplexity"]
    assert result["split"] == "val" and result["tokens"] == len(ids) - 1
    assert result["loss"] == pytest.approx(score(model, ids, 0)[0] / (len(ids) - 1), rel=1e-6)
    assert result["bpc"] == pytest.approx(result["loss"] / math.log(2), rel=1e-12)
    assert result["perplexity"] == pytest.approx(math.exp(result["loss"]), rel=1e-12)


def test_bpe_data_has_no_bpc_and_needs_no_bpe_files(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "empty"))    # nothing may be decoded
    meta = {"tokenizer": "tiktoken", "vocab_size": 50, "encoding": "gpt2"}
    folder = tmp_path / "data" / "bpe"
    folder.mkdir(parents=True)
    (folder / "meta.json").write_text(json.dumps(meta))
    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        rng.integers(0, 50, 100).astype(np.uint16).tofile(folder / f"{split}.bin")
    out = save_run(tmp_path / "run", tmp_path / "data", wide_model(50, 8), meta, dataset="bpe")
    result = json_of(capsys, [f"--out_dir={out}", "--json"])
    assert result["tokens"] == 99 and result["bpc"] is None
    assert main([f"--out_dir={out}"]) == 0
    assert capsys.readouterr().out.splitlines()[1].startswith(f"loss {result['loss']:.4f} nats, perplexity ")


def test_the_test_split_is_scored_where_there_is_one_and_refused_where_not(run, data_dir, capsys):
    out, model, ids = run
    err = error_of(capsys, [f"--out_dir={out}", "--split=test"])
    assert err == (f"error: {data_dir / 'tiny'} has no test.bin: this dataset has no test split; "
                   "give --split=val\n")
    ids[:300][::-1].tofile(data_dir / "tiny" / "test.bin")
    result = json_of(capsys, [f"--out_dir={out}", "--split=test", "--json"])
    assert result["split"] == "test" and result["tokens"] == 299
    assert result["loss"] == pytest.approx(score(model, ids[:300][::-1].copy(), 0)[0] / 299, rel=1e-6)


def test_the_checkpoint_is_the_best_one_unless_asked(run, tmp_path, capsys, data_dir):
    out, model, ids = run
    shutil.move(out / "ckpt_best.pt", out / "ckpt.pt")
    assert error_of(capsys, [f"--out_dir={out}"]) == (
        f"error: {out / 'ckpt_best.pt'} does not exist (no evaluation since iteration 0 has scored better than "
        "the untrained model did, or it could not be written); --ckpt=latest evaluates ckpt.pt\n")
    assert json_of(capsys, [f"--out_dir={out}", "--ckpt=latest", "--json"])["tokens"] == len(ids) - 1


def test_another_data_dir_is_read_and_checked_against_the_runs_vocabulary(run, tmp_path, capsys, data_dir):
    out, _, ids = run
    moved = tmp_path / "elsewhere"
    shutil.copytree(data_dir, moved)
    shutil.rmtree(data_dir)
    assert "give --data_dir=FOLDER holding it" in error_of(capsys, [f"--out_dir={out}"])
    assert json_of(capsys, [f"--out_dir={out}", f"--data_dir={moved}", "--json"])["tokens"] == len(ids) - 1
    meta = json.loads((moved / "tiny" / "meta.json").read_text())
    meta["chars"] = meta["chars"][::-1]
    (moved / "tiny" / "meta.json").write_text(json.dumps(meta))
    assert "is not the run's" in error_of(capsys, [f"--out_dir={out}", f"--data_dir={moved}"])


@pytest.mark.parametrize("argv,message", [
    (["--stride=-1"], "error: stride=-1 must not be negative; give 1 to block_size, or 0 for block_size\n"),
    (["--stride=17"], "error: stride=17 is more than the model's block_size=16: tokens between windows would "
                      "go unscored; give --stride from 1 to 16 (0 means 16)\n"),
    (["--stride=two"], "error: stride='two' is not a valid int; give a whole number\n"),
    (["--batch_size=0"], "error: batch_size=0 must be positive\n"),
    (["--split=train"], "error: split='train' is not allowed; choose one of val, test\n"),
    (["--out_dir="], "error: out_dir is empty; give a folder name\n"),
    (["--bogus=1"], "error: unknown option --bogus; see --help for the list\n"),
])
def test_bad_values_are_one_line_each(run, capsys, argv, message):
    out, _, _ = run
    assert error_of(capsys, [f"--out_dir={out}", *argv]) == message


def test_a_folder_without_a_run_and_a_split_too_short_are_one_line_each(run, tmp_path, capsys, data_dir):
    out, _, _ = run
    assert error_of(capsys, [f"--out_dir={tmp_path / 'nothing'}"]).startswith(
        f"error: no checkpoint at {tmp_path / 'nothing' / 'ckpt_best.pt'}; train first")
    np.zeros(1, np.uint16).tofile(data_dir / "tiny" / "test.bin")
    assert error_of(capsys, [f"--out_dir={out}", "--split=test"]) == (
        f"error: {data_dir / 'tiny' / 'test.bin'} holds 1 token; scoring needs at least 2\n")


def test_help_lists_the_options(capsys):
    assert main(["--help"]) == 0
    said = capsys.readouterr().out
    assert said.startswith("usage: python -m gpt.evaluate [--name=value ...]\n")
    for option in ("--out_dir=out", "--ckpt=best", "--split=val", "--stride=0", "--batch_size=64",
                   "--data_dir=''", "--device=auto", "--json=false"):
        assert option in said


@pytest.mark.e2e
def test_runs_as_a_module_with_only_the_json_on_stdout(run):
    out, _, ids = run
    done = subprocess.run([sys.executable, "-m", "gpt.evaluate", f"--out_dir={out}", "--json", "--stride=8"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["tokens"] == len(ids) - 1 and done.stdout.count("\n") == 1
