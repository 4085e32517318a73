"""gpt/datasets.py and gpt/text_dataset.py: fetching and preparing datasets, and the prepare.py scripts (prepare_main)."""

import http.client
import json
import os
import re

import numpy as np
import pytest

from conftest import gpt2_bpe_or_skip, make_text
from gpt.errors import UserError
from gpt.datasets import ensure_prepared
from gpt.text_dataset import prepare
from gpt.tokenizers import CharTokenizer, tokenizer_from_meta


def test_prepare_round_trip(tmp_path):
    text = make_text(500) + "äé—\n"
    meta = prepare(text, tmp_path)
    tok = tokenizer_from_meta(json.loads((tmp_path / "meta.json").read_text()))
    train = np.fromfile(tmp_path / "train.bin", dtype=np.uint16)
    val = np.fromfile(tmp_path / "val.bin", dtype=np.uint16)
    assert tok.decode(train.tolist()) + tok.decode(val.tolist()) == text
    assert tok.decode(tok.encode(text)) == text
    assert meta["vocab_size"] == len(set(text)) == tok.vocab_size
    assert len(train) == int(len(text) * 0.9) and len(val) == len(text) - len(train)
    assert not list(tmp_path.glob("*.pkl"))


def test_prepare_again_gives_the_same_files(tmp_path):
    text = make_text(300)
    prepare(text, tmp_path)
    first = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    prepare(text, tmp_path)
    assert first == {p.name: p.read_bytes() for p in tmp_path.iterdir()}


def test_prepare_script_on_a_users_file(tmp_path, capsys):
    from gpt.datasets import prepare_main
    src = tmp_path / "mine.txt"
    src.write_text("hello world\n" * 50)
    assert prepare_main("shakespeare_char", ["--input", str(src), "--out_dir", str(tmp_path / "out")]) == 0
    meta = json.loads((tmp_path / "out" / "meta.json").read_text())
    assert meta["chars"] == sorted(set("hello world\n"))
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    assert prepare_main("shakespeare_char", ["--input", str(empty), "--out_dir", str(tmp_path / "e")]) == 2
    assert capsys.readouterr().err == f"error: {empty} is empty; give a text file to prepare\n"
    assert not (tmp_path / "e").exists()
    one = tmp_path / "one.txt"
    one.write_text("x")
    assert prepare_main("shakespeare_char", ["--input", str(one), "--out_dir", str(tmp_path / "e")]) == 2
    assert capsys.readouterr().err == (f"error: {one} is too short to prepare: its train and val splits would "
                                       "hold 0 and 1 tokens; give a longer text\n")
    assert not (tmp_path / "e").exists()
    # as Windows editors save it: a byte-order mark, CRLF line ends
    windows = tmp_path / "windows.txt"
    windows.write_bytes(b"\xef\xbb\xbf" + b"hello world\r\n" * 50)
    assert prepare_main("shakespeare_char", ["--input", str(windows), "--out_dir", str(tmp_path / "w")]) == 0
    assert json.loads((tmp_path / "w" / "meta.json").read_text())["chars"] == sorted(set("hello world\n"))


AWKWARD = ("\n\n\n  indented\n\u3000全角 é—\n\x1cx\n<|endoftext|>\nZ\r\n 'll\n\n'sx\n \n\t\nq\u2028\n"
           "\x85\nend.\n\n")      # blank runs, leading and Unicode spaces, a special token, non-ASCII


@pytest.mark.parametrize("tokenizer", ["char", "tiktoken"])
def test_a_text_prepared_in_small_pieces_gives_the_files_of_the_whole(tokenizer, tmp_path, monkeypatch):
    """The text is encoded piece by piece, so that a file of any size fits in memory; the ids must
    be those of each half encoded whole, wherever the pieces end (BPE: only between a character
    and a newline, as its pre-tokenizer would split anyway)."""
    from gpt import text_dataset
    if tokenizer == "tiktoken":
        enc = gpt2_bpe_or_skip().enc
        encode = lambda text: enc.encode(text, allowed_special={"<|endoftext|>"})  # noqa: E731
    else:
        encode = lambda text: [sorted(set(text)).index(c) for c in text]          # noqa: E731
    text = make_text(400) + AWKWARD * 3 + make_text(200, seed=1) + "\n\n"
    n = int(len(text) * 0.9)
    for piece in (1, 5, 64, len(text)):
        monkeypatch.setattr(text_dataset, "PIECE", piece)
        meta = prepare(text, tmp_path / str(piece), tokenizer=tokenizer)
        train, val = (np.fromfile(tmp_path / str(piece) / f"{s}.bin", dtype=np.uint16).tolist()
                      for s in ("train", "val"))
        if tokenizer == "char":
            assert meta["chars"] == sorted(set(text))
            assert train == encode(text)[:n] and val == encode(text)[n:]
        else:
            assert train == encode(text[:n]) and val == encode(text[n:])
        assert (meta["train_tokens"], meta["val_tokens"]) == (len(train), len(val))


