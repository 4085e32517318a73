"""gpt/datasets.py for enwik8 and text8: zips fetched (over a loopback server), checked, cut into
train, val and test. The datasets here are small variants: their definitions' size and split are
fields, made small, and the real 100 MB files are never needed."""

import dataclasses
import io
import json
import zipfile

import numpy as np
import pytest

import sample
import train
from conftest import tiny_args
from gpt import datasets
from gpt.errors import UserError
from gpt.tokenizers import tokenizer_from_meta

TEXT8 = b" anarchism originated as a term of abuse first used against early working class radicals"


def zipped(name: str, data: bytes) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr(name, data)
    return buffer.getvalue()


@pytest.fixture
def small(monkeypatch):
    """enwik8 and text8 cut down to len(data) bytes, their last 10% val and test."""
    def define(name: str, size: int) -> None:
        split = (size - 2 * (size // 10), size // 10)
        monkeypatch.setitem(datasets.DATASETS, name, dataclasses.replace(
            datasets.DATASETS[name], size=size, split=split))
    return define


def enwik8_bytes(n: int = 2000) -> bytes:
    """XML-like text with multi-byte characters and a few bytes that are not UTF-8 at all."""
    text = ("<page><title>Zürich</title><text>東京 & naïve ")
    data = (text.encode() * (n // len(text.encode()) + 1))[:n - 3] + b"\xff\xfe\x80"
    assert len(data) == n
    return data


def files_of(folder):
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def test_enwik8_is_cut_in_order_into_train_val_and_test_as_bytes(tmp_path, small, http_server, capsys):
    data = enwik8_bytes()
    small("enwik8", len(data))
    url = http_server({"/enwik8.zip": zipped("enwik8", data)}) + "/enwik8.zip"
    folder = datasets.ensure_prepared(str(tmp_path), "enwik8", url)
    assert files_of(folder) == ["enwik8.zip", "meta.json", "test.bin", "train.bin", "val.bin"]
    ids = {s: np.fromfile(folder / f"{s}.bin", dtype=np.uint16) for s in ("train", "val", "test")}
    assert bytes(ids["train"].astype(np.uint8)) == data[:1600]
    assert bytes(ids["val"].astype(np.uint8)) == data[1600:1800]
    assert bytes(ids["test"].astype(np.uint8)) == data[1800:]
    meta = json.loads((folder / "meta.json").read_text())
    assert meta == {"tokenizer": "byte", "vocab_size": 256, "train_tokens": 1600, "val_tokens": 200,
                    "test_tokens": 200}
    assert "prepared" in capsys.readouterr().out
    # the bytes that are not UTF-8 decode, marked
    assert tokenizer_from_meta(meta).decode(ids["test"][-3:].tolist()) == "\ufffd" * 3


def test_text8_has_its_fixed_alphabet_whatever_the_text_holds(tmp_path, small, http_server):
    small("text8", len(TEXT8))
    url = http_server({"/t.zip": zipped("text8", TEXT8)}) + "/t.zip"
    folder = datasets.ensure_prepared(str(tmp_path), "text8", url)
    meta = json.loads((folder / "meta.json").read_text())
    assert meta["tokenizer"] == "char" and meta["chars"] == list(" abcdefghijklmnopqrstuvwxyz")
    assert not {"j", "q", "z"} & set(TEXT8.decode())        # letters the text lacks are in it too
    tok = tokenizer_from_meta(meta)
    ids = np.concatenate([np.fromfile(folder / f"{s}.bin", dtype=np.uint16) for s in ("train", "val", "test")])
    assert tok.decode(ids.tolist()) == TEXT8.decode()


def test_a_mirror_or_a_local_copy_is_named_with_data_url(tmp_path, small):
    data = enwik8_bytes()
    small("enwik8", len(data))
    copy = tmp_path / "copy.zip"
    copy.write_bytes(zipped("enwik8", data))
    folder = datasets.ensure_prepared(str(tmp_path / "data"), "enwik8", copy.as_uri())
    assert np.fromfile(folder / "train.bin", dtype=np.uint16).size == 1600


@pytest.mark.parametrize("case, message", [
    ("truncated", r"enwik8.zip is not a whole zip file \(File is not a zip file\)"),
    ("corrupt", r"enwik8.zip is not a whole zip file \((Bad CRC-32|Error -3)"),
    ("member", r"enwik8.zip holds no file named enwik8 \(it holds enwik9\)"),
    ("size", r"enwik8 in .*enwik8.zip is 1,999 bytes, not 2,000: it is not enwik8"),
])
def test_a_bad_download_is_refused_removed_and_leaves_nothing_half_written(case, message, tmp_path, small,
                                                                              http_server):
    data = enwik8_bytes()
    small("enwik8", len(data))
    good = zipped("enwik8", data)
    body = {"truncated": good[:len(good) // 2],
            "corrupt": good[:40] + bytes(b ^ 0x55 for b in good[40:60]) + good[60:],   # compressed bytes
            "member": zipped("enwik9", data),
            "size": zipped("enwik8", data[:-1])}[case]
    url = http_server({"/enwik8.zip": body}) + "/enwik8.zip"
    with pytest.raises(UserError, match=message + r".*; the download from .* was removed: run again to "
                                        r"download it anew, or give --data_url=URL of a good copy$"):
        datasets.ensure_prepared(str(tmp_path), "enwik8", url)
    assert files_of(tmp_path / "enwik8") == []


def test_a_zip_put_there_by_hand_is_kept_and_named(tmp_path, small):
    data = enwik8_bytes()
    small("enwik8", len(data))
    (tmp_path / "enwik8").mkdir()
    (tmp_path / "enwik8" / "enwik8.zip").write_bytes(zipped("enwik8", data[:-5]))
    with pytest.raises(UserError, match=r"is 1,995 bytes, not 2,000: it is not enwik8; delete .*enwik8.zip "
                                        r"to download it again, or give --data_url=URL of a good copy$"):
        datasets.ensure_prepared(str(tmp_path), "enwik8")
    assert files_of(tmp_path / "enwik8") == ["enwik8.zip"]


def test_text8_with_a_character_outside_its_alphabet_is_refused_where_it_is(tmp_path, small, http_server):
    data = TEXT8[:30] + b"E" + TEXT8[31:]
    small("text8", len(data))
    url = http_server({"/t.zip": zipped("text8", data)}) + "/t.zip"
    with pytest.raises(UserError, match=r"^text8 holds the byte b'E' at offset 30, outside its alphabet "
                                        r"\(' abcdefghijklmnopqrstuvwxyz'\); the download"):
        datasets.ensure_prepared(str(tmp_path), "text8", url)
    assert files_of(tmp_path / "text8") == []


def test_an_unreachable_data_url_is_one_line(tmp_path, http_server):
    url = http_server({}) + "/nothing.zip"          # 404
    with pytest.raises(UserError, match=r"^could not download enwik8.zip \(HTTPError: HTTP Error 404: Not "
                                        r"Found\); put the file from .*nothing.zip at .*enwik8.zip and run "
                                        r"again, or give --data_url=URL of a copy$"):
        datasets.ensure_prepared(str(tmp_path), "enwik8", url)
    with pytest.raises(UserError, match=r"^could not download enwik8.zip \(ValueError: unknown url type"):
        datasets.ensure_prepared(str(tmp_path), "enwik8", "mirror.example/enwik8.zip")
    assert files_of(tmp_path / "enwik8") == []


@pytest.mark.e2e
def test_a_byte_model_trains_from_data_url_and_samples_what_is_not_utf8(tmp_path, small, http_server, capsys):
    data = enwik8_bytes(4000)
    small("enwik8", len(data))
    url = http_server({"/e.zip": zipped("enwik8", data)}) + "/e.zip"
    out = tmp_path / "run"
    args = tiny_args(tmp_path / "data", out, "--max_iters=20", "--eval_interval=10", f"--data_url={url}")
    args[1] = "--dataset=enwik8"
    assert train.main(args) == 0        # downloads and prepares the data first
    (tmp_path / "data" / "enwik8" / "test.bin").write_bytes(b"odd")    # training never reads it
    assert train.main([*args, "--overwrite=true"]) == 0
    assert json.loads((out / "config.json").read_text())["train"]["data_url"] == url
    capsys.readouterr()
    # an untrained byte model's samples are mostly not UTF-8: they print, marked
    assert sample.main([f"--out_dir={out}", "--start=<page>", "--max_new_tokens=60", "--temperature=2"]) == 0
    assert capsys.readouterr().out.startswith("<page>")


def test_the_files_do_not_depend_on_the_pieces_the_zip_is_read_in(tmp_path, small, http_server, monkeypatch):
    """The text streams through in pieces (PIECE bytes), never held whole; the cuts between the
    splits fall inside pieces or between them alike."""
    data = enwik8_bytes()
    small("enwik8", len(data))
    url = http_server({"/e.zip": zipped("enwik8", data)}) + "/e.zip"
    whole = datasets.ensure_prepared(str(tmp_path / "whole"), "enwik8", url)
    reads = []
    real = zipfile.ZipExtFile.read

    def read(self, n=-1):
        reads.append(n)
        return real(self, n)
    monkeypatch.setattr(zipfile.ZipExtFile, "read", read)
    for piece in (7, 200, 1600):
        monkeypatch.setattr(datasets, "BLOCK", piece)
        folder = datasets.ensure_prepared(str(tmp_path / str(piece)), "enwik8", url)
        for name in ("train.bin", "val.bin", "test.bin", "meta.json"):
            assert (folder / name).read_bytes() == (whole / name).read_bytes()
    assert reads and set(reads) == {7, 200, 1600}


@pytest.mark.e2e
def test_the_scale_benchmarks_synthetic_zip_prepares_as_the_real_one_would(tmp_path):
    """benchmarks/hutter_scale.py at a size a test can afford: its zip passes every check."""
    from conftest import benchmark
    module = benchmark("hutter_scale")
    module.write_zip(tmp_path / "t.zip", "text8", 5000)
    seconds, peak, imports = module.prepare_peak(tmp_path / "data", "text8", (tmp_path / "t.zip").as_uri(), 5000)
    assert peak >= imports > 0 and seconds > 0
    assert (tmp_path / "data" / "text8" / "test.bin").stat().st_size == 2 * 250     # 5%, 2 bytes an id
