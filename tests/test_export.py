"""gpt/export.py: python -m gpt.export writes a run's model as a Hugging Face GPT-2 folder."""

import dataclasses
import itertools
import json
import os
import re
import subprocess
import sys

import pytest
import torch

from conftest import ROOT, gpt2_bpe_or_skip
from gpt import checkpoint
from gpt.config import GPTConfig, TrainConfig
from gpt.export import main
from gpt.hf_tokenizers import recover_merges
from gpt.model import GPT
from gpt.pretrained import from_pretrained
from gpt.tokenizers import ByteTokenizer, CharTokenizer

pytestmark = pytest.mark.usefixtures("one_thread")     # conftest.py

transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")
pytest.importorskip("tokenizers")

TEXTS = ["ROMEO:\nWhat, ho! apothecary!\n", " \n\n  \t\tÄé—😀 x\u0301 œ. ", "\n", " ", "\t", "a  b\n\nc"]
CHARS = sorted(set("".join(TEXTS) + "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz,.;:?!'-"))
CHAR_META = {"tokenizer": "char", "vocab_size": len(CHARS), "chars": CHARS}
BLOCK = 32


def wide_model(seed: int = 0, **settings) -> GPT:
    """A tiny untrained model, every weight, bias and norm weight moved off its start (norms
    from 1, biases from 0), so that a tensor written to the wrong place, or not at all, shows."""
    settings = {"vocab_size": len(CHARS), "block_size": BLOCK, "n_layer": 2, "n_head": 2, "n_embd": 16,
                **settings}
    torch.manual_seed(seed)
    model = GPT(GPTConfig(**settings))
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.3)
            else:
                p.add_(0.3 * torch.randn_like(p))
    return model.eval()


def save_run(out, model: GPT, meta: dict = CHAR_META, name: str = "ckpt_best.pt"):
    out.mkdir(exist_ok=True)
    checkpoint.save({"model": model.state_dict(), "model_config": dataclasses.asdict(model.config),
                     "train_config": dataclasses.asdict(TrainConfig()), "meta": meta}, out / name)
    return out


def export_ok(capsys, run, dest, *extra) -> str:
    assert main([f"--out_dir={run}", f"--to={dest}", *extra]) == 0
    said = capsys.readouterr()
    assert said.out.startswith(f"wrote {dest}: ") and said.out.count("\n") == 1
    return said.out


def error_of(capsys, argv) -> str:
    assert main(argv) == 2
    said = capsys.readouterr()
    assert said.out == "" and said.err.startswith("error: ") and said.err.count("\n") == 1
    return said.err


def leftovers(folder) -> list[str]:
    """The export's temporary folders (hidden, beside --to) still in folder."""
    return [p.name for p in folder.iterdir() if p.name.startswith(".")]


def hf_model(folder):
    return transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


# ---------------------------------------------------------------- the model

# pos_encoding, activation, bias, mlp_ratio, tie_weights: every pair of values of any two of them
# is in some row (9 rows rather than the 72 of every combination)
GRID = [("learned", "gelu", True, 4, True), ("learned", "gelu_tanh", False, 2, False),
        ("sinusoidal", "relu", True, 4, False), ("none", "relu", False, 2, True),
        ("sinusoidal", "gelu", False, 2, True), ("none", "gelu_tanh", True, 4, True),
        ("none", "gelu", True, 2, False), ("learned", "relu", False, 4, True),
        ("sinusoidal", "gelu_tanh", True, 4, True)]


def test_the_grid_holds_every_pair_of_settings():
    levels = [sorted({row[i] for row in GRID}, key=str) for i in range(5)]
    assert [len(v) for v in levels] == [3, 3, 2, 2, 2]
    for i, j in itertools.combinations(range(5), 2):
        assert {(row[i], row[j]) for row in GRID} == set(itertools.product(levels[i], levels[j]))


@pytest.mark.e2e
@pytest.mark.parametrize("pos, activation, bias, mlp_ratio, tie", GRID,
                         ids=["-".join(map(str, row)) for row in GRID])
def test_transformers_gives_the_exported_models_logits_and_greedy_text(tmp_path, capsys, pos, activation,
                                                                        bias, mlp_ratio, tie):
    model = wide_model(pos_encoding=pos, activation=activation, bias=bias, mlp_ratio=mlp_ratio,
                       tie_weights=tie)
    run = save_run(tmp_path / "run", model)
    export_ok(capsys, run, tmp_path / "hf")
    hf = hf_model(tmp_path / "hf")
    written = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert written["n_inner"] == mlp_ratio * 16 and written["tie_word_embeddings"] is tie
    assert written["n_positions"] == BLOCK and written["eos_token_id"] is None
    idx = torch.randint(0, len(CHARS), (3, BLOCK))
    with torch.no_grad():
        ours, _ = model(idx)
        theirs = hf(idx).logits
    assert (ours - theirs).abs().max() <= 1e-4
    prompt = idx[:2, :8]
    greedy = hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=20,
                         min_new_tokens=20, do_sample=False)
    assert torch.equal(greedy, model.generate(prompt, 20, temperature=0))


