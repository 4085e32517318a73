"""Prepare shakespeare: python data/shakespeare/prepare.py [--input FILE] [--out_dir DIR]"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))   # run from a plain clone too

from gpt.console import interrupt_in_one_line, interrupt_quietly_while_loading, output_may_close  # noqa: E402

interrupt_quietly_while_loading(__name__)      # before torch loads
from gpt.datasets import prepare_main  # noqa: E402

if __name__ == "__main__":
    with interrupt_in_one_line(terminate=True), output_may_close():     # no half-written files
        sys.exit(prepare_main("shakespeare"))
