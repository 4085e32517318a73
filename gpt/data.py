"""Datasets on disk and batches in memory.

A prepared dataset is a folder with train.bin and val.bin (uint16 token ids) and meta.json,
which says how to turn text into ids: {"tokenizer": "char", "vocab_size": N, "chars": [...]}
or {"tokenizer": "tiktoken", "vocab_size": N, "encoding": "gpt2"}, in UTF-8. No pickle anywhere.
"""

from __future__ import annotations

import http.client
import json
import os
import shlex
import urllib.request
from pathlib import Path

import numpy as np
import torch

from .config import UserError

TINY_SHAKESPEARE_URL = ("https://raw.githubusercontent.com/karpathy/char-rnn/master/"
                        "data/tinyshakespeare/input.txt")


# ---------------------------------------------------------------- tokenizers

class CharTokenizer:
    def __init__(self, chars: list[str]):
        self.chars = chars
        self.stoi = {c: i for i, c in enumerate(chars)}

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> list[int]:
        unknown = sorted(set(text) - self.stoi.keys())
        if unknown:
            typed = ("; \\n there is a backslash and an n, not a newline: bash gives one in "
                     "$'A\\nB', or read the prompt from a file with FILE:path") if "\\n" in text else ""
            raise UserError(f"characters not in the vocabulary: {''.join(unknown)!r}; "
                            f"use only characters that occur in the training text{typed}")
        return [self.stoi[c] for c in text]

    def decode(self, ids) -> str:
        return "".join(self.chars[i] for i in ids)

    def meta(self) -> dict:
        return {"tokenizer": "char", "vocab_size": self.vocab_size, "chars": self.chars}


class TiktokenTokenizer:
    def __init__(self, encoding: str = "gpt2"):
        import tiktoken
        self.encoding_name = encoding
        try:
            self.enc = tiktoken.get_encoding(encoding)
        except (OSError, ValueError) as e:  # network errors (requests': OSErrors) or bad files
            first = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
            raise UserError(f"tiktoken could not load the {encoding!r} BPE files ({first}); connect "
                            "to the internet once, or set TIKTOKEN_CACHE_DIR to a folder that holds "
                            "them") from None

    @property
    def vocab_size(self) -> int:
        return self.enc.n_vocab

    def encode(self, text: str) -> list[int]:
        return self.enc.encode(text, allowed_special={"<|endoftext|>"})

    def decode(self, ids) -> str:
        return self.enc.decode(list(ids))

    def meta(self) -> dict:
        return {"tokenizer": "tiktoken", "vocab_size": self.vocab_size, "encoding": self.encoding_name}


def tokenizer_from_meta(meta: dict):
    kind = meta.get("tokenizer")
    if kind == "char":
        return CharTokenizer(list(meta["chars"]))
    if kind == "tiktoken":
        return TiktokenTokenizer(meta["encoding"])
    raise UserError(f"meta.json names an unknown tokenizer {kind!r}; expected 'char' or 'tiktoken'")


# ---------------------------------------------------------------- preparing a dataset

def read_text(input_path: Path, download_url: str | None = None) -> str:
    """The text at input_path, downloaded there first when it is missing and a URL is known."""
    if not input_path.exists():
        if download_url is None:
            raise UserError(f"{input_path} does not exist; give a text file with --input FILE")
        try:
            print(f"downloading {download_url} -> {input_path}")
            with urllib.request.urlopen(download_url, timeout=30) as response:
                data = response.read()
            input_path.parent.mkdir(parents=True, exist_ok=True)
            tmp = input_path.with_suffix(f".part{os.getpid()}")
            tmp.write_bytes(data)
            os.replace(tmp, input_path)
        except (OSError, http.client.HTTPException) as e:    # a reply cut short is the latter
            raise UserError(f"could not download the text ({e.__class__.__name__}); put the file "
                            f"from {download_url} at {input_path} and run again") from None
    try:
        return input_path.read_text(encoding="utf-8-sig")   # a byte-order mark is no character
    except UnicodeDecodeError as e:
        raise UserError(f"{input_path} is not UTF-8 text (byte {e.start}); convert it, e.g. with "
                        f"iconv -t utf-8") from None
    except OSError as e:        # a folder, or no permission
        raise UserError(f"{input_path} cannot be read ({e.strerror}); give a text file") from None


def read_prompt(start: str) -> str:
    """A --start value: the prompt itself, or FILE:path for the text of a file."""
    if not start.startswith("FILE:"):
        return start
    if not start[5:]:
        raise UserError("--start=FILE: names no file; give FILE:path to a text file")
    path = Path(start[5:]).expanduser()    # the shell leaves a ~ after FILE: as it is
    if not path.is_file():
        raise UserError(f"--start=FILE:{start[5:]}: {'not a file' if path.exists() else 'no such file'}; "
                        "give FILE:path to a text file")
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError:
        raise UserError(f"--start=FILE:{path}: the file is not UTF-8 text") from None
    except OSError as e:
        raise UserError(f"--start=FILE:{path} cannot be read ({e.strerror})") from None
    if not text:
        raise UserError(f"--start=FILE:{path}: the file is empty; a prompt needs at least one character")
    return text


