"""Tokenizers: text to token ids and back, by characters or with tiktoken (GPT-2's BPE), and prompts."""

from __future__ import annotations

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


class TiktokenTokenizer:
    def __init__(self, encoding: str = "gpt2"):
        import tiktoken
        self.encoding_name = encoding
        try:
            self.enc = tiktoken.get_encoding(encoding)
        except (OSError, ValueError) as e:  # network errors (requests': OSErrors) or bad files
            raise UserError(f"tiktoken could not load the {encoding!r} BPE files ({first_line(e)}); connect "
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


