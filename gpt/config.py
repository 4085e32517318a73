"""Typed configuration: every option's field, default, one-line help and validation.

TrainConfig describes one training run, SweepConfig the grid around it and SampleConfig one
sampling command; GPTConfig, the model, stands alone in model_config.py and is taken from there.
Validation happens in __post_init__, so a bad value fails where it enters; the command line is read
in cli.py, config files in config_files.py.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from dataclasses import dataclass
from pathlib import Path

from . import model_config
from .errors import UserError
from .model_config import SPELLED, GPTConfig, field_type, opt, type_problem  # the first four for the commands

# the field checks of gpt/model_config.py, raising the commands' one-line error
check_types = functools.partial(model_config.check_types, error=UserError)
_check_choices = functools.partial(model_config.check_choices, error=UserError)
_positive = functools.partial(model_config.positive, error=UserError)

REPO_ROOT = Path(__file__).resolve().parent.parent

MIN_LR = 1e-4      # min_lr's default: min_lr_ratio replaces it, and refuses it set to another value

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


def check_seed(seed: int) -> None:
    if not 0 <= seed < 2 ** 32:     # what numpy's generators take, and torch's alike
        raise UserError(f"seed={seed} must be in [0, 2**32)")


@dataclass
class TrainConfig:
    dataset: str = opt("shakespeare_char", "folder under data_dir holding train.bin, val.bin, meta.json")
    data_dir: str = opt("data", "where datasets live")
    data_url: str = opt("", "where a shipped dataset is downloaded from on first use: a mirror, or "
                            "file:///path for a local copy; empty: its public source")
    init_from: str = opt("", "start from these weights: a run's out_dir, a Hugging Face GPT-2 folder, or "
                             "a GPT-2 name (gpt2, gpt2-medium, gpt2-large, gpt2-xl); the model's shape is "
                             "theirs, block_size may be cropped; empty: random weights")
    out_dir: str = opt("out", "where checkpoints, metrics.jsonl and config.json are written")
    device: str = opt("auto", "auto picks cuda, then mps, then cpu")
    dtype: str = opt("auto", "auto: bfloat16 autocast on GPUs that compute it (Ampere on), else float32; "
                     "fast: also on CPUs that compute it (AVX-512 BF16); bfloat16 on a CPU keeps "
                     "attention in float32, where it is faster", ("auto", "fast", "float32", "bfloat16"))
    matmul_precision: str = opt("high", "float32 matmuls while training: highest is exact; high lets "
                                "CUDA use TF32 (a CPU stays exact); medium also lets a CPU with AMX "
                                "round their inputs to bfloat16, summing in float32, for faster steps "
                                "there; other CPUs stay exact", ("highest", "high", "medium"))
    compile: bool = opt(False, "torch.compile the model (slow first step, faster after)")
    threads: int = opt(0, "CPU threads for torch during the run; 0 keeps the current count")
    flush_denormal: bool = opt(True, "CPU: treat subnormal floats as zero; saturated attention makes "
                               "them, and they slow training steps")
    thread_split: str = opt("auto", "CPU: batch gives each thread its own rows of a micro-batch, on "
                            "one core, for faster steps; ops lets torch "
                            "split every op between the threads; auto is batch for 2 to 4 threads "
                            "where a run can split (batch_size 2 or more; no dropout, compile, "
                            "torchrun or AMX rounding), else ops", ("auto", "batch", "ops"))
    seed: int = opt(1337, "seed for weights, batches and dropout")
    batch_size: int = opt(64, "sequences per micro-batch")
    gradient_accumulation_steps: int = opt(1, "micro-batches per optimizer step (over all processes)")
    max_iters: int = opt(5000, "optimizer steps to train for")
    learning_rate: float = opt(1e-3, "peak learning rate")
    min_lr: float = opt(MIN_LR, "learning rate at the end of the decay")
    min_lr_ratio: float = opt(0.0, "the end of the decay as a fraction of learning_rate (0.1: a tenth of "
                              "the peak), in place of min_lr, so runs at several peak rates decay alike; "
                              "0 uses min_lr")
    warmup_iters: int = opt(100, "steps of linear warmup up to learning_rate")
    lr_decay_iters: int = opt(5000, "step at which the decay reaches min_lr")
    lr_schedule: str = opt("cosine", "after warmup: cosine or linear decay to min_lr, wsd (warmup-"
                           "stable-decay: flat, then a linear cooldown; Hu 2024, Hagele 2024), or "
                           "constant at learning_rate", ("cosine", "linear", "wsd", "constant"))
    cooldown_frac: float = opt(0.2, "wsd: share of the steps between warmup and lr_decay_iters spent "
                               "cooling down to min_lr")
    optimizer: str = opt("adamw", "adamw: AdamW (Loshchilov 2019) on every parameter; muon: Muon (Jordan "
                         "2024) on the blocks' weight matrices, AdamW on the rest (embeddings, head, "
                         "norms, biases), as nanochat splits them", ("adamw", "muon"))
    muon_lr: float = opt(0.02, "optimizer=muon: peak learning rate of the blocks' matrices, under the "
                         "run's warmup and decay like learning_rate (which the AdamW part keeps)")
    muon_momentum: float = opt(0.95, "optimizer=muon: Muon's Nesterov momentum")
    muon_weight_decay: float = opt(0.0, "optimizer=muon: decoupled weight decay on the blocks' matrices, "
                                   "per step lr * this (Muon's own default is none)")
    muon_split: str = opt("fused", "optimizer=muon: what Muon orthogonalises apart, each with its own "
                          "shape factor. fused: each matrix whole; qkv: c_attn's query, key and value "
                          "rows; heads: each head's rows of them. qkv and heads also split a gated "
                          "MLP's c_fc into its gate and up halves (heads has no meaning there); "
                          "groups: muon_head_group heads' rows at a time, of the queries, keys and "
                          "values apart", ("fused", "qkv", "heads", "groups"))
    muon_dtype: str = opt("auto", "optimizer=muon: the dtype of Muon's Newton-Schulz iteration. bfloat16, "
                          "as torch.optim.Muon; float32, about 3 times faster a step on a CPU without "
                          "bfloat16 dot products (AVX2), which only emulates bfloat16; auto: bfloat16 "
                          "where the device computes it (a GPU from Ampere on, Apple's, a CPU with "
                          "AVX-512 BF16 or AMX), else float32", ("auto", "bfloat16", "float32"))
    muon_head_group: int = opt(2, "muon_split=groups: heads per block; it must divide n_head and the "
                               "key and value heads' count")
    muon_momentum_warmup: int = opt(0, "optimizer=muon: steps over which Muon's momentum rises linearly "
                                    "from muon_momentum_start to muon_momentum (nanochat: 300); 0: "
                                    "muon_momentum from the first step")
    muon_momentum_start: float = opt(0.85, "optimizer=muon: Muon's momentum at step 0 of "
                                     "muon_momentum_warmup (nanochat's 0.85)")
    embed_lr: float = opt(0.0, "peak AdamW rate of the token and position embeddings, under the run's "
                          "warmup and decay like learning_rate (nanochat gives them their own); 0: "
                          "learning_rate")
    head_lr: float = opt(0.0, "peak AdamW rate of an untied output head (tie_weights=false), as embed_lr; "
                         "0: learning_rate")
    weight_decay: float = opt(0.1, "AdamW weight decay, applied to matrices and embeddings only")
    beta1: float = opt(0.9, "AdamW beta1")
    beta2: float = opt(0.99, "AdamW beta2")
    grad_clip: float = opt(1.0, "clip the global gradient norm to this; 0 disables")
    eval_interval: int = opt(250, "evaluate and checkpoint every this many steps")
    eval_iters: int = opt(200, "batches per split in each evaluation")
    eval_train: bool = opt(True, "score the train split at every evaluation; false: at the last (max_iters) "
                           "alone, which halves the others where only val is read. A sweep's runs take "
                           "false unless given: its report and figures read val, and the final train loss")
    eval_batch_size: int = opt(0, "sequences per evaluation batch; 0 uses batch_size. The windows "
                               "scored depend on eval_iters, this and block_size alone: give it to "
                               "compare runs of different batch_size on the same text")
    log_interval: int = opt(10, "write a train-loss line to metrics.jsonl every this many steps")
    diagnostics: bool = opt(True, "log per-block gradient norm, update/weight ratio, residual RMS, "
                                  "position similarity and per-head attention entropy at each evaluation")
    skip_nonfinite: bool = opt(False, "skip steps whose loss is nan/inf instead of stopping")
    stop_hopeless: bool = opt(False, "stop the run (status pruned, exit status 4) at an evaluation after "
                              "warmup whose val loss is above the unigram level and no better than the "
                              "evaluations before: it has stopped learning short of the characters' "
                              "frequencies; a sweep's --tune_prune sets it on tuning runs")
    pause_at: int = opt(0, "end the run at this iteration, after an evaluation there, with its checkpoint "
                        "saved (status paused, exit status 5); --resume then trains on to max_iters. "
                        "A sweep's --tune_halving sets it on tuning runs; 0: train to max_iters")
    resume: bool = opt(False, "continue from out_dir/ckpt.pt")
    overwrite: bool = opt(False, "start afresh in an out_dir that holds an earlier run's checkpoints, "
                          "deleting them; without it such a start is refused")
    adopt_checkpoint: bool = opt(False, "resume a ckpt.pt that another run saved (copied in by hand), "
                                 "setting this folder's metrics.jsonl aside; without it such a resume is refused")
    wandb: bool = opt(False, "log metrics to Weights & Biases")
    wandb_project: str = opt("gpt", "Weights & Biases project")
    wandb_run_name: str = opt("", "Weights & Biases run name; empty uses out_dir's name")
    wandb_group: str = opt("", "Weights & Biases group, one per experiment; a sweep gives its runs its "
                           "folder's name unless given")
    wandb_job_type: str = opt("", "Weights & Biases job type; a sweep gives each run its setting")
    wandb_tags: str = opt("", "Weights & Biases tags, separated by ','; a sweep tags each run with its "
                          "settings, seed and stage (tune or confirm)")

    def __post_init__(self):
        check_types(self)
        _check_choices(self)
        _positive(self, "batch_size", "gradient_accumulation_steps", "max_iters", "eval_interval",
                  "eval_iters", "log_interval", "learning_rate", "muon_lr", "muon_head_group")
        for name in ("muon_weight_decay", "muon_momentum_warmup", "embed_lr", "head_lr", "min_lr", "warmup_iters", "lr_decay_iters", "weight_decay", "grad_clip",
                     "threads", "eval_batch_size", "pause_at"):
            if getattr(self, name) < 0:
                raise UserError(f"{name}={getattr(self, name)} must not be negative")
        check_seed(self.seed)
        _named(self, "dataset", "data_dir", "out_dir")
        if self.resume and self.overwrite:
            raise UserError("resume=true continues the run in out_dir and overwrite=true replaces it; "
                            "give one of them")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise UserError(f"min_lr_ratio={self.min_lr_ratio} must be in [0, 1] (a fraction of learning_rate)")
        if self.min_lr_ratio and self.min_lr != MIN_LR:
            raise UserError(f"min_lr={self.min_lr} and min_lr_ratio={self.min_lr_ratio} both set the end of the "
                            "decay; give one of them")
        if self.min_lr > self.learning_rate and self.lr_schedule != "constant" and not self.min_lr_ratio:
            raise UserError(f"min_lr={self.min_lr} is above learning_rate={self.learning_rate}")
        if self.lr_schedule != "constant" and self.lr_decay_iters <= self.warmup_iters:
            raise UserError(f"lr_decay_iters={self.lr_decay_iters} is not after the end of warmup_iters="
                            f"{self.warmup_iters}; the decay would start with a drop to min_lr "
                            "(raise lr_decay_iters, lower warmup_iters, or pass --lr_schedule=constant)")
        if self.pause_at >= self.max_iters:
            raise UserError(f"pause_at={self.pause_at} is not before max_iters={self.max_iters}: there would be "
                            "nothing left to resume; give a lower pause_at, or 0 to train to the end")
        if not 0.0 < self.cooldown_frac <= 1.0:
            raise UserError(f"cooldown_frac={self.cooldown_frac} must be in (0, 1]")
        for name in ("beta1", "beta2", "muon_momentum", "muon_momentum_start"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise UserError(f"{name}={getattr(self, name)} must be in [0, 1)")

    @property
    def final_lr(self) -> float:
        """Where the decay ends: min_lr_ratio of the peak where it is set, else min_lr."""
        return self.min_lr_ratio * self.learning_rate if self.min_lr_ratio else self.min_lr


# the schedules that read each of these settings; the others ignore it, so runs that differ only
# in it train alike
READ_BY_SCHEDULES = {"cooldown_frac": ("wsd",), "min_lr": ("cosine", "linear", "wsd"),
                     "min_lr_ratio": ("cosine", "linear", "wsd"),
                     "lr_decay_iters": ("cosine", "linear", "wsd")}


def read_by(lr_schedule: str, name: str) -> bool:
    """Whether a run at lr_schedule reads the setting `name` (any setting outside the schedule's)."""
    return lr_schedule in READ_BY_SCHEDULES.get(name, (lr_schedule,))


# the optimizers that read each of these settings; a run with another trains alike whatever they are
READ_BY_OPTIMIZERS = {"muon_lr": ("muon",), "muon_momentum": ("muon",), "muon_weight_decay": ("muon",),
                      "muon_split": ("muon",), "muon_dtype": ("muon",), "muon_head_group": ("muon",),
                      "muon_momentum_warmup": ("muon",), "muon_momentum_start": ("muon",)}


def read_by_optimizer(optimizer: str, name: str) -> bool:
    """Whether a run with this optimizer reads the setting `name` (any setting outside the optimizers')."""
    return optimizer in READ_BY_OPTIMIZERS.get(name, (optimizer,))


@dataclass
class SweepConfig:
    seeds: int = opt(1, "seeds per setting (seed, seed+1, ...)")
    jobs: int = opt(1, "runs at once; CPU threads are split between them (Slurm: the job array's %N)")
    run_start: str = opt("auto", "local launcher: how each run's process starts. fork: forked from one "
                         "server that imported torch and the trainer once, which saves each run the "
                         "interpreter's start and the imports; fresh: a new python train.py; auto: fork "
                         "on Linux, else fresh", choices=("auto", "fork", "fresh"))
    launcher: str = opt("local", "local: runs as processes here; slurm: a Slurm job array through submitit; "
                        "submitit_local: submitit's jobs as local processes, to try a sweep",
                        choices=("local", "slurm", "submitit_local"))
    tune_seeds: int = opt(1, "with --tune: seeds each grid point is trained on to choose a setting's value "
                          "(apart from the confirmation seeds, which are then trained at it)")
    tune_seed: int = opt(-1, "with --tune: the first tuning seed; -1: seed + 1000, clear of the "
                         "confirmation seeds seed, seed+1, ...")
    tune_extend: int = opt(2, "with --tune: a best value at its grid's edge adds one more grid step that "
                           "way, at most this many times per edge")
    tune_prune: bool = opt(False, "with --tune: stop tuning runs whose val loss stays above the unigram "
                           "level after warmup (stop_hopeless); they count as the worst loss")
    tune_halving: bool = opt(True, "with --tune: successive halving; each setting's given grid trains to a "
                             "quarter of max_iters, where the best point there, its neighbours one grid "
                             "step away and the best half train on and the rest stop (docs/sweeps.md); "
                             "false: every point to the end, for LR sensitivity")
    tune_evals: int = opt(4, "with --tune: evaluations a tuning run makes after its first, evenly spaced "
                          "and never more often than eval_interval, without diagnostics: the choice "
                          "reads its final val loss alone; 0: as the confirmation runs")
    slurm_partition: str = opt("", "Slurm partition; empty: the cluster's default")
    slurm_time: int = opt(60, "minutes per run, Slurm's time limit (also submitit_local's); a run "
                          "stopped by it saves and is requeued")
    slurm_gpus: int = opt(0, "GPUs per run (--gpus-per-node)")
    slurm_cpus: int = opt(0, "CPUs per run (--cpus-per-task); 0: Slurm's default")
    slurm_mem: str = opt("", "memory per run as Slurm writes it (16G); empty: Slurm's default")
    slurm_account: str = opt("", "Slurm account to charge")
    slurm_qos: str = opt("", "Slurm quality of service")
    slurm_extra: str = opt("", "more #SBATCH options, separated by ';' (--constraint=a100;--exclusive)")

    def __post_init__(self):
        check_types(self)
        _check_choices(self)
        _positive(self, "seeds", "jobs", "slurm_time", "tune_seeds")
        if self.tune_seed != -1:
            check_seed(self.tune_seed)
        for name in ("slurm_gpus", "slurm_cpus", "tune_extend", "tune_evals"):
            if getattr(self, name) < 0:
                raise UserError(f"{name}={getattr(self, name)} must not be negative")


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
    threads: int = opt(0, "CPU threads; 0 times one thread against torch's count now and then and "
                       "samples at the faster, which keeps its speed when other work holds a core")
    init_from: str = opt("", "sample from these weights instead of out_dir's: a Hugging Face GPT-2 folder "
                         "or a GPT-2 name (gpt2, gpt2-medium, gpt2-large, gpt2-xl), with their own tokenizer")

    def __post_init__(self):
        check_types(self)
        _check_choices(self)
        _positive(self, "num_samples", "max_new_tokens")
        _named(self, "out_dir")
        if self.temperature != 0 and not 1e-3 <= self.temperature:
            raise UserError(f"temperature={self.temperature} must be 0 (greedy) or at least 0.001")
        for name in ("top_k", "threads"):
            if getattr(self, name) < 0:
                raise UserError(f"{name}={getattr(self, name)} must not be negative")
        if not 0.0 < self.top_p <= 1.0:
            raise UserError(f"top_p={self.top_p} must be in (0, 1]")
        check_seed(self.seed)


# options that were replaced: what an old name given now is told to use instead
REPLACED = {"decay_lr": ("lr_schedule", {True: "cosine", False: "constant"})}


def upgraded(cls, saved: dict) -> dict:
    """A config saved by an older version, in today's fields."""
    for name, (new, values) in REPLACED.items():
        if name in saved and new not in saved and new in cls.__dataclass_fields__:
            saved = {**saved, new: values[saved[name]]}
    return saved



def build(cls, values: dict, base: dict | None = None):
    """Make a `cls` from `base` (e.g. a checkpoint's saved config) updated with `values`."""
    names = {f.name for f in dataclasses.fields(cls)}
    merged = {k: v for k, v in upgraded(cls, base or {}).items() if k in names}
    merged.update({k: v for k, v in upgraded(cls, values).items() if k in names})
    try:
        return cls(**merged)
    except UserError:
        raise
    except ValueError as e:     # the model config's own checks raise plain ValueErrors
        raise UserError(str(e)) from None

