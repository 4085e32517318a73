"""The training loop: the optimizer under warmup then decay, accumulation, clipping, evaluation and checkpoints.

One optimizer step draws all of its micro-batches at once from a seeded generator, and each
micro-batch's dropout is seeded from its place in the run, so a step is the same whether it runs
in one process or is split over several (DDP), and the same after a resume.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import sys
import time

import numpy as np
import torch
from .. import checkpoint
from ..config import GPTConfig, TrainConfig
from ..speed.optim import clip_grad_norm
from ..speed.split import split_plan
from ..data import bpc, per_character
from ..diagnostics import measure as measure_diagnostics
from ..errors import UserError
from ..memory import out_of_memory_in_one_line
from ..optim import momentum_at
from ..progress import progress
from . import estimate
from .evaluate import mean_losses
from .outcome import loss_text
from .pending import Pending
from .resume import NOT_SAVED, rng_state
from .rundir import how_to_continue
from .runtime import (TRAINING_FIX, any_rank, check_compile, check_threads, compile_failure_in_one_line,
                      join_processes, process_place, resolve_device)
from .setup import Run, setup, tokens_per_step
from .signals import StopRequest, end_with_the_sweep


class Diverged(UserError):
    """The loss or the gradient became nan or inf."""


class Hopeless(UserError):
    """stop_hopeless: after warmup, an evaluation's val loss was above the unigram level."""


def lr_at(it: int, cfg: TrainConfig) -> float:
    """Linear warmup over the first warmup_iters steps (step i uses (i + 1) / warmup_iters of
    learning_rate), then lr_schedule's way down to the floor (min_lr, or min_lr_ratio of the peak)
    at lr_decay_iters, then the floor."""
    if it < cfg.warmup_iters:
        return cfg.learning_rate * (it + 1) / cfg.warmup_iters
    if cfg.lr_schedule == "constant":
        return cfg.learning_rate
    if it >= cfg.lr_decay_iters:
        return cfg.final_lr
    progress = (it - cfg.warmup_iters) / (cfg.lr_decay_iters - cfg.warmup_iters)    # config: > 0
    if cfg.lr_schedule == "cosine":
        share = 0.5 * (1.0 + math.cos(math.pi * progress))
    elif cfg.lr_schedule == "linear":
        share = 1.0 - progress
    else:       # wsd: flat at learning_rate until the cooldown, then linear down to min_lr
        share = min(1.0, (1.0 - progress) / cfg.cooldown_frac)
    return cfg.final_lr + share * (cfg.learning_rate - cfg.final_lr)


def dropout_seed(seed: int, micro_batch: int) -> int:
    """The seed of a micro-batch's dropout masks: the run's seed and the micro-batch's place mixed
    into 64 bits, each bit depending on both, since a CPU's generator keeps only the low 32 bits
    (`seed << 32 | place` gave every seed the same masks)."""
    return int(np.random.SeedSequence([seed, micro_batch]).generate_state(1, np.uint64)[0])


def bpc_columns(losses: dict, meta: dict) -> dict:
    """train_bpc and val_bpc, for a dataset whose tokens are characters or bytes; else none."""
    if not per_character(meta):
        return {}
    return {key.removesuffix("_loss") + "_bpc": bpc(loss) for key, loss in losses.items()}


def train(model_cfg: GPTConfig, cfg: TrainConfig, argv: list[str] | None = None) -> dict:
    """Train one model; returns a summary of the run (also in out_dir/metrics.jsonl)."""
    end_with_the_sweep()
    rank, world = process_place()
    if cfg.gradient_accumulation_steps % world:
        raise UserError(f"gradient_accumulation_steps={cfg.gradient_accumulation_steps} must be a "
                        f"multiple of the {world} processes")
    device = resolve_device(cfg.device)
    check_threads(cfg)
    check_compile(cfg, device)
    parts = split_plan(model_cfg, cfg, device, world, cfg.threads or torch.get_num_threads())
    device = join_processes(device, rank, world)
    try:
        with (out_of_memory_in_one_line(TRAINING_FIX), compile_failure_in_one_line(cfg.compile),
              contextlib.ExitStack() as holds):
            run = setup(model_cfg, cfg, argv, device, rank, world, parts, holds)    # makes out_dir
            summary = Loop(run).fit() if isinstance(run, Run) else run      # else it had already ended
        if world > 1:   # leave together: none tears down its connections while rank 0 still saves
            torch.distributed.barrier()
        return summary
    finally:
        if world > 1:
            torch.distributed.destroy_process_group()


