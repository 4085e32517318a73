"""Tokenizers: text to token ids and back, by characters, by UTF-8 bytes or with tiktoken (GPT-2's BPE), and prompts."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

from .errors import UserError, first_line


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


class ByteTokenizer:
    """Text as its UTF-8 bytes, 256 ids: every text encodes, and any ids decode, a byte that is
    not valid UTF-8 there as U+FFFD (enwik8 is modelled this way, as in the papers)."""

    vocab_size = 256

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8", "surrogatepass"))

    def decode(self, ids) -> str:
        return bytes(ids).decode("utf-8", "replace")

    def meta(self) -> dict:
        return {"tokenizer": "byte", "vocab_size": self.vocab_size}


# the BPE files of each encoding by their published names, with the address tiktoken fetches each
# from: its cache (TIKTOKEN_CACHE_DIR) keeps a file under the sha1 of that address
BPE_FILES = {
    "gpt2": {"vocab.bpe": "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/vocab.bpe",
             "encoder.json": "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/encoder.json"},
    "r50k_base": {"r50k_base.tiktoken": "https://openaipublic.blob.core.windows.net/encodings/r50k_base.tiktoken"},
}


def fill_tiktoken_cache(folder: Path, encoding: str) -> bool:
    """Copy the encoding's files, found in folder under their published names, to the names
    tiktoken's cache looks for there (it checks their hashes as it reads them); whether it could."""
    files = BPE_FILES.get(encoding, {})
    if not files or not all((folder / name).is_file() for name in files):
        return False
    try:
        for name, url in files.items():
            cached = folder / hashlib.sha1(url.encode()).hexdigest()
            if not cached.exists():
                tmp = cached.with_name(f"{cached.name}.{os.getpid()}.tmp")
                shutil.copyfile(folder / name, tmp)
                os.replace(tmp, cached)
    except OSError:     # a read-only folder: the error names what to do
        return False
    return True


class TiktokenTokenizer:
    def __init__(self, encoding: str = "gpt2"):
        import tiktoken
        self.encoding_name = encoding
        try:
            self.enc = tiktoken.get_encoding(encoding)
            return
        except (OSError, ValueError) as e:  # network errors (requests': OSErrors) or bad files
            error = e
        folder = os.environ.get("TIKTOKEN_CACHE_DIR", "")
        if folder and fill_tiktoken_cache(Path(folder), encoding):   # files put there by their own names
            try:
                self.enc = tiktoken.get_encoding(encoding)
                return
            except (OSError, ValueError) as e:
                error = e
        names = " and ".join(BPE_FILES.get(encoding, {})) or f"the {encoding!r} files"
        looked = f" (looked in {folder} for {names})" if folder else ""
        raise UserError(f"tiktoken could not load the {encoding!r} BPE files ({first_line(error)}); connect "
                        f"to the internet once, or put {names} in a writable folder and set "
                        f"TIKTOKEN_CACHE_DIR to it{looked}") from None

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
    if kind == "byte":
        return ByteTokenizer()
    if kind == "tiktoken":
        return TiktokenTokenizer(meta["encoding"])
    raise UserError(f"meta.json names an unknown tokenizer {kind!r}; expected 'char', 'byte' or 'tiktoken'")




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


