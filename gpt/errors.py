"""UserError, the one kind of error a command prints as one line, and how a library's error is cut to one."""

from __future__ import annotations


class UserError(ValueError):
    """A mistake in what the user asked for; scripts print it as one line and exit 2."""


def first_line(error: BaseException) -> str:
    """What a library's error says, for one line of ours: its first line (or its type's name),
    cut to about 160 characters between words where one ends late enough (requests' errors run
    to hundreds; a long path is kept in part)."""
    width = 160
    text = str(error).strip()
    text = text.splitlines()[0] if text else type(error).__name__
    if len(text) <= width:
        return text
    space = text.rfind(" ", 0, width)
    return text[:space if space > width // 2 else width] + " ..."

