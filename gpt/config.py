"""Typed configuration: the single source of truth for every option.

GPTConfig describes the model, TrainConfig one training run, SweepConfig the grid around it.
Each field carries its default and a one-line help; validation happens in __post_init__, so a
bad value fails where it enters. Config files (TOML) and `--name=value` overrides are read here
and nowhere else.
"""

from __future__ import annotations

import dataclasses
import datetime
import difflib
import math
import numbers
import os
import re
import tomllib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
CONFIG_DIR = REPO_ROOT / "configs"


class UserError(ValueError):
    """A mistake in what the user asked for; scripts print it as one line and exit 2."""


def first_line(error: BaseException) -> str:
    """What a library's error says, for one line of ours: its first line (or its type's name),
    cut to about 160 characters between words where one ends late enough (requests' errors run
    to hundreds; a long path is kept in part)."""
    width = 160
    text = str(error).strip()
    text = text.splitlines()[0] if text else type(error).__name__
    if len(text) <= width:
        return text
    space = text.rfind(" ", 0, width)
    return text[:space if space > width // 2 else width] + " ..."


def opt(default, help: str, choices: tuple[str, ...] | None = None, given_by: str | None = None):
    """A config field; `given_by` names where its value comes from when no command may set it."""
    meta = {"help": help}
    if choices:
        meta["choices"] = choices
    if given_by:
        meta["given_by"] = given_by
    return field(default=default, metadata=meta)


def _positive(obj, *names: str) -> None:
    for name in names:
        value = getattr(obj, name)
        if value <= 0:
            raise UserError(f"{name}={value} must be positive")


NAME_MAX = 255      # bytes in one file or folder name, on Linux, macOS and Windows alike


def user_path(text: str, what: str = "the path") -> str:
    """A path as given, with ~ expanded (bash leaves --out_dir=~/runs as it is, which would make a
    folder named ~ in the current one), and refused if a name in it is too long for any disk."""
    try:
        text = os.path.expanduser(text)
    except RuntimeError:    # ~user of no such user: a name like any other
        pass
    longest = max(Path(text).parts or [""], key=lambda part: len(os.fsencode(part)))
    if len(os.fsencode(longest)) > NAME_MAX:
        raise UserError(f"{what} has a name of {len(os.fsencode(longest))} bytes ({longest[:40]}...), "
                        f"more than the {NAME_MAX} a file system allows; give a shorter one")
    return text


def _named(obj, *names: str) -> None:
    """Folders given empty would mean the current one (an unset shell variable, --out_dir=$OUT)."""
    for name in names:
        if not getattr(obj, name).strip():
            raise UserError(f"{name} is empty; give a folder name")
        setattr(obj, name, user_path(getattr(obj, name), name))


def _check_seed(seed: int) -> None:
    if not 0 <= seed < 2 ** 32:     # what numpy's generators take, and torch's alike
        raise UserError(f"seed={seed} must be in [0, 2**32)")


def check_types(obj) -> None:
    """Each value of the field's own type, for configs built in Python: "false" would be true.
    Other kinds of numbers and strings (numpy's, from np.arange) become Python's own."""
    for f in dataclasses.fields(obj):
        value, kind = getattr(obj, f.name), _field_type(type(obj), f)
        if type(value) not in (bool, int, float, str):
            if kind is int and isinstance(value, numbers.Integral):
                object.__setattr__(obj, f.name, int(value))
            elif kind is float and isinstance(value, numbers.Real):
                object.__setattr__(obj, f.name, float(value))
            elif kind is bool and str(getattr(value, "dtype", "")) == "bool":   # numpy's bool
                object.__setattr__(obj, f.name, bool(value))
            elif kind is str and isinstance(value, str):    # numpy's: a checkpoint could not hold it
                object.__setattr__(obj, f.name, str(value))
        problem = _type_problem(type(obj), f, getattr(obj, f.name))
        if problem:
            raise UserError(problem)


def _type_problem(cls, f, value) -> str | None:
    kind = _field_type(cls, f)
    if isinstance(value, bool) != (kind is bool) or not isinstance(value, (int, float) if kind is float else kind):
        return f"{f.name}={value!r} is not {SPELLED.get(kind, kind.__name__)}"
    if kind is float and not math.isfinite(value):     # nan passes every comparison check after
        return f"{f.name}={value!r} is not a finite number"
    return None


def _check_choices(obj) -> None:
    for f in dataclasses.fields(obj):
        choices = f.metadata.get("choices")
        value = getattr(obj, f.name)
        if choices and value not in choices:
            close = difflib.get_close_matches(str(value).lower(), choices, n=1)
            hint = f"did you mean {close[0]}? " if close else ""
            raise UserError(f"{f.name}={value!r} is not allowed; {hint}choose one of {', '.join(choices)}")


@dataclass
class GPTConfig:
    vocab_size: int = opt(50304, "number of token ids", given_by="the dataset (its meta.json)")
    block_size: int = opt(256, "longest context the model sees, in tokens")
    n_layer: int = opt(6, "number of transformer blocks")
    n_head: int = opt(6, "attention heads per block")
    n_embd: int = opt(384, "width of the residual stream")
    n_kv_head: int = opt(0, "key/value heads; 0 means n_head, fewer gives grouped-query attention")
    dropout: float = opt(0.0, "dropout on the embeddings, the attention weights and each residual branch "
                         "(sandwich: before the branch's output norm)")
    bias: bool = opt(True, "biases in Linear layers (not the output head, as in GPT-2) and LayerNorms")
    pos_encoding: str = opt("learned", "how positions enter: learned table, fixed sinusoids "
                            "(Vaswani 2017), rotary (Su 2021), ALiBi bias (Press 2021), or none",
                            ("learned", "sinusoidal", "rope", "alibi", "none"))
    norm_placement: str = opt("pre", "pre: x + f(norm(x)) plus a final norm; post: norm(x + f(x)) "
                              "as in the 2017 Transformer; sandwich: x + norm(f(norm(x))) plus a "
                              "final norm (CogView, Gemma 2; Peri-LN)", ("pre", "post", "sandwich"))
    residual: bool = opt(True, "add each sub-layer's input back to its output (x + f(...))")
    norm_type: str = opt("layernorm", "LayerNorm (Ba 2016) or RMSNorm (Zhang 2019)",
                         ("layernorm", "rmsnorm"))
    parallel: bool = opt(False, "attention and MLP read the same input and their outputs are "
                         "summed (GPT-J, PaLM): one norm per block, not one per sub-layer (sandwich: "
                         "and one on the sum)")
    qk_norm: bool = opt(False, "normalise each head's queries and keys (norm_type) before their dot "
                        "product, which bounds the attention logits (Dehghani 2023)")
    activation: str = opt("gelu", "MLP non-linearity; gelu_tanh is GPT-2's approximation; swiglu and "
                          "geglu are gated (Shazeer 2020), at 2/3 the hidden width so the MLP keeps "
                          "about its weight count", ("gelu", "gelu_tanh", "relu", "swiglu", "geglu"))
    mlp_ratio: int = opt(4, "MLP hidden width as a multiple of n_embd (2/3 of that when gated)")
    tie_weights: bool = opt(True, "share the token embedding with the output head")
    scale_embeddings: bool = opt(False, "multiply the embeddings (tokens plus positions) by sqrt(n_embd) "
                                 "on the way in, as the 2017 Transformer and Gemma do for tokens")

    def __post_init__(self):
        check_types(self)
        _positive(self, "vocab_size", "block_size", "n_layer", "n_head", "n_embd", "mlp_ratio")
        if self.n_kv_head < 0:
            raise UserError(f"n_kv_head={self.n_kv_head} must be positive, or 0 for as many as n_head")
        if self.n_kv_head == self.n_head:
            # 0 whichever way it was given, so records of one model compare equal, and never
            # resolved, so dataclasses.replace(cfg, n_head=8) does not keep cfg's count (GQA)
            self.n_kv_head = 0
        _check_choices(self)
        if self.n_embd % self.n_head:
            raise UserError(f"n_embd={self.n_embd} is not divisible by n_head={self.n_head}; "
                            f"pick n_head among the divisors of {self.n_embd}")
        if self.n_head % self.kv_heads:
            raise UserError(f"n_head={self.n_head} is not divisible by n_kv_head={self.n_kv_head}")
        if self.pos_encoding == "rope" and (self.n_embd // self.n_head) % 2:
            raise UserError(f"pos_encoding='rope' needs an even head size, but n_embd/n_head = "
                            f"{self.n_embd // self.n_head}")
        if self.qk_norm and self.norm_type == "layernorm" and self.head_size == 1:
            raise UserError("qk_norm with norm_type='layernorm' needs a head size above 1 (a LayerNorm "
                            "of one channel is always 0); use fewer heads or norm_type='rmsnorm'")
        if not 0.0 <= self.dropout < 1.0:
            raise UserError(f"dropout={self.dropout} must be in [0, 1)")
        if self.mlp_hidden < 1:
            raise UserError(f"activation={self.activation!r} leaves the MLP no hidden units at "
                            f"mlp_ratio={self.mlp_ratio} and n_embd={self.n_embd}; raise mlp_ratio")

    @property
    def head_size(self) -> int:
        return self.n_embd // self.n_head

    @property
    def kv_heads(self) -> int:
        """Key/value heads: n_kv_head, or n_head for its 0."""
        return self.n_kv_head or self.n_head

    @property
    def gated(self) -> bool:
        """Whether c_fc makes two halves, one gating the other (GLU variants)."""
        return self.activation in ("swiglu", "geglu")

    @property
    def mlp_hidden(self) -> int:
        """MLP hidden units; gated MLPs have three matrices, so 2/3 the width matches two."""
        width = self.mlp_ratio * self.n_embd
        return 2 * width // 3 if self.gated else width

    def num_params(self) -> int:
        """Parameters of the model this describes, shared ones once, without building it."""
        C, H, kv = self.n_embd, self.mlp_hidden, self.kv_heads * self.head_size
        fc = H * (2 if self.gated else 1)
        per_width = 2 if self.norm_type == "layernorm" and self.bias else 1
        norm = C * per_width
        sublayers = 1 if self.parallel else 2
        norms = sublayers * (2 if self.norm_placement == "sandwich" else 1)
        block = C * (C + 2 * kv) + C * C + C * fc + H * C + norms * norm
        if self.qk_norm:
            block += 2 * self.head_size * per_width
        if self.bias:
            block += (C + 2 * kv) + C + fc + C
        return (self.n_layer * block + self.vocab_size * C * (1 if self.tie_weights else 2)
                + (self.block_size * C if self.pos_encoding == "learned" else 0)
                + (norm if self.norm_placement != "post" else 0))


@dataclass
class TrainConfig:
    dataset: str = opt("shakespeare_char", "folder under data_dir holding train.bin, val.bin, meta.json")
    data_dir: str = opt("data", "where datasets live")
    out_dir: str = opt("out", "where checkpoints, metrics.jsonl and config.json are written")
    device: str = opt("auto", "auto picks cuda, then mps, then cpu")
    dtype: str = opt("auto", "auto: bfloat16 autocast on GPUs that compute it (Ampere on), else float32; "
                     "fast: also on CPUs that compute it (AVX-512 BF16); bfloat16 on a CPU keeps "
                     "attention in float32, where it is faster", ("auto", "fast", "float32", "bfloat16"))
    matmul_precision: str = opt("high", "float32 matmuls while training: highest is exact; high lets "
                                "CUDA use TF32 (a CPU stays exact); medium also lets a CPU with AMX "
                                "round their inputs to bfloat16, summing in float32: 1.2-1.5x faster "
                                "steps there; other CPUs stay exact", ("highest", "high", "medium"))
    compile: bool = opt(False, "torch.compile the model (slow first step, faster after)")
    threads: int = opt(0, "CPU threads for torch during the run; 0 keeps the current count")
    flush_denormal: bool = opt(True, "CPU: treat subnormal floats as zero; saturated attention makes "
                               "them, and they slowed training steps by up to 1.6x")
    thread_split: str = opt("auto", "CPU: batch gives each thread its own rows of a micro-batch, on "
                            "one core (1.1x faster steps on the CPU recipe, 2 cores); ops lets torch "
                            "split every op between the threads; auto is batch for 2 to 4 threads "
                            "where a run can split (batch_size 2 or more; no dropout, compile, "
                            "torchrun or AMX rounding), else ops", ("auto", "batch", "ops"))
    seed: int = opt(1337, "seed for weights, batches and dropout")
    batch_size: int = opt(64, "sequences per micro-batch")
    gradient_accumulation_steps: int = opt(1, "micro-batches per optimizer step (over all processes)")
    max_iters: int = opt(5000, "optimizer steps to train for")
    learning_rate: float = opt(1e-3, "peak learning rate")
    min_lr: float = opt(1e-4, "learning rate at the end of the decay")
    warmup_iters: int = opt(100, "steps of linear warmup up to learning_rate")
    lr_decay_iters: int = opt(5000, "step at which the decay reaches min_lr")
    lr_schedule: str = opt("cosine", "after warmup: cosine or linear decay to min_lr, wsd (warmup-"
                           "stable-decay: flat, then a linear cooldown; Hu 2024, Hagele 2024), or "
                           "constant at learning_rate", ("cosine", "linear", "wsd", "constant"))
    cooldown_frac: float = opt(0.2, "wsd: share of the steps between warmup and lr_decay_iters spent "
                               "cooling down to min_lr")
    weight_decay: float = opt(0.1, "AdamW weight decay, applied to matrices and embeddings only")
    beta1: float = opt(0.9, "AdamW beta1")
    beta2: float = opt(0.99, "AdamW beta2")
    grad_clip: float = opt(1.0, "clip the global gradient norm to this; 0 disables")
    eval_interval: int = opt(250, "evaluate and checkpoint every this many steps")
    eval_iters: int = opt(200, "batches per split in each evaluation")
    eval_batch_size: int = opt(0, "sequences per evaluation batch; 0 uses batch_size. The windows "
                               "scored depend on eval_iters, this and block_size alone: give it to "
                               "compare runs of different batch_size on the same text")
    log_interval: int = opt(10, "write a train-loss line to metrics.jsonl every this many steps")
    diagnostics: bool = opt(True, "log per-block gradient norm, update/weight ratio, residual RMS, "
                                  "position similarity and per-head attention entropy at each evaluation")
    skip_nonfinite: bool = opt(False, "skip steps whose loss is nan/inf instead of stopping")
    resume: bool = opt(False, "continue from out_dir/ckpt.pt")
    overwrite: bool = opt(False, "start afresh in an out_dir that holds an earlier run's checkpoints, "
                          "deleting them; without it such a start is refused")
    wandb: bool = opt(False, "log metrics to Weights & Biases")
    wandb_project: str = opt("gpt", "Weights & Biases project")
    wandb_run_name: str = opt("", "Weights & Biases run name; empty uses out_dir's name")

    def __post_init__(self):
        check_types(self)
        _check_choices(self)
        _positive(self, "batch_size", "gradient_accumulation_steps", "max_iters", "eval_interval",
                  "eval_iters", "log_interval", "learning_rate")
        for name in ("min_lr", "warmup_iters", "lr_decay_iters", "weight_decay", "grad_clip",
                     "threads", "eval_batch_size"):
            if getattr(self, name) < 0:
                raise UserError(f"{name}={getattr(self, name)} must not be negative")
        _check_seed(self.seed)
        _named(self, "dataset", "data_dir", "out_dir")
        if self.resume and self.overwrite:
            raise UserError("resume=true continues the run in out_dir and overwrite=true replaces it; "
                            "give one of them")
        if self.min_lr > self.learning_rate and self.lr_schedule != "constant":
            raise UserError(f"min_lr={self.min_lr} is above learning_rate={self.learning_rate}")
        if self.lr_schedule != "constant" and self.lr_decay_iters <= self.warmup_iters:
            raise UserError(f"lr_decay_iters={self.lr_decay_iters} is not after the end of warmup_iters="
                            f"{self.warmup_iters}; the decay would start with a drop to min_lr "
                            "(raise lr_decay_iters, lower warmup_iters, or pass --lr_schedule=constant)")
        if not 0.0 < self.cooldown_frac <= 1.0:
            raise UserError(f"cooldown_frac={self.cooldown_frac} must be in (0, 1]")
        for name in ("beta1", "beta2"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise UserError(f"{name}={getattr(self, name)} must be in [0, 1)")


# the schedules that read each of these settings; the others ignore it, so runs that differ only
# in it train alike
READ_BY_SCHEDULES = {"cooldown_frac": ("wsd",), "min_lr": ("cosine", "linear", "wsd"),
                     "lr_decay_iters": ("cosine", "linear", "wsd")}


def read_by(lr_schedule: str, name: str) -> bool:
    """Whether a run at lr_schedule reads the setting `name` (any setting outside the schedule's)."""
    return lr_schedule in READ_BY_SCHEDULES.get(name, (lr_schedule,))


@dataclass
class SweepConfig:
    seeds: int = opt(1, "seeds per setting (seed, seed+1, ...)")
    jobs: int = opt(1, "runs at once; CPU threads are split between them")

    def __post_init__(self):
        check_types(self)
        _positive(self, "seeds", "jobs")


@dataclass
class SampleConfig:
    out_dir: str = opt("out", "run folder whose checkpoint is sampled")
    ckpt: str = opt("latest", "latest: ckpt.pt, the last saved; best: ckpt_best.pt, the lowest val loss",
                    choices=("latest", "best"))
    start: str = opt("\n", "prompt text (a newline by default; bash writes one as $'A\\nB'), or "
                     "FILE:path to read it from a file")
    num_samples: int = opt(1, "number of samples to write")
    max_new_tokens: int = opt(500, "tokens generated per sample")
    temperature: float = opt(0.8, "softmax temperature; 0 picks the most likely token")
    top_k: int = opt(0, "sample among the k most likely tokens (and any tied with the k-th); 0 means all")
    top_p: float = opt(1.0, "sample among the smallest set of tokens whose probability reaches p (and "
                       "any tied with the least likely of them)")
    seed: int = opt(1337, "random seed: the same seed gives the same text")
    device: str = opt("auto", "auto picks cuda, then mps, then cpu")
    use_cache: bool = opt(True, "reuse past keys and values (KV cache) while generating")

    def __post_init__(self):
        check_types(self)
        _check_choices(self)
        _positive(self, "num_samples", "max_new_tokens")
        _named(self, "out_dir")
        if self.temperature != 0 and not 1e-3 <= self.temperature:
            raise UserError(f"temperature={self.temperature} must be 0 (greedy) or at least 0.001")
        if self.top_k < 0:
            raise UserError(f"top_k={self.top_k} must not be negative")
        if not 0.0 < self.top_p <= 1.0:
            raise UserError(f"top_p={self.top_p} must be in (0, 1]")
        _check_seed(self.seed)


SECTIONS = (GPTConfig, TrainConfig, SweepConfig)
RESERVED_AXES = ("seed", "seeds", "jobs", "out_dir", "resume", "overwrite")   # a sweep sets these itself


def fields_of(sections) -> dict:
    return {f.name: (cls, f) for cls in sections for f in dataclasses.fields(cls)}


FIELDS = fields_of(SECTIONS)
# options that were replaced: what an old name given now is told to use instead
REPLACED = {"decay_lr": ("lr_schedule", {True: "cosine", False: "constant"})}


def replacement(name: str, toml: bool = False, axis: bool = False) -> str:
    """How to say what the replaced option `name` said: on the command line, in a TOML file, or
    as an axis of a TOML file's [sweep] table."""
    field, values = REPLACED[name]
    if axis:
        return f"{field} = [...], with " + ", ".join(f'"{new}" for {shown(old)}' for old, new in values.items())
    said = (f'{field} = "{new}"' if toml else f"--{field}={new}" for new in values.values())
    return ", ".join(f"{s} for {shown(old)}" for s, old in zip(said, values))


# ---------------------------------------------------------------- converting values

def _field_type(cls, f) -> type:
    hint = typing.get_type_hints(cls)[f.name]
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if isinstance(hint, types.UnionType) else hint


SPELLED = {bool: "true or false", int: "a whole number", float: "a number", str: "text"}


def convert(name: str, value, fields: dict = FIELDS, axis: bool = False):
    """Turn a command-line string or a TOML value into the type of field `name`. A folder keeps
    its ~ on a sweep axis, where it names the run folders; the runs expand it."""
    if name not in fields:
        raise UserError(unknown_name_message(name, fields))
    kind = _field_type(*fields[name])
    if kind is bool:
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in ("true", "1", "yes", "on"):
            return True
        if text in ("false", "0", "no", "off"):
            return False
    elif kind is int and not isinstance(value, bool):
        try:
            return int(str(value).strip())
        except ValueError:
            pass
        try:    # 1e4 and 5000.0 are whole numbers too; float() alone would round past 2**53
            number = float(value)
            if number == int(number):
                return int(number)
        except (TypeError, ValueError, OverflowError):
            pass
    elif kind is float and not isinstance(value, bool):
        try:
            number = float(value)
            if math.isfinite(number):
                return number
        except (TypeError, ValueError, OverflowError):
            pass
    elif kind is str:   # a folder given by the user is taken as the shell would have it
        folder = name.endswith("_dir") and str(value).strip() and not axis
        return user_path(str(value), name) if folder else str(value)
    given = value.isoformat() if isinstance(value, (datetime.date, datetime.time)) else repr(value)  # TOML's
    raise UserError(f"{name}={given} is not a valid {kind.__name__}; give {SPELLED.get(kind, kind.__name__)}")


def unknown_name_message(name: str, fields: dict = FIELDS) -> str:
    classes = {cls for cls, _ in fields.values()}
    if name in REPLACED and name not in fields and TrainConfig in classes:
        return f"--{name} was replaced; use {replacement(name)}"
    extra = ["config"] * (TrainConfig in classes) + ["sweep"] * (SweepConfig in classes)
    close = difflib.get_close_matches(name, list(fields) + extra, n=1)
    hint = f"; did you mean --{close[0]}?" if close else "; see --help for the list"
    return f"unknown option --{name}{hint}"


# ---------------------------------------------------------------- config files

def available_configs() -> list[str]:
    return sorted(str(p.relative_to(CONFIG_DIR).with_suffix("")) for p in CONFIG_DIR.rglob("*.toml"))


def config_path(name: str) -> Path:
    """A config shipped in configs/ or a TOML file, '.toml' optional. A name that reads as a path
    (a .toml suffix, or a start of /, ./, ../ or ~) is looked up as a file first, a bare name
    in configs/ first."""
    stem = name.removesuffix(".toml")
    as_path = name.endswith(".toml") or name.startswith(("/", "./", "../", "~"))
    places = [Path(user_path(f"{stem}.toml", "--config")), CONFIG_DIR / f"{stem}.toml"]
    for candidate in places if as_path else places[::-1]:
        if candidate.is_file():
            return candidate
    if as_path and (places[0].is_dir() or Path(user_path(name, "--config")).is_dir()):
        raise UserError(f"--config {name!r} is a folder; give a TOML file in it, or a shipped config's name")
    close = difflib.get_close_matches(stem, available_configs(), n=1)
    hint = f"did you mean {close[0]}? " if close else ""
    what = "no such file, nor a shipped config of that name" if as_path else "no config named"
    raise UserError(f"{what} {name!r}; {hint}available: {', '.join(available_configs())}")


def read_config_file(name: str) -> tuple[dict, dict[str, list]]:
    """Return (field values, sweep axes) from a TOML config; `[sweep]` holds the axes."""
    path = config_path(name)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8-sig"))
    except tomllib.TOMLDecodeError as e:
        raise UserError(f"{path}: {e}") from None
    except UnicodeDecodeError:
        raise UserError(f"{path} is not UTF-8 text; is it a TOML config?") from None
    except OSError as e:
        raise UserError(f"{path} cannot be read ({e.strerror})") from None
    axes = data.pop("sweep", {})
    if not isinstance(axes, dict):
        raise UserError(f"{path}: [sweep] must be a table of axis = [values]")

    def typed(key, value, axis=False):
        if key in REPLACED:
            raise UserError(f"{path}: {'[sweep] ' * axis}{key} was replaced; use "
                            f"{replacement(key, toml=True, axis=axis)}")
        if isinstance(value, dict):     # [model], [train]: sections this file format has not
            raise UserError(f"{path}: [{'sweep.' * axis}{key}] is a table; settings go at the top "
                            "level, name = value, and axes in [sweep], name = [values]")
        if key not in FIELDS:
            close = difflib.get_close_matches(key, list(FIELDS), n=1)
            raise UserError(f"{path}: {key} is not a setting"
                            f"{f'; did you mean {close[0]}?' if close else '; see --help for the list'}")
        try:
            return convert(key, value, axis=axis)
        except UserError as e:
            raise UserError(f"{path}: {e}") from None
    values = {key: typed(key, value) for key, value in data.items()}
    sweep = {}
    for key, value in axes.items():
        if key in SweepConfig.__dataclass_fields__:
            values[key] = typed(key, value)
        else:
            listed = value if isinstance(value, list) else [value]
            if not listed:
                raise UserError(f"{path}: [sweep] {key} = [] lists no values; give at least one")
            sweep[key] = [typed(key, v, axis=True) for v in listed]
    return values, sweep


# ---------------------------------------------------------------- command line

@dataclass
class Args:
    """A parsed command line: the config file's values, then the overrides on top."""
    values: dict                      # field name -> typed value, file first, then overrides
    sweep: dict[str, list]            # axis name -> values to try
    config_name: str | None = None    # --config: where the values not given on the command line came from
    from_file: tuple[str, ...] = ()   # those values' names

    def blame(self, message: str) -> str:
        """A validation message that names values (name=value), with the file that set them: a
        value checked against others is wrong where it was written, not where it is checked."""
        named = [n for n in dict.fromkeys(re.findall(r"\b([a-z][a-z0-9_]*)=", message))
                 if n in self.from_file]
        return f"{message} ({', '.join(named)} set by --config {self.config_name})" if named else message


def parse_argv(argv: list[str], sections=SECTIONS) -> Args:
    fields = fields_of(sections)
    config_name, raw, sweep = None, {}, {}
    tokens = list(argv)
    for token in tokens:
        if not token.isascii():     # bytes a shell passed on that are not UTF-8 become surrogates
            try:
                token.encode("utf-8")
            except UnicodeEncodeError:
                raise UserError(f"{token!r} is not UTF-8 text (\\udcXX marks a byte that is not); "
                                "give names and paths in UTF-8") from None
    while tokens:
        token = tokens.pop(0)
        if not token.startswith("--"):
            raise UserError(f"unexpected argument {token!r}; options look like --name=value")
        name, eq, value = token[2:].partition("=")
        if not eq:
            if tokens and not tokens[0].startswith("--"):
                value = tokens.pop(0)
            elif name in fields and _field_type(*fields[name]) is bool:
                value = "true"
            elif name not in fields and name not in ("config", "sweep"):
                raise UserError(unknown_name_message(name, fields))
            else:
                raise UserError(f"--{name} needs a value: --{name}=VALUE")
        if name == "sweep" and SweepConfig not in sections:
            raise UserError("--sweep: this command runs one setting; sweeps run with python train.py")
        if name == "config" and TrainConfig not in sections:
            raise UserError("--config: this command takes the model's settings from the checkpoint "
                            "in --out_dir")
        if name == "config":
            if not value:
                raise UserError("--config is empty; give a config's name or a .toml path")
            if config_name is not None:
                raise UserError(f"--config is given twice ({config_name}, {value}); give one file, and "
                                "the values to change as --name=value")
            config_name = value
        elif name == "sweep":
            axis, eq, values = value.partition("=")
            if not eq or not values:
                raise UserError(f"--sweep {value!r} should look like --sweep name=v1,v2")
            if axis in REPLACED:
                raise UserError(f"--sweep {axis}: {axis} was replaced; use {replacement(axis)}")
            if axis not in fields:
                close = difflib.get_close_matches(axis, list(fields), n=1)
                hint = f"; did you mean {close[0]}?" if close else "; see --help for the fields"
                raise UserError(f"--sweep {axis}: not a config field{hint}")
            if axis in sweep:
                raise UserError(f"--sweep {axis} is given twice; list all its values in one: "
                                f"--sweep {axis}=v1,v2")
            sweep[axis] = [convert(axis, v, fields, axis=True) for v in values.split(",")]
        else:
            raw[name] = convert(name, value, fields)
    values, file_sweep = read_config_file(config_name) if config_name else ({}, {})
    source = dict(config_name=config_name,
                  from_file=tuple(n for n in (*values, *file_sweep) if n not in raw and n not in sweep))
    values.update(raw)
    for name, (cls, f) in fields.items():
        if "given_by" in f.metadata and name in {**values, **file_sweep, **sweep}:
            where = (f"--{name}" if name in raw else f"--sweep {name}" if name in sweep
                     else f"{config_name} sets {name}")
            raise UserError(f"{where}: {name} is set by {f.metadata['given_by']}, not by hand; remove it")
    if config_name and values.get("resume") and not (sweep or file_sweep) and SweepConfig in sections:
        # the file's values would silently replace the run's own (its warmup, its schedule); for
        # train.py alone, as the bench refuses --resume in its own words
        folder = values.get("out_dir", TrainConfig.out_dir)
        raise UserError(f"--resume continues a run with the settings in its checkpoint, which "
                        f"{config_name}'s would replace; run train.py --out_dir={shown(folder)} "
                        "--resume, adding only what should change (e.g. --max_iters)")
    if SweepConfig not in sections:     # a command that runs one setting: each axis needs a value
        unset = [name for name in file_sweep if name not in raw]
        if unset:
            picks = " ".join(f"--{name}={shown(file_sweep[name][0])}" for name in unset)
            raise UserError(f"{config_name} sweeps {', '.join(unset)}; this command runs one "
                            f"setting: pick one value for each, e.g. {picks}")
        return Args(values=values, sweep={}, **source)
    for name, listed in {**file_sweep, **sweep}.items():
        where = "--sweep" if name in sweep else config_name
        if name in RESERVED_AXES:
            hint = "; use --seeds=N for seeds" if name.startswith("seed") else ""
            raise UserError(f"{f'--sweep {name}' if name in sweep else f'{config_name} sweeps {name}'}: "
                            f"the sweep sets {name} itself{hint}")
        twice = [v for i, v in enumerate(listed) if v in listed[:i]]
        if twice:   # 1 and true, or 1e-3 and 0.001, are one value once typed
            raise UserError(f"{where} lists {name}={shown(twice[0])} twice; list each value once")
        if name in raw:         # the axis would win unseen
            axis = ",".join(shown(v) for v in sweep.get(name, file_sweep.get(name)))
            fix = ("give one or the other" if name in sweep else
                   f"to run only some values, give them as --sweep {name}={shown(raw[name])}")
            raise UserError(f"--{name}={shown(raw[name])} is also swept by {where} ({name}={axis}); {fix}")
    return Args(values=values, sweep={**file_sweep, **sweep}, **source)


def _upgraded(cls, saved: dict) -> dict:
    """A config saved by an older version, in today's fields."""
    for name, (new, values) in REPLACED.items():
        if name in saved and new not in saved and new in cls.__dataclass_fields__:
            saved = {**saved, new: values[saved[name]]}
    return saved


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
    saved = _upgraded(cls, saved)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(str(k) for k in saved if k not in fields and k not in REPLACED)
    if model and unknown:
        return f"it has options this version does not know ({', '.join(unknown)}); update the project"
    known = {k: v for k, v in saved.items() if k in fields}
    problem = next(filter(None, (_type_problem(cls, fields[k], v) for k, v in known.items())), None)
    if problem:
        return problem
    if model:
        try:
            cls(**known)
        except UserError as e:
            return str(e)
    return None


def build(cls, values: dict, base: dict | None = None):
    """Make a `cls` from `base` (e.g. a checkpoint's saved config) updated with `values`."""
    names = {f.name for f in dataclasses.fields(cls)}
    merged = {k: v for k, v in _upgraded(cls, base or {}).items() if k in names}
    merged.update({k: v for k, v in _upgraded(cls, values).items() if k in names})
    return cls(**merged)


def shown(value) -> str:
    """A value as it would be typed: true, 0.001, learned; quoted when spaces or commas would blur it."""
    if isinstance(value, bool):
        return str(value).lower()
    text = str(value)
    return repr(text) if text != text.strip() or not text or "," in text or " " in text else text


def help_text(prog: str, sections=SECTIONS, hidden=()) -> str:
    """--help: each field of sections with its default and help, but those named in hidden."""
    configs, sweeps = TrainConfig in sections, SweepConfig in sections
    lines = [f"usage: python {prog}{' [--config NAME]' if configs else ''} [--name=value ...]"
             f"{' [--sweep name=v1,v2 ...]' if sweeps else ''}", ""]
    if configs:
        lines.append(f"--config NAME: one of {', '.join(available_configs())}, or a .toml path")
    if sweeps:
        lines.append("--sweep name=v1,v2: run every combination of the listed values (see SweepConfig)")
    if configs:
        lines.append("")
    for cls in sections:
        lines.append(f"{cls.__name__}:")
        for f in dataclasses.fields(cls):
            if "given_by" in f.metadata or f.name in hidden:
                continue
            choices = f.metadata.get("choices")
            allowed = f" [{' | '.join(choices)}]" if choices else ""
            lines.append(f"  --{f.name}={shown(f.default)}{allowed}\n      {f.metadata['help']}")
        lines.append("")
    return "\n".join(lines)
