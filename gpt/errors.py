"""Errors a command prints as one line: UserError, a library's error cut to one, and that line printed."""

from __future__ import annotations

import os
import sys
import traceback

TRACEBACK = "GPT_TRACEBACK"     # set to 1, a command prints the traceback behind its one-line error


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



def say_error(error: BaseException, text: str | None = None) -> None:
    """Print `error: ` and text (else the error) as one line on stderr. With GPT_TRACEBACK=1 in the
    environment, the whole traceback comes first, with every exception behind the error, those a
    `raise ... from None` hides included."""
    if os.environ.get(TRACEBACK, "") not in ("", "0"):
        hidden = [e for e in _chain(error) if e.__suppress_context__]
        for e in hidden:
            e.__suppress_context__ = False
        try:
            traceback.print_exception(error, file=sys.stderr)
        finally:
            for e in hidden:    # the error is the caller's, and stays as it was
                e.__suppress_context__ = True
    print(f"error: {error if text is None else text}", file=sys.stderr)


def _chain(error: BaseException) -> list[BaseException]:
    """error and every exception behind it, by __cause__ or __context__, each once."""
    found, todo = [], [error]
    while todo:
        e = todo.pop()
        if e is not None and not any(e is f for f in found):
            found.append(e)
            todo += [e.__cause__, e.__context__]
    return found
