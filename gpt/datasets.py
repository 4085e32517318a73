"""The shipped datasets (DATASETS): each fetched, checked and prepared on first use, and the
data/<name>/prepare.py command line.

ensure_prepared prepares Tiny Shakespeare from its text (text_dataset.py) and enwik8 and text8
from their zips, cut in order into train.bin, val.bin and test.bin. prepare_main, which
data/<name>/prepare.py runs, also prepares a text file of the user's own."""

from __future__ import annotations

import contextlib
import json
import shlex
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .config import user_path
from .console import Parser
from .downloads import download, write_whole
from .errors import UserError, first_line, say_error
from .progress import progress
from .text_dataset import dataset_files, prepare_file
from .tokenizers import ByteTokenizer, CharTokenizer

BLOCK = 1 << 20     # bytes of a zip's text read at a time while preparing it
TINY_SHAKESPEARE_URL = ("https://raw.githubusercontent.com/karpathy/char-rnn/master/"
                        "data/tinyshakespeare/input.txt")
HUTTER = 100_000_000    # bytes of enwik8 and of text8, cut 90M / 5M / 5M as in the papers


@dataclass(frozen=True)
class Dataset:
    """A shipped dataset: its tokenizer, the public source of its text, and how that is checked and cut."""
    tokenizer: str                  # char, byte or tiktoken
    url: str                        # the text itself, or a zip holding it (member)
    member: str = ""                # the text's file in the zip; "": the download is the text
    size: int = 0                   # the text's exact size in bytes (0: any)
    split: tuple[int, int] = (0, 0)     # train and val bytes, in order, the rest test; (0, 0): 90/10, no test
    alphabet: str = ""              # the only bytes allowed, in the vocabulary's order ("": any)


DATASETS = {
    "shakespeare_char": Dataset("char", TINY_SHAKESPEARE_URL),
    "shakespeare": Dataset("tiktoken", TINY_SHAKESPEARE_URL),
    # the first 10^8 bytes of an English Wikipedia dump (XML, UTF-8), modelled as bytes
    "enwik8": Dataset("byte", "http://mattmahoney.net/dc/enwik8.zip", "enwik8", HUTTER,
                      (90_000_000, 5_000_000)),
    # the same dump's text lowercased to a-z and single spaces (Mahoney's wikifil.pl)
    "text8": Dataset("char", "http://mattmahoney.net/dc/text8.zip", "text8", HUTTER,
                     (90_000_000, 5_000_000), " abcdefghijklmnopqrstuvwxyz"),
}


def fetch_text(input_path: Path, download_url: str) -> None:
    """Download the text to input_path unless it is there, or copy it from a shipped dataset
    beside it that has the same source (shakespeare and shakespeare_char)."""
    if input_path.exists():
        return
    twins = [input_path.parent.parent / name / "input.txt" for name, ds in DATASETS.items()
             if ds.url == download_url and name != input_path.parent.name]
    for twin in (path for path in twins if path.is_file()):     # offline, one copy serves both
        with contextlib.suppress(OSError):
            data = twin.read_bytes()
            print(f"copying {twin} -> {input_path}")
            write_whole(input_path, lambda out: out.write(data), "copied text")
            return
    download(download_url, input_path, "the text")


def _prepared(folder: Path) -> bool:
    return all((folder / f).exists() for f in ("train.bin", "val.bin", "meta.json"))


def ensure_prepared(data_dir: str, dataset: str, data_url: str = "") -> Path:
    """The dataset's folder, preparing the shipped datasets on first use, from data_url if given."""
    folder = Path(data_dir) / dataset
    if _prepared(folder):
        return folder
    given, whole = Path(data_dir).resolve(), Path(dataset)     # resolved: '.' has no name to give
    if len(whole.parts) > 1 and _prepared(whole):   # its path given as the dataset's name
        raise UserError(f"dataset={dataset!r} is a name under data_dir, not a path; give "
                        f"--data_dir={shlex.quote(str(whole.parent))} --dataset={shlex.quote(whole.name)}")
    # a dataset's own folder given as data_dir: say so, rather than prepare another one inside it
    inside = (f"data_dir={data_dir!r} holds a prepared dataset itself (train.bin, val.bin, meta.json); "
              f"to train on it, give "
              f"--data_dir={shlex.quote(str(given.parent))} --dataset={shlex.quote(given.name)}"
              if not folder.exists() and _prepared(given) else "")
    if dataset not in DATASETS:
        raise UserError(f"dataset {dataset!r} is not prepared: {folder} needs train.bin, val.bin and "
                        f"meta.json (run: python data/shakespeare_char/prepare.py --input FILE "
                        f"--out_dir {folder}){'; ' + inside if inside else ''}")
    if inside:
        raise UserError(f"{inside}; to prepare {dataset}, give a data_dir without those files")
    ds = DATASETS[dataset]
    if ds.member:
        meta = prepare_zip(folder / f"{dataset}.zip", data_url or ds.url, dataset, folder)
    else:
        fetch_text(folder / "input.txt", data_url or ds.url)
        meta = prepare_file(folder / "input.txt", folder, ds.tokenizer)
    test = f" and {meta['test_tokens']:,} test" if "test_tokens" in meta else ""
    print(f"prepared {folder}: {meta['train_tokens']:,} train, {meta['val_tokens']:,} val{test} tokens")
    return folder