@pytest.mark.parametrize("pos, activation, bias, mlp_ratio, tie",
                         [("sinusoidal", "gelu_tanh", False, 4, False), ("none", "relu", True, 4, True),
                          ("learned", "gelu", False, 2, True)])
def test_the_exported_folder_loads_back_here_with_the_same_logits(tmp_path, capsys, pos, activation,
                                                                  bias, mlp_ratio, tie):
    model = wide_model(pos_encoding=pos, activation=activation, bias=bias, mlp_ratio=mlp_ratio,
                       tie_weights=tie)
    export_ok(capsys, save_run(tmp_path / "run", model), tmp_path / "hf")
    back = from_pretrained(str(tmp_path / "hf")).eval()
    assert back.config.activation == activation and back.config.tie_weights is tie
    assert back.config.mlp_ratio == mlp_ratio
    idx = torch.randint(0, len(CHARS), (2, BLOCK))
    with torch.no_grad():
        torch.testing.assert_close(back(idx)[0], model(idx)[0], atol=1e-4, rtol=0)


@pytest.mark.e2e
def test_the_chosen_checkpoint_is_the_one_written(tmp_path, capsys):
    run = save_run(tmp_path / "run", wide_model(seed=1), name="ckpt.pt")
    save_run(run, wide_model(seed=2), name="ckpt_best.pt")
    export_ok(capsys, run, tmp_path / "latest", "--ckpt=latest")
    export_ok(capsys, run, tmp_path / "best")
    idx = torch.randint(0, len(CHARS), (1, BLOCK))
    with torch.no_grad():
        for name, seed in (("latest", 1), ("best", 2)):
            expected = wide_model(seed=seed)(idx)[0]
            assert (hf_model(tmp_path / name)(idx).logits - expected).abs().max() <= 1e-4


# ---------------------------------------------------------------- what GPT-2 cannot compute

@pytest.mark.parametrize("setting, named", [
    (dict(pos_encoding="rope"), "pos_encoding=rope"),
    (dict(pos_encoding="alibi"), "pos_encoding=alibi"),
    (dict(norm_placement="post"), "norm_placement=post"),
    (dict(norm_placement="sandwich"), "norm_placement=sandwich"),
    (dict(residual=False), "residual=false"),
    (dict(norm_type="rmsnorm"), "norm_type=rmsnorm"),
    (dict(parallel=True), "parallel=true"),
    (dict(qk_norm=True), "qk_norm=true"),
    (dict(activation="swiglu"), "activation=swiglu"),
    (dict(activation="geglu"), "activation=geglu"),
    (dict(n_head=4, n_kv_head=2), "n_kv_head=2"),
    (dict(scale_embeddings=True), "scale_embeddings=true"),
])
def test_a_setting_gpt2_cannot_compute_is_refused_by_name_and_nothing_is_written(tmp_path, capsys,
                                                                                 setting, named):
    run = save_run(tmp_path / "run", wide_model(**setting))
    err = error_of(capsys, [f"--out_dir={run}", f"--to={tmp_path / 'hf'}"])
    assert err.startswith(f"error: {run}'s model cannot be written as GPT-2: {named} (GPT-2 has ")
    assert not (tmp_path / "hf").exists() and leftovers(tmp_path) == []


def test_every_setting_in_the_way_is_named_in_one_line(tmp_path, capsys):
    run = save_run(tmp_path / "run", wide_model(pos_encoding="rope", qk_norm=True, norm_type="rmsnorm"))
    err = error_of(capsys, [f"--out_dir={run}", f"--to={tmp_path / 'hf'}"])
    assert err == (f"error: {run}'s model cannot be written as GPT-2: pos_encoding=rope, norm_type=rmsnorm, "
                   "qk_norm=true (GPT-2 has a table of positions added to the tokens; LayerNorm; no QK-norm)\n")
    assert not (tmp_path / "hf").exists()


# ---------------------------------------------------------------- the tokenizers

