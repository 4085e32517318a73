"""gpt/train/source.py: --init_from, training and sampling from GPT-2 folders and other runs. The GPT-2
folders are small random ones made with transformers' save_pretrained; nothing needs the network."""

import json

import pytest
import torch

import sample
import train
from conftest import gpt2_bpe_or_skip, make_text
from gpt import checkpoint
from gpt.text_dataset import prepare
from gpt.pretrained import from_pretrained
from gpt.train import source

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.e2e]     # conftest.py
RUN = ["--device=cpu", "--batch_size=4", "--eval_iters=2", "--warmup_iters=2", "--threads=1",
       "--log_interval=1", "--flush_denormal=false", "--eval_interval=5"]
SHAPE = ["--n_layer=2", "--n_head=2", "--n_embd=16", "--block_size=16", "--dropout=0.0"]


@pytest.fixture(autouse=True)
def fresh_sources():
    source.resolve.cache_clear()        # a folder reused by name between tests is another source
    yield
    source.resolve.cache_clear()


def run_args(data_dir, out, *extra, dataset="tiny"):
    return [f"--data_dir={data_dir}", f"--dataset={dataset}", f"--out_dir={out}", *RUN, *extra]


def val_losses(out):
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r["val_loss"] for r in rows if r["kind"] == "eval"]


def gpt2_folder(path, n_positions=32, vocab_size=50257, **changes):
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=16, n_positions=n_positions,
                                     vocab_size=vocab_size, bos_token_id=0, eos_token_id=0, **changes)
    torch.manual_seed(0)
    transformers.GPT2LMHeadModel(config).save_pretrained(path)
    return path


@pytest.fixture
def bpe_data(tmp_path):
    gpt2_bpe_or_skip()
    prepare(make_text(3000), tmp_path / "data" / "tinybpe", tokenizer="tiktoken")
    return tmp_path / "data"


def test_another_run_is_continued_from_its_weights_with_its_shape(data_dir, tmp_path, capsys):
    first, second = tmp_path / "first", tmp_path / "second"
    assert train.main(run_args(data_dir, first, *SHAPE, "--max_iters=10", "--learning_rate=3e-3")) == 0
    # no shape given: the source's; its last evaluation's windows, so its last score comes back
    assert train.main(run_args(data_dir, second, f"--init_from={first}", "--max_iters=5")) == 0
    assert val_losses(second)[0] == pytest.approx(val_losses(first)[-1], abs=1e-6)
    saved = json.loads((second / "config.json").read_text())
    assert saved["train"]["init_from"] == str(first) and saved["model"]["n_embd"] == 16
    # a fine-tuning run resumes like any other
    capsys.readouterr()
    assert train.main(run_args(data_dir, second, f"--init_from={first}", "--max_iters=10", "--resume")) == 0
    assert "resuming" in capsys.readouterr().out and len(val_losses(second)) == 3


def test_shape_values_given_on_the_command_line_must_be_the_sources(data_dir, tmp_path, capsys):
    first = tmp_path / "first"
    assert train.main(run_args(data_dir, first, *SHAPE, "--max_iters=5")) == 0
    capsys.readouterr()
    assert train.main(run_args(data_dir, tmp_path / "a", f"--init_from={first}", "--n_layer=3",
                               "--pos_encoding=rope", "--max_iters=5")) == 2
    assert capsys.readouterr().err == (
        f"error: --init_from={first} gives the model's shape, and n_layer=3 (the source's is 2), "
        "pos_encoding=rope (the source's is learned) contradicts it; leave the shape options out\n")
    assert not (tmp_path / "a").exists()
    # the same values are no contradiction; dropout is the run's own
    assert train.main(run_args(data_dir, tmp_path / "b", f"--init_from={first}", "--n_layer=2",
                               "--dropout=0.1", "--max_iters=5")) == 0
    assert json.loads((tmp_path / "b" / "config.json").read_text())["model"]["dropout"] == 0.1


