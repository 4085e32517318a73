import json
import re
import shutil
import subprocess

import pytest

import train
from conftest import ROOT, tiny_args


def losses(out_dir):
    rows = [json.loads(x) for x in (out_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in rows if r["kind"] == "train"]


@pytest.mark.skipif(shutil.which("torchrun") is None, reason="torchrun is not installed")
def test_two_processes_match_one_process_accumulating_two_steps(data_dir, tmp_path):
    # dropout too: each micro-batch's masks must follow it to whichever process runs it
    args = ["--max_iters=8", "--eval_interval=8", "--gradient_accumulation_steps=2", "--seed=3",
            "--dropout=0.1"]
    single = tmp_path / "single"
    assert train.main(tiny_args(data_dir, single, *args)) == 0
    ddp = tmp_path / "ddp"
    proc = subprocess.run(
        ["torchrun", "--standalone", "--nproc_per_node=2", str(ROOT / "train.py"),
         *tiny_args(data_dir, ddp, *args)],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    # the ranks' own lines, without the launcher's log lines (W/E/I + date) that would bury them
    ranks = [line for line in proc.stderr.splitlines() if not re.match(r"[WEI]\d{4} ", line)]
    assert proc.returncode == 0, "\n".join(ranks)[-3000:]
    assert (ddp / "command.txt").read_text().startswith("torchrun --nproc_per_node=2 train.py --data_dir=")
    a, b = losses(single), losses(ddp)
    assert len(a) == len(b) == 8
    assert max(abs(x - y) for x, y in zip(a, b)) < 1e-5
    assert a[-1] < a[0]
