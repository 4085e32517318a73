"""A run's folder: guards on out_dir, atomic writes, and the records a run leaves (config.json, command.txt)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shlex
from pathlib import Path

import torch

from .. import checkpoint
from ..config import GPTConfig, TrainConfig
from ..console import to_json
from ..errors import UserError
from .runtime import env_int
from .signals import SWEEP_PID


def write_atomic(path: Path, text: str) -> None:
    """Write, then rename: a stop or a full disk in the middle leaves the old file or none, never
    half of one."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        if isinstance(e, OSError):
            raise UserError(f"cannot write {path} ({e.strerror or e}); it is unchanged") from None
        raise


def not_a_pipe(path: Path) -> None:
    """Opening a named pipe or a device waits for the other end, forever if none comes."""
    if path.exists() and not path.is_file() and not path.is_dir():
        raise UserError(f"{path} is not a regular file (a pipe or a device); move it away")


def append_line(path: Path, line: str) -> None:
    """Add a line to a file that grows in place (metrics.jsonl, command.txt)."""
    not_a_pipe(path)
    try:
        with open(path, "a") as f:
            f.write(line)
    except OSError as e:    # a full disk, a folder of that name
        raise UserError(f"cannot write {path} ({e.strerror or e})") from None


def write_json(path: Path, data: dict) -> None:
    write_atomic(path, to_json(data, indent=1))


def as_flags(model_cfg: GPTConfig, cfg: TrainConfig) -> list[str]:
    """The train.py options that give these configs: each value away from its default (the
    vocabulary size comes from the dataset)."""
    flags = []
    for config in (model_cfg, cfg):
        for f in dataclasses.fields(config):
            value = getattr(config, f.name)
            if f.name != "vocab_size" and value != f.default:     # quoted by shlex.join, once
                flags.append(f"--{f.name}={str(value).lower() if isinstance(value, bool) else value}")
    return flags


def run_record(path: Path) -> dict:
    """A run's config.json as written; empty where there is none, or it cannot be read as one."""
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def listed_in(record: dict, key: str = "code") -> list[str]:
    """What a run record lists under key: the code versions that trained it (`code`) or how its
    starts ran (`ran_as`); none for a run older than the record."""
    items = record.get(key, [])
    return [c for c in items if isinstance(c, str)] if isinstance(items, list) else []


def ran_as(device: str, dtype: torch.dtype, level: str, parts: int = 1) -> str:
    """How a run's `device`, `dtype` and `matmul_precision` resolved on this machine: `auto` and
    `fast` differ between machines, and a CPU stays exact at `high`. The device by its type, as
    one GPU is `cuda` to a run of its own and `cuda:0` under torchrun. On CUDA, `medium` is
    recorded as `high`: torch gives both the same TF32 matmuls there. Then the parts a step was
    split into (`thread_split`), where it was: `auto` splits by the run's other settings too."""
    kind = torch.device(device).type
    if kind == "cuda" and level == "medium":
        level = "high"
    return f"{kind} {str(dtype).removeprefix('torch.')} matmul={level}" + (f" split={parts}" if parts > 1 else "")


def in_a_sweep() -> bool:
    """Whether a sweep started this run (a run of one's own may sit in a sweep's folder)."""
    return SWEEP_PID in os.environ


def how_to_continue(out_dir: Path) -> str:
    if in_a_sweep():
        return "the sweep's command, run again, continues it"
    return f"continue with --out_dir={shlex.quote(str(out_dir))} --resume"


def writable(out_dir: Path) -> None:
    if out_dir.exists() and not out_dir.is_dir():
        raise UserError(f"out_dir={str(out_dir)!r} is a file; choose another --out_dir")
    if checkpoint.is_sweep(out_dir):    # a run's files would mix with the sweep's run folders
        raise UserError(f"out_dir={str(out_dir)!r} holds a sweep; choose another --out_dir")
    probe = out_dir / f".write-test{os.getpid()}"
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        probe.write_text("ok")
    except OSError as e:
        raise UserError(f"out_dir={str(out_dir)!r} cannot be written ({e.strerror or e}); "
                        "choose another --out_dir") from None
    finally:    # also when a full disk let it be made but not written
        with contextlib.suppress(OSError):
            probe.unlink(missing_ok=True)
    for name in ("metrics.jsonl", "command.txt"):   # appended to in place (the rest is replaced whole)
        path = out_dir / name
        if path.exists() and not os.access(path, os.W_OK):
            raise UserError(f"{path} is read-only; make it writable (chmod u+w) or choose another --out_dir")


def launcher(world: int) -> list[str]:
    """How this run was started, for command.txt: python, or torchrun with its process counts."""
    if world == 1:
        return ["python"]
    local = env_int("LOCAL_WORLD_SIZE", world, least=1)
    nodes = [f"--nnodes={world // local}"] if world != local else []
    return ["torchrun", *nodes, f"--nproc_per_node={local}"]