def test_a_config_files_shape_gives_way_to_the_source(data_dir, tmp_path):
    first = tmp_path / "first"
    assert train.main(run_args(data_dir, first, *SHAPE, "--max_iters=5")) == 0
    config = tmp_path / "c.toml"
    config.write_text('n_layer = 4\nn_head = 4\nn_embd = 64\nblock_size = 64\nmax_iters = 5\n')   # block 64: more than 16
    assert train.main(["--config", str(config), *run_args(data_dir, tmp_path / "b", f"--init_from={first}")]) == 0
    model = json.loads((tmp_path / "b" / "config.json").read_text())["model"]
    assert (model["n_layer"], model["n_embd"], model["block_size"]) == (2, 16, 16)


def test_block_size_is_cropped_never_grown(data_dir, tmp_path, capsys):
    first = tmp_path / "first"
    assert train.main(run_args(data_dir, first, *SHAPE, "--max_iters=5")) == 0
    assert train.main(run_args(data_dir, tmp_path / "b", f"--init_from={first}", "--block_size=8",
                               "--max_iters=5", "--learning_rate=1e-9", "--min_lr=0", "--weight_decay=0")) == 0
    cropped = checkpoint.load_for_sampling(tmp_path / "b")[0]
    theirs = checkpoint.load_for_sampling(first)[0]
    assert cropped.config.block_size == 8
    torch.testing.assert_close(cropped.transformer.wpe.weight, theirs.transformer.wpe.weight[:8], atol=1e-6, rtol=0)
    capsys.readouterr()
    assert train.main(run_args(data_dir, tmp_path / "c", f"--init_from={first}", "--block_size=32",
                               "--max_iters=5")) == 2
    assert capsys.readouterr().err == (f"error: block_size=32 is more than the 16 positions --init_from={first} "
                                       "was trained on; give at most 16\n")


def test_gpt2_from_a_folder_trains_on_bpe_data_and_starts_from_its_weights(bpe_data, tmp_path, capsys):
    folder = gpt2_folder(tmp_path / "gpt2")
    out = tmp_path / "ft"
    assert train.main(run_args(bpe_data, out, f"--init_from={folder}", "--block_size=16", "--max_iters=5",
                               dataset="tinybpe")) == 0
    ours = checkpoint.load_for_sampling(out)[0]
    assert (ours.config.n_layer, ours.config.vocab_size, ours.config.block_size, ours.config.activation) == (
        2, 50257, 16, "gelu_tanh")
    # its first evaluation scores GPT-2's own weights, on the run's first windows
    start = from_pretrained(str(folder)).eval()
    from gpt.data import Batches
    xs, ys = Batches(bpe_data / "tinybpe", 16, 4, "cpu", 0).evenly_spaced("val", 2, 4)
    with torch.no_grad():
        expected = sum(start(x, y)[1].item() for x, y in zip(xs, ys)) / 2
    assert val_losses(out)[0] == pytest.approx(expected, abs=1e-5)
    capsys.readouterr()
    # and sampling straight from it uses GPT-2's tokenizer
    assert sample.main([f"--init_from={folder}", "--start=To be", "--max_new_tokens=5", "--seed=1"]) == 0
    assert capsys.readouterr().out.startswith("To be")


def test_char_data_with_a_gpt2_source_is_refused_naming_a_dataset_that_fits(data_dir, tmp_path, capsys):
    folder = gpt2_folder(tmp_path / "gpt2")
    capsys.readouterr()
    assert train.main(run_args(data_dir, tmp_path / "ft", f"--init_from={folder}", "--max_iters=5")) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --init_from={folder} reads gpt2 BPE tokens (50,257 ids), but dataset 'tiny' "
                          "holds characters (")
    assert "give --dataset=shakespeare (Tiny Shakespeare in GPT-2's BPE)" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "ft").exists()


def test_another_runs_vocabulary_must_be_the_datas(data_dir, tmp_path, capsys):
    first = tmp_path / "first"
    assert train.main(run_args(data_dir, first, *SHAPE, "--max_iters=5")) == 0
    prepare("other letters: xyz\n" * 200, data_dir / "other")
    capsys.readouterr()
    assert train.main(run_args(data_dir, tmp_path / "b", f"--init_from={first}", "--max_iters=5",
                               dataset="other")) == 2
    err = capsys.readouterr().err
    assert "but dataset 'other' holds characters (" in err and err.endswith("; give --dataset=tiny, the dataset it trained on\n")


