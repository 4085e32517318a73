"""The training loop: AdamW, warmup then the chosen decay, accumulation, clipping, evaluation,
checkpoints, metrics.jsonl, and resuming exactly where a run stopped.

One optimizer step draws all of its micro-batches at once from a seeded generator, and each
micro-batch's dropout is seeded from its place in the run, so a step is the same whether it runs
in one process or is split over several (DDP), and the same after a resume.
"""

from __future__ import annotations

import contextlib
import copy
import ctypes
import dataclasses
import json
import math
import os
import random
import re
import shlex
import signal
import sys
import threading
import time
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from . import checkpoint
from .cli import shown
from .config import GPTConfig, TrainConfig, build
from .errors import UserError, first_line
from .console import NONFINITE, to_json
from .data import Batches, ensure_prepared, load_meta
from .diagnostics import measure as measure_diagnostics
from .diagnostics import unigram_loss
from .model import GPT
from .optim import AdamW, clip_grad_norm
from .cpu.precision import cpu_computes_bfloat16, matmul_precision, torch_level
from .cpu.split import RowSplit, split_plan


class Diverged(UserError):
    """The loss or the gradient became nan or inf."""


DIVERGED_EXIT = 3       # train.py's exit status for Diverged, so a sweep can tell it from a failure


# ---------------------------------------------------------------- pieces

def keep_freed_memory() -> None:
    """Ask glibc to keep freed memory for reuse. By default it returns large blocks to the OS as
    soon as they are freed, and every CPU training step then pays page faults to get its
    activation buffers back (3.5% of a step for the shakespeare_char shape; glibc adapts by itself
    for blocks under 32 MB, so small models gain little). Elsewhere this does nothing."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, 256 << 20)         # M_MMAP_THRESHOLD: serve blocks up to 256 MB from the heap
        libc.mallopt(-1, 512 << 20)         # M_TRIM_THRESHOLD: keep up to 512 MB of freed heap
    except (OSError, AttributeError):
        pass


def device_memory(device: str) -> int | None:
    """Bytes of memory the device has: the GPU's, or the whole machine's; None where unknown."""
    if torch.device(device).type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):     # Windows has no sysconf
        return None


def check_fits(model_cfg: GPTConfig, cfg: TrainConfig, device: str) -> None:
    """Refuse a run that cannot fit in the device's whole memory, which would hang in swap, be
    killed or fail deep inside numpy: the weights, gradients and AdamW moments (16 bytes a
    parameter in float32), or a batch's float32 activations that must be held at once: its logits
    and their log-softmax, or a block's residual stream and c_fc output; for a backward pass (a
    training step's, and the diagnostics' at each evaluation) the logits and every block's."""
    total = device_memory(device)
    if total is None:
        return
    n = model_cfg.num_params()
    if 16 * n > total:
        raise UserError(f"the model has {n:,} parameters: training needs at least {16 * n / 2**30:,.1f} "
                        f"GiB for its weights, gradients and optimizer state, more than the "
                        f"{total / 2**30:,.1f} GiB here; lower n_layer, n_embd, mlp_ratio or (for learned "
                        "positions) block_size")
    logits = 2 * model_cfg.vocab_size
    block = model_cfg.n_embd + model_cfg.mlp_hidden * (2 if model_cfg.gated else 1)
    for name, per_token, fix in (   # an evaluation keeps no block's output, but its diagnostics do
            ("batch_size", logits + model_cfg.n_layer * block,
             "; raising gradient_accumulation_steps keeps the batch per step"),
            ("eval_batch_size", logits + model_cfg.n_layer * block if cfg.diagnostics else max(logits, block), "")):
        need = getattr(cfg, name) * model_cfg.block_size * 4 * per_token
        if need > total:
            raise UserError(f"{name}={getattr(cfg, name)} needs at least {need / 2**30:,.1f} GiB for one "
                            f"batch's activations, more than the {total / 2**30:,.1f} GiB here; lower "
                            f"it{fix}")


TRAINING_FIX = ("lower batch_size (raising gradient_accumulation_steps keeps the batch per step), "
                "eval_iters or eval_batch_size, which --resume may change, or block_size or the "
                "model's size in a new run; checkpoints already saved are whole")


@contextlib.contextmanager
def out_of_memory_in_one_line(fix: str = TRAINING_FIX):
    """A failed allocation (numpy's, the CPU allocator's or CUDA's) becomes a UserError that
    says fix."""
    try:
        yield
    except (MemoryError, RuntimeError) as e:       # torch.OutOfMemoryError is a RuntimeError
        text = str(e)
        if not (isinstance(e, (MemoryError, torch.OutOfMemoryError)) or "can't allocate memory" in text):
            raise
        raise UserError(out_of_memory_message(text, fix)) from None


@contextlib.contextmanager
def compile_failure_in_one_line(compiling: bool):
    """torch.compile's own failures (no C++ compiler, an unsupported op) become a UserError: they
    surface in the first step, as pages of compiler output."""
    try:
        yield
    except Exception as e:
        if not compiling or not type(e).__module__.startswith(("torch._dynamo", "torch._inductor")):
            raise
        raise UserError(f"torch.compile failed ({first_line(e)}); run without --compile, or fix what it "
                        "names") from None


def out_of_memory_message(text: str, fix: str = TRAINING_FIX) -> str:
    found = re.search(r"allocate (\d+(?:\.\d*)?) ?(bytes|[KMGT]iB)", text, re.IGNORECASE)
    size = ""
    if found:
        scale = {"bytes": 1, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}[found[2].lower()]
        size = f" (an allocation of {float(found[1]) * scale / 2**30:,.2f} GiB failed)"
    return f"out of memory{size}; {fix}"


