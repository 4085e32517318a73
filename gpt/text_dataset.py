"""A text prepared as a dataset: read in pieces, tokenized, split train/val and written as
train.bin, val.bin and meta.json, all replaced together or none."""

from __future__ import annotations

import codecs
import contextlib
import filecmp
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from .downloads import unique
from .errors import UserError
from .progress import progress
from .tokenizers import CharTokenizer, TiktokenTokenizer

PIECE = 1 << 20     # characters of a text file read at a time while preparing it


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
    with dataset_files(out_dir, ("train.bin", "val.bin", "meta.json")) as (targets, tmps):
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
def dataset_files(out_dir: Path, names: tuple[str, ...]):
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
