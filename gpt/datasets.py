"""Preparing a dataset: its text fetched, checked and written as train.bin, val.bin (test.bin) and meta.json.

The shipped datasets (DATASETS) prepare themselves on first use (ensure_prepared): Tiny
Shakespeare from its text, enwik8 and text8 from their zips. data/<name>/prepare.py runs
prepare_main, which also prepares a text file of the user's own."""

from __future__ import annotations

import codecs
import contextlib
import filecmp
import http.client
import json
import os
import re
import secrets
import shlex
import urllib.request
import zipfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .config import user_path
from .console import Parser
from .errors import UserError, first_line, say_error
from .progress import progress
from .tokenizers import ByteTokenizer, CharTokenizer, TiktokenTokenizer

PIECE = 1 << 20     # characters of a text file read at a time while preparing it
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


def unique() -> str:
    """A name for a temporary file that no other process shares, on another machine either (the
    first process of each machine of a torchrun prepares the data, maybe on one shared disk)."""
    return f"{os.getpid()}-{secrets.token_hex(4)}"


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
            _write_whole(input_path, lambda out: out.write(data), "copied text")
            return
    download(download_url, input_path, "the text")


def download(url: str, path: Path, what: str) -> None:
    """url's body streamed into path, whole or not at all, with a progress bar over its
    Content-Length; what names it in errors."""
    print(f"downloading {url} -> {path}")
    try:
        response = urllib.request.urlopen(url, timeout=30)
    except (OSError, ValueError, http.client.HTTPException) as e:   # ValueError: not a URL
        raise _unreachable(url, path, what, e) from None

    def copy(out) -> None:
        size = response.headers.get("Content-Length")
        with progress(int(size) if size and size.isdigit() else None, f"downloading {path.name}", "B",
                      unit_scale=True) as bar:
            while True:
                try:
                    chunk = response.read(1 << 16)
                except (OSError, http.client.HTTPException) as e:     # a reply cut short is the latter
                    raise _unreachable(url, path, what, e) from None
                if not chunk:
                    return
                out.write(chunk)
                bar.update(len(chunk))
    with response:
        _write_whole(path, copy, f"downloaded {what.removeprefix('the ')}")


def _unreachable(url: str, path: Path, what: str, error: BaseException) -> UserError:
    return UserError(f"could not download {what} ({error.__class__.__name__}: {first_line(error)}); "
                     f"put the file from {url} at {path.absolute()} and run again, or give "
                     "--data_url=URL of a copy")