def env_int(name: str, default: int, least: int = 0) -> int:
    """A count torchrun puts in the environment (RANK, WORLD_SIZE, ...); a stray or mistyped one
    stops the run with one line."""
    text = os.environ.get(name)
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        value = least - 1
    if value < least:
        fix = "unset it to run one process" if name in ("RANK", "WORLD_SIZE") else "start the run with torchrun"
        raise UserError(f"{name}={text!r} in the environment is not a whole number of at least {least}; "
                        f"torchrun sets it: {fix}")
    return value


def launcher(world: int) -> list[str]:
    """How this run was started, for command.txt: python, or torchrun with its process counts."""
    if world == 1:
        return ["python"]
    local = env_int("LOCAL_WORLD_SIZE", world, least=1)
    nodes = [f"--nnodes={world // local}"] if world != local else []
    return ["torchrun", *nodes, f"--nproc_per_node={local}"]


def resolve_device(name: str) -> str:
    if name == "auto":
        if torch.cuda.is_available():
            return "cuda"
        if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
            return "mps"
        return "cpu"
    try:
        device = torch.device(name)
    except RuntimeError:
        raise UserError(f"device={name!r} is not a device; use auto, cpu, cuda, cuda:N or mps") from None
    if device.type not in ("cpu", "cuda", "mps"):
        raise UserError(f"device={name!r} is not supported; use auto, cpu, cuda, cuda:N or mps")
    if device.type == "cpu" and device.index not in (None, 0):
        raise UserError(f"device={name!r}: the CPU is one device; use --device=cpu")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"device={name!r} but CUDA is not available here; use --device=cpu")
    if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
        raise UserError(f"device={name!r} but there are {torch.cuda.device_count()} GPUs here "
                        f"(cuda:0 to cuda:{torch.cuda.device_count() - 1})")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise UserError(f"device={name!r} but MPS is not available here; use --device=cpu")
    return "cpu" if device.type == "cpu" else name      # torch.load cannot map to "cpu:0"


def autocast_dtype(cfg: TrainConfig, device: str) -> torch.dtype:
    if cfg.dtype in ("auto", "fast"):
        # bfloat16 where the GPU computes it (Ampere on); older ones only emulate it, slowly
        if torch.device(device).type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 8:
            return torch.bfloat16
        # emulated, bfloat16 made the fast config's steps 10-15x slower than float32 (an AVX-512
        # CPU held to AVX2 by ONEDNN_MAX_CPU_ISA and ATEN_CPU_CAPABILITY)
        if cfg.dtype == "fast" and torch.device(device).type == "cpu" and cpu_computes_bfloat16():
            return torch.bfloat16
        return torch.float32
    return getattr(torch, cfg.dtype)


def check_threads(cfg: TrainConfig) -> None:
    """Here, not in the config: a run saved on a bigger machine still loads, and says what to do."""
    cpus = os.cpu_count() or 1
    if cfg.threads > cpus:      # far past it, torch cannot start the threads and crashes
        raise UserError(f"threads={cfg.threads} is more than the {cpus} CPUs here; give at most "
                        f"--threads={cpus}, or --threads=0 for torch's default")


def check_compile(cfg: TrainConfig, device: str | None = None) -> None:
    """Refuse compile with medium on a CPU that rounds, in float32 or bfloat16 (whose attention is
    float32 too); device is resolved from cfg if not given."""
    if (cfg.compile and torch_level(cfg.matmul_precision, "cpu") == "medium"
            and (device or resolve_device(cfg.device)) == "cpu"):
        raise UserError("compile=true with matmul_precision=medium made CPU steps 2x slower (55 against "
                        "25 ms on the CPU recipe), since compiled attention cannot keep its matmuls "
                        "exact; use one of the two")


def exit_status(stopped_by: str | None) -> int:
    """0 for a run that ended, else 128 + the signal's number, as a shell reports a stopped job
    (130 for Ctrl-C, 143 for SIGTERM); a stop that came from another DDP rank counts as Ctrl-C."""
    if stopped_by is None:
        return 0
    return 128 + getattr(signal.Signals, stopped_by, signal.SIGINT)


def lr_at(it: int, cfg: TrainConfig) -> float:
    """Linear warmup over the first warmup_iters steps (step i uses (i + 1) / warmup_iters of
    learning_rate), then lr_schedule's way down to min_lr at lr_decay_iters, then min_lr."""
    if it < cfg.warmup_iters:
        return cfg.learning_rate * (it + 1) / cfg.warmup_iters
    if cfg.lr_schedule == "constant":
        return cfg.learning_rate
    if it >= cfg.lr_decay_iters:
        return cfg.min_lr
    progress = (it - cfg.warmup_iters) / (cfg.lr_decay_iters - cfg.warmup_iters)    # config: > 0
    if cfg.lr_schedule == "cosine":
        share = 0.5 * (1.0 + math.cos(math.pi * progress))
    elif cfg.lr_schedule == "linear":
        share = 1.0 - progress
    else:       # wsd: flat at learning_rate until the cooldown, then linear down to min_lr
        share = min(1.0, (1.0 - progress) / cfg.cooldown_frac)
    return cfg.min_lr + share * (cfg.learning_rate - cfg.min_lr)


def tokens_per_step(model_cfg: GPTConfig, cfg: TrainConfig) -> int:
    return cfg.gradient_accumulation_steps * cfg.batch_size * model_cfg.block_size