def encode_prompt(tok, prompt: str, default: bool) -> list[int]:
    """The prompt's token ids. A default prompt that the run's text cannot spell (a text without
    newlines, or without Shakespeare's letters) asks for one, rather than for other characters."""
    try:
        return tok.encode(prompt)
    except UserError:
        if not default:
            raise
        missing = "".join(sorted(set(prompt) - set(tok.chars)))    # only characters can be missing
        raise UserError(f"the default prompt {prompt!r} has characters that this run's text lacks "
                        f"({missing!r}); give a prompt with --start=TEXT") from None


def prepare(text: str, out_dir: Path, tokenizer: str = "char", val_fraction: float = 0.1) -> dict:
    """Tokenize text, split it train/val, and write train.bin, val.bin and meta.json."""
    if not text:
        raise UserError("the input text is empty")
    tok = CharTokenizer(sorted(set(text))) if tokenizer == "char" else TiktokenTokenizer("gpt2")
    if tok.vocab_size > 65536:
        raise UserError(f"vocabulary of {tok.vocab_size} does not fit uint16 token ids")
    n = int(len(text) * (1 - val_fraction))
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"{out_dir} cannot be made a folder ({e.strerror}); pick another --out_dir") from None
    if not os.access(out_dir, os.W_OK):
        raise UserError(f"{out_dir} is not writable; pick another --out_dir")
    targets = [out_dir / name for name in ("train.bin", "val.bin", "meta.json")]
    for path in targets:
        if path.exists() and not path.is_file():
            raise UserError(f"{path} is not a file; remove it and prepare the dataset again")
    pid = os.getpid()                   # two preparers never share a temporary file
    tmps = [path.with_name(f"{path.name}.tmp{pid}") for path in targets]
    try:
        sizes = {}
        for split, part, tmp in (("train", text[:n], tmps[0]), ("val", text[n:], tmps[1])):
            ids = np.array(tok.encode(part), dtype=np.uint16)
            ids.tofile(tmp)
            sizes[split] = len(ids)
        meta = {**tok.meta(), "train_tokens": sizes["train"], "val_tokens": sizes["val"]}
        tmps[2].write_text(json.dumps(meta, ensure_ascii=False, indent=1), encoding="utf-8")
        for tmp, path in zip(tmps, targets):     # all written before any replaces the old files
            os.replace(tmp, path)
    except BaseException as e:  # a full disk, a character the tokenizer refuses, Ctrl-C
        for tmp in tmps:
            tmp.unlink(missing_ok=True)
        if isinstance(e, OSError):
            raise UserError(f"cannot write the dataset into {out_dir} ({e.strerror})") from None
        raise
    return meta


DATASETS = {  # name -> (tokenizer, public source of its input.txt)
    "shakespeare_char": ("char", TINY_SHAKESPEARE_URL),
    "shakespeare": ("tiktoken", TINY_SHAKESPEARE_URL),
}


def _prepared(folder: Path) -> bool:
    return all((folder / f).exists() for f in ("train.bin", "val.bin", "meta.json"))


def ensure_prepared(data_dir: str, dataset: str) -> Path:
    """The dataset's folder, preparing the shipped datasets on first use."""
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
    tokenizer, url = DATASETS[dataset]
    text = read_text(folder / "input.txt", url)
    meta = prepare(text, folder, tokenizer)
    print(f"prepared {folder}: {meta['train_tokens']:,} train and {meta['val_tokens']:,} val tokens")
    return folder


def load_meta(folder: Path) -> dict:
    path = folder / "meta.json"
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:      # ValueError: not JSON, or not UTF-8
        raise UserError(f"cannot read {path}: {e}") from None
    if not valid_meta(meta):
        raise UserError(f"{path} is not a valid dataset description (needs tokenizer, vocab_size and, "
                        "for 'char', its distinct characters, for 'tiktoken', the encoding's name); "
                        "prepare the dataset again")
    return meta


def valid_meta(meta) -> bool:
    """Whether meta describes a tokenizer fully: checked where it is read, so that sampling never
    finds out, after training, that the vocabulary cannot decode."""
    if not isinstance(meta, dict):
        return False
    size, kind = meta.get("vocab_size"), meta.get("tokenizer")
    if not (isinstance(size, int) and size > 0):
        return False
    if kind == "char":
        chars = meta.get("chars")
        return (isinstance(chars, list) and len(chars) == size and len(set(chars)) == size
                and all(isinstance(c, str) and len(c) == 1 for c in chars))
    return kind == "tiktoken" and isinstance(meta.get("encoding"), str)


# ---------------------------------------------------------------- batches

