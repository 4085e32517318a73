"""Where a run's first weights come from (--init_from): GPT-2 by name or folder, or another run.

The model's shape is the source's: a config file's shape values give way to it, and ones given on
the command line that differ are refused. block_size may be cropped below the source's, never
grown. The data must be tokenized as the source was; the weights are loaded in setup."""

from __future__ import annotations

import dataclasses
import functools
import json
from dataclasses import dataclass
from pathlib import Path

import torch

from .. import checkpoint
from ..config import GPTConfig
from ..errors import UserError
from ..model import GPT
from ..tokenizers import tokenizer_from_meta
from ..pretrained import HUB_NAMES, gpt2_config, gpt2_folder, gpt2_state
from ..speed import attach_attention, lay_out_weights

GPT2_BPE = {"tokenizer": "tiktoken", "vocab_size": 50257, "encoding": "gpt2"}
NOT_SHAPE = ("vocab_size", "block_size", "dropout")     # the data's, at most the source's, the run's


@dataclass(frozen=True)
class Source:
    name: str               # as given
    config: GPTConfig       # the source model's
    meta: dict | None       # its tokenizer, as a dataset's meta.json says it; None: not known
    folder: Path
    run_file: Path | None   # a run's checkpoint; None: a Hugging Face GPT-2 folder


@functools.cache
def resolve(init_from: str) -> Source:
    """The source that --init_from names: a run's out_dir, a Hugging Face GPT-2 folder, or a GPT-2
    name on the hub (fetched once, then from the hub's cache)."""
    path = Path(init_from).expanduser()
    if checkpoint.is_sweep(path):
        pick = checkpoint.sweep_given(path, ("ckpt.pt", "ckpt_best.pt"))
        raise UserError(f"init_from={init_from!r}: " + (pick or f"{path} is a sweep, none of whose runs "
                                                          "has saved a checkpoint yet; give one once it has"))
    runs = [path / name for name in ("ckpt.pt", "ckpt_best.pt") if (path / name).is_file()]
    if runs:
        ckpt = checkpoint.load(runs[0], mmap=True, verify=("model_config", "meta"))  # the weights come later
        return Source(init_from, checkpoint.model_config(ckpt), ckpt["meta"], path, runs[0])
    if path.is_dir() and not (path / "config.json").is_file():
        raise UserError(f"init_from={init_from!r}: {path} holds neither a run (ckpt.pt) nor a Hugging "
                        "Face GPT-2 model (config.json)")
    if not path.is_dir() and init_from not in HUB_NAMES:
        raise UserError(f"init_from={init_from!r} is no folder here; give a run's out_dir, a Hugging Face "
                        f"GPT-2 folder, or a GPT-2 name: {', '.join(HUB_NAMES)}")
    folder = gpt2_folder(init_from)
    config = gpt2_config(folder / "config.json")
    return Source(init_from, config, tokenizer_of(folder, config.vocab_size), folder, None)


def tokenizer_of(folder: Path, vocab_size: int) -> dict | None:
    """What a Hugging Face folder's tokenizer is, as a meta.json would say: the characters of a
    word-level tokenizer.json (a char model exported from here), its 256 bytes, or GPT-2's BPE."""
    try:
        model = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))["model"]
    except (OSError, ValueError, KeyError, TypeError):
        model = {}
    vocab = model.get("vocab") if isinstance(model, dict) else None
    if model.get("type") == "WordLevel" and isinstance(vocab, dict) and len(vocab) == vocab_size:
        chars = sorted(vocab, key=vocab.get)
        if all(len(c) == 1 for c in chars) and sorted(vocab.values()) == list(range(vocab_size)):
            return {"tokenizer": "char", "vocab_size": vocab_size, "chars": chars}
    if model.get("type") == "BPE" and vocab_size == 256 and not model.get("merges"):
        return {"tokenizer": "byte", "vocab_size": 256}
    return dict(GPT2_BPE) if vocab_size == GPT2_BPE["vocab_size"] else None