def make_optimizer(model: GPT, cfg: TrainConfig) -> AdamW:
    """Weight decay on matrices and embeddings (dim >= 2), none on biases and norm gains."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    return AdamW(groups, lr=cfg.learning_rate, betas=(cfg.beta1, cfg.beta2))


def rng_state(device: str) -> dict:
    """Every random stream, as tensors and lists (loadable with weights_only). All processes of a
    DDP run are seeded alike and draw alike, so rank 0's state stands for every rank's."""
    np_state = np.random.get_state()
    py_state = random.getstate()
    cuda = torch.device(device).type == "cuda"
    # the gauss entries: each generator keeps the second of a pair of normal draws for the next call
    return {"torch": torch.get_rng_state(), "python": list(py_state[1]), "python_gauss": py_state[2],
            "numpy": torch.from_numpy(np_state[1].astype(np.int64)), "numpy_pos": int(np_state[2]),
            "numpy_gauss": [int(np_state[3]), float(np_state[4])],
            "cuda": torch.cuda.get_rng_state(device) if cuda else None}


def set_rng_state(state: dict, device: str) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate((3, tuple(state["python"]), state.get("python_gauss")))     # older: none kept
    np.random.set_state(("MT19937", state["numpy"].numpy().astype(np.uint32), state["numpy_pos"],
                         *state.get("numpy_gauss", [0, 0.0])))
    if state["cuda"] is not None and torch.device(device).type == "cuda":
        torch.cuda.set_rng_state(state["cuda"], device)


def dropout_seed(seed: int, micro_batch: int) -> int:
    """The seed of a micro-batch's dropout masks: the run's seed and the micro-batch's place mixed
    into 64 bits, each bit depending on both, since a CPU's generator keeps only the low 32 bits
    (`seed << 32 | place` gave every seed the same masks)."""
    return int(np.random.SeedSequence([seed, micro_batch]).generate_state(1, np.uint64)[0])


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


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


def json_line(row: dict) -> str:
    return to_json(row) + "\n"


def _numbers(value):
    if isinstance(value, list):
        return [_numbers(v) for v in value]
    return float(value) if isinstance(value, str) and value in NONFINITE else value


def read_jsonl(path: Path) -> list[dict]:
    """The rows of a metrics.jsonl, non-finite numbers as floats again; a line cut short by a
    kill is skipped."""
    rows = []
    not_a_pipe(Path(path))
    try:
        text = Path(path).read_text(errors="replace")
    except OSError as e:
        raise UserError(f"cannot read {path} ({e.strerror})") from None
    for line in text.splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        # a line edited by hand into another shape is skipped like a cut one
        if isinstance(row, dict) and isinstance(row.get("kind"), str) and type(row.get("iter")) is int:
            row = {key: _numbers(value) for key, value in row.items()}
            if row["kind"] != "eval" or type(row.get("val_loss")) in (int, float):
                rows.append(row)
    return rows


def flatten(row: dict) -> dict:
    """Numbers only, lists spread out: {"block_rms": [a, b]} -> {"block_rms/0": a, "block_rms/1": b}."""
    flat = {}
    for key, value in row.items():
        if isinstance(value, list):
            flat.update(flatten({f"{key}/{i}": v for i, v in enumerate(value)}))
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            flat[key] = value
    return flat


class Metrics:
    """metrics.jsonl, one JSON object per line, mirrored to wandb when asked."""

    def __init__(self, path: Path, wandb_run=None):
        self.path, self.wandb = path, wandb_run

    def trim(self, last_iter: int) -> None:
        """Drop lines a killed run wrote after its checkpoint, so a resume does not repeat them."""
        if not self.path.exists():
            return
        def per_step(row):      # logged with the index of the step, not the count of steps done
            return row["kind"] == "train" or row.get("event") == "nonfinite"
        keep = [row for row in read_jsonl(self.path)
                if row["iter"] <= (last_iter - 1 if per_step(row) else last_iter)]
        write_atomic(self.path, "".join(json_line(row) for row in keep))

    def log(self, row: dict) -> None:
        try:
            append_line(self.path, json_line(row))
        except UserError as e:      # the checkpoints already saved are whole
            folder = self.path.parent
            kept = (f"ckpt.pt is whole: once the file can be written, {how_to_continue(folder)}"
                    if (folder / "ckpt.pt").exists() else "no checkpoint had been saved yet")
            raise UserError(f"{e}; the run stopped, and {kept}") from None
        if self.wandb is not None:
            try:
                self.wandb.log(flatten(row), step=row["iter"])
            except Exception as e:   # a logging service must never stop training
                print(f"warning: wandb logging failed ({e}); continuing without it", file=sys.stderr)
                self.wandb = None


def start_wandb(cfg: TrainConfig, config: dict):
    if not cfg.wandb:
        return None
    try:
        import wandb
        return wandb.init(project=cfg.wandb_project, name=cfg.wandb_run_name or Path(cfg.out_dir).name,
                          config=config, dir=cfg.out_dir)
    except Exception as e:
        print(f"warning: wandb could not start ({first_line(e)}); "
              "training goes on without it", file=sys.stderr)
        return None


# besides Ctrl-C: a kill, and a terminal closing under the run (no SIGHUP on Windows)
STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name))
SWEEP_PID = "GPT_SWEEP_PID"     # set for the runs a sweep starts: the sweep's process id


def end_with_the_sweep() -> None:
    """In a run a sweep started, ask Linux for SIGTERM (a save, then the end) when the sweep
    process dies, even by SIGKILL: an orphaned run would train on unwatched, and the sweep, run
    again, would start a second process on its folder."""
    sweep_pid = os.environ.get(SWEEP_PID)
    if not sweep_pid:
        return
    try:
        ctypes.CDLL("libc.so.6").prctl(1, signal.SIGTERM)     # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if str(os.getppid()) != sweep_pid:      # it died before the request was made
        raise UserError("the sweep that started this run has ended; run the sweep's command again")


def catch_signals(handler) -> dict:
    """Install handler for Ctrl-C and STOP_SIGNALS; returns the handlers it replaced. A signal
    the process was started to ignore (nohup's SIGHUP) stays ignored, and a thread other than
    the main one (training from a notebook's worker) cannot catch any: Python delivers them to
    the main thread alone."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, *STOP_SIGNALS)
            if signal.getsignal(sig) is not signal.SIG_IGN}


class StopRequest:
    """Turns the first Ctrl-C, SIGTERM or SIGHUP into a flag the loop checks after each step. A
    second Ctrl-C stops at once, except while a checkpoint is being written: it then waits for the
    file. Other signals never escalate: Linux may deliver a dying sweep's SIGTERM several times."""

    def __init__(self):
        self.signal = None
        self.previous = {}
        self.holding, self.pending = False, False

    def __enter__(self):
        self.previous = catch_signals(self._handle)
        return self

    def _handle(self, signum, frame):
        if self.signal is None:
            self.signal = signal.Signals(signum).name
            if os.environ.get("RANK", "0") == "0":  # said at once: a step can take seconds
                with contextlib.suppress(OSError):  # os.write: a print could land inside tqdm's
                    os.write(2, f"\n{self.signal}: stopping at the end of the step under way (a "
                                "second Ctrl-C stops at once)\n".encode())
        elif signum != signal.SIGINT:
            return
        elif self.holding:
            self.pending = True
        else:
            raise KeyboardInterrupt

    @contextlib.contextmanager
    def hold(self):
        """Let no second signal cut the block short; it takes effect when the block ends."""
        self.holding = True
        try:
            yield
        finally:
            self.holding = False
            if self.pending:
                raise KeyboardInterrupt

    def __exit__(self, *exc):
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)


