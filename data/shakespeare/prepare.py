"""Prepare shakespeare: python data/shakespeare/prepare.py [--input FILE] [--out_dir DIR]"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))   # run from a plain clone too

try:    # importing torch takes seconds: a Ctrl-C then gets one line, as later
    from gpt.console import interrupt_in_one_line  # noqa: E402
    from gpt.data import prepare_main  # noqa: E402
except KeyboardInterrupt:
    print("interrupted", file=sys.stderr)
    sys.exit(130)

if __name__ == "__main__":
    with interrupt_in_one_line():
        sys.exit(prepare_main("shakespeare"))
