"""Checkpoints that survive crashes, run no code when loaded, and say when they were damaged.

A checkpoint holds tensors and plain values only (the configs as dicts, the vocabulary as a
list), so torch.load(weights_only=True) reads it. It is written to a temporary file, flushed to
disk and renamed over the old one: a process killed at any moment leaves a loadable checkpoint.
It carries a hash of each part as saved, checked when that part is loaded (integrity.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import math
import os
import pickle
import re
import shlex
import shutil
import time
import zipfile
from pathlib import Path

import torch

from .config import REPLACED, GPTConfig, TrainConfig, build, type_problem, upgraded
from .config_files import available_configs, read_config_file
from .data import valid_meta
from .errors import UserError, first_line
from .integrity import check_digests, digest
from .model import GPT
from .pretrained import weights_mismatch
from .progress import progress
from .speed import attach_attention, lay_out_weights
from .tokenizers import tokenizer_from_meta

FORMAT = "gpt-checkpoint-1"


@functools.cache
def code_version() -> str:
    """A fingerprint of this package's source, every .py file in gpt/ and its subpackages: runs
    that share it were trained by the same code. Any edit changes it, a comment's too, so a difference says the results may
    differ, not that they do."""
    return fingerprint(Path(__file__).parent)


def fingerprint(folder: Path) -> str:
    digest = hashlib.sha256()
    try:    # an editor's lock files (.#model.py) are not source
        for path in sorted(p for p in Path(folder).rglob("*.py") if not p.name.startswith(".")):
            digest.update(path.relative_to(folder).as_posix().encode() + b"\0" + path.read_bytes())
    except OSError:     # a file that cannot be read: nothing can be said
        return "unknown"
    return digest.hexdigest()[:12]


def save(obj: dict, path: Path) -> None:
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with (open(tmp, "wb") as f,
              progress(tensor_bytes(obj), f"saving {path.name}", "B", leave=False, unit_scale=True) as bar):
            digests = {key: digest(value) for key, value in obj.items()}
            torch.save({"format": FORMAT, **obj, "digests": digests}, _Counted(f, bar.update))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except (OSError, RuntimeError) as e:    # a full disk: torch reports it as a RuntimeError
        raise _not_saved(path, tmp, e) from None
    _sync_folder(path.parent)


class _Counted:
    """A file being written that reports each write's size."""

    def __init__(self, file, advance):
        self.file, self.advance = file, advance

    def write(self, data) -> int:
        written = self.file.write(data)
        self.advance(len(data))
        return written

    def flush(self) -> None:
        self.file.flush()