# ---------------------------------------------------------------- configs for a run

def configs_for_run(values: dict) -> tuple[GPTConfig, TrainConfig]:
    """Typed configs from parsed values. A resume starts from the checkpoint's own configs,
    so `--resume --out_dir=DIR` alone continues a run; given values still apply on top."""
    base_model, base_train = None, None
    # only the merged config is checked: a value given is valid against the run's own settings
    if values.get("resume", TrainConfig.resume):
        path = Path(values.get("out_dir", TrainConfig.out_dir)) / "ckpt.pt"
        if not path.exists():
            if checkpoint.is_sweep(path.parent):
                raise UserError(f"--resume: {path.parent} is a sweep; run the sweep's own command "
                                "again, without --resume, to continue its runs")
            if path.parent.is_dir():
                with checkpoint.hold_folder(path.parent):   # a run not yet at its first checkpoint
                    pass
            best = path.with_name("ckpt_best.pt")
            hint = f" ({best.name} is: copy it to {path.name} to continue from it)" if best.exists() else ""
            raise UserError(f"--resume: nothing to resume, {path} does not exist{hint}")
        ckpt = checkpoint.load(path, mmap=True, needs=checkpoint.RESUME_KEYS)   # only configs are read
        base_model, base_train = ckpt["model_config"], ckpt["train_config"]
        if isinstance(base_train, dict):    # how that run was started is not how this one is
            base_train = {k: v for k, v in base_train.items() if k not in ("resume", "overwrite")}
            base_train.setdefault("thread_split", "ops")    # saved before the split: go on as it ran
    return build(GPTConfig, values, base=base_model), build(TrainConfig, values, base=base_train)


NOT_SAVED = "checkpoint not saved"      # the event a failed save logs


def _check_replaceable(out_dir: Path, theirs: list[str]) -> None:
    """Refuse a fresh run where it would replace what is not a run of this project (another
    program's config.json, say), or the evaluations of a run whose checkpoints were removed."""
    ours = {"model", "train"} <= run_record(out_dir / "config.json").keys()
    if (out_dir / "config.json").exists() and not ours:
        raise UserError(f"{out_dir} holds a config.json that no run of this project wrote; replace it "
                        "with --overwrite=true, or choose another --out_dir")
    if theirs and not ours:
        raise UserError(f"{out_dir} holds {', '.join(theirs)} but no run of this project (no "
                        "config.json); remove them, replace them with --overwrite=true, or choose "
                        "another --out_dir")
    rows = read_jsonl(out_dir / "metrics.jsonl") if "metrics.jsonl" in theirs else []
    unsaved = {r["iter"] for r in rows if r.get("event") == NOT_SAVED}
    # each finite evaluation past 0 saved a checkpoint, unless its save failed and said so
    saved = [r["iter"] for r in rows if r["kind"] == "eval" and r["iter"] > 0 and r["iter"] not in unsaved
             and math.isfinite(r["val_loss"]) and math.isfinite(r.get("train_loss", 0.0))]
    if saved:
        raise UserError(f"{out_dir} holds an earlier run's metrics.jsonl, evaluated up to iteration "
                        f"{max(saved)}, but not its checkpoints; replace the run with --overwrite=true, "
                        "or choose another --out_dir")


def _check_resume(ckpt: dict, model_cfg: GPTConfig, meta: dict) -> None:
    saved = ckpt.get("meta", {})
    if (saved.get("tokenizer"), saved.get("chars")) != (meta.get("tokenizer"), meta.get("chars")):
        raise UserError(f"cannot resume: the dataset's vocabulary ({meta.get('vocab_size')} tokens) "
                        f"differs from the checkpoint's ({saved.get('vocab_size')} tokens)")
    now = dataclasses.asdict(model_cfg)
    then = dataclasses.asdict(checkpoint.model_config(ckpt))    # fields newer than it at their defaults
    diffs = [f"{k}={shown(then[k])} in the checkpoint but {shown(now[k])} now"
             for k in now if k != "dropout" and then[k] != now[k]]
    if diffs:
        raise UserError("cannot resume with a different model: " + "; ".join(diffs) + ". Leave "
                        "those options out to continue the run, or train the new model in another "
                        "--out_dir")


@torch.no_grad()
def mean_losses(model: GPT, batches: Batches, splits, n_batches: int, batch_size: int, autocast,
                interrupted=lambda: False) -> dict | None:
    """{split_loss: mean loss} over the evaluation windows, or None once interrupted() is true."""
    model.eval()
    try:
        out = {}
        for split in splits:
            xs, ys = batches.evenly_spaced(split, n_batches, batch_size)
            losses = []
            for x, y in zip(xs, ys):
                if interrupted():
                    return None
                with autocast:
                    losses.append(model(x, y)[1].item())
            out[f"{split}_loss"] = float(np.mean(losses))
        return out
    finally:
        model.train()