@pytest.mark.e2e
def test_a_character_models_tokenizer_maps_exactly_its_characters(tmp_path, capsys):
    export_ok(capsys, save_run(tmp_path / "run", wide_model()), tmp_path / "hf")
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    ours = CharTokenizer(CHARS)
    assert len(tok) == len(CHARS)
    for text in TEXTS:
        ids = tok.encode(text)
        assert ids == ours.encode(text) and tok.decode(ids) == text
        assert tok(text)["input_ids"] == ids        # nothing added at either end
    assert tok.convert_ids_to_tokens(list(range(len(CHARS)))) == CHARS


@pytest.mark.e2e
def test_a_byte_models_tokenizer_maps_the_utf8_bytes(tmp_path, capsys):
    model = wide_model(vocab_size=256)
    export_ok(capsys, save_run(tmp_path / "run", model, {"tokenizer": "byte", "vocab_size": 256}),
              tmp_path / "hf")
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    every = "".join(map(chr, range(1, 700))) + "\x00"
    for text in [*TEXTS, every]:
        ids = tok.encode(text)
        assert ids == list(text.encode()) and tok.decode(ids) == text
    for ids in ([0xff], [0x61, 0xc3, 0x28, 0xe2, 0x28, 0xa1], [0xf0, 0x9f, 0x98]):   # not UTF-8
        assert tok.decode(ids) == ByteTokenizer().decode(ids)


@pytest.mark.e2e
def test_a_gpt2_bpe_models_tokenizer_is_gpt2s_own(tmp_path, capsys, monkeypatch):
    ours = gpt2_bpe_or_skip()
    model = wide_model(vocab_size=50304, n_embd=8)      # padded, as the default config trains it
    run = save_run(tmp_path / "run", model, ours.meta())
    export_ok(capsys, run, tmp_path / "hf")
    folder = tmp_path / "hf"
    vocab = json.loads((folder / "vocab.json").read_text(encoding="utf-8"))
    assert len(vocab) == 50257 and vocab["<|endoftext|>"] == 50256 and vocab["Ġthe"] == 262
    merges = (folder / "merges.txt").read_text(encoding="utf-8").splitlines()
    assert merges[:3] == ["#version: 0.2", "Ġ t", "Ġ a"] and len(merges) == 50001
    written = json.loads((folder / "config.json").read_text())
    assert written["vocab_size"] == 50304 and written["eos_token_id"] == written["bos_token_id"] == 50256
    texts = [*TEXTS, "I'll've don't 're 123456 3.14 €100 ünïcödé 日本語 <|endoftext|>next", "   spaces   "]
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    for text in texts:
        assert tok.encode(text) == ours.encode(text) and tok.decode(ours.encode(text)) == text
    (folder / "tokenizer.json").unlink()    # vocab.json and merges.txt alone, as GPT-2 shipped them
    alone = transformers.AutoTokenizer.from_pretrained(folder)
    assert all(alone.encode(text) == ours.encode(text) for text in texts)


def test_the_merges_are_those_bpe_leaves_two_of():
    ranks = {bytes([b]): b for b in range(256)}
    for token in (b"ab", b"abc", b"bc", b"abcd"):
        ranks[token] = len(ranks)
    assert recover_merges(ranks) == [(b"a", b"b"), (b"ab", b"c"), (b"b", b"c"), (b"abc", b"d")]


# ---------------------------------------------------------------- the folder

def test_a_folder_holding_files_is_replaced_only_with_overwrite(tmp_path, capsys):
    run = save_run(tmp_path / "run", wide_model())
    dest = tmp_path / "hf"
    dest.mkdir()
    (dest / "notes.txt").write_text("mine")
    err = error_of(capsys, [f"--out_dir={run}", f"--to={dest}"])
    assert err == (f"error: --to={dest} already holds notes.txt; give --overwrite=true to replace the "
                   "whole folder, or another --to\n")
    assert os.listdir(dest) == ["notes.txt"]
    export_ok(capsys, run, dest, "--overwrite=true")
    assert sorted(os.listdir(dest)) == ["config.json", "generation_config.json", "model.safetensors",
                                        "tokenizer.json", "tokenizer_config.json"]
    assert leftovers(tmp_path) == []
    empty = tmp_path / "empty"
    empty.mkdir()
    export_ok(capsys, run, empty)       # an empty folder holds nothing to lose
    nested = tmp_path / "a" / "b" / "hf"
    export_ok(capsys, run, nested)      # missing parents are made
    assert (nested / "config.json").is_file()


