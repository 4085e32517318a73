"""Long checks that a shipped recipe still reaches what README promises: run with -m slow."""
import json
import shutil

import numpy as np
import pytest

import train
from conftest import ROOT
from gpt import checkpoint
from gpt.config_files import read_config_file
from gpt.diagnostics import whole_split_loss

TEXT = ROOT / "data" / "shakespeare_char" / "input.txt"


@pytest.mark.slow
@pytest.mark.skipif(not TEXT.exists(), reason=f"Tiny Shakespeare is not at {TEXT}")
def test_fast_recipe_reaches_the_nanogpt_cpu_recipe_quality(tmp_path):
    (tmp_path / "shakespeare_char").mkdir()
    shutil.copy(TEXT, tmp_path / "shakespeare_char" / "input.txt")
    out = tmp_path / "fast"
    # in this process, flushing subnormals would outlast the test (this healthy run makes none)
    assert train.main(["--config", "shakespeare_char_fast", f"--data_dir={tmp_path}",
                       f"--out_dir={out}", "--flush_denormal=false"]) == 0
    evals = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()
             if json.loads(line)["kind"] == "eval"]
    # nanoGPT's 2000-step CPU recipe: 1.886 by its own 20-batch estimate, 1.898 on the whole split
    assert evals[-1]["iter"] == read_config_file("shakespeare_char_fast")[0]["max_iters"]
    assert evals[-1]["val_loss"] <= 1.886
    model = checkpoint.load_model(checkpoint.load(out / "ckpt.pt"))
    val = np.fromfile(tmp_path / "shakespeare_char" / "val.bin", dtype=np.uint16)
    assert whole_split_loss(model, val) <= 1.898