def rescore(model: GPT, batches: Batches, out_dir: Path, start_iter: int, best_iter: int | None,
            windows_before: int, n_batches: int, batch_size: int, autocast) -> tuple[float, int]:
    """On resuming with other evaluation windows: (best val loss, its iteration) on the new ones,
    from the state resumed (ckpt.pt) and ckpt_best.pt, so that the best checkpoint is chosen on
    one text; ckpt_best.pt becomes a copy of ckpt.pt if that scores better."""
    def val_loss(m: GPT) -> float:
        return mean_losses(m, batches, ("val",), n_batches, batch_size, autocast)["val_loss"]
    scores = {start_iter: val_loss(model)}
    best_path = out_dir / "ckpt_best.pt"
    if best_iter != start_iter and best_path.exists():  # there is none when iteration 0 was best
        other = copy.deepcopy(model)    # not a new model: building one draws random numbers
        try:    # mapped: its weights alone reach the device, not its optimizer state
            saved = checkpoint.load(best_path, mmap=True, needs=(*checkpoint.MODEL_KEYS, "iter"))
            checkpoint.load_weights(other, saved)
            scores[saved["iter"]] = val_loss(other)
        except UserError:
            pass    # a damaged copy, or another model's: ckpt.pt's state replaces it
        del other
    said = ", ".join(f"iteration {it} {loss:.4f}" for it, loss in sorted(scores.items()))
    note = (f"note: evaluations now score {n_batches * batch_size} windows, before {windows_before}, "
            f"so the val losses before and after compare other text; on the new ones {said}")
    finite = {it: loss for it, loss in scores.items() if math.isfinite(loss)}
    if not finite:      # ckpt_best.pt stays; any finite evaluation will replace it
        print(f"{note}: no score is finite, so the next finite evaluation becomes ckpt_best.pt", flush=True)
        return float("inf"), best_iter
    best = min(finite, key=finite.get)
    if best == start_iter and start_iter != best_iter:
        checkpoint.save_copy(out_dir / "ckpt.pt", best_path)
    print(f"{note}: ckpt_best.pt holds iteration {best}, and later evaluations must beat "
          f"{finite[best]:.4f}", flush=True)
    return finite[best], best


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


def _writable(out_dir: Path) -> None:
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


# ---------------------------------------------------------------- the loop

def train(model_cfg: GPTConfig, cfg: TrainConfig, argv: list[str] | None = None) -> dict:
    """Train one model; returns a summary of the run (also in out_dir/metrics.jsonl)."""
    end_with_the_sweep()
    launched = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    rank, world = (env_int("RANK", 0), env_int("WORLD_SIZE", 1, least=1)) if launched else (0, 1)
    if rank >= world:
        raise UserError(f"RANK={rank} in the environment is not below WORLD_SIZE={world}; torchrun sets "
                        "both: unset them to run one process")
    ddp = world > 1     # one process of one needs no process group
    if cfg.gradient_accumulation_steps % world:
        raise UserError(f"gradient_accumulation_steps={cfg.gradient_accumulation_steps} must be a "
                        f"multiple of the {world} processes")
    device = resolve_device(cfg.device)
    check_threads(cfg)
    check_compile(cfg, device)
    plan = split_plan(model_cfg, cfg, device, world, cfg.threads or torch.get_num_threads())
    if world > 1 and device.startswith("mps"):  # gloo, the only backend there, cannot reduce MPS tensors
        raise UserError("torchrun on an Apple GPU (mps) is not supported; run one process, or pass "
                        "--device=cpu")
    if ddp:
        local_rank = env_int("LOCAL_RANK", 0)
        try:
            torch.distributed.init_process_group(backend="nccl" if device.startswith("cuda") else "gloo")
        except (ValueError, RuntimeError) as e:     # RANK and WORLD_SIZE left over, without torchrun
            raise UserError(f"RANK={rank} and WORLD_SIZE={world} in the environment make this one of {world} "
                            f"processes, but they could not connect ({first_line(e)}); start the run with "
                            "torchrun, or unset RANK and WORLD_SIZE to run one process") from None
        if device.startswith("cuda"):
            device = f"cuda:{local_rank}"
            torch.cuda.set_device(device)
    elif device.startswith("cuda:"):    # the run's GPU is the current one: no context on GPU 0
        torch.cuda.set_device(device)
    try:
        # _train takes out_dir once it may make it
        with (out_of_memory_in_one_line(), compile_failure_in_one_line(cfg.compile),
              contextlib.ExitStack() as holds):
            summary = _train(model_cfg, cfg, argv, device, rank, world, plan, holds)
        if ddp:     # leave together: none tears down its connections while rank 0 still saves
            torch.distributed.barrier()
        return summary
    finally:
        if ddp:
            torch.distributed.destroy_process_group()