@pytest.mark.parametrize("there", [False, True])
def test_a_failure_while_writing_leaves_the_folder_as_it_was(tmp_path, capsys, monkeypatch, there):
    import safetensors.torch

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(safetensors.torch, "save_file", full_disk)
    run = save_run(tmp_path / "run", wide_model())
    dest = tmp_path / "new" / "hf"
    if there:
        dest.mkdir(parents=True)
        (dest / "config.json").write_text("an earlier export")
    err = error_of(capsys, [f"--out_dir={run}", f"--to={dest}", "--overwrite=true"])
    kept = f"{dest} is as it was" if there else "nothing was written"
    assert err == f"error: cannot write {dest} (No space left on device); {kept}\n"
    if there:
        assert os.listdir(dest) == ["config.json"] and (dest / "config.json").read_text() == "an earlier export"
        assert leftovers(dest.parent) == []
    else:
        assert not (tmp_path / "new").exists()      # the parent made for it is gone too


@pytest.mark.parametrize("when", ["writing", "between the moves"])
def test_ctrl_c_leaves_the_folder_as_it_was(tmp_path, capsys, monkeypatch, when):
    import safetensors.torch

    import gpt.export
    run = save_run(tmp_path / "run", wide_model())
    dest = tmp_path / "hf"
    dest.mkdir()
    (dest / "config.json").write_text("an earlier export")
    if when == "writing":
        def interrupted(*args, **kwargs):
            raise KeyboardInterrupt
        monkeypatch.setattr(safetensors.torch, "save_file", interrupted)
    else:   # the old folder moved aside, the new one not yet in
        moves, replace = [], os.replace

        def second_interrupted(src, dst):
            moves.append(dst)
            if len(moves) == 2:
                raise KeyboardInterrupt
            replace(src, dst)
        monkeypatch.setattr(gpt.export.os, "replace", second_interrupted)
    with pytest.raises(KeyboardInterrupt):
        main([f"--out_dir={run}", f"--to={dest}", "--overwrite=true"])
    monkeypatch.undo()
    assert os.listdir(dest) == ["config.json"] and (dest / "config.json").read_text() == "an earlier export"
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("case, message", [
    ("file", r"--to=.*/hf is a file, not a folder"),
    ("run", r"--to=.* holds the run folder .*/run, whose checkpoints the export would replace"),
    ("no --to", r"--to is missing or empty; give the folder"),
    ("cwd", r"--to=\. is or holds the current folder, which the export would replace"),
    ("no run", r"no checkpoint at .*/nothing/ckpt_best.pt"),
    ("no best", r"ckpt_best.pt does not exist.*--ckpt=latest exports ckpt.pt"),
    ("ckpt", r"ckpt='last' is not allowed; did you mean latest\?"),
])
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, capsys, monkeypatch, case, message):
    run = save_run(tmp_path / "run", wide_model(), name="ckpt.pt" if case == "no best" else "ckpt_best.pt")
    argv = {"file": [f"--to={tmp_path / 'hf'}"], "run": [f"--to={tmp_path}", "--overwrite=true"],
            "no --to": [], "cwd": ["--to=.", "--overwrite=true"], "no run": [f"--to={tmp_path / 'hf'}"], "no best": [f"--to={tmp_path / 'hf'}"],
            "ckpt": [f"--to={tmp_path / 'hf'}", "--ckpt=last"]}[case]
    if case == "file":
        (tmp_path / "hf").write_text("not a folder")
    if case == "cwd":
        (tmp_path / "here").mkdir()
        monkeypatch.chdir(tmp_path / "here")
    out_dir = tmp_path / "nothing" if case == "no run" else run
    before = sorted(p.name for p in tmp_path.rglob("*"))
    err = error_of(capsys, [f"--out_dir={out_dir}", *argv])
    assert re.search(message, err), err
    assert sorted(p.name for p in tmp_path.rglob("*")) == before


def test_without_the_hf_extra_the_command_says_what_to_install(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "tokenizers", None)    # import tokenizers: ImportError
    run = save_run(tmp_path / "run", wide_model())
    err = error_of(capsys, [f"--out_dir={run}", f"--to={tmp_path / 'hf'}"])
    assert err == 'error: python -m gpt.export needs safetensors and tokenizers: pip install -e ".[hf]"\n'
    assert not (tmp_path / "hf").exists()


# ---------------------------------------------------------------- the command

def test_help_lists_the_options(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: python -m gpt.export [--name=value ...]")
    for option in ("--out_dir=out", "--ckpt=best [best | latest]", "--to=''", "--overwrite=false"):
        assert option in out


@pytest.mark.e2e
def test_python_m_gpt_export_runs(tmp_path):
    save_run(tmp_path / "run", wide_model())
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "gpt.export", "--out_dir=run", "--to=hf"],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("wrote hf: run/ckpt_best.pt as GPT-2 (")
    assert (tmp_path / "hf" / "model.safetensors").is_file()