@pytest.mark.parametrize("case, message", [
    ("llama", r"config.json describes a 'llama' model, not 'gpt2'; only GPT-2 loads here"),
    ("empty", r"holds neither a run \(ckpt.pt\) nor a Hugging Face GPT-2 model \(config.json\)$"),
    ("typo", r"^init_from='gpt3' is no folder here; give a run's out_dir, a Hugging Face GPT-2 folder, or a "
             r"GPT-2 name: gpt2, gpt2-medium, gpt2-large, gpt2-xl$"),
    ("offline", r"^'gpt2-medium' is not a folder, and the hub could not give it: "),
])
def test_a_source_that_cannot_be_used_is_one_line(case, message, data_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")       # no network: the hub says so at once
    name = {"llama": tmp_path / "llama", "empty": tmp_path / "empty", "typo": "gpt3", "offline": "gpt2-medium"}[case]
    if case == "llama":
        name.mkdir()
        (name / "config.json").write_text(json.dumps({"model_type": "llama"}))
    if case == "empty":
        name.mkdir()
    capsys.readouterr()
    assert train.main(run_args(data_dir, tmp_path / "ft", f"--init_from={name}", "--max_iters=5")) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and err.startswith("error: ")
    assert __import__("re").search(message, err[len("error: "):].rstrip("\n")), err
    assert not (tmp_path / "ft").exists()


def test_a_sweep_of_fine_tuning_runs_is_refused(data_dir, tmp_path, capsys):
    assert train.main(run_args(data_dir, tmp_path / "s", "--init_from=gpt2", "--sweep", "learning_rate=1e-3,1e-4")) == 2
    assert "a sweep of fine-tuning runs is not supported yet" in capsys.readouterr().err


def test_an_exported_run_comes_back_through_init_from_with_its_score_and_characters(data_dir, tmp_path, capsys):
    pytest.importorskip("safetensors")
    pytest.importorskip("tokenizers")
    from gpt import export
    first, folder, second = tmp_path / "first", tmp_path / "hf", tmp_path / "second"
    assert train.main(run_args(data_dir, first, *SHAPE, "--max_iters=10", "--learning_rate=3e-3",
                               "--pos_encoding=sinusoidal", "--bias=false")) == 0
    assert export.main([f"--out_dir={first}", "--ckpt=latest", f"--to={folder}"]) == 0
    assert train.main(run_args(data_dir, second, f"--init_from={folder}", "--max_iters=5")) == 0
    assert val_losses(second)[0] == pytest.approx(val_losses(first)[-1], abs=1e-4)
    capsys.readouterr()
    # sampled with the exported characters, as the run itself samples
    args = ["--start=to be", "--max_new_tokens=30", "--seed=3", "--temperature=0"]
    assert sample.main([f"--init_from={folder}", *args]) == 0
    from_folder = capsys.readouterr().out
    assert sample.main([f"--out_dir={first}", *args]) == 0
    assert from_folder == capsys.readouterr().out and from_folder.startswith("to be")


def test_without_the_hf_extra_a_gpt2_source_says_what_to_install(data_dir, tmp_path, capsys, monkeypatch):
    folder = gpt2_folder(tmp_path / "gpt2")
    monkeypatch.setitem(__import__("sys").modules, "safetensors.torch", None)     # not installed
    monkeypatch.setitem(__import__("sys").modules, "huggingface_hub", None)
    capsys.readouterr()
    assert sample.main([f"--init_from={folder}"]) == 2
    assert capsys.readouterr().err == 'error: reading model.safetensors needs safetensors: pip install -e ".[hf]"\n'
    assert sample.main(["--init_from=gpt2"]) == 2
    assert capsys.readouterr().err == ("error: 'gpt2' is not a folder, and fetching it from the hub needs "
                                       'huggingface_hub: pip install -e ".[hf]"\n')