def tensor_bytes(obj) -> int:
    """The bytes of the tensors in obj, nested in dicts, lists and tuples: a checkpoint's size, near enough."""
    if isinstance(obj, torch.Tensor):
        return obj.nbytes
    if isinstance(obj, dict):
        return sum(tensor_bytes(value) for value in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(tensor_bytes(value) for value in obj)
    return 0


def save_copy(path: Path, other: Path) -> None:
    """Make other hold the checkpoint in path, as safely as save writes one: a hard link where the
    file system allows, the two then taking the room of one, else a copy. save puts a new ckpt.pt
    in place of the old, never writing into it, so the link keeps its state (cp over ckpt.pt would not)."""
    tmp = other.with_name(other.name + ".tmp")
    try:
        tmp.unlink(missing_ok=True)     # one a kill left may be a link to path: a copy into it would empty path
        try:
            os.link(path, tmp)
        except OSError:     # no hard links here (FAT, some network file systems)
            with (open(path, "rb") as src, open(tmp, "wb") as dst,
                  progress(path.stat().st_size, f"copying it to {other.name}", "B", leave=False,
                           unit_scale=True) as bar):
                shutil.copyfileobj(src, _Counted(dst, bar.update), 1 << 24)
                dst.flush()
                os.fsync(dst.fileno())
        os.replace(tmp, other)
    except OSError as e:
        raise _not_saved(other, tmp, e) from None
    _sync_folder(other.parent)


def make_best_good(folder: Path, ckpt: dict) -> int | None:
    """When ckpt, the folder's ckpt.pt as loaded, holds the run's best iteration and ckpt_best.pt
    is missing, damaged or older (its copy failed: a full disk, a kill between the two files),
    copy it again. Returns that iteration, or None when nothing needed doing."""
    best_iter = ckpt.get("best_iter")
    if best_iter is None or best_iter != ckpt["iter"]:
        return None
    try:
        behind = load(Path(folder) / "ckpt_best.pt", mmap=True, needs=("iter",))["iter"] < best_iter
    except UserError:
        behind = True
    if not behind:
        return None
    save_copy(Path(folder) / "ckpt.pt", Path(folder) / "ckpt_best.pt")
    return best_iter


def _not_saved(path: Path, tmp: Path, e: Exception) -> UserError:
    with contextlib.suppress(OSError):
        tmp.unlink(missing_ok=True)     # half a file would only take more of the space
    cause = next((c for c in (e, e.__cause__, e.__context__) if isinstance(c, OSError)), None)
    reason = cause.strerror if cause is not None and cause.strerror else first_line(e)
    kept = f"the {path.name} from before is unchanged" if path.exists() else f"no {path.name} was written"
    return UserError(f"cannot save {path} ({reason}); {kept}")


def _sync_folder(folder: Path) -> None:
    # a rename is durable only once the folder's entry is on disk; some file systems cannot sync
    # a folder, and the file is whole either way
    with contextlib.suppress(OSError):
        dir_fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


# what sampling needs; resuming needs the rest of what the training loop saves as well
MODEL_KEYS = ("model", "model_config", "meta")
RESUME_KEYS = (*MODEL_KEYS, "train_config", "optimizer", "iter", "best_val_loss",
               "last_eval_iter", "rng", "batch_rng")


def _broken(path: Path, detail: str = "") -> str:
    best = path.with_name("ckpt_best.pt")
    spare = (f"; {best} may be whole: sample it with --ckpt=best, or copy it to {path.name} to "
             "resume from it") if path.name == "ckpt.pt" and best.is_file() and zipfile.is_zipfile(best) else ""
    detail = f": {detail}" if detail else ""
    return f"{path} is not a readable checkpoint (truncated or corrupt){detail}{spare}"


def train_command(out_dir: Path) -> str:
    """A command that trains a run into out_dir: the shipped config whose out_dir it is, else the
    CPU recipe; never the default model, sized for a GPU."""
    for name in available_configs():
        if not name.startswith("sweeps/") and Path(read_config_file(name)[0].get("out_dir", "")) == Path(out_dir):
            return f"python train.py --config {name}"
    return f"python train.py --config shakespeare_char_cpu --out_dir={shlex.quote(str(out_dir))}"


def load(path: Path, map_location="cpu", mmap: bool = False, needs=MODEL_KEYS, verify=None) -> dict:
    """The checkpoint at path, holding at least the keys `needs`, each of the keys `verify` (by
    default `needs`) checked against the hash saved with it. mmap=True maps the tensors instead of
    reading them: for callers that want only some of it (its weights, not the optimizer's state)."""
    path = Path(path)
    if path.parent.is_file():
        raise UserError(f"{path.parent} is a file, not a run folder; give the out_dir a run was "
                        "trained into")
    if path.is_dir():
        inner = path / "ckpt.pt"
        raise UserError(f"{path} is a folder, not a checkpoint" + (f"; give {inner}" if inner.is_file() else ""))
    if not path.is_file():
        in_a_sweep = sweep_given(path.parent, (path.name,))
        if in_a_sweep:
            raise UserError(in_a_sweep)
        raise UserError(f"no checkpoint at {path}; train first ({train_command(path.parent)})")
    try:
        with open(path, "rb") as f:
            whole = zipfile.is_zipfile(f)   # torch.save writes a zip; its end is what a cut loses
    except OSError as e:
        raise UserError(f"{path} cannot be read ({e.strerror})") from None
    if not whole:
        raise UserError(_broken(path))
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as e:
        # torch names the class a refused global would build; anything else is a broken file
        refused = re.search(r"GLOBAL (\S+)", str(e))
        if refused:
            raise UserError(f"{path} holds a pickled Python object ({refused.group(1)}) and was not "
                            "loaded: only tensors and plain values are allowed") from None
        raise UserError(_broken(path)) from None
    except (RuntimeError, EOFError, OSError, ValueError) as e:
        raise UserError(_broken(path, first_line(e))) from None
    if not isinstance(ckpt, dict) or ckpt.get("format") != FORMAT:
        raise UserError(f"{path} is not a checkpoint of this project (no '{FORMAT}' marker)")
    missing = [k for k in needs if k not in ckpt]
    if missing:
        raise UserError(f"{path} lacks {', '.join(missing)}: it was written by another version of "
                        "this project")
    problem = _problem(ckpt, needs)
    if problem:
        raise UserError(f"{path} cannot be used: {problem}")
    check_digests(path, ckpt, needs if verify is None else verify)
    return ckpt


def _problem(ckpt: dict, needs) -> str | None:
    """What is wrong with the parts of a loaded checkpoint that the caller needs, if anything:
    found here, a damaged or foreign file is named, not blamed on the command's own options."""
    weights = ckpt.get("model")
    if "model" in needs and not (isinstance(weights, dict) and
                                 all(isinstance(v, torch.Tensor) for v in weights.values())):
        return "its weights are not a table of tensors"
    for key, cls in (("model_config", GPTConfig), ("train_config", TrainConfig)):
        problem = saved_problem(cls, ckpt[key], model=cls is GPTConfig) if key in needs else None
        if problem:
            return f"its {key}: {problem}"
    if "meta" in needs and not valid_meta(ckpt["meta"]):
        return "its vocabulary (meta) is incomplete or malformed"
    # what a resume reads besides: a wrong type would fail far from here
    for key, least in (("iter", 0), ("last_eval_iter", -1)):
        if key in needs and not (type(ckpt[key]) is int and ckpt[key] >= least):
            return f"its {key}={ckpt[key]!r} is not a count"
    best = ckpt.get("best_val_loss")
    if "best_val_loss" in needs and (type(best) not in (int, float) or math.isnan(best)):
        return f"its best_val_loss={best!r} is not a number"
    optimizer = ckpt.get("optimizer")
    if "optimizer" in needs and not (isinstance(optimizer, dict) and isinstance(optimizer.get("state"), dict)
                                     and isinstance(optimizer.get("param_groups"), list)):
        return "its optimizer state is malformed"
    if ("rng" in needs and not isinstance(ckpt["rng"], dict)
            or "batch_rng" in needs and not isinstance(ckpt["batch_rng"], torch.Tensor)):
        return "its random states are malformed"
    return None


@contextlib.contextmanager
def hold_folder(folder: Path, wait: bool = True):
    """Keep folder to this process while inside: a second process (the same command in another
    terminal, a sweep run again while its old runs still train) would interleave its log and
    checkpoints with this one's. The lock is the kernel's, so it goes with the process however
    that ends. It is a safety net: where it cannot be had (Windows has no flock; NFS and Lustre
    refuse it on a folder), the work goes on without it. It waits a second for a holder to let go
    (a glance of `gpt.sweep status`), unless wait=False."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    fd = os.open(folder, os.O_RDONLY)
    try:
        tries = 20 if wait else 1   # a second: a glance of `gpt.sweep status`, which takes it for an instant, passes
        for attempt in range(tries):
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if attempt == tries - 1:
                    raise UserError(f"another process (a run or a sweep) is using {folder}; let it finish "
                                    "or stop it first, or choose another folder") from None
                time.sleep(0.05)
            except OSError:
                break
        yield
    finally:
        os.close(fd)


def is_sweep(folder: Path) -> bool:
    """Whether folder holds a sweep (its runs in subfolders) rather than one run."""
    return (Path(folder) / "sweep.json").is_file()


def sweep_given(folder: Path, names: tuple[str, ...]) -> str | None:
    """Where folder, given for one run, holds a sweep one of whose runs saved a file of names:
    that it is a sweep, and one of those runs to give instead; else None."""
    if not is_sweep(folder):
        return None
    runs = sorted(p.parent for name in names for p in Path(folder).rglob(name))
    return f"{folder} is a sweep; give one of its runs, e.g. {runs[0]}" if runs else None


def saved_in(folder: Path) -> list[str]:
    """The run checkpoints folder holds: a run's, to continue or to keep."""
    return [name for name in ("ckpt.pt", "ckpt_best.pt") if (Path(folder) / name).exists()]


def saved_problem(cls, saved, model: bool) -> str | None:
    """Why a config read back from a checkpoint cannot be used, or None. Its values must have
    their fields' own types (a string "4" for n_head means the file was altered). A model config
    must also be valid as it is, and hold no option this version does not know: a newer version's
    would change the model. A training config is checked as a whole only once the command's
    values are merged in (a resume may mend an old run's settings), and it may hold retired
    options."""
    if not isinstance(saved, dict):
        return "not a table of values"
    damaged = [f"{k}={saved[k]!r}" for k, (_, values) in REPLACED.items()
               if k in saved and saved[k] not in list(values)]     # a list: the value may not hash
    if damaged:
        return f"{damaged[0]} is not one of its values"
    saved = upgraded(cls, saved)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(str(k) for k in saved if k not in fields and k not in REPLACED)
    if model and unknown:
        return f"it has options this version does not know ({', '.join(unknown)}); update the project"
    known = {k: v for k, v in saved.items() if k in fields}
    problem = next(filter(None, (type_problem(cls, fields[k], v) for k, v in known.items())), None)
    if problem:
        return problem
    if model:
        try:
            cls(**known)
        except ValueError as e:     # GPTConfig's own checks raise plain ValueErrors
            return str(e)
    return None




def model_config(ckpt: dict) -> GPTConfig:
    return build(GPTConfig, ckpt["model_config"])


def load_model(ckpt: dict) -> GPT:
    """The model a checkpoint describes, rebuilt from its config alone, with its weights."""
    model = attach_attention(GPT(model_config(ckpt)))
    load_weights(model, ckpt)
    return model


def load_weights(model: GPT, ckpt: dict) -> None:
    problem = weights_mismatch(ckpt["model"], model.state_dict())
    if problem:
        raise UserError(f"the checkpoint's weights do not fit its own model config, so it was written "
                        f"by another version of this project ({problem})")
    model.load_state_dict(ckpt["model"])


def chosen(out_dir: Path, which: str, verb: str) -> tuple[str, str]:
    """(file name, what else the caller could load) for --ckpt=which (latest or best) in out_dir,
    refusing a missing one where the other is there; verb says what the caller does with it."""
    name = {"latest": "ckpt.pt", "best": "ckpt_best.pt"}[which]
    run = Path(out_dir)
    other, flag = ("ckpt_best.pt", "best") if which == "latest" else ("ckpt.pt", "latest")
    otherwise = f"; --ckpt={flag} {verb} {other}" if (run / other).is_file() else ""
    if otherwise and not (run / name).exists():
        why = (" (no evaluation since iteration 0 has scored better than the untrained model did, or "
               "it could not be written)" if which == "best" else "")
        raise UserError(f"{run / name} does not exist{why}{otherwise}")
    return name, otherwise


def load_for_inference(out_dir: Path, device="cpu", name: str = "ckpt.pt", otherwise: str = "",
                       needs=MODEL_KEYS) -> tuple[GPT, dict]:
    """(model in eval mode on device, the checkpoint) of the run in out_dir; `otherwise` ends the
    message about weights that are not finite, with what else the caller could load."""
    # mapped, not read: the optimizer's moments (twice the weights) never reach memory or the device
    ckpt = load(Path(out_dir) / name, mmap=True, needs=needs)
    # a stop saves ckpt.pt unevaluated, so a diverged run's may hold them; sampling would fail deep
    # in torch (a resume may go on from them, skipping steps, and an evaluation scores them nan)
    broken = [k for k, t in ckpt["model"].items() if t.is_floating_point() and not t.isfinite().all()]
    if broken:
        more = f" and {len(broken) - 1} more" if len(broken) > 1 else ""
        raise UserError(f"{Path(out_dir) / name}'s weights hold nan or inf ({broken[0]}{more}): the run had "
                        f"diverged when it was saved, or the file is damaged{otherwise}")
    with torch.device(device):      # built where it runs: the weights go there once, from the file
        model = attach_attention(GPT(model_config(ckpt)))
    load_weights(model, ckpt)
    return model.eval(), ckpt


def load_for_sampling(out_dir: Path, device="cpu", name: str = "ckpt.pt", otherwise: str = ""):
    """(model in eval mode on device, tokenizer) of the run in out_dir, its weights laid out for
    one-token steps."""
    model, ckpt = load_for_inference(out_dir, device, name, otherwise)
    lay_out_weights(model)
    return model, tokenizer_from_meta(ckpt["meta"])