def shaped(model_cfg: GPTConfig, values: dict, on_command_line: set[str], source: Source) -> GPTConfig:
    """model_cfg with the source's shape: every model value but vocab_size, block_size and dropout.
    block_size stays as given where that is at most the source's."""
    theirs = source.config
    clash = [f"{f.name}={getattr(model_cfg, f.name)} (the source's is {getattr(theirs, f.name)})"
             for f in dataclasses.fields(GPTConfig) if f.name not in NOT_SHAPE and f.name in on_command_line
             and getattr(model_cfg, f.name) != getattr(theirs, f.name)]
    if clash:
        raise UserError(f"--init_from={source.name} gives the model's shape, and {', '.join(clash)} "
                        "contradicts it; leave the shape options out")
    block = model_cfg.block_size if "block_size" in values else theirs.block_size
    if block > theirs.block_size:
        if "block_size" in on_command_line:
            raise UserError(f"block_size={block} is more than the {theirs.block_size} positions "
                            f"--init_from={source.name} was trained on; give at most {theirs.block_size}")
        block = theirs.block_size       # a config file's value gives way
    return dataclasses.replace(theirs, block_size=block, dropout=model_cfg.dropout,
                               vocab_size=model_cfg.vocab_size)


def check_data(source: Source, meta: dict, dataset: str) -> None:
    """Refuse data not tokenized as the source's was: its ids would mean other tokens."""
    keys = ("tokenizer", "vocab_size", "chars", "encoding")
    if source.meta is not None and [meta.get(k) for k in keys] == [source.meta.get(k) for k in keys]:
        return
    if source.meta is None:
        raise UserError(f"--init_from={source.name}: its tokenizer is not one this project knows (GPT-2's "
                        "BPE, or characters or bytes exported from here), so no dataset can be checked "
                        "to fit it")
    theirs = describe(source.meta)
    if source.meta == GPT2_BPE:
        fits = "give --dataset=shakespeare (Tiny Shakespeare in GPT-2's BPE), or prepare your text with data/shakespeare/prepare.py"
    elif source.run_file is not None:
        trained = checkpoint.load(source.run_file, mmap=True, needs=("train_config",))["train_config"]
        fits = f"give --dataset={trained.get('dataset')}, the dataset it trained on"
    else:
        fits = "give a dataset prepared with that vocabulary"
    raise UserError(f"--init_from={source.name} reads {theirs}, but dataset {dataset!r} holds {describe(meta)}; {fits}")


def describe(meta: dict) -> str:
    kind = meta.get("tokenizer")
    if kind == "tiktoken":
        return f"{meta.get('encoding')} BPE tokens ({meta.get('vocab_size'):,} ids)"
    if kind == "byte":
        return "bytes"
    return f"characters ({meta.get('vocab_size')} of them)"


def load_source_weights(model, source: Source) -> None:
    """The source's weights into model, the position table cropped to model's block_size."""
    expected = model.state_dict()
    if source.run_file is not None:
        state = checkpoint.load(source.run_file)["model"]
    else:
        full = dataclasses.replace(model.config, block_size=source.config.block_size)
        state = gpt2_state(source.folder, {**expected, **_position_table(full)})
    for key, value in state.items():
        if key.endswith("wpe.weight") and key in expected and value.shape[0] > expected[key].shape[0]:
            state[key] = value[:expected[key].shape[0]]
    problem = checkpoint.weights_mismatch(state, expected)
    if problem:
        raise UserError(f"the weights of --init_from={source.name} do not fit the model: {problem}")
    model.load_state_dict(state)


def _position_table(config: GPTConfig) -> dict:
    """The learned position table's entry in a state_dict of config's model, by shape alone."""
    if config.pos_encoding != "learned":
        return {}
    return {"transformer.wpe.weight": torch.empty(config.block_size, config.n_embd, device="meta")}


def load_source_for_sampling(init_from: str, device: str):
    """(model in eval mode on device, tokenizer) of a GPT-2 name or folder, exported from here too."""
    found = resolve(init_from)
    if found.run_file is not None:
        raise UserError(f"init_from={init_from!r} is a run of this project; sample it with --out_dir={init_from}")
    if found.meta is None:
        raise UserError(f"init_from={init_from!r}: its tokenizer is not one this project knows (GPT-2's BPE, "
                        "or characters or bytes exported from here)")
    model = GPT(found.config)
    load_source_weights(model, found)
    attach_attention(model).to(device)
    lay_out_weights(model)     # a sampling step's matrix-vector products read memory in order
    return model.eval(), tokenizer_from_meta(found.meta)
