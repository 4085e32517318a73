"""A run's vocabulary as Hugging Face tokenizer files, for an exported GPT-2 folder (gpt/export.py).

A character model's tokenizer maps exactly its characters (tokenizer.json: one token per character,
nothing added); a byte model's its 256 bytes; a GPT-2 BPE model's is GPT-2's own (vocab.json,
merges.txt and tokenizer.json, rebuilt from tiktoken's data, offline). Needs the tokenizers package.
"""

from __future__ import annotations

import json

from .errors import UserError
from .tokenizers import TiktokenTokenizer


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's printable stand-in for each byte: printable Latin-1 bytes are themselves, the
    others take the characters from U+0100 on, in byte order."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    shifted = [b for b in range(256) if b not in kept]
    return {**{b: chr(b) for b in kept}, **{b: chr(256 + n) for n, b in enumerate(shifted)}}


def recover_merges(ranks: dict[bytes, int]) -> list[tuple[bytes, bytes]]:
    """GPT-2's merge list from a BPE's ranks (token bytes -> id): each token of two or more bytes,
    in rank order, is the merge of the two parts that BPE over its bytes, with only the merges
    ranked below it, leaves."""
    merges = []
    for token, rank in sorted(ranks.items(), key=lambda item: item[1]):
        if len(token) < 2:
            continue
        parts = [token[i:i + 1] for i in range(len(token))]
        while len(parts) > 2:
            best, at = rank, -1
            for i in range(len(parts) - 1):
                r = ranks.get(parts[i] + parts[i + 1], rank)
                if r < best:
                    best, at = r, i
            if at < 0:
                break
            parts[at:at + 2] = [parts[at] + parts[at + 1]]
        if len(parts) != 2:
            raise UserError(f"the BPE token {token!r} is not the merge of two tokens; this encoding "
                            "cannot be written as GPT-2's files")
        merges.append((parts[0], parts[1]))
    return merges


def char_tokenizer(chars: list[str]):
    """One token per character, id i for chars[i]; decoding joins them as they are."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    tok = Tokenizer(models.WordLevel({c: i for i, c in enumerate(chars)}))     # no unknown token
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")  # each code point
    tok.decoder = decoders.Fuse()
    return tok


def byte_level_bpe(vocab: dict[str, int], merges: list[tuple[str, str]], split_words: bool):
    """GPT-2's byte-level BPE; with no merges and split_words=False, bytes as ids."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    tok = Tokenizer(models.BPE(vocab, merges, fuse_unk=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=split_words)
    tok.decoder = decoders.ByteLevel()
    if split_words:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok


def tokenizer_files(meta: dict, block_size: int) -> tuple[dict[str, str], object, int | None, str]:
    """(files written as text: name -> content, a tokenizers.Tokenizer for tokenizer.json, the
    end-of-text id or None, what the tokenizer is in words) for a run's vocabulary."""
    kind = meta["tokenizer"]
    plain = {"tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False,
             "model_max_length": block_size}
    if kind == "char":
        return {"tokenizer_config.json": dumps(plain)}, char_tokenizer(list(meta["chars"])), None, \
            f"character ({len(meta['chars'])} characters)"
    if kind == "byte":
        stand_in = bytes_to_unicode()
        tok = byte_level_bpe({stand_in[b]: b for b in range(256)}, [], split_words=False)
        return {"tokenizer_config.json": dumps(plain)}, tok, None, "byte (256 bytes)"
    encoding = meta.get("encoding")
    if encoding != "gpt2":
        raise UserError(f"the run's tokenizer is tiktoken's {encoding!r} encoding; only 'gpt2' "
                        "can be written as GPT-2's tokenizer files")
    enc = TiktokenTokenizer(encoding).enc
    specials = {name: enc.encode_single_token(name) for name in enc.special_tokens_set}
    ranks = {enc.decode_single_token_bytes(i): i for i in range(enc.n_vocab) if i not in specials.values()}
    stand_in = str.maketrans({chr(b): c for b, c in bytes_to_unicode().items()})

    def shown_as(token: bytes) -> str:
        return token.decode("latin-1").translate(stand_in)

    vocab = {shown_as(token): i for token, i in ranks.items()}
    merges = [(shown_as(a), shown_as(b)) for a, b in recover_merges(ranks)]
    vocab.update(specials)
    eos = specials["<|endoftext|>"]
    tok = byte_level_bpe(vocab, merges, split_words=True)
    from tokenizers import AddedToken
    tok.add_special_tokens([AddedToken(name, special=True, normalized=False)
                            for name in sorted(specials, key=specials.get)])
    config = {"tokenizer_class": "GPT2Tokenizer", "add_prefix_space": False, "add_bos_token": False,
              "bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>", "unk_token": "<|endoftext|>",
              "clean_up_tokenization_spaces": False, "model_max_length": block_size,
              "errors": "replace"}
    files = {"vocab.json": dumps(dict(sorted(vocab.items(), key=lambda item: item[1]))),
             "merges.txt": "#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges),
             "tokenizer_config.json": dumps(config)}
    return files, tok, eos, f"GPT-2 BPE ({enc.n_vocab} tokens)"


def dumps(data) -> str:
    return json.dumps(data, ensure_ascii=False, indent=2) + "\n"