class Loop:
    """fit() and the steps, evaluations and saves it is made of, over one Run."""

    def __init__(self, run: Run):
        self.run, self.cfg = run, run.cfg
        self.stop = StopRequest(shared=run.world > 1)
        self.summary = {"stopped_by": None}
        self.tokens_per_iter = tokens_per_step(run.model_cfg, run.cfg)
        self.local_steps = run.cfg.gradient_accumulation_steps // run.world     # micro-batches per rank
        self.tokens_since, self.skipped = 0, 0      # tokens trained since the last evaluation
        self.pending = Pending()
        self.lowest_val = run.at.best_val       # the best evaluation yet, held on every rank
        self.reached = run.at.start_iter        # the iteration the steps have reached
        self.steps_s, self.evals_s = 0.0, 0.0   # this process's seconds in steps and in evaluations

    def fit(self) -> dict:
        """Estimate the time the run will take, then evaluate every eval_interval steps (and at the
        end) and step until max_iters or a stop."""
        run, cfg = self.run, self.cfg
        with self.stop:
            # one process of one: under DDP a backward outside the wrapper would not meet the others'
            if run.master and run.world == 1 and run.at.start_iter < (cfg.pause_at or cfg.max_iters):
                estimate.say(run, self.all_threads, lambda: self.stop.signal is not None)
            self.t_start = self.tick = self.step_end = time.perf_counter()     # the estimate is not training
            self.cpu_tick, self.loop_start = time.process_time(), time.time()
            self.bar = progress(cfg.max_iters, run.out_dir.name, "steps", run.at.start_iter, disable=not run.master)
            try:
                with contextlib.closing(self.bar):
                    it = self.fit_steps()
            finally:    # a diverged or pruned run took its time too
                self.log_timing()
        self.summary.update(iters=it, best_val_loss=run.at.best_val, skipped_steps=self.skipped,
                            wall_s=time.perf_counter() - self.t_start)
        if run.master and not self.summary["stopped_by"] and not self.summary.get("paused"):
            self.say_done(it)
        return self.summary

    def fit_steps(self) -> int:
        """Evaluate every eval_interval steps (and at the end), step until max_iters or a stop;
        returns the iteration reached."""
        run, cfg = self.run, self.cfg
        it = run.at.start_iter
        while True:
            lr = lr_at(it, cfg)
            run.optimizer.set_lr(lr)    # before evaluating: diagnostics read it
            if cfg.optimizer == "muon" and cfg.muon_momentum_warmup:
                run.optimizer.set_momentum(momentum_at(it, cfg))
            if (it % cfg.eval_interval == 0 or it in (cfg.max_iters, cfg.pause_at)) and it != run.at.last_eval:
                if not self.evaluate(it, lr):
                    self.stop_at(it)
                    return it
            if cfg.pause_at and it == cfg.pause_at:
                self.pause(it)
                return it
            if it >= cfg.max_iters:
                self.read_steps()
                return it
            self.step(it)
            logged = it % cfg.log_interval == 0
            if logged:
                self.read_steps()
            self.bar.update(1)
            it += 1
            # under DDP the ranks agree on a stop only where they read, so as not to wait each step
            if (logged or run.world == 1) and self.stop_asked() and it < cfg.max_iters:
                self.stop_at(it)        # at the last step, finish with the evaluation
                return it

    def step(self, it: int) -> None:
        """One optimizer step over gradient_accumulation_steps micro-batches, queued on the device
        without waiting for it: the loss and the gradient norm go to self.pending, and a step
        where either is not finite is skipped by the optimizer itself (found_inf)."""
        run, cfg = self.run, self.cfg
        xs, ys = run.batches.draw("train", cfg.gradient_accumulation_steps)
        mine = slice(run.rank * self.local_steps, (run.rank + 1) * self.local_steps)
        xs, ys = xs[mine], ys[mine]                       # (local_steps, B, T)
        loss_sum = torch.zeros((), device=run.device)
        for micro in range(self.local_steps):
            if run.world > 1:   # one gradient all-reduce per step, not one per micro-step
                run.model.require_backward_grad_sync = micro == self.local_steps - 1
            if run.model_cfg.dropout:   # its masks follow the micro-batch's place in the run
                torch.manual_seed(dropout_seed(cfg.seed, it * cfg.gradient_accumulation_steps
                                               + run.rank * self.local_steps + micro))
            loss_sum += run.backward(run.model, xs[micro], ys[micro], self.local_steps).detach()
        if run.world > 1:   # the mean over ranks, so that every rank skips the same steps
            torch.distributed.all_reduce(loss_sum)
            loss_sum = loss_sum / run.world
        grad_norm = clip_grad_norm(run.params, cfg.grad_clip or float("inf"))
        nonfinite = (~(torch.isfinite(loss_sum) & torch.isfinite(grad_norm))).float()
        run.optimizer.step(found_inf=nonfinite)
        run.optimizer.zero_grad(set_to_none=True)
        self.pending.add(it, loss_sum, grad_norm)
        self.tokens_since += self.tokens_per_iter
        self.reached = it + 1

    def read_steps(self) -> None:
        """Read the steps queued since the last read: log each non-finite one (and end the run at
        the first, unless skip_nonfinite) and the train row of each log_interval-th."""
        run, cfg = self.run, self.cfg
        steps = self.pending.read()
        if not steps:
            return
        # a step's time runs from the previous read's end: logging and the bar count too
        now = time.perf_counter()
        self.steps_s += now - self.step_end
        step_ms, self.step_end = 1000 * (now - self.step_end) / len(steps), now
        for it, loss_sum, grad_norm in steps:
            loss = loss_sum / self.local_steps
            if not (math.isfinite(loss) and math.isfinite(grad_norm)):
                if run.master:
                    run.metrics.log({"kind": "event", "iter": it, "event": "nonfinite",
                                     "loss": str(loss), "grad_norm": str(grad_norm)})
                if not cfg.skip_nonfinite:
                    raise self.diverged(f"loss became {loss} (gradient norm {grad_norm})", it)
                self.skipped += 1
                self.tokens_since -= self.tokens_per_iter      # skipped: not trained
            if run.master and it % cfg.log_interval == 0:
                run.metrics.log({"kind": "train", "iter": it, "loss": loss, "lr": lr_at(it, cfg),
                                 "grad_norm": grad_norm, "ms": step_ms})
        self.bar.set_postfix(loss=f"{loss:.4f}", lr=f"{lr_at(it, cfg):.1e}",
                             tok_s=f"{self.tokens_per_iter / step_ms * 1000:,.0f}", refresh=False)

    def stop_asked(self) -> bool:
        """Whether a stop signal came; under DDP, whether one came to any rank, so all stop together."""
        return any_rank(self.stop.signal is not None, self.run.device, self.run.world)

    def evaluate(self, it: int, lr: float) -> bool:
        """Score both splits, log them with the diagnostics, and save (ckpt_best.pt too when val
        improved); False when a stop signal came meanwhile: an evaluation can take minutes, and it
        runs again on resuming."""
        run, cfg, at = self.run, self.cfg, self.run.at
        self.read_steps()       # a non-finite step before it ends the run before anything is saved
        began = time.perf_counter()
        since_tick = began - self.tick
        # under DDP the ranks finish it together; the last one, which no resume would repeat, always
        stoppable = it < cfg.max_iters and run.world == 1
        # the compiled model where there is one (DDP's wrapper left out: no gradients to sync)
        scored = run.model.module if run.world > 1 else run.model
        mine = len(range(run.rank, cfg.eval_iters, run.world))     # each rank scores its share
        splits = ("train", "val") if cfg.eval_train or it == cfg.max_iters else ("val",)
        with self.all_threads(), progress(len(splits) * mine, f"evaluating at iteration {it}", "batches",
                                          leave=False, disable=not run.master) as bar:
            losses = mean_losses(scored, run.batches, splits, cfg.eval_iters, run.eval_batch,
                                 run.autocast, lambda: stoppable and self.stop.signal is not None, bar.update,
                                 run.rank, run.world)
        if losses is None:
            return False
        row = {"kind": "eval", "iter": it, **losses, **bpc_columns(losses, run.meta), "lr": lr,
               "tokens_per_sec": self.tokens_since / since_tick if self.tokens_since else 0.0,
               "elapsed_s": self.elapsed(), "unigram_loss": run.unigram, **self.cpu_share(since_tick)}
        # rank 0 alone logs them, and on the unwrapped model they wait for no other rank
        if cfg.diagnostics and run.master:
            x, y = run.batches.evenly_spaced("val", 1, run.eval_batch)
            with self.all_threads():
                row.update(measure_diagnostics(run.raw_model, x[0], y[0], run.optimizer))
        at.last_eval = it
        # the losses are all-reduced, so every rank takes the same branch here, as the next all-reduce needs
        finite = all(math.isfinite(loss) for loss in losses.values())
        if run.master:
            run.metrics.log(row)
            speed = f", {row['tokens_per_sec']:,.0f} tokens/s" if self.tokens_since else ""  # none yet
            in_bpc = per_character(run.meta)
            train = f"train {loss_text(row['train_loss'], in_bpc)}, " if "train_loss" in row else ""
            self.bar.write(f"iter {it}: {train}val {loss_text(row['val_loss'], in_bpc)} "
                           f"(unigram level {run.unigram:.2f}), lr {lr:.2e}{speed}")
            sys.stdout.flush()      # now, not at exit, when the output is piped (| tee)
        if not finite:      # weights gone bad: saving them would replace the last good ones
            if run.master:
                run.metrics.log({"kind": "event", "iter": it, "event": "nonfinite evaluation"})
            if not cfg.skip_nonfinite:
                raise self.diverged(f"the evaluation loss became {row['val_loss']}", it)
        elif (cfg.stop_hopeless and it >= max(cfg.warmup_iters, 1) and row["val_loss"] > run.unigram
              and row["val_loss"] >= self.lowest_val):      # not a slow start: no better than before
            raise Hopeless(f"val loss {row['val_loss']:.4f} at iteration {it} is above the unigram level "
                           f"{run.unigram:.4f} after warmup, and no better than before; stopped (stop_hopeless)")
        elif run.master:
            improved = row["val_loss"] < at.best_val
            if improved:
                at.best_val, at.best_iter = row["val_loss"], it
            if it > 0:          # an untrained model is not worth a file
                self.save(it, best=improved)
        if finite:      # on every rank, from the all-reduced losses, so that all stop alike
            self.lowest_val = min(self.lowest_val, row["val_loss"])
        self.summary.update(row)
        self.tick, self.tokens_since = time.perf_counter(), 0
        self.cpu_tick = time.process_time()
        self.step_end = self.tick             # step times leave evaluation out
        self.evals_s += self.tick - began
        return True

    def log_timing(self) -> None:
        """A timing row: when this process's loop began and ended (seconds since the epoch, to set
        against the process's start) and its seconds in steps and in evaluations, which tell a
        run's start-up and ending from its training."""
        if not self.run.master:
            return
        with contextlib.suppress(UserError):    # a full disk: the error under way says so
            self.run.metrics.log({"kind": "timing", "iter": self.reached, "loop_start": self.loop_start,
                                  "loop_end": time.time(), "steps_s": self.steps_s, "evals_s": self.evals_s})

    def cpu_share(self, since_tick: float) -> dict:
        """On a CPU, the share of its threads' time the steps since the last evaluation got: near 1
        alone on its cores, less where other work took them, so its tokens/s is no measure of the
        setting. Its threads: the split's parts, else torch's."""
        if torch.device(self.run.device).type != "cpu" or not self.tokens_since or since_tick <= 0:
            return {}
        threads = self.run.split.parts if self.run.split else torch.get_num_threads()
        return {"cpu_share": (time.process_time() - self.cpu_tick) / (since_tick * threads)}

    def all_threads(self):
        """For evaluations of a run whose steps split rows between threads: every thread at once."""
        return self.run.split.all_threads() if self.run.split else contextlib.nullcontext()

    def elapsed(self) -> float:
        """Seconds of training so far, earlier runs of a resumed one included."""
        return self.run.at.elapsed_before + time.perf_counter() - self.t_start

    def save(self, it: int, best: bool = False) -> None:
        """ckpt.pt at iteration it, first, so that a run whose disk fills can still be resumed;
        with best, ckpt_best.pt becomes the same file (checkpoint.save_copy). A second Ctrl-C waits for both."""
        run, at, out_dir = self.run, self.run.at, self.run.out_dir
        with self.stop.hold():
            try:
                checkpoint.save({
                    "model": run.raw_model.state_dict(), "optimizer": run.optimizer.state_dict(),
                    "model_config": dataclasses.asdict(run.model_cfg), "train_config": dataclasses.asdict(self.cfg),
                    "meta": run.meta, "iter": it, "best_val_loss": at.best_val, "best_iter": at.best_iter,
                    "last_eval_iter": at.last_eval,
                    "rng": rng_state(run.device), "batch_rng": run.batches.state(), "elapsed_s": self.elapsed(),
                    "run_id": at.run_id,
                }, out_dir / "ckpt.pt")
                at.last_saved = it
                if best:
                    checkpoint.save_copy(out_dir / "ckpt.pt", out_dir / "ckpt_best.pt")
            except UserError as e:      # a full disk: room made, the run goes on from ckpt.pt
                with contextlib.suppress(UserError):    # so the same command may start afresh
                    run.metrics.log({"kind": "event", "iter": it, "event": NOT_SAVED})
                more = f"; once it can be written, {how_to_continue(out_dir)}" if at.last_saved is not None else ""
                raise UserError(f"{e}{more}") from None

    def diverged(self, what: str, it: int) -> Diverged:
        last_saved, out_dir = self.run.at.last_saved, self.run.out_dir
        kept = ("no checkpoint had been saved yet" if last_saved is None else
                f"{out_dir / 'ckpt.pt'} keeps the last good state (iteration {last_saved})")
        return Diverged(f"{what} at iteration {it}; stopped, and {kept}. Lower --learning_rate, "
                        "or pass --skip_nonfinite=true to skip such steps")

    def stop_at(self, it: int) -> None:
        """End the run at iteration it on a stop signal, saving the steps made since the last save."""
        run, out_dir = self.run, self.run.out_dir
        self.read_steps()
        signal_name = self.stop.signal or "a signal to another process"
        if run.master:
            if it > run.at.start_iter:
                self.save(it)
                done = f"saved {out_dir / 'ckpt.pt'} at iteration {it}; {how_to_continue(out_dir)}"
            elif self.cfg.resume:
                done = f"{out_dir / 'ckpt.pt'} still holds iteration {it}; {how_to_continue(out_dir)}"
            else:
                done = "stopped before the first step; nothing was saved"
            run.metrics.log({"kind": "event", "iter": it, "event": f"stopped by {signal_name}"})
            self.bar.write(f"{signal_name}: {done}")
        self.summary["stopped_by"] = signal_name

    def pause(self, it: int) -> None:
        """End the run at pause_at, its state saved (the evaluation there saved it, unless its loss was
        not finite), for --resume to train on from."""
        run = self.run
        self.read_steps()
        if run.master:
            # not after a non-finite evaluation (skip_nonfinite): ckpt.pt keeps the last good state
            finite = math.isfinite(self.summary.get("val_loss", math.nan))
            if run.at.last_saved != it and it > run.at.start_iter and finite:
                self.save(it)
            run.metrics.log({"kind": "event", "iter": it, "event": "paused"})
            self.bar.write(f"paused at iteration {it} (pause_at); {how_to_continue(run.out_dir)}")
        self.summary["paused"] = True

    def say_done(self, it: int) -> None:
        at = self.run.at
        notes = [f"{self.skipped} non-finite step{'s' * (self.skipped > 1)} skipped"
                 f"{' since resuming' if self.cfg.resume else ''}"] if self.skipped else []
        if at.last_saved != it:        # --skip_nonfinite kept going past a non-finite evaluation
            notes.append(f"ckpt.pt holds iteration {at.last_saved}: the evaluations after it were not finite"
                         if at.last_saved is not None else
                         "no evaluation after the first was finite, so nothing was saved")
        best = loss_text(at.best_val, per_character(self.run.meta))
        saved = f", best val loss {best}; checkpoints in {self.run.out_dir}" if at.last_saved is not None else ""
        print(f"done: {it} iteration{'s' * (it != 1)}{saved}" + "".join(f"; {note}" for note in notes))
