"""Everything a run needs before its first step: process settings, data, folder, model, optimizer, records."""

from __future__ import annotations

import contextlib
import dataclasses
import shlex
from dataclasses import dataclass
from pathlib import Path

import torch

from .. import checkpoint
from ..config import GPTConfig, TrainConfig
from ..speed.allocator import keep_freed_memory
from ..speed import attach_attention, lay_out_weights
from ..speed.optim import AdamW
from ..speed.precision import matmul_precision, torch_level
from ..speed.split import RowSplit
from ..data import Batches, load_meta
from ..datasets import ensure_prepared
from ..diagnostics import unigram_loss
from ..errors import UserError
from ..model import GPT
from ..optim import MuonAdamW, check_optimizer, make_optimizer
from ..progress import progress
from . import resume, rundir, source
from .evaluate import mean_losses
from .metrics import Metrics, start_wandb
from .rundir import in_a_sweep
from .runtime import autocast_dtype, check_fits, env_int


@dataclass
class Run:
    """What the loop works with: the configs, the data, the model as it steps (compiled, wrapped
    for DDP) and as it is saved (raw_model), its optimizer, and where the run stands."""
    model_cfg: GPTConfig
    cfg: TrainConfig
    device: str
    rank: int
    world: int
    meta: dict
    batches: Batches
    unigram: float                  # the val loss of knowing only the characters' frequencies
    autocast: contextlib.AbstractContextManager
    model: torch.nn.Module
    raw_model: GPT
    params: list[torch.Tensor]
    optimizer: AdamW | MuonAdamW
    metrics: Metrics
    split: RowSplit | None          # each micro-batch's rows over threads (thread_split), or None
    at: resume.Position

    @property
    def master(self) -> bool:
        return self.rank == 0

    @property
    def out_dir(self) -> Path:
        return Path(self.cfg.out_dir)

    @property
    def eval_batch(self) -> int:
        return self.cfg.eval_batch_size or self.cfg.batch_size

    def backward(self, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, micro_steps: int) -> torch.Tensor:
        """One of micro_steps micro-batches: forward and backward through model, the gradients
        divided among them; returns its loss."""
        if self.split:
            return self.split.backward(x, y, 1 / micro_steps)
        with self.autocast:
            _, loss = model(x, y)
        (loss / micro_steps).backward()
        return loss


def setup(model_cfg: GPTConfig, cfg: TrainConfig, argv: list[str] | None, device: str, rank: int,
          world: int, parts: int, holds: contextlib.ExitStack) -> Run | dict:
    """The run, ready for its first step; or, for a resume that had already ended, its summary.
    parts: the row parts of each micro-batch (split_plan). What must be undone when the run ends
    (threads, settings, the folder's lock) goes on holds."""
    master, out_dir = rank == 0, Path(cfg.out_dir)
    set_process(cfg, torch.device(device).type, holds)
    model_cfg, meta, batches = load_data(model_cfg, cfg, device, world)
    if master:          # only now, so a start that fails on its data or size leaves no folder
        claim_folder(out_dir, cfg, holds)
    unigram = unigram_loss(batches.ids["train"], batches.ids["val"], meta["vocab_size"])
    dtype = autocast_dtype(cfg, device)
    autocast = (torch.autocast(device_type=torch.device(device).type, dtype=dtype) if dtype != torch.float32
                else contextlib.nullcontext())
    # gpt/speed's CPU kernels, and the layout sampling wants, as training always had it (a layout
    # sets the order of a gradient's sums, so a run's losses stay as they were)
    model = lay_out_weights(attach_attention(GPT(model_cfg))).to(device)
    optimizer = make_optimizer(model, cfg)
    at = resume.Position()
    if cfg.resume:
        at = resume_from_checkpoint(model, optimizer, batches, autocast, model_cfg, cfg, meta, device, rank, world)
        if at.start_iter >= cfg.max_iters:
            return already_done(at, cfg, master)
    else:
        if cfg.init_from:   # every rank: DDP checks that they start alike
            source.load_source_weights(model, source.resolve(cfg.init_from))
        if master:      # a fresh run in an old folder replaces that run, so nothing stale mixes in
            resume.start_afresh(out_dir, cfg)

    # before config.json and command.txt record this start, which a failure here ends
    raw_model = model
    params = list(model.parameters())     # walked once: walking the modules each step costs time
    if cfg.compile:
        try:
            model = torch.compile(model)
        except OSError as e:    # its cache folder (TORCHINDUCTOR_CACHE_DIR) cannot be made
            raise UserError(f"torch.compile failed ({e.strerror}: {e.filename}); run without --compile, "
                            "or fix what it names") from None
    metrics = record_start(model_cfg, cfg, argv, device, dtype, parts, master, world, at)
    if world > 1:   # after rank 0's writes: its constructor holds the other ranks until they are done
        model = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[torch.device(device).index] if torch.device(device).type == "cuda" else None)
    split = None
    if parts > 1:
        split = RowSplit(model, params, parts, dtype, cfg.flush_denormal)
        holds.callback(split.close)
    run = Run(model_cfg, cfg, device, rank, world, meta, batches, unigram, autocast, model, raw_model,
              params, optimizer, metrics, split, at)
    if master:      # at once: a big model's first evaluation may take a while on a CPU
        say_start(run, dtype)
    return run


