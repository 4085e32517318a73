import importlib.util
import itertools
import json
import random
import signal
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))   # `import gpt` under a bare `pytest` too

# A test run started in the background by a shell without job control (`pytest &` in a script)
# inherits SIGINT ignored, as would the scripts it starts, and then no Ctrl-C test could pass
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
# likewise SIGHUP under nohup, which a run rightly leaves ignored
if hasattr(signal, "SIGHUP") and signal.getsignal(signal.SIGHUP) is signal.SIG_IGN:
    signal.signal(signal.SIGHUP, signal.SIG_DFL)

from gpt.config import GPTConfig  # noqa: E402
from gpt.text_dataset import prepare  # noqa: E402
from gpt.model import GPT  # noqa: E402

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


def untimed_metrics(out_dir: Path, kind: str) -> list[dict]:
    """metrics.jsonl's rows of one kind, without the timings, which differ between any two runs."""
    rows = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in ("ms", "elapsed_s", "tokens_per_sec", "cpu_share")}
            for r in rows if r["kind"] == kind]


def resumed_as_whole(data_dir: Path, tmp_path: Path, args: list[str], steps: int, cut: int) -> tuple[dict, dict]:
    """Train args for `steps` steps at once, and again cut at `cut` and resumed; assert the two
    logged the same train rows and end with the same weights. Returns both final checkpoints."""
    import train
    from gpt import checkpoint
    whole, halves = tmp_path / "whole", tmp_path / "halves"
    assert train.main(tiny_args(data_dir, whole, *args, f"--max_iters={steps}")) == 0
    assert train.main(tiny_args(data_dir, halves, *args, f"--max_iters={cut}")) == 0
    assert train.main([f"--out_dir={halves}", "--resume", f"--max_iters={steps}"]) == 0
    assert untimed_metrics(whole, "train") == untimed_metrics(halves, "train")
    a, b = checkpoint.load(whole / "ckpt.pt"), checkpoint.load(halves / "ckpt.pt")
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    return a, b


@pytest.fixture
def cpu_rounds_when_asked(monkeypatch):
    """As on a CPU with AMX, matmul_precision=medium asks a CPU to round whatever this CPU does, so
    that tests of where the setting reaches, and of attention's exact detour, run on every CPU."""
    import gpt.speed.precision
    monkeypatch.setattr(gpt.speed.precision, "cpu_can_round", lambda: True)


# Tiny models, for the tests of gpt/model.py, generate.py, positions.py, pretrained.py and cpu/.

POS_ENCODINGS = ("learned", "sinusoidal", "rope", "alibi", "none")
PLACEMENTS = ("pre", "post", "sandwich")
GRID = list(itertools.product(POS_ENCODINGS, PLACEMENTS, (True, False), ("layernorm", "rmsnorm")))
GRID_IDS = [f"{pe}-{place}-{'res' if res else 'nores'}-{norm}" for pe, place, res, norm in GRID]
V, BLOCK = 13, 16


@pytest.fixture(scope="module")
def one_thread():
    """One torch thread through a module's tests: pytestmark = pytest.mark.usefixtures("one_thread")."""
    # ops this small only pay for thread hand-offs; on a busy 2-core box that cost 10x the runtime
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def tiny_model(seed: int = 0, **overrides) -> GPT:
    settings = dict(vocab_size=V, block_size=BLOCK, n_layer=2, n_head=4, n_embd=16, dropout=0.0)
    torch.manual_seed(seed)
    return GPT(GPTConfig(**{**settings, **overrides})).eval()


def grid_model(pos, place, res, norm) -> GPT:
    return tiny_model(pos_encoding=pos, norm_placement=place, residual=res, norm_type=norm)


def check_causal(model: GPT, t: int = 7) -> None:
    idx = torch.randint(0, V, (2, BLOCK))
    changed = idx.clone()
    changed[:, t] = (idx[:, t] + 1) % V
    with torch.no_grad():
        before, _ = model(idx)
        after, _ = model(changed)
    torch.testing.assert_close(after[:, :t], before[:, :t], atol=1e-6, rtol=0)
    assert (after[:, t:] - before[:, t:]).abs().max() > 1e-4


def check_generate_cache(model: GPT) -> None:
    # at GPT-2's 0.02 init a tiny untrained model has near-flat logits (top-2 gaps down to 2e-6),
    # where float rounding alone could flip a greedy pick; wide random weights separate them
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.5)
    prompt = torch.randint(0, V, (2, 10))
    # the first 6 new tokens fill the cache to block_size, the last 4 slide the window past it
    cached = model.generate(prompt, 10, temperature=0, use_cache=True)
    uncached = model.generate(prompt, 10, temperature=0, use_cache=False)
    assert cached.shape == (2, 20)
    assert torch.equal(cached, uncached)


@pytest.fixture
def no_estimate(monkeypatch):
    """Runs without the estimate before them, for tests that count a run's own forward passes."""
    from gpt.train import estimate
    monkeypatch.setattr(estimate, "say", lambda run, all_threads, stopped: None)


@pytest.fixture
def http_server():
    """serve(files) -> base URL: files ({path: bytes}) served over HTTP on 127.0.0.1 until the test ends."""
    import http.server
    import threading
    servers = []

    def serve(files: dict[str, bytes]) -> str:
        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                body = files.get(self.path)
                self.send_response(200 if body is not None else 404)
                self.send_header("Content-Length", str(len(body or b"")))
                self.end_headers()
                self.wfile.write(body or b"")

            def log_message(self, *args):      # no request lines in the test's output
                pass
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        # shutdown() waits for the loop's next poll: at the default poll_interval, 0.5 s a test
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"
    yield serve
    for server in servers:
        server.shutdown()
        server.server_close()


def gpt2_bpe_or_skip():
    """Skip unless GPT-2's BPE files are at hand: in tiktoken's cache, or by their own names in
    TIKTOKEN_CACHE_DIR, as the README tells an offline user to put them."""
    from gpt.errors import UserError
    from gpt.tokenizers import TiktokenTokenizer
    try:
        return TiktokenTokenizer("gpt2")
    except UserError:
        pytest.skip("GPT-2 BPE files are not at hand: set TIKTOKEN_CACHE_DIR to a folder holding "
                    "vocab.bpe and encoder.json")


def benchmark(name: str):
    """benchmarks/NAME.py, loaded as a module."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