class Batches:
    """Random windows of block_size + 1 tokens, drawn by a generator whose state is saved in
    checkpoints. All micro-batches of one optimizer step are drawn at once, so a run split over
    several processes sees exactly the batches of one process accumulating the same steps."""

    def __init__(self, folder: Path, block_size: int, batch_size: int, device, seed: int,
                 vocab_size: int | None = None):
        self.block_size, self.batch_size, self.device = block_size, batch_size, device
        self.data, self.ids = {}, {}
        for split in ("train", "val"):
            path = folder / f"{split}.bin"
            if not path.is_file():
                raise UserError(f"{path} is not a file; remove it and prepare the dataset again")
            size = path.stat().st_size
            if size % 2:
                raise UserError(f"{path} has an odd number of bytes; it is not uint16 token ids")
            ids = np.memmap(path, dtype=np.uint16, mode="r") if size else np.zeros(0, np.uint16)
            if len(ids) < block_size + 1:
                raise UserError(f"{split} split of {folder} has {len(ids)} tokens, too few for "
                                f"block_size={block_size}; lower block_size or use more text")
            if vocab_size is not None and len(ids) and int(ids.max()) >= vocab_size:
                raise UserError(f"{path} holds token id {int(ids.max())}, outside meta.json's "
                                f"vocabulary of {vocab_size}; prepare the dataset again")
            # a view, not a copy: datasets larger than memory work, and a batch is one gather
            self.data[split] = np.lib.stride_tricks.sliding_window_view(ids, block_size + 1)
            self.ids[split] = ids
        self.generator = torch.Generator().manual_seed(seed)
        self.pin = torch.device(device).type == "cuda"

    def draw(self, split: str, n_batches: int):
        """n_batches micro-batches as (x, y) with shapes (n_batches, B, T)."""
        windows = self.data[split]
        ix = torch.randint(len(windows), (n_batches * self.batch_size,), generator=self.generator)
        batch = self._gather(windows, ix.numpy(), n_batches, self.batch_size)
        if self.pin:
            batch = batch.pin_memory().to(self.device, non_blocking=True)
        elif batch.device != torch.device(self.device):
            batch = batch.to(self.device)
        return batch[..., :-1], batch[..., 1:]

    def evenly_spaced(self, split: str, n_batches: int, batch_size: int):
        """n_batches micro-batches of batch_size windows spread evenly over the split, (n_batches,
        B, T) each for x and y. The windows depend on n_batches * batch_size and block_size alone,
        so every evaluation of every run with those scores the same text, spread from the split's
        start to its end (a sample of it, not all of it: `diagnostics.whole_split_loss` scores
        every token), and the estimate has less variance than random windows."""
        windows = self.data[split]
        ix = np.linspace(0, len(windows) - 1, n_batches * batch_size).astype(np.int64)
        batch = self._gather(windows, ix, n_batches, batch_size).to(self.device)
        return batch[..., :-1], batch[..., 1:]

    def _gather(self, windows: np.ndarray, ix: np.ndarray, n_batches: int, batch_size: int) -> torch.Tensor:
        rows = torch.from_numpy(windows[ix].astype(np.int64))               # (n * B, T + 1)
        return rows.view(n_batches, batch_size, self.block_size + 1)

    def state(self) -> torch.Tensor:
        return self.generator.get_state()

    def set_state(self, state: torch.Tensor) -> None:
        self.generator.set_state(state)


def prepare_main(dataset: str, argv: list[str] | None = None) -> int:
    """Command line of data/<dataset>/prepare.py."""
    import sys

    from .console import Parser
    tokenizer, url = DATASETS[dataset]
    default_dir = Path(__file__).resolve().parent.parent / "data" / dataset
    parser = Parser(prog=f"python data/{dataset}/prepare.py",
                    description=f"Prepare {dataset}: text -> train.bin, val.bin, meta.json")
    parser.add_argument("--input", help="text file to prepare (default: Tiny Shakespeare, "
                                        "downloaded to OUT_DIR/input.txt when missing)")
    parser.add_argument("--out_dir", help=f"where the files go (default: {default_dir}, for "
                                           "Tiny Shakespeare only)")
    args = parser.parse_args(argv)
    try:
        if args.out_dir == "":
            raise UserError("--out_dir is empty; give the folder the dataset goes into")
        if args.input and args.out_dir is None:     # it would pass for the shipped dataset from then on
            raise UserError(f"--input needs --out_dir: {default_dir} holds the shipped {dataset} "
                            "dataset; give e.g. --out_dir data/mine and train with --dataset=mine")
        out_dir = Path(args.out_dir) if args.out_dir is not None else default_dir
        source = Path(args.input) if args.input else out_dir / "input.txt"
        text = read_text(source, None if args.input else url)
        if not text:
            raise UserError(f"{source} is empty; give a text file to prepare")
        meta = prepare(text, out_dir, tokenizer)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"{out_dir}: vocabulary {meta['vocab_size']}, {meta['train_tokens']:,} train and "
          f"{meta['val_tokens']:,} val tokens")
    return 0
