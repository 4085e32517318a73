"""How long a run will take: its own step and evaluation batch timed before it starts, every random state put back."""

from __future__ import annotations

import contextlib
import time

import torch

from ..config_files import available_configs, read_config_file
from ..config import GPTConfig, TrainConfig, build
from ..model import GPT
from ..progress import duration
from ..speed import attach_attention, lay_out_weights
from .resume import rng_state, set_rng_state
from .setup import Run

GPU_SIZED_S = 30 * 60       # past this on a CPU, the run is one for a GPU and the CPU recipe is named
CPU_RECIPE = "shakespeare_char_cpu"     # for a dataset without a CPU recipe of its own
CPU_RECIPE_VOCAB = 65       # Tiny Shakespeare's characters
WARM_S = 1.0


def evaluations_left(cfg: TrainConfig, start_iter: int, last_eval: int) -> int:
    """The evaluations a run has still to make: every eval_interval steps and at the end."""
    points = {it for it in range(start_iter, cfg.max_iters + 1) if it % cfg.eval_interval == 0}
    return len((points | {cfg.max_iters}) - {last_eval})


def run_seconds(cfg: TrainConfig, steps: int, evaluations: int, step: float, batch: float) -> float:
    """A run's time from one step's and one evaluation batch's; an evaluation scores both splits
    (val alone but at the end under eval_train=false), and the diagnostics add about a step's work."""
    final_train = 0 if cfg.eval_train or not evaluations else cfg.eval_iters * batch
    return steps * step + evaluations * evaluation_seconds(cfg, step, batch) + final_train


def evaluation_seconds(cfg: TrainConfig, step: float, batch: float) -> float:
    """One evaluation before the last: both splits, or val alone under eval_train=false."""
    return (2 if cfg.eval_train else 1) * cfg.eval_iters * batch + (step if cfg.diagnostics else 0.0)


def _seconds(work, device: str) -> float:
    """How long work() takes: a second time when the first took under WARM_S, which may be mostly
    warming up (allocations, thread pools); a longer first time is mostly the work itself."""
    cuda = torch.device(device).type == "cuda"      # its work is queued: wait for it
    for _ in range(2):
        if cuda:
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        work()
        if cuda:
            torch.cuda.synchronize(device)
        took = time.perf_counter() - start
        if took >= WARM_S:
            break
    return took


def batch_seconds(model: GPT, x: torch.Tensor, y: torch.Tensor, autocast, device: str) -> float:
    """One evaluation batch's forward pass."""
    model.eval()
    try:
        with torch.no_grad(), autocast:
            return _seconds(lambda: model(x, y), device)
    finally:
        model.train()


def step_seconds(run: Run) -> float:
    """One training step's forward and backward passes on fixed windows of the data (no draw from
    the batch generator); the gradients are thrown away. The optimizer's update is left out: it
    would change the weights, and it is a small share of a step."""
    cfg, x, y = run.cfg, *run.batches.evenly_spaced("train", 1, run.cfg.batch_size)
    local_steps = cfg.gradient_accumulation_steps // run.world

    def step():
        for _ in range(local_steps):
            run.backward(run.raw_model, x[0], y[0], local_steps)
        run.optimizer.zero_grad(set_to_none=True)
    return _seconds(step, run.device)


def cpu_recipe(dataset: str, vocab_size: int) -> tuple[str, int]:
    """(config name, vocabulary) of the CPU recipe to name: the dataset's own (configs/<dataset>_cpu),
    or Tiny Shakespeare's."""
    own = f"{dataset}_cpu"
    return (own, vocab_size) if own in available_configs() else (CPU_RECIPE, CPU_RECIPE_VOCAB)


def cpu_recipe_seconds(device: str, name: str = CPU_RECIPE, vocab_size: int = CPU_RECIPE_VOCAB) -> float:
    """A CPU recipe's time here, from its model timed on one batch of zeros."""
    values, _, _ = read_config_file(name)
    model_cfg, cfg = build(GPTConfig, {**values, "vocab_size": vocab_size}), build(TrainConfig, values)
    with torch.random.fork_rng(devices=[]):     # its initial weights draw nothing from the run's stream
        model = lay_out_weights(attach_attention(GPT(model_cfg)))
    x = torch.zeros((cfg.batch_size, model_cfg.block_size), dtype=torch.long)

    def step():
        model(x, x)[1].backward()
        model.zero_grad(set_to_none=True)
    evaluations = evaluations_left(cfg, 0, -1)
    return run_seconds(cfg, cfg.max_iters, evaluations, _seconds(step, device),
                       batch_seconds(model, x, x, contextlib.nullcontext(), device))


def say(run: Run, all_threads, stopped) -> None:
    """Print how long the run will take, evaluations included, and on a CPU, when that is a GPU's
    kind of time, the CPU recipe's time. Nothing is printed once stopped() is true."""
    cfg, at = run.cfg, run.at
    state = rng_state(run.device)       # the timed steps draw dropout's masks
    try:
        step = step_seconds(run)
        if stopped():
            return
        x, y = run.batches.evenly_spaced("val", 1, run.eval_batch)
        with all_threads():
            batch = batch_seconds(run.raw_model, x[0], y[0], run.autocast, run.device)
        steps, evaluations = cfg.max_iters - at.start_iter, evaluations_left(cfg, at.start_iter, at.last_eval)
        total = run_seconds(cfg, steps, evaluations, step, batch)
        print(f"estimated time: {duration(total)} for {steps:,} step{'s' * (steps != 1)} and {evaluations} "
              f"evaluation{'s' * (evaluations != 1)} ({step * 1000:,.0f} ms a step, "
              f"{duration(evaluation_seconds(cfg, step, batch)).removeprefix('about ')} an evaluation"
              f"{', timed without compiling' if cfg.compile else ''})", flush=True)
        if torch.device(run.device).type == "cpu" and total > GPU_SIZED_S and not stopped():
            name, vocab = cpu_recipe(cfg.dataset, run.model_cfg.vocab_size)
            recipe = cpu_recipe_seconds(run.device, name, vocab)
            print(f"this run is sized for a GPU; on this CPU, python train.py --config {name} trains "
                  f"a smaller model in {duration(recipe)}", flush=True)
    finally:
        run.optimizer.zero_grad(set_to_none=True)
        set_rng_state(state, run.device)