def resume_from_checkpoint(model: GPT, optimizer: AdamW | MuonAdamW, batches: Batches, autocast, model_cfg: GPTConfig,
                           cfg: TrainConfig, meta: dict, device: str, rank: int, world: int) -> resume.Position:
    """The state of out_dir/ckpt.pt restored into model, optimizer and batches, and where the run
    stands; the best checkpoint scored again where the evaluation windows changed."""
    out_dir = Path(cfg.out_dir)
    # on the CPU: RNG states must stay there
    ckpt = checkpoint.load(out_dir / "ckpt.pt", needs=checkpoint.RESUME_KEYS)
    resume.check_identity(ckpt, out_dir, cfg.adopt_checkpoint)
    at = resume.restore(ckpt, model, optimizer, batches, model_cfg, cfg, meta, device, rank == 0, world)
    if at.start_iter >= cfg.max_iters or rank != 0:
        return at
    eval_batch = cfg.eval_batch_size or cfg.batch_size
    windows = resume.windows_scored(ckpt["train_config"])   # as saved: newer settings at their defaults
    if windows != cfg.eval_iters * eval_batch:
        def val_loss(m):
            with progress(cfg.eval_iters, "scoring on the new evaluation windows", "batches", leave=False) as bar:
                return mean_losses(m, batches, ("val",), cfg.eval_iters, eval_batch, autocast,
                                   advance=bar.update)["val_loss"]
        at.best_val, at.best_iter = resume.rescore(model, val_loss, out_dir, at.start_iter, at.best_iter,
                                                   windows, cfg.eval_iters * eval_batch)
    print(f"resuming {out_dir / 'ckpt.pt'} at iteration {at.start_iter} of {cfg.max_iters}", flush=True)
    return at


def set_process(cfg: TrainConfig, device_type: str, holds: contextlib.ExitStack) -> None:
    """This process's settings for the run, each put back as it was when the run ends."""
    if device_type == "cpu":
        # before the first parallel op: OpenMP's threads take this thread's float state when made
        torch.set_flush_denormal(cfg.flush_denormal)
        keep_freed_memory()
    if cfg.threads:     # for this run only: a notebook that trains keeps its own count after
        holds.callback(torch.set_num_threads, torch.get_num_threads())
        torch.set_num_threads(cfg.threads)
    holds.enter_context(matmul_precision(cfg.matmul_precision, device_type))     # as it was after


def load_data(model_cfg: GPTConfig, cfg: TrainConfig, device: str, world: int
              ) -> tuple[GPTConfig, dict, Batches]:
    """The dataset, prepared if need be, its vocabulary in the model's config, and the batches."""
    # one process per machine prepares: another machine may not share this one's disk
    node_master = world == 1 or env_int("LOCAL_RANK", 0) == 0
    folder = ensure_prepared(cfg.data_dir, cfg.dataset, cfg.data_url) if node_master else Path(cfg.data_dir) / cfg.dataset
    if world > 1:
        torch.distributed.barrier()
    meta = load_meta(folder)
    if cfg.init_from and not cfg.resume:
        source.check_data(source.resolve(cfg.init_from), meta, cfg.dataset)
    model_cfg = dataclasses.replace(model_cfg, vocab_size=meta["vocab_size"])
    resume.seed_everything(cfg.seed)
    batches = Batches(folder, model_cfg.block_size, cfg.batch_size, device, cfg.seed, meta["vocab_size"])
    check_fits(model_cfg, cfg, device)      # after the data: a context longer than the text is its fault
    check_optimizer(model_cfg, cfg)
    return model_cfg, meta, batches


