"""Checkpoint integrity: a hash of each part of a checkpoint, written at save and checked at load,
so that a file changed on disk since (a flipped bit that still decodes to finite numbers) is refused
rather than used."""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

import torch

from .errors import UserError


def digest(value) -> str:
    """A hash of a checkpoint's part: each tensor's dtype, shape and bytes and each plain value, in order."""
    h = hashlib.sha256()

    def walk(v) -> None:
        if isinstance(v, torch.Tensor):
            t = v.detach().cpu().contiguous()
            h.update(f"T{t.dtype}{tuple(t.shape)}".encode())
            h.update(t.reshape(-1).view(torch.uint8).numpy())     # the bytes as they are, no copy
        elif isinstance(v, dict):
            h.update(b"{")
            for key, item in v.items():
                h.update(repr(key).encode() + b":")
                walk(item)
            h.update(b"}")
        elif isinstance(v, (list, tuple)):      # a tuple saved may load as either
            h.update(b"[")
            for item in v:
                walk(item)
            h.update(b"]")
        else:
            h.update(repr(v).encode() + b",")
    walk(value)
    return h.hexdigest()[:32]


_UNHASHED_SAID = set()      # checkpoints said once to predate the hashes


def check_digests(path: Path, ckpt: dict, keys) -> None:
    """Refuse a checkpoint whose parts `keys` no longer hash as they did when saved; say once of a
    checkpoint older than the hashes that it is loaded unchecked."""
    saved = ckpt.pop("digests", None)
    if not isinstance(saved, dict):
        if path not in _UNHASHED_SAID:
            _UNHASHED_SAID.add(path)
            print(f"note: {path} was saved before checkpoints carried a hash of their contents; it is "
                  "loaded unchecked", file=sys.stderr)
        return
    damaged = [key for key in keys if key in ckpt and saved.get(key) != digest(ckpt[key])]
    if damaged:
        raise UserError(f"{path} is damaged: its {', '.join(damaged)} no longer match{'es' * (len(damaged) == 1)} "
                        f"what was saved (the file changed on disk since){elsewhere(path)}")


def elsewhere(path: Path) -> str:
    """Where else a run's state may be whole: its other checkpoint, when it is another file."""
    other = path.with_name("ckpt_best.pt" if path.name == "ckpt.pt" else "ckpt.pt")
    try:
        apart = other.is_file() and not os.path.samefile(path, other)
    except OSError:
        apart = False
    if not apart:
        return "; train the run again, or use another copy of the file"
    use = ("copy it to ckpt.pt to resume from it, or sample it with --ckpt=best" if path.name == "ckpt.pt"
           else "sample it with --ckpt=latest")
    return f"; {other} is another file, which may be whole: {use}"