def prepare_zip(path: Path, url: str, dataset: str, out_dir: Path) -> dict:
    """Download the zip to path unless it is there, check the text it holds, and cut that in
    order into train.bin, val.bin and test.bin. A zip downloaded here that fails the checks is
    removed, so that the next run downloads it again."""
    downloaded = not path.exists()
    if downloaded:
        download(url, path, path.name)
    try:
        return _prepare_member(path, DATASETS[dataset], out_dir)
    except BadSource as e:
        if not downloaded:
            raise UserError(f"{e}; delete {path} to download it again, or give --data_url=URL of a "
                            "good copy") from None
        path.unlink(missing_ok=True)
        raise UserError(f"{e}; the download from {url} was removed: run again to download it "
                        "anew, or give --data_url=URL of a good copy") from None


class BadSource(UserError):
    """The downloaded file is not the dataset: a download or copy to replace, not a setting to fix."""


def _prepare_member(path: Path, ds: Dataset, out_dir: Path) -> dict:
    tok = CharTokenizer(list(ds.alphabet)) if ds.alphabet else ByteTokenizer()
    try:
        with zipfile.ZipFile(path) as archive:
            try:
                info = archive.getinfo(ds.member)
            except KeyError:
                held = ", ".join(archive.namelist()[:5]) or "nothing"
                raise BadSource(f"{path} holds no file named {ds.member} (it holds {held})") from None
            if ds.size and info.file_size != ds.size:
                raise BadSource(f"{ds.member} in {path} is {info.file_size:,} bytes, not {ds.size:,}: "
                                f"it is not {out_dir.name}")
            names = ("train.bin", "val.bin", "test.bin", "meta.json")
            with (dataset_files(out_dir, names) as (_, tmps), archive.open(info) as text,
                  progress(info.file_size, f"preparing {out_dir.name}", "B", unit_scale=True) as bar):
                sizes = _write_bytes(text, tok, ds, tmps[:3], bar.update)
                meta = {**tok.meta(), **{f"{s}_tokens": n for s, n in zip(("train", "val", "test"), sizes)}}
                tmps[3].write_text(json.dumps(meta, ensure_ascii=False, indent=1), encoding="utf-8")
    except (zipfile.BadZipFile, zlib.error, EOFError) as e:     # cut short, or bytes changed
        raise BadSource(f"{path} is not a whole zip file ({first_line(e)})") from None
    return meta


def _write_bytes(text, tok, ds: Dataset, tmps: list[Path], advance) -> list[int]:
    """The text's bytes as token ids, cut in order at ds.split into the three files; a byte
    outside ds.alphabet is refused, naming where it is."""
    ids = np.full(256, 0xFFFF, dtype=np.uint16)     # byte -> id; 0xFFFF: not in the vocabulary
    if ds.alphabet:
        ids[list(ds.alphabet.encode("ascii"))] = np.arange(len(ds.alphabet))
    else:
        ids[:] = np.arange(256)
    ends = (ds.split[0], ds.split[0] + ds.split[1], None)
    done, sizes = 0, [0, 0, 0]
    files = [open(tmp, "wb") for tmp in tmps]
    try:
        while block := text.read(BLOCK):
            block_ids = ids[np.frombuffer(block, dtype=np.uint8)]
            bad = np.flatnonzero(block_ids == 0xFFFF)
            if len(bad):
                raise BadSource(f"{ds.member} holds the byte {block[bad[0]:bad[0] + 1]!r} at offset "
                                f"{done + int(bad[0]):,}, outside its alphabet ({''.join(tok.chars)!r})")
            start = 0
            for i, end in enumerate(ends):      # the part of this block before each split's end
                stop = len(block) if end is None else min(max(end - done, 0), len(block))
                if stop > start:
                    block_ids[start:stop].tofile(files[i])
                    sizes[i] += stop - start
                    start = stop
            done += len(block)
            advance(len(block))
    finally:
        for f in files:
            f.close()
    if min(sizes) < 2:
        raise BadSource(f"{ds.member} holds {done:,} bytes, too few to cut into train, val and test "
                        f"at {ends[0]:,} and {ends[1]:,}")
    return sizes


def prepare_main(dataset: str, argv: list[str] | None = None) -> int:
    """Command line of data/<dataset>/prepare.py."""
    tokenizer, url = DATASETS[dataset].tokenizer, DATASETS[dataset].url
    default_dir = Path(__file__).resolve().parent.parent / "data" / dataset
    parser = Parser(prog=f"python data/{dataset}/prepare.py",
                    description=f"Prepare {dataset}: text -> train.bin, val.bin, meta.json")
    parser.add_argument("--input", help="text file to prepare (default: Tiny Shakespeare, "
                                        "downloaded to OUT_DIR/input.txt when missing)")
    parser.add_argument("--out_dir", help=f"where the files go (default: {default_dir}, for "
                                           "Tiny Shakespeare only)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace a dataset in OUT_DIR prepared from other text")
    args = parser.parse_args(argv)
    try:
        if args.out_dir == "":
            raise UserError("--out_dir is empty; give the folder the dataset goes into")
        if args.input == "":    # an unset $FILE, say: not a request for Tiny Shakespeare
            raise UserError("--input is empty; give the text file to prepare")
        if args.input and args.out_dir is None:     # it would pass for the shipped dataset from then on
            raise UserError(f"--input needs --out_dir: {default_dir} holds the shipped {dataset} "
                            "dataset; give e.g. --out_dir data/mine and train with --dataset=mine")
        out_dir = Path(user_path(args.out_dir, "--out_dir")) if args.out_dir is not None else default_dir
        source = Path(user_path(args.input, "--input")) if args.input else out_dir / "input.txt"
        if not args.input:
            fetch_text(source, url)
        meta = prepare_file(source, out_dir, tokenizer, keep_other=_prepared(out_dir) and not args.overwrite)
    except UserError as e:
        say_error(e)
        return 2
    print(f"{out_dir}: vocabulary {meta['vocab_size']}, {meta['train_tokens']:,} train and "
          f"{meta['val_tokens']:,} val tokens")
    return 0