def _write_whole(path: Path, write, what: str) -> None:
    """write(file) into a file beside path that becomes path only once written whole."""
    tmp = path.with_name(f"{path.name}.part{unique()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as out:
            write(out)
        os.replace(tmp, path)
    except OSError as e:
        raise UserError(f"cannot write the {what} to {path} ({e.strerror or e})") from None
    finally:
        with contextlib.suppress(OSError):     # its folder may be a file
            tmp.unlink(missing_ok=True)


def text_pieces(path: Path) -> Iterator[str]:
    """The text of a UTF-8 file, PIECE characters at a time, line ends made \\n and a byte-order
    mark dropped, so that a file of any size can be prepared in little memory."""
    if not path.exists():
        raise UserError(f"{path} does not exist; give a text file with --input FILE")
    try:
        with open(path, encoding="utf-8-sig") as f:     # a byte-order mark is no character
            while piece := f.read(PIECE):
                yield piece
    except UnicodeDecodeError:
        raise UserError(f"{path} is not UTF-8 text (byte {first_bad_byte(path)}); convert it, e.g. "
                        "with iconv -t utf-8") from None
    except OSError as e:        # a folder, or no permission
        raise UserError(f"{path} cannot be read ({e.strerror}); give a text file") from None


def first_bad_byte(path: Path) -> int:
    """Where a file stops being UTF-8: a text reader's error gives only a place in its buffer."""
    decoder, done = codecs.getincrementaldecoder("utf-8")(), 0
    with open(path, "rb") as f:
        while True:
            block = f.read(1 << 20)
            pending = len(decoder.getstate()[0])    # bytes of a character the last block began
            try:
                decoder.decode(block, final=not block)
            except UnicodeDecodeError as e:
                return done - pending + e.start
            if not block:
                return done
            done += len(block)



def prepare(text: str, out_dir: Path, tokenizer: str = "char", val_fraction: float = 0.1) -> dict:
    """Tokenize text, split it train/val, and write train.bin, val.bin and meta.json."""
    return _prepare(lambda: in_pieces(text), "the input text", out_dir, tokenizer, val_fraction)


def in_pieces(text: str) -> Iterator[str]:
    return (text[i:i + PIECE] for i in range(0, len(text), PIECE))


def prepare_file(path: Path, out_dir: Path, tokenizer: str = "char", val_fraction: float = 0.1,
                 keep_other: bool = False) -> dict:
    """prepare() for the text of a UTF-8 file, read twice in pieces rather than held whole; a
    pipe (--input /dev/stdin), which can be read only once, is held whole. With keep_other, a
    dataset in out_dir prepared from other text is refused rather than replaced."""
    if path.exists() and not path.is_file() and not path.is_dir():
        text = "".join(text_pieces(path))
        return _prepare(lambda: in_pieces(text), str(path), out_dir, tokenizer, val_fraction,
                        keep_other=keep_other)
    before = path.stat() if path.is_file() else None

    def unchanged() -> bool:
        try:
            after = path.stat()
        except OSError:         # deleted meanwhile
            return False
        return (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)
    return _prepare(lambda: text_pieces(path), str(path), out_dir, tokenizer, val_fraction, unchanged,
                    keep_other)


def _prepare(pieces, source: str, out_dir: Path, tokenizer: str, val_fraction: float,
             unchanged=lambda: True, keep_other: bool = False) -> dict:
    """pieces() gives the text in pieces, once to learn its size and characters, once to encode it;
    unchanged() says whether the text is still what the first pass read."""
    chars, length = set(), 0
    for piece in pieces():
        if tokenizer == "char":     # BPE has its own vocabulary
            chars.update(piece)
        length += len(piece)
    if not length:
        raise UserError(f"{source} is empty; give a text file to prepare")
    tok = CharTokenizer(sorted(chars)) if tokenizer == "char" else TiktokenTokenizer("gpt2")
    if tok.vocab_size > 65536:
        raise UserError(f"vocabulary of {tok.vocab_size} does not fit uint16 token ids")
    n = int(length * (1 - val_fraction))
    with _dataset_files(out_dir, ("train.bin", "val.bin", "meta.json")) as (targets, tmps):
        with (open(tmps[0], "wb") as train, open(tmps[1], "wb") as val,
              progress(length, f"preparing {out_dir.name}", "chars", unit_scale=True) as bar):
            sizes, read = _write_ids(_advancing(pieces(), bar.update), n, tok, (train, val))
        if read != length or not unchanged():
            raise UserError(CHANGED)
        if min(sizes) < 2:     # a split needs a token and the one after it to train or score on
            raise UserError(f"{source} is too short to prepare: its train and val splits would hold "
                            f"{sizes[0]} and {sizes[1]} tokens; give a longer text")
        meta = {**tok.meta(), "train_tokens": sizes[0], "val_tokens": sizes[1]}
        tmps[2].write_text(json.dumps(meta, ensure_ascii=False, indent=1), encoding="utf-8")
        if keep_other and not _same_dataset(tmps, targets):
            raise UserError(f"{out_dir} holds a dataset prepared from other text, which runs may have "
                            "trained on; give --overwrite to replace it, or another --out_dir")
    return meta


@contextlib.contextmanager
def _dataset_files(out_dir: Path, names: tuple[str, ...]):
    """(targets, tmps): the named files in out_dir and a temporary path beside each to write. When
    the block ends, all replace their targets together; when it fails, none does, the temporary
    files go, and so does out_dir if it was made here."""
    made = not out_dir.exists()     # then a failure takes it away again
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"{out_dir} cannot be made a folder ({e.strerror}); pick another --out_dir") from None
    if not os.access(out_dir, os.W_OK):
        raise UserError(f"{out_dir} is not writable; pick another --out_dir")
    targets = [out_dir / name for name in names]
    for path in targets:
        if path.exists() and not path.is_file():
            raise UserError(f"{path} is not a file; remove it and prepare the dataset again")
    tmps = [path.with_name(f"{path.name}.tmp{unique()}") for path in targets]
    try:
        yield targets, tmps
        for tmp, path in zip(tmps, targets):     # all written before any replaces the old files
            os.replace(tmp, path)
    except BaseException as e:  # a full disk, a file that stops being UTF-8 text, Ctrl-C
        for tmp in tmps:
            tmp.unlink(missing_ok=True)
        if made:
            with contextlib.suppress(OSError):     # not empty: someone else's files meanwhile
                out_dir.rmdir()
        if isinstance(e, OSError):
            raise UserError(f"cannot write the dataset into {out_dir} ({e.strerror})") from None
        raise


