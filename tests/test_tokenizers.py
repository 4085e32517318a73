"""gpt/tokenizers.py: the character and byte tokenizers and prompts read from files."""

import re

import pytest

from gpt.errors import UserError
from gpt.data import per_character, valid_meta
from gpt.tokenizers import ByteTokenizer, CharTokenizer, tokenizer_from_meta


def test_unknown_characters_are_named():
    tok = CharTokenizer(list("abc"))
    with pytest.raises(UserError, match=r"not in the vocabulary: 'xz'; use only characters that occur "
                                        r"in the training text$"):
        tok.encode("abxcz")
    # a newline typed as backslash-n on a command line: said what it is
    with pytest.raises(UserError, match=r"'\\\\'; .* \\n there is a backslash and an n, not a newline"):
        CharTokenizer(list("abn\n")).encode("a\\nb")


@pytest.mark.parametrize("start, message", [
    ("FILE:", "--start=FILE: names no file"),
    ("FILE:{tmp}", "--start=FILE:{tmp}: not a file"),
    ("FILE:{tmp}/none.txt", "--start=FILE:{tmp}/none.txt: no such file"),
    ("FILE:{tmp}/empty.txt", "--start=FILE:{tmp}/empty.txt: the file is empty; a prompt needs at least one"),
])
def test_a_prompt_file_that_cannot_be_read_is_named(start, message, tmp_path):
    from gpt.tokenizers import read_prompt
    (tmp_path / "empty.txt").write_text("")
    with pytest.raises(UserError, match=re.escape(message.format(tmp=tmp_path))):
        read_prompt(start.format(tmp=tmp_path))
    assert read_prompt("ROMEO:") == "ROMEO:"


def test_the_byte_tokenizer_encodes_every_text_and_decodes_any_ids():
    tok = tokenizer_from_meta(ByteTokenizer().meta())
    text = "naïve café, 東京 \U0001f600\n"
    assert tok.encode(text) == list(text.encode("utf-8")) and tok.decode(tok.encode(text)) == text
    assert tok.vocab_size == 256 and max(tok.encode(text)) > 127
    # ids that are not UTF-8 (a cut character, a stray continuation byte) decode, marked
    assert tok.decode([0xE6, 0x9D]) == "\ufffd" and tok.decode([0x80, 65]) == "\ufffdA"


def test_a_byte_dataset_description_must_say_256():
    assert valid_meta({"tokenizer": "byte", "vocab_size": 256})
    assert not valid_meta({"tokenizer": "byte", "vocab_size": 255})
    assert per_character({"tokenizer": "byte"}) and per_character({"tokenizer": "char"})
    assert not per_character({"tokenizer": "tiktoken"})
