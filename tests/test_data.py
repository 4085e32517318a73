"""gpt/data.py: meta.json as read (load_meta) and the batches drawn from a prepared dataset."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from gpt.config import REPO_ROOT
from gpt.errors import UserError
from gpt.data import Batches
from gpt.text_dataset import prepare


@pytest.mark.e2e
def test_meta_json_is_utf8_whatever_the_locale(tmp_path):
    """A vocabulary of non-ASCII characters survives a machine whose locale is not UTF-8."""
    code = ("import sys; from pathlib import Path; from gpt.data import load_meta; from gpt.text_dataset import prepare; "
            "text = 'h\\u00e9llo \\u2014 \\u2603 '; out = Path(sys.argv[1]); prepare(text * 50, out); "
            "assert load_meta(out)['chars'] == sorted(set(text)); print('ok')")     # ASCII: the C locale's argv
    env = {**os.environ, "LC_ALL": "C", "PYTHONCOERCECLOCALE": "0", "PYTHONUTF8": "0"}
    proc = subprocess.run([sys.executable, "-X", "utf8=0", "-c", code, str(tmp_path)], env=env,
                          capture_output=True, text=True, cwd=REPO_ROOT, encoding="utf-8")
    assert proc.stdout == "ok\n", proc.stderr
    assert json.loads((tmp_path / "meta.json").read_bytes().decode("utf-8"))["chars"][-1] == "☃"


@pytest.mark.parametrize("meta", [
    {"tokenizer": "tiktoken", "vocab_size": 50257},                                   # no encoding
    {"tokenizer": "char", "vocab_size": 2, "chars": ["a", "a"]},                      # not distinct
    {"tokenizer": "char", "vocab_size": 2, "chars": ["a", "bc"]},                     # not one character
    {"tokenizer": "char", "chars": ["a", "b"]},                                       # no vocab_size
])
def test_an_incomplete_meta_json_is_refused_where_it_is_read(meta, tmp_path):
    from gpt.data import load_meta
    (tmp_path / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(UserError, match=r"meta.json is not a valid dataset description"):
        load_meta(tmp_path)


def test_batches_are_shifted_windows_and_reproducible(data_dir):
    b1 = Batches(data_dir / "tiny", 16, 4, "cpu", seed=3)
    b2 = Batches(data_dir / "tiny", 16, 4, "cpu", seed=3)
    x1, y1 = b1.draw("train", 2)
    x2, y2 = b2.draw("train", 2)
    assert x1.shape == y1.shape == (2, 4, 16)
    assert torch.equal(x1, x2) and torch.equal(y1, y2)
    assert torch.equal(x1[..., 1:], y1[..., :-1])           # y is x shifted by one token
    train = torch.from_numpy(np.fromfile(data_dir / "tiny" / "train.bin", dtype=np.uint16).astype(np.int64))
    row = x1[0, 0]
    starts = [i for i in range(len(train) - 16) if torch.equal(train[i:i + 16], row)]
    assert starts, "every row is a window of the training tokens"
    state = b1.state()
    x3, _ = b1.draw("train", 1)
    b1.set_state(state)
    assert torch.equal(b1.draw("train", 1)[0], x3)


def test_evaluation_windows_run_from_the_start_of_the_split_to_its_end(data_dir):
    val = np.fromfile(data_dir / "tiny" / "val.bin", dtype=np.uint16).astype(np.int64)
    x, y = Batches(data_dir / "tiny", 16, 4, "cpu", seed=3).evenly_spaced("val", 3, 4)    # 12 windows
    starts = np.linspace(0, len(val) - 17, 12).astype(np.int64)
    assert starts[-1] - starts[0] > 0.9 * len(val)
    for row, start in zip(x.reshape(12, 16).tolist(), starts):
        assert row == val[start:start + 16].tolist()
    assert y.reshape(12, 16)[-1].tolist() == val[-16:].tolist()      # the last window ends the split


def test_block_size_longer_than_the_data(tmp_path):
    prepare("abcdefghij" * 3, tmp_path)
    with pytest.raises(UserError, match=r"val split .* has 3 tokens, too few for block_size=16"):
        Batches(tmp_path, 16, 2, "cpu", 0)


def test_a_split_of_block_size_plus_one_tokens_has_its_one_window(tmp_path):
    prepare("abcdefghij" * 3, tmp_path)         # 27 train tokens, 3 val tokens: "hij"
    batches = Batches(tmp_path, 2, 4, "cpu", 0)
    x, y = batches.evenly_spaced("val", 1, 4)
    assert x.tolist() == [[[7, 8]] * 4] and y.tolist() == [[[8, 9]] * 4]
    with pytest.raises(UserError, match="has 3 tokens, too few for block_size=3"):
        Batches(tmp_path, 3, 4, "cpu", 0)


def test_a_split_file_that_is_a_folder_is_named(data_dir, tmp_path):
    (data_dir / "tiny" / "val.bin").unlink()
    (data_dir / "tiny" / "val.bin").mkdir()
    before = {p.name: p.read_bytes() for p in (data_dir / "tiny").iterdir() if p.is_file()}
    for attempt in (lambda: Batches(data_dir / "tiny", 16, 4, "cpu", seed=3),
                    lambda: prepare("hello world\n" * 50, data_dir / "tiny")):
        with pytest.raises(UserError, match="val.bin is not a file; remove it and prepare the dataset again"):
            attempt()
    # nothing half-written: the other files are as they were, and no temporary file is left
    assert {p.name: p.read_bytes() for p in (data_dir / "tiny").iterdir() if p.is_file()} == before
