import random
import signal
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))   # `import gpt` under a bare `pytest` too

# A test run started in the background by a shell without job control (`pytest &` in a script)
# inherits SIGINT ignored, as would the scripts it starts, and then no Ctrl-C test could pass
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

from gpt.datasets import prepare  # noqa: E402

# A tiny run: fast on 2 cores, still a real model with every part present.
TINY = ["--device=cpu", "--n_layer=2", "--n_head=2", "--n_embd=16", "--block_size=16",
        "--batch_size=4", "--eval_iters=2", "--warmup_iters=2", "--threads=1",
        "--dropout=0.0", "--log_interval=1",
        "--flush_denormal=false"]   # this process's torch threads exist already: flushing would
                                    # reach only the main thread, and outlive the test


def make_text(n_words: int = 4000, seed: int = 0) -> str:
    rng = random.Random(seed)
    words = ["to", "be", "or", "not", "the", "king", "queen", "ROMEO:", "JULIET:", "love", "night",
             "thou", "art", "my", "sweet", "and", "fair", "day", "shall", "we", "go"]
    lines, line = [], []
    for _ in range(n_words):
        line.append(rng.choice(words))
        if len(line) > 7 or rng.random() < 0.1:
            lines.append(" ".join(line) + rng.choice([",", ".", "!", "?"]))
            line = []
    return "\n".join(lines) + "\n"


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    """A prepared character dataset named 'tiny' under tmp_path/data."""
    prepare(make_text(), tmp_path / "data" / "tiny")
    return tmp_path / "data"


def tiny_args(data_dir: Path, out_dir: Path, *extra: str) -> list[str]:
    """Arguments for a tiny run; a field in extra, as a value or as a --sweep axis, replaces TINY's."""
    given = {token.removeprefix("--sweep=").removeprefix("--").split("=")[0] for token in extra}
    tiny = [a for a in TINY if a[2:].split("=")[0] not in given]
    return [f"--data_dir={data_dir}", "--dataset=tiny", f"--out_dir={out_dir}", *tiny, *extra]


@pytest.fixture
def cpu_rounds_when_asked(monkeypatch):
    """As on a CPU with AMX, matmul_precision=medium asks a CPU to round whatever this CPU does, so
    that tests of where the setting reaches, and of attention's exact detour, run on every CPU."""
    import gpt.cpu.precision
    monkeypatch.setattr(gpt.cpu.precision, "cpu_can_round", lambda: True)