def test_a_text_file_is_prepared_without_holding_it_in_memory(tmp_path, monkeypatch):
    import tracemalloc
    from gpt import text_dataset
    from gpt.text_dataset import prepare_file
    src = tmp_path / "big.txt"
    src.write_bytes(("hello wörld\r\n" * 200_000).encode())     # 2.6 MB; CRLF read as \n
    monkeypatch.setattr(text_dataset, "PIECE", 1 << 14)
    tracemalloc.start()
    try:
        meta = prepare_file(src, tmp_path / "out")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert meta["chars"] == sorted(set("hello wörld\n"))
    assert meta["train_tokens"] + meta["val_tokens"] == 12 * 200_000
    assert peak < 1_000_000, f"{peak:,} bytes held while preparing a 2.6 MB file"


@pytest.mark.parametrize("content, byte", [
    (b"abcdefgh\xd8", 8),                   # past the first piece
    ("é—".encode() * 5 + b"\xff", 25),     # after characters of several bytes
    (b"ab\xc3", 2),                         # a character cut off at the end
])
def test_a_file_that_is_not_utf8_is_named_with_its_first_bad_byte(content, byte, tmp_path, monkeypatch):
    from gpt import text_dataset
    monkeypatch.setattr(text_dataset, "PIECE", 3)
    (tmp_path / "bad.txt").write_bytes(content)
    with pytest.raises(UserError, match=rf"bad.txt is not UTF-8 text \(byte {byte}\); convert it"):
        text_dataset.prepare_file(tmp_path / "bad.txt", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_users_file_never_replaces_the_shipped_dataset(tmp_path, capsys, monkeypatch):
    from gpt import datasets
    monkeypatch.setattr(datasets, "__file__", str(tmp_path / "gpt" / "datasets.py"))    # the shipped folder
    shipped = tmp_path / "data" / "shakespeare_char"
    shipped.mkdir(parents=True)
    (shipped / "input.txt").write_text("to be or not to be\n" * 20)
    assert datasets.prepare_main("shakespeare_char", []) == 0
    before = {p.name: p.read_bytes() for p in shipped.iterdir()}
    src = tmp_path / "mine.txt"
    src.write_text("hello world\n" * 50)
    assert datasets.prepare_main("shakespeare_char", ["--input", str(src)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --input needs --out_dir: ") and err.count("\n") == 1
    assert datasets.prepare_main("shakespeare_char", ["--input", str(src), "--out_dir="]) == 2     # an unset $OUT
    assert capsys.readouterr().err == "error: --out_dir is empty; give the folder the dataset goes into\n"
    mine = tmp_path / "data" / "mine"       # an unset $FILE, which would have fetched Tiny Shakespeare
    assert datasets.prepare_main("shakespeare_char", ["--input=", "--out_dir", str(mine)]) == 2
    assert capsys.readouterr().err == "error: --input is empty; give the text file to prepare\n"
    assert not mine.exists()
    assert before == {p.name: p.read_bytes() for p in shipped.iterdir()}


@pytest.mark.parametrize("case, message", [
    ("folder_as_input", "cannot be read (Is a directory); give a text file"),
    ("not_utf8", "is not UTF-8 text (byte 1); convert it"),
    ("file_as_out_dir", "cannot be made a folder (File exists); pick another --out_dir"),
])
def test_prepare_script_names_bad_paths_in_one_line(case, message, tmp_path, capsys):
    from gpt.datasets import prepare_main
    src, out = tmp_path / "mine.txt", tmp_path / "out"
    src.write_text("hello world\n" * 50)
    if case == "folder_as_input":
        src = tmp_path
    elif case == "not_utf8":
        src.write_bytes(b"a\xd8b")
    else:
        out = src
    assert prepare_main("shakespeare_char", ["--input", str(src), "--out_dir", str(out)]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.splitlines()) == 1


def test_bpe_prepare_round_trip(tmp_path, monkeypatch):
    gpt2_bpe_or_skip()
    text = make_text(300)
    prepare(text, tmp_path, tokenizer="tiktoken")
    tok = tokenizer_from_meta(json.loads((tmp_path / "meta.json").read_text()))
    ids = np.concatenate([np.fromfile(tmp_path / f"{s}.bin", dtype=np.uint16) for s in ("train", "val")])
    assert tok.vocab_size == 50257
    assert tok.decode(ids.tolist()) == text


def test_missing_dataset_says_what_to_do(tmp_path):
    with pytest.raises(UserError, match=r"dataset 'mine' is not prepared: .*prepare.py --input FILE"):
        ensure_prepared(str(tmp_path), "mine")


@pytest.mark.parametrize("failure", [OSError("no network"), http.client.IncompleteRead(b"First Citizen")])
def test_download_failure_says_where_to_put_the_file(failure, tmp_path, monkeypatch):
    import urllib.request

    def offline(*a, **k):
        raise failure
    monkeypatch.setattr(urllib.request, "urlopen", offline)
    monkeypatch.chdir(tmp_path)         # a relative data_dir: the message names the folder in full
    with pytest.raises(UserError, match=r"put the file from https://\S+ at "
                                        + re.escape(f"{tmp_path}/data/shakespeare_char/input.txt and")):
        ensure_prepared("data", "shakespeare_char")


def test_a_shipped_dataset_copies_its_text_from_a_twin_of_the_same_source(tmp_path, monkeypatch, capsys):
    import urllib.request
    from gpt.datasets import DATASETS, fetch_text

    def offline(*a, **k):
        raise OSError("no network")
    monkeypatch.setattr(urllib.request, "urlopen", offline)
    url = DATASETS["shakespeare"].url
    (tmp_path / "shakespeare_char").mkdir()
    (tmp_path / "shakespeare_char" / "input.txt").write_text("First Citizen:\n")
    fetch_text(tmp_path / "shakespeare" / "input.txt", url)
    assert (tmp_path / "shakespeare" / "input.txt").read_text() == "First Citizen:\n"
    assert "copying" in capsys.readouterr().out
    with pytest.raises(UserError, match="could not download the text"):    # no twin: a download
        fetch_text(tmp_path / "other" / "shakespeare" / "input.txt", url)


def test_a_failed_write_leaves_the_old_dataset_whole_and_no_temporary_file(data_dir, monkeypatch):
    from pathlib import Path
    folder = data_dir / "tiny"
    before = {p.name: p.read_bytes() for p in folder.iterdir()}

    def full_disk(self, *args, **kwargs):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(Path, "write_text", full_disk)      # meta.json, the last file written
    with pytest.raises(UserError, match=r"cannot write the dataset into .*tiny \(No space left on device\)"):
        prepare("hello world\n" * 50, folder)
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before


@pytest.mark.parametrize("tokenizer, new_text", [
    ("char", "abcz\n" * 100),         # a character the first pass did not see
    ("char", "abc\n" * 30),           # shorter: the split would be wrong
    ("char", "cba\n" * 100),          # the same size and characters
    ("tiktoken", "abc\n" * 30),
    ("char", None),                   # deleted
])
def test_a_file_that_changes_while_it_is_prepared_is_refused(tokenizer, new_text, tmp_path, monkeypatch):
    from gpt import text_dataset
    if tokenizer == "tiktoken":
        gpt2_bpe_or_skip()
    src = tmp_path / "a.txt"
    src.write_text("abc\n" * 100)
    os.utime(src, ns=(0, 0))
    read, passes = text_dataset.text_pieces, []

    def pieces(path):
        passes.append(path)
        if len(passes) == 2:        # between learning the characters and encoding them
            if new_text is not None:
                path.write_text(new_text)
        yield from read(path)
        if new_text is None and len(passes) == 2:
            path.unlink()
    monkeypatch.setattr(text_dataset, "text_pieces", pieces)
    with pytest.raises(UserError, match=r"^the text changed while it was being prepared; prepare it again$"):
        text_dataset.prepare_file(src, tmp_path / "out", tokenizer=tokenizer)
    assert not (tmp_path / "out").exists()        # the folder it made is gone again


def test_a_pipe_is_read_once(tmp_path):
    """--input /dev/stdin or <(command): a second read would find nothing."""
    import threading
    from gpt.text_dataset import prepare_file
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    text = make_text(300)
    writer = threading.Thread(target=fifo.write_text, args=(text,))
    writer.start()
    meta = prepare_file(fifo, tmp_path / "out")
    writer.join()
    ids = np.concatenate([np.fromfile(tmp_path / "out" / f"{s}.bin", dtype=np.uint16) for s in ("train", "val")])
    assert CharTokenizer(meta["chars"]).decode(ids.tolist()) == text
    assert meta["val_tokens"] == len(text) - int(len(text) * 0.9)


def test_a_download_that_cannot_be_written_says_so_and_leaves_no_part_file(tmp_path, monkeypatch, http_server):
    from gpt import datasets
    url = http_server({"/input.txt": b"First Citizen:\n"}) + "/input.txt"
    real_replace = os.replace

    def full(src, dst):
        if str(src).endswith(tuple("0123456789abcdef")) and ".part" in str(src):
            raise OSError(28, "No space left on device")
        real_replace(src, dst)
    monkeypatch.setattr(os, "replace", full)
    with pytest.raises(UserError, match=r"^cannot write the downloaded text to .*input.txt \(No space left on device\)$"):
        datasets.fetch_text(tmp_path / "input.txt", url)
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "file").write_text("")          # a folder that is a file
    with pytest.raises(UserError, match=r"^cannot write the downloaded text to .*file/input.txt \("):
        datasets.fetch_text(tmp_path / "file" / "input.txt", url)


def test_two_preparers_of_one_folder_with_the_same_pid_do_not_share_temporary_files(tmp_path, monkeypatch):
    """The first process of each machine of a torchrun prepares the data, maybe on a shared disk,
    where two of them can have the same process id."""
    from gpt import text_dataset
    src = tmp_path / "a.txt"
    src.write_text(make_text(300))
    read, passes = text_dataset.text_pieces, []

    def pieces(path):
        passes.append(path)
        if len(passes) == 2:        # the first preparer is encoding: a second one runs meanwhile
            text_dataset.prepare_file(src, tmp_path / "out")
        yield from read(path)
    monkeypatch.setattr(text_dataset, "text_pieces", pieces)
    monkeypatch.setattr(os, "getpid", lambda: 4242)
    meta = text_dataset.prepare_file(src, tmp_path / "out")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["meta.json", "train.bin", "val.bin"]
    ids = np.concatenate([np.fromfile(tmp_path / "out" / f"{s}.bin", dtype=np.uint16) for s in ("train", "val")])
    assert CharTokenizer(meta["chars"]).decode(ids.tolist()) == src.read_text()


def test_prepare_refuses_to_replace_a_dataset_made_from_other_text(tmp_path, capsys):
    from gpt import datasets
    out = tmp_path / "mine"
    first, second = tmp_path / "a.txt", tmp_path / "b.txt"
    first.write_text("to be or not to be\n" * 30)
    second.write_text("hello world\n" * 50)
    assert datasets.prepare_main("shakespeare_char", ["--input", str(first), "--out_dir", str(out)]) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert datasets.prepare_main("shakespeare_char", ["--input", str(first), "--out_dir", str(out)]) == 0   # again
    capsys.readouterr()
    assert datasets.prepare_main("shakespeare_char", ["--input", str(second), "--out_dir", str(out)]) == 2
    assert capsys.readouterr().err == (f"error: {out} holds a dataset prepared from other text, which runs may "
                                       "have trained on; give --overwrite to replace it, or another --out_dir\n")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before      # no temporary file left either
    assert datasets.prepare_main("shakespeare_char", ["--input", str(second), "--out_dir", str(out), "--overwrite"]) == 0
    assert json.loads((out / "meta.json").read_text())["vocab_size"] == len(set("hello world\n"))
    # the same text again, over a meta.json an older version laid out otherwise, is the same dataset
    meta = json.loads((out / "meta.json").read_text())
    (out / "meta.json").write_text(json.dumps(meta))
    assert datasets.prepare_main("shakespeare_char", ["--input", str(second), "--out_dir", str(out)]) == 0


def test_a_download_shows_its_progress_in_a_log_as_plain_lines(tmp_path, monkeypatch, http_server, capsys):
    from gpt import datasets, progress
    text = make_text(60000).encode()
    url = http_server({"/input.txt": text}) + "/input.txt"
    ticks = iter(range(0, 10**6, 20))           # a clock 20 s on at each reading
    monkeypatch.setattr(progress, "clock", lambda: next(ticks))
    datasets.fetch_text(tmp_path / "input.txt", url)
    assert (tmp_path / "input.txt").read_bytes() == text
    lines = capsys.readouterr().err.splitlines()
    # a line once 30 s of the clock have passed since the last, and one at the end
    assert len(lines) >= 2 and all(line.startswith("downloading input.txt: ") for line in lines)
    assert re.match(r"downloading input.txt: 100% (\S+)/\1 B \[", lines[-1]) and "\r" not in "".join(lines)
