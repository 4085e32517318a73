"""python -m gpt.sweep report DIR: the report of a sweep, written again from its run folders."""

from __future__ import annotations

from ..console import interrupt_quietly_while_loading

interrupt_quietly_while_loading(__name__)      # before torch loads

import sys  # noqa: E402

from ..console import interrupt_in_one_line, output_may_close  # noqa: E402
from .report import main  # noqa: E402

if __name__ == "__main__":
    # | head: no traceback for the reader going away; Ctrl-C: one line
    with interrupt_in_one_line(), output_may_close(product=True):
        sys.exit(main())
