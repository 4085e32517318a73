"""Checkpoints that survive crashes and run no code when loaded.

A checkpoint holds tensors and plain values only (the configs as dicts, the vocabulary as a
list), so torch.load(weights_only=True) reads it. It is written to a temporary file, flushed to
disk and renamed over the old one: a process killed at any moment leaves a loadable checkpoint.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import torch

from .config import GPTConfig, UserError, build
from .model import GPT

FORMAT = "gpt-checkpoint-1"


def save(obj: dict, path: Path) -> None:
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        torch.save({"format": FORMAT, **obj}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    # the rename itself is durable only once the folder's entry is on disk
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def load(path: Path, map_location="cpu", mmap: bool = False) -> dict:
    """The checkpoint at path. mmap=True maps the tensors instead of reading them: for callers
    that want only its plain values (configs, iteration)."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"no checkpoint at {path}; train first (python train.py --out_dir={path.parent})")
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        if "weights_only" in str(e) or "Unsupported" in str(e):
            raise UserError(f"{path} holds pickled Python objects and was refused unloaded "
                            f"(only tensors and plain values are allowed): {first}") from None
        raise UserError(f"{path} is not a readable checkpoint (truncated or corrupt): {first}") from None
    except (RuntimeError, EOFError, OSError, ValueError) as e:
        raise UserError(f"{path} is not a readable checkpoint (truncated or corrupt): "
                        f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    if not isinstance(ckpt, dict) or ckpt.get("format") != FORMAT:
        raise UserError(f"{path} is not a checkpoint of this project (no '{FORMAT}' marker)")
    return ckpt


def model_config(ckpt: dict) -> GPTConfig:
    return build(GPTConfig, ckpt["model_config"])


def load_model(ckpt: dict) -> GPT:
    """The model a checkpoint describes, rebuilt from its config alone, with its weights."""
    model = GPT(model_config(ckpt))
    model.load_state_dict(ckpt["model"])
    return model