def _advancing(pieces, advance) -> Iterator[str]:
    for piece in pieces:
        yield piece
        advance(len(piece))


CHANGED = "the text changed while it was being prepared; prepare it again"


def _same_dataset(made: list[Path], there: list[Path]) -> bool:
    """Whether the ids are those already there, and meta.json says the same (as JSON: an older
    version may have written it in another layout)."""
    try:
        metas = [json.loads(path.read_text(encoding="utf-8")) for path in (made[2], there[2])]
    except ValueError:      # not JSON, or not UTF-8: not the same
        return False
    return metas[0] == metas[1] and all(filecmp.cmp(a, b, shallow=False) for a, b in zip(made[:2], there[:2]))


def _encoder(tok):
    """(encode, cut): encode turns text into uint16 ids; cut(text) is the end of the longest
    start of text that encodes as it would within a longer text, 0 if none does."""
    if isinstance(tok, TiktokenTokenizer):
        def cut(text: str) -> int:
            last = None
            for last in _WORD_END.finditer(text):
                pass
            return last.start() if last else 0
        return lambda text: np.array(tok.encode(text), dtype=np.uint16), cut
    points = np.array([ord(c) for c in tok.chars], dtype=np.uint32)    # sorted, as chars are

    def encode(text: str) -> np.ndarray:
        """All of a piece's characters looked up at once by code point, not one by one."""
        codes = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
        ids = np.minimum(np.searchsorted(points, codes), len(points) - 1)
        if not np.array_equal(points[ids], codes):      # the file changed since it was read
            raise UserError(CHANGED)
        return ids.astype(np.uint16)
    return encode, len


# GPT-2's pre-tokenizer never puts a non-space character and a space after it in one piece, and
# BPE merges only within a piece, so text cut between the two encodes as it would whole. (Not
# after the space: a text's trailing spaces pre-tokenize as one piece, inside it maybe not.)
_WORD_END = re.compile(r"(?<=\S)(?=\s)")


def _write_ids(pieces, n: int, tok, files) -> tuple[list[int], int]:
    """Encode the text's first n characters into files[0], the rest into files[1], each half as
    it would encode whole; returns the two token counts and the characters read."""
    encode, cut = _encoder(tok)
    sizes, done, held, split = [0, 0], 0, [], 0     # held: text not yet encoded, in parts

    def write(text: str) -> None:
        ids = encode(text)
        ids.tofile(files[split])
        sizes[split] += len(ids)

    for piece in pieces:
        at = min(max(n - done, 0), len(piece))     # where val begins in this piece
        done += len(piece)
        for half, part in ((0, piece[:at]), (1, piece[at:])):
            if not part:
                continue
            if half != split:       # the train half is complete
                write("".join(held))
                held, split = [], half
            before = held[-1][-1:] if held else ""     # a cut may fall just before part
            end = cut(before + part) - len(before)
            if end < 0:
                held.append(part)
            else:
                write("".join(held) + part[:end])
                held = [part[end:]]
    write("".join(held))
    return sizes, done


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
            with (_dataset_files(out_dir, names) as (_, tmps), archive.open(info) as text,
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
        while block := text.read(PIECE):
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