def _train(model_cfg, cfg, argv, device, rank, world, plan: tuple[int, str | None],
           holds: contextlib.ExitStack) -> dict:
    parts, unsplit = plan       # row parts per micro-batch, and why auto made none (split_plan)
    device_type = torch.device(device).type
    master = rank == 0
    out_dir = Path(cfg.out_dir)
    if device_type == "cpu":
        # before the first parallel op: OpenMP's threads take this thread's float state when made
        torch.set_flush_denormal(cfg.flush_denormal)
        keep_freed_memory()
    if cfg.threads:     # for this run only: a notebook that trains keeps its own count after
        holds.callback(torch.set_num_threads, torch.get_num_threads())
        torch.set_num_threads(cfg.threads)
    holds.enter_context(matmul_precision(cfg.matmul_precision, device_type))     # as it was after

    # one process per machine prepares: another machine may not share this one's disk
    node_master = world == 1 or env_int("LOCAL_RANK", 0) == 0
    folder = ensure_prepared(cfg.data_dir, cfg.dataset) if node_master else Path(cfg.data_dir) / cfg.dataset
    if world > 1:
        torch.distributed.barrier()
    meta = load_meta(folder)
    model_cfg = dataclasses.replace(model_cfg, vocab_size=meta["vocab_size"])
    check_fits(model_cfg, cfg, device)
    seed_everything(cfg.seed)
    batches = Batches(folder, model_cfg.block_size, cfg.batch_size, device, cfg.seed, meta["vocab_size"])
    eval_batch = cfg.eval_batch_size or cfg.batch_size
    if master:          # only now, so a start that fails on its data or size leaves no folder
        _writable(out_dir)
        holds.enter_context(checkpoint.hold_folder(out_dir))
        held = checkpoint.saved_in(out_dir)
        if held and not cfg.resume and not cfg.overwrite:
            if in_a_sweep():    # only ckpt_best.pt: the sweep would resume from ckpt.pt
                raise UserError(f"{out_dir} holds ckpt_best.pt but no ckpt.pt; copy it to ckpt.pt to "
                                "continue the run from there, or delete the folder to train it afresh, "
                                "then run the sweep's command again")
            go_on = (f"continue it with --out_dir={shlex.quote(str(out_dir))} --resume" if "ckpt.pt" in held
                     else "continue it by copying it to ckpt.pt and passing --resume")
            raise UserError(f"{out_dir} holds an earlier run's {' and '.join(held)}; {go_on}, replace it "
                            "with --overwrite=true, or choose another --out_dir")
    unigram = unigram_loss(batches.ids["train"], batches.ids["val"], meta["vocab_size"])
    dtype = autocast_dtype(cfg, device)
    autocast = (torch.autocast(device_type=device_type, dtype=dtype) if dtype != torch.float32
                else contextlib.nullcontext())
    model = GPT(model_cfg).to(device)
    optimizer = make_optimizer(model, cfg)

    start_iter, best_val, last_eval, last_saved, elapsed_before = 0, float("inf"), -1, None, 0.0
    best_iter = None
    metrics_path = out_dir / "metrics.jsonl"
    if cfg.resume:
        # on the CPU: RNG states must stay there
        ckpt = checkpoint.load(out_dir / "ckpt.pt", needs=checkpoint.RESUME_KEYS)
        _check_resume(ckpt, model_cfg, meta)
        if (seed := ckpt["train_config"].get("seed", cfg.seed)) != cfg.seed:
            raise UserError(f"cannot resume with seed={cfg.seed}: the run's batches and dropout follow "
                            f"its seed={seed}; leave --seed out to continue it, or train with the new "
                            "seed in another --out_dir")
        checkpoint.load_weights(model, ckpt)
        with checkpoint.damaged_part(out_dir / "ckpt.pt", "optimizer state"):
            optimizer.load_state_dict(ckpt["optimizer"])
        start_iter, best_val, last_eval = ckpt["iter"], ckpt["best_val_loss"], ckpt["last_eval_iter"]
        last_saved = start_iter
        elapsed_before = ckpt.get("elapsed_s")
        if elapsed_before is None:      # a checkpoint of an older version: its log has the time
            logged = [r["elapsed_s"] for r in read_jsonl(metrics_path) if r["kind"] == "eval"
                      and r["iter"] <= start_iter and "elapsed_s" in r] if metrics_path.exists() else []
            elapsed_before = logged[-1] if logged else 0.0
        with checkpoint.damaged_part(out_dir / "ckpt.pt", "random states"):
            set_rng_state(ckpt["rng"], device)
            batches.set_state(ckpt["batch_rng"])
        best_iter = ckpt.get("best_iter")
        mended = checkpoint.make_best_good(out_dir, ckpt) if master else None
        if mended is not None:
            print(f"ckpt_best.pt did not hold the best iteration, {mended}: copied it from ckpt.pt",
                  flush=True)
        if world > 1:   # every rank must end the same way below
            flag = torch.tensor(float(mended is not None), device=device)
            torch.distributed.broadcast(flag, 0)
            mended = start_iter if flag.item() > 0 else None
        if start_iter >= cfg.max_iters:
            if mended is not None:      # what the failed copy's message asked for is done
                if master:
                    print(f"done: the run had already reached iteration {start_iter}", flush=True)
                return {"stopped_by": None, "iters": start_iter, "best_val_loss": best_val,
                        "skipped_steps": 0, "wall_s": 0.0}
            raise UserError(f"the checkpoint is already at iteration {start_iter}; raise --max_iters "
                            "to train further")
        then = ckpt["train_config"]     # as saved: a setting newer than the run at its default
        # the windows depend on their number alone (Batches.evenly_spaced)
        windows = then.get("eval_iters", TrainConfig.eval_iters) * (
            then.get("eval_batch_size") or then.get("batch_size", TrainConfig.batch_size))
        if master and windows != cfg.eval_iters * eval_batch:
            best_val, best_iter = rescore(model, batches, out_dir, start_iter, best_iter, windows,
                                          cfg.eval_iters, eval_batch, autocast)
        if master:
            print(f"resuming {out_dir / 'ckpt.pt'} at iteration {start_iter} of {cfg.max_iters}", flush=True)
    elif master:    # a fresh run in an old folder replaces that run, so nothing stale mixes in
        old = [out_dir / name for name in ("metrics.jsonl", "command.txt", "ckpt.pt", "ckpt_best.pt",
                                           "ckpt.pt.tmp", "ckpt_best.pt.tmp", "config.json.tmp",
                                           "metrics.jsonl.tmp", "dashboard.png", "attention.png")]
        old = [p for p in old if p.exists()]
        theirs = [p.name for p in old if not p.name.endswith(".tmp")]
        if not cfg.overwrite:
            _check_replaceable(out_dir, theirs)
        for path in old:
            try:
                path.unlink()
            except OSError as e:    # a folder of that name, or no permission
                raise UserError(f"{path} cannot be replaced ({e.strerror}); remove it, or choose "
                                "another --out_dir") from None
        if any(p.name.startswith("ckpt") for p in old):
            print(f"starting afresh in {out_dir}: removed the earlier run's checkpoints", flush=True)

    # before config.json and command.txt record this start, which a failure here ends
    raw_model = model
    params = list(model.parameters())     # walking the modules each step costs 0.1 ms
    if cfg.compile:
        try:
            model = torch.compile(model)
        except OSError as e:    # its cache folder (TORCHINDUCTOR_CACHE_DIR) cannot be made
            raise UserError(f"torch.compile failed ({e.strerror}: {e.filename}); run without --compile, "
                            "or fix what it names") from None

    # every version of the code that trained the run, so a sweep can tell results of older code
    earlier = run_record(out_dir / "config.json") if cfg.resume else {}
    codes = (listed_in(earlier) or ["unknown"]) if cfg.resume else []
    # and every way it ran, so a sweep can tell settings that resolved alike here
    ways = (listed_in(earlier, "ran_as") or ["unknown"]) if cfg.resume else []
    way = ran_as(device, dtype, torch_level(cfg.matmul_precision, device_type), parts)
    config_record = {"model": dataclasses.asdict(model_cfg), "train": dataclasses.asdict(cfg),
                     "code": codes + [c for c in [checkpoint.code_version()] if c not in codes],
                     "ran_as": ways + [w for w in [way] if w not in ways]}
    metrics = Metrics(metrics_path, start_wandb(cfg, config_record) if master else None)
    if master:
        if cfg.resume:
            metrics.trim(start_iter)
        not_a_pipe(out_dir / "command.txt")     # before config.json records this start
        write_json(out_dir / "config.json", config_record)     # a sweep reads it to reuse the run
        given = argv if argv is not None else as_flags(model_cfg, cfg)     # called from Python
        append_line(out_dir / "command.txt", shlex.join([*launcher(world), "train.py", *given]) + "\n")
    if world > 1:   # after rank 0's writes: its constructor holds the other ranks until they are done
        model = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[torch.device(device).index] if device_type == "cuda" else None)

    split = None
    if parts > 1:
        split = RowSplit(model, params, parts, dtype, cfg.flush_denormal)
        holds.callback(split.close)
    spread = split.all_threads if split else contextlib.nullcontext     # for evaluations
    local_steps = cfg.gradient_accumulation_steps // world
    tokens_per_iter = tokens_per_step(model_cfg, cfg)
    if master:      # at once: a big model's first evaluation may take a while on a CPU
        steps = cfg.max_iters - start_iter
        how = str(dtype).removeprefix("torch.")
        if split:
            how += f", each batch split by rows over {parts} threads"
        elif unsplit:
            how += f"; not split by rows: {unsplit}"
        print(f"training {model_cfg.num_params():,} parameters on {device} ({how}): {steps} "
              f"step{'s' * (steps != 1)} of {tokens_per_iter:,} tokens into {out_dir}", flush=True)

    stop = StopRequest()

    def elapsed() -> float:
        """Seconds of training so far, earlier runs of a resumed one included."""
        return elapsed_before + time.perf_counter() - t_start

    def save(it: int, best: bool = False) -> None:
        """ckpt.pt at iteration it, first, so that a run whose disk fills can still be resumed;
        with best, ckpt_best.pt becomes a copy of it. A second Ctrl-C waits for both."""
        nonlocal last_saved
        with stop.hold():
            try:
                checkpoint.save({
                    "model": raw_model.state_dict(), "optimizer": optimizer.state_dict(),
                    "model_config": dataclasses.asdict(model_cfg), "train_config": dataclasses.asdict(cfg),
                    "meta": meta, "iter": it, "best_val_loss": best_val, "best_iter": best_iter,
                    "last_eval_iter": last_eval,
                    "rng": rng_state(device), "batch_rng": batches.state(), "elapsed_s": elapsed(),
                }, out_dir / "ckpt.pt")
                last_saved = it
                if best:
                    checkpoint.save_copy(out_dir / "ckpt.pt", out_dir / "ckpt_best.pt")
            except UserError as e:      # a full disk: room made, the run goes on from ckpt.pt
                with contextlib.suppress(UserError):    # so the same command may start afresh
                    metrics.log({"kind": "event", "iter": it, "event": NOT_SAVED})
                more = f"; once it can be written, {how_to_continue(out_dir)}" if last_saved is not None else ""
                raise UserError(f"{e}{more}") from None

    def diverged(what: str, it: int) -> Diverged:
        kept = ("no checkpoint had been saved yet" if last_saved is None else
                f"{out_dir / 'ckpt.pt'} keeps the last good state (iteration {last_saved})")
        return Diverged(f"{what} at iteration {it}; stopped, and {kept}. Lower --learning_rate, "
                        "or pass --skip_nonfinite=true to skip such steps")

    def evaluate(stoppable: bool) -> dict | None:
        """The mean losses, or None when a stop signal came meanwhile: an evaluation can take
        minutes, and it runs again on resuming. Under DDP the ranks finish it together, and
        the last one, which no resume would repeat, is always finished."""
        with spread():
            return mean_losses(raw_model, batches, ("train", "val"), cfg.eval_iters, eval_batch,
                               autocast, lambda: stoppable and stop.signal is not None and world == 1)

    def stop_at(it: int) -> None:
        signal_name = stop.signal or "a signal to another process"
        if master:
            if it > start_iter:
                save(it)
                done = f"saved {out_dir / 'ckpt.pt'} at iteration {it}; {how_to_continue(out_dir)}"
            elif cfg.resume:
                done = f"{out_dir / 'ckpt.pt'} still holds iteration {it}; {how_to_continue(out_dir)}"
            else:
                done = "stopped in the first evaluation, before any step; nothing was saved"
            metrics.log({"kind": "event", "iter": it, "event": f"stopped by {signal_name}"})
            bar.write(f"{signal_name}: {done}")
        summary["stopped_by"] = signal_name

    summary = {"stopped_by": None}
    tick, tokens_since, skipped = time.perf_counter(), 0, 0
    t_start = step_end = time.perf_counter()
    bar = tqdm(total=cfg.max_iters, initial=start_iter, disable=not master or None,
               dynamic_ncols=True, desc=out_dir.name)
    with stop, contextlib.closing(bar):
        it = start_iter
        while True:
            lr = lr_at(it, cfg)
            for group in optimizer.param_groups:    # before evaluating: diagnostics read it
                group["lr"] = lr
            if (it % cfg.eval_interval == 0 or it == cfg.max_iters) and it != last_eval:
                since_tick = time.perf_counter() - tick
                losses = evaluate(stoppable=it < cfg.max_iters)
                if losses is None:
                    stop_at(it)
                    break
                row = {"kind": "eval", "iter": it, **losses, "lr": lr,
                       "tokens_per_sec": tokens_since / since_tick if tokens_since else 0.0,
                       "elapsed_s": elapsed(), "unigram_loss": unigram}
                if cfg.diagnostics:
                    x, y = batches.evenly_spaced("val", 1, eval_batch)
                    with spread():
                        row.update(measure_diagnostics(raw_model, x[0], y[0], optimizer))
                last_eval = it
                finite = math.isfinite(row["train_loss"]) and math.isfinite(row["val_loss"])
                if world > 1:   # all ranks must take the same branch, or the next all-reduce hangs
                    flag = torch.tensor(float(finite), device=device)
                    torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MIN)
                    finite = flag.item() > 0
                if master:
                    metrics.log(row)
                    speed = f", {row['tokens_per_sec']:,.0f} tokens/s" if tokens_since else ""  # none yet
                    bar.write(f"iter {it}: train {row['train_loss']:.4f}, val {row['val_loss']:.4f} "
                              f"(unigram level {unigram:.2f}), lr {lr:.2e}{speed}")
                    sys.stdout.flush()      # now, not at exit, when the output is piped (| tee)
                if not finite:      # weights gone bad: saving them would replace the last good ones
                    if master:
                        metrics.log({"kind": "event", "iter": it, "event": "nonfinite evaluation"})
                    if not cfg.skip_nonfinite:
                        raise diverged(f"the evaluation loss became {row['val_loss']}", it)
                elif master:
                    improved = row["val_loss"] < best_val
                    if improved:
                        best_val, best_iter = row["val_loss"], it
                    if it > 0:          # an untrained model is not worth a file
                        save(it, best=improved)
                summary.update(row)
                tick, tokens_since = time.perf_counter(), 0
                step_end = tick             # step times leave evaluation out
            if it >= cfg.max_iters:
                break

            xs, ys = batches.draw("train", cfg.gradient_accumulation_steps)
            mine = slice(rank * local_steps, (rank + 1) * local_steps)
            xs, ys = xs[mine], ys[mine]                       # (local_steps, B, T)
            loss_sum = torch.zeros((), device=device)
            for micro in range(local_steps):
                if world > 1:   # one gradient all-reduce per step, not one per micro-step
                    model.require_backward_grad_sync = micro == local_steps - 1
                if model_cfg.dropout:   # its masks follow the micro-batch's place in the run
                    torch.manual_seed(dropout_seed(cfg.seed, it * cfg.gradient_accumulation_steps
                                                   + rank * local_steps + micro))
                if split:
                    loss = split.backward(xs[micro], ys[micro], 1 / local_steps)
                else:
                    with autocast:
                        _, loss = model(xs[micro], ys[micro])
                    (loss / local_steps).backward()
                loss_sum += loss.detach()
            stopping = stop.signal is not None
            if world > 1:   # the stop flag rides along, so every rank stops after the same step
                flags = torch.stack([loss_sum, torch.tensor(float(stopping), device=device)])
                torch.distributed.all_reduce(flags)
                loss_sum, stopping = flags[0] / world, flags[1].item() > 0
            loss_value = loss_sum.item() / local_steps
            grad_norm = clip_grad_norm(params, cfg.grad_clip or float("inf"))
            if math.isfinite(loss_value) and math.isfinite(grad_norm):
                optimizer.step()
                tokens_since += tokens_per_iter
            else:
                if master:
                    metrics.log({"kind": "event", "iter": it, "event": "nonfinite",
                                 "loss": str(loss_value), "grad_norm": str(grad_norm)})
                if not cfg.skip_nonfinite:
                    raise diverged(f"loss became {loss_value} (gradient norm {grad_norm})", it)
                skipped += 1
            optimizer.zero_grad(set_to_none=True)
            # a step's time runs from the previous step's end: logging and the bar count too
            step_ms, step_end = 1000 * (time.perf_counter() - step_end), time.perf_counter()
            if master and it % cfg.log_interval == 0:
                metrics.log({"kind": "train", "iter": it, "loss": loss_value, "lr": lr,
                             "grad_norm": grad_norm, "ms": step_ms})
            bar.set_postfix(loss=f"{loss_value:.4f}", lr=f"{lr:.1e}",
                            tok_s=f"{tokens_per_iter / step_ms * 1000:,.0f}", refresh=False)
            bar.update(1)
            it += 1
            if stopping and it < cfg.max_iters:     # at the last step, finish with the evaluation
                stop_at(it)
                break
    summary.update(iters=it, best_val_loss=best_val, skipped_steps=skipped,
                   wall_s=time.perf_counter() - t_start)
    if master and not summary["stopped_by"]:
        notes = [f"{skipped} non-finite step{'s' * (skipped > 1)} skipped"
                 f"{' since resuming' if cfg.resume else ''}"] if skipped else []
        if last_saved != it:        # --skip_nonfinite kept going past a non-finite evaluation
            notes.append(f"ckpt.pt holds iteration {last_saved}: the evaluations after it were not finite"
                         if last_saved is not None else
                         "no evaluation after the first was finite, so nothing was saved")
        saved = f", best val loss {best_val:.4f}; checkpoints in {out_dir}" if last_saved is not None else ""
        print(f"done: {it} iteration{'s' * (it != 1)}{saved}" + "".join(f"; {note}" for note in notes))
    return summary
