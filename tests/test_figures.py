"""gpt/figures.py: the run dashboard and attention pictures, python -m gpt.figures."""

import json
import math

import pytest

import train
from conftest import tiny_args
from gpt import figures


@pytest.mark.e2e
def test_training_logs_diagnostics_and_the_dashboards_render(data_dir, tmp_path, capsys):
    out = tmp_path / "run"
    assert train.main(tiny_args(data_dir, out, "--max_iters=6", "--eval_interval=3")) == 0
    evals = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    evals = [e for e in evals if e["kind"] == "eval"]
    for key in ("block_grad_norm", "block_rms", "block_pos_sim", "block_update_ratio"):
        assert len(evals[-1][key]) == 2
    assert evals[0]["block_update_ratio"] == [0.0, 0.0] and evals[-1]["block_update_ratio"][0] > 0
    assert 0 < evals[-1]["unigram_loss"] < math.log(40)
    assert figures.main(["run", str(out)]) == 0
    assert (out / "dashboard.png").stat().st_size > 20_000
    assert figures.main(["attention", f"--out_dir={out}", "--start=ROMEO: to be"]) == 0
    assert (out / "attention.png").stat().st_size > 20_000
    # the folder either way, for both
    assert figures.main(["run", f"--out_dir={out}", f"--out={tmp_path / 'd.png'}"]) == 0
    assert figures.main(["attention", str(out), "--start=ROMEO: to be", f"--out={tmp_path / 'a.png'}"]) == 0
    assert (tmp_path / "d.png").read_bytes() == (out / "dashboard.png").read_bytes()
    assert (tmp_path / "a.png").stat().st_size > 20_000
    # the prompt from a file, as sample.py takes it
    (tmp_path / "prompt.txt").write_text("ROMEO: to be")
    assert figures.main(["attention", f"--out_dir={out}", f"--start=FILE:{tmp_path / 'prompt.txt'}",
                         f"--out={tmp_path / 'a.png'}"]) == 0
    assert (tmp_path / "a.png").read_bytes() == (out / "attention.png").read_bytes()
    # a prompt longer than the context: the picture is of its last block_size tokens, and it says so
    capsys.readouterr()
    assert figures.main(["attention", f"--out_dir={out}", "--start=" + "ROMEO: to be " * 3,
                         f"--out={tmp_path / 'long.png'}"]) == 0
    assert "note: the prompt has 39 tokens; the picture shows its last 16 (block_size)" in capsys.readouterr().out
    # bad names for the picture, and lines of another shape in the log
    for bad, message in ((tmp_path / "a.txt", "a format matplotlib writes, such as .png"),
                         (out / "ckpt.pt" / "x.png", "ckpt.pt is a file, not a folder")):
        assert figures.main(["run", str(out), f"--out={bad}"]) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.splitlines()) == 1
    with open(out / "metrics.jsonl", "a") as f:
        f.write('{"kind": "eval", "iter": 9}\n{"kind": "train", "iter": 9}\n\xff\n')
    assert figures.main(["run", str(out)]) == 0
    capsys.readouterr()
    (out / "metrics.jsonl").write_bytes(b"\x00" * 4096)     # overwritten by a crash, say
    assert figures.main(["run", str(out)]) == 2
    assert capsys.readouterr().err == (f"error: {out / 'metrics.jsonl'} holds no line of a training run's; "
                                       "is it damaged or another program's?\n")
    (out / "metrics.jsonl").write_text('{"kind": "train", "iter": 0, "loss": 4.1, "lr": 0.001}\n')
    assert figures.main(["run", str(out)]) == 2
    assert capsys.readouterr().err == f"error: {out / 'metrics.jsonl'} has no evaluation yet\n"


@pytest.mark.e2e
def test_the_dashboard_draws_the_learning_rate_to_the_last_evaluation(data_dir, tmp_path, monkeypatch):
    out = tmp_path / "run"
    assert train.main(tiny_args(data_dir, out, "--max_iters=6", "--eval_interval=3", "--log_interval=4")) == 0
    drawn = []
    monkeypatch.setattr(figures, "save_figure", lambda fig, path: drawn.append(fig))
    figures.run_figure(out, out / "dashboard.png")
    lr_line = drawn[0].axes[1].lines[0]
    assert list(lr_line.get_xdata()) == [0, 3, 4, 6]       # train lines at 0 and 4, evals at 0, 3, 6
    (bits,) = drawn[0].axes[0].child_axes           # char data: the losses read in bits per character too
    assert bits.get_ylabel() == "bits per character"
    figures.pyplot().close(drawn[0])


@pytest.mark.e2e
def test_an_attention_picture_of_many_heads_and_a_long_prompt_stays_viewable(data_dir, tmp_path):
    from PIL import Image
    out = tmp_path / "run"
    assert train.main(tiny_args(data_dir, out, "--max_iters=1", "--n_head=8", "--block_size=96")) == 0
    assert figures.main(["attention", f"--out_dir={out}", "--start=" + "ROMEO: to be " * 8]) == 0
    with Image.open(out / "attention.png") as picture:
        assert max(picture.size) <= 4800 and picture.size[0] > 4000     # 48 inches at 100 dpi


def test_attention_maps_share_one_colour_bar_of_probabilities():
    import torch
    maps = [torch.softmax(torch.randn(1, 3, 5, 5), dim=-1) for _ in range(2)]     # 2 layers of 3 heads
    fig = figures.attention_maps_figure(maps, list("ROMEO"))
    panels = [ax for ax in fig.axes if ax.images]
    assert len(panels) == 6 and len(fig.axes) == 7
    bars = [image.colorbar for ax in panels for image in ax.images if image.colorbar is not None]
    assert len(bars) == 1 and bars[0].ax in fig.axes and bars[0].ax not in panels
    assert (bars[0].vmin, bars[0].vmax) == (0, 1) and bars[0].ax.get_ylabel() == "attention probability"
    assert all(ax.images[0].get_clim() == (0, 1) for ax in panels)     # one scale for every panel
    figures.pyplot().close(fig)


def test_figures_errors_are_one_line(tmp_path, capsys):
    assert figures.main(["run", str(tmp_path)]) == 2
    assert capsys.readouterr().err.startswith("error: ")
    assert figures.main(["attention", f"--out_dir={tmp_path}"]) == 2
    assert "no checkpoint at" in capsys.readouterr().err
    # a sweep's folder holds runs, not a checkpoint: name one
    for run in ("b=2__seed=1", "a=1__seed=1"):
        (tmp_path / run).mkdir()
        (tmp_path / run / "ckpt.pt").write_bytes(b"")
    (tmp_path / "sweep.json").write_text("{}")
    assert figures.main(["attention", f"--out_dir={tmp_path}"]) == 2
    assert capsys.readouterr().err == (f"error: {tmp_path} is a sweep; give one of its runs, "
                                       f"e.g. {tmp_path / 'a=1__seed=1'}\n")
    assert figures.main(["run", str(tmp_path)]) == 2
    assert capsys.readouterr().err == (f"error: {tmp_path} is a sweep: its curves are in "
                                       f"{tmp_path / 'curves.png'} (python -m gpt.sweep report "
                                       f"{tmp_path}); or give one of its runs\n")
    # the checkpoint given for its run folder
    ckpt = tmp_path / "a=1__seed=1" / "ckpt.pt"
    for argv in (["run", str(ckpt)], ["attention", f"--out_dir={ckpt}"]):
        assert figures.main(argv) == 2
        assert capsys.readouterr().err == f"error: {ckpt} is a file, not a run folder; give {ckpt.parent}\n"
