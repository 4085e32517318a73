"""A checkpoint says when it was damaged or belongs to another run: hashes of its parts checked at
every load, a run id checked at resume, and optimizer moments no training could leave refused."""

import json
import shutil

import pytest
import torch

import sample
import train
from conftest import tiny_args
from gpt import checkpoint, integrity

pytestmark = pytest.mark.e2e


@pytest.fixture
def run(data_dir, tmp_path):
    out = tmp_path / "run"
    assert train.main(tiny_args(data_dir, out, "--max_iters=4", "--eval_interval=2")) == 0
    return out


def rewrite(path, change) -> None:
    """Load the checkpoint as torch reads it, change it, and save it back as it was, hashes and all:
    damage that still decodes to finite numbers."""
    ckpt = torch.load(path, weights_only=True)
    change(ckpt)
    torch.save(ckpt, path)


def test_a_weight_changed_on_disk_is_refused_by_sampling_and_resume_in_one_line(run, data_dir, capsys):
    path = run / "ckpt.pt"
    (run / "ckpt_best.pt").unlink()
    shutil.copy(path, run / "ckpt_best.pt")         # another file, whole
    def nudge(ckpt):
        ckpt["model"]["transformer.h.0.attn.c_attn.weight"][0, 0] += 0.01
    rewrite(path, nudge)
    assert sample.main([f"--out_dir={run}", "--max_new_tokens=3"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: {path} is damaged: its model no longer matches what was saved")
    assert "ckpt_best.pt is another file, which may be whole: copy it to ckpt.pt to resume from it" in err
    assert train.main(tiny_args(data_dir, run, "--max_iters=6", "--eval_interval=2", "--resume")) == 2
    assert "is damaged: its model no longer matches" in capsys.readouterr().err
    assert sample.main([f"--out_dir={run}", "--max_new_tokens=3", "--ckpt=best"]) == 0


def test_a_checkpoint_from_before_the_hashes_loads_with_a_note_said_once(run, capsys):
    def strip(ckpt):
        ckpt.pop("digests")
    rewrite(run / "ckpt.pt", strip)
    checkpoint.load(run / "ckpt.pt")
    checkpoint.load(run / "ckpt.pt")
    assert capsys.readouterr().err == (f"note: {run / 'ckpt.pt'} was saved before checkpoints carried a hash "
                                       "of their contents; it is loaded unchecked\n")


def test_damaged_moments_are_named_as_damage_not_blamed_on_the_learning_rate(run, data_dir, capsys):
    for damage, said in ((float("nan"), "holds nan or inf"), (-1.0, "holds a negative second moment")):
        path = run / "ckpt.pt"
        backup = path.read_bytes()
        def spoil(ckpt, value=damage):
            ckpt["optimizer"]["state"][0]["exp_avg_sq"].fill_(value)
            ckpt.pop("digests")         # as a checkpoint older than the hashes would be
        rewrite(path, spoil)
        assert train.main(tiny_args(data_dir, run, "--max_iters=6", "--eval_interval=2", "--resume")) == 2
        err = capsys.readouterr().err
        assert f"cannot be resumed: damage in its optimizer state (state[0]['exp_avg_sq'] {said})" in err
        assert "learning_rate" not in err and err.count("error:") == 1
        path.write_bytes(backup)


def test_another_runs_checkpoint_copied_in_is_refused_naming_both_unless_adopted(run, data_dir, tmp_path, capsys):
    other = tmp_path / "other"
    assert train.main(tiny_args(data_dir, other, "--max_iters=4", "--eval_interval=2", "--seed=5")) == 0
    ours = json.loads((run / "config.json").read_text())["run_id"]
    theirs = torch.load(other / "ckpt.pt", weights_only=True)["run_id"]
    assert ours != theirs and torch.load(run / "ckpt.pt", weights_only=True)["run_id"] == ours
    (run / "ckpt.pt").unlink()
    shutil.copy(other / "ckpt.pt", run / "ckpt.pt")
    lines_before = (run / "metrics.jsonl").read_text()
    argv = tiny_args(data_dir, run, "--max_iters=6", "--eval_interval=2", "--resume")
    assert train.main(argv) == 2
    err = capsys.readouterr().err
    assert f"was saved by run {theirs}, but {run} holds run {ours}" in err and "--adopt_checkpoint=true" in err
    assert (run / "metrics.jsonl").read_text() == lines_before      # nothing written
    assert train.main([*argv, "--adopt_checkpoint=true"]) == 0
    assert (run / f"metrics.{ours}.jsonl").read_text() == lines_before
    assert json.loads((run / "config.json").read_text())["run_id"] == theirs


def test_the_hash_covers_each_part_and_a_tuple_loads_as_saved():
    a = {"w": torch.ones(2, 3), "betas": (0.9, 0.99), "n": 3}
    assert integrity.digest(a) == integrity.digest({"w": torch.ones(2, 3), "betas": [0.9, 0.99], "n": 3})
    assert integrity.digest(a) != integrity.digest({**a, "w": torch.ones(3, 2)})      # the shape counts
    assert integrity.digest(a) != integrity.digest({**a, "w": torch.ones(2, 3, dtype=torch.bfloat16)})
    assert integrity.digest(a) != integrity.digest({**a, "n": 4})
