"""gpt/tokenizers.py: the character tokenizer and prompts read from files."""

import re

import pytest

from gpt.errors import UserError
from gpt.tokenizers import CharTokenizer


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