def claim_folder(out_dir: Path, cfg: TrainConfig, holds: contextlib.ExitStack) -> None:
    """Make out_dir and hold it against a second run; refuse one whose checkpoints a fresh start
    would replace unasked."""
    rundir.writable(out_dir)
    holds.enter_context(checkpoint.hold_folder(out_dir))
    for stale in out_dir.glob("*.pt.tmp"):  # a save cut short by a kill; the hold says no process writes it now
        stale.unlink(missing_ok=True)
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


def already_done(at: resume.Position, cfg: TrainConfig, master: bool) -> dict:
    """A resume at or past max_iters: done, if all it lacked was the best checkpoint's copy."""
    if at.mended is None:
        raise UserError(f"the checkpoint is already at iteration {at.start_iter}; raise --max_iters "
                        "to train further")
    if master:      # what the failed copy's message asked for is done
        print(f"done: the run had already reached iteration {at.start_iter}", flush=True)
    return {"stopped_by": None, "iters": at.start_iter, "best_val_loss": at.best_val,
            "skipped_steps": 0, "wall_s": 0.0}


def record_start(model_cfg: GPTConfig, cfg: TrainConfig, argv: list[str] | None, device: str,
                 dtype: torch.dtype, parts: int, master: bool, world: int, at: resume.Position) -> Metrics:
    """config.json (every code version and way the run ran, so a sweep can tell results of older
    code and settings that resolved alike here), a line in command.txt, and the metrics log."""
    out_dir = Path(cfg.out_dir)
    earlier = rundir.run_record(out_dir / "config.json") if cfg.resume else {}
    codes = (rundir.listed_in(earlier) or ["unknown"]) if cfg.resume else []
    ways = (rundir.listed_in(earlier, "ran_as") or ["unknown"]) if cfg.resume else []
    way = rundir.ran_as(device, dtype, torch_level(cfg.matmul_precision, torch.device(device).type), parts)
    config_record = {"model": dataclasses.asdict(model_cfg), "train": dataclasses.asdict(cfg),
                     "code": codes + [c for c in [checkpoint.code_version()] if c not in codes],
                     "ran_as": ways + [w for w in [way] if w not in ways], "run_id": at.run_id}
    metrics = Metrics(out_dir / "metrics.jsonl", start_wandb(cfg, config_record) if master else None)
    if master:
        if cfg.resume:
            metrics.trim(at.start_iter)
        rundir.not_a_pipe(out_dir / "command.txt")     # before config.json records this start
        rundir.write_json(out_dir / "config.json", config_record)     # a sweep reads it to reuse the run
        given = argv if argv is not None else rundir.as_flags(model_cfg, cfg)     # called from Python
        rundir.append_line(out_dir / "command.txt",
                           shlex.join([*rundir.launcher(world), "train.py", *given]) + "\n")
    return metrics


def say_start(run: Run, dtype: torch.dtype) -> None:
    """The run's start line: its size, device, dtype, a CPU's threads, and where it writes."""
    steps = run.cfg.max_iters - run.at.start_iter
    how = str(dtype).removeprefix("torch.")
    if run.split:
        how += f", {run.split.parts} threads, each batch split by rows between them"
    elif torch.device(run.device).type == "cpu":
        threads = torch.get_num_threads()
        how += f", {threads} thread{'s' * (threads != 1)}"
    if run.cfg.optimizer == "muon":     # muon_dtype=auto: it depends on the machine
        how += f", Muon's iteration in {str(run.optimizer.muon.ns_dtype).removeprefix('torch.')}"
    print(f"training {run.model_cfg.num_params():,} parameters on {run.device} ({how}): {steps} "
          f"step{'s' * (steps != 1)} of {tokens_per_step(run.model_cfg, run.cfg):,} tokens into {run.out_dir}",
          flush=True)


def tokens_per_step(model_cfg: GPTConfig, cfg: TrainConfig) -> int:
    return cfg.gradient_accumulation_steps * cfg.batch_size * model_cfg.block_size
