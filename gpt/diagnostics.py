"""Measurements that explain why a setting trains or fails.

At each evaluation the training loop calls `measure` on one fixed batch, outside the training step:
per block, the gradient norm of its parameters, the size of the update AdamW's stored moments
make at this step's learning rate relative to its weights, the RMS of the residual stream after
it, and how alike its output vectors at different positions are; per head, the entropy of its
attention. `unigram_loss` gives the loss of a model that knows only character frequencies: the
level a model that learned nothing sits at.

`python -m gpt.diagnostics grad-depth` measures freshly initialised models of growing depth and
several widths (head size fixed), with residuals on and off, pre- and post-norm, over several
seeds: the gradient norm of block 0's parameters, the gradient norm reaching block 0's input (the
embeddings it receives), and how alike the positions' vectors are after the last block (before
ln_f), each as its mean and range over seeds.
"""

from __future__ import annotations

from .console import interrupt_quietly_while_loading

interrupt_quietly_while_loading(__name__)      # before torch loads

import argparse
import dataclasses
import itertools
import math
import sys

import numpy as np
import torch

from .config import GPTConfig, build, check_seed
from .console import Parser, interrupt_in_one_line, output_may_close, to_json
from .speed.optim import AdamW
from .errors import UserError
from .memory import device_memory, out_of_memory_in_one_line
from .model import GPT
from .muon import muon_update
from .optim import MuonAdamW
from .progress import progress


def unigram_loss(train_ids, val_ids, vocab_size: int, chunk: int = 1 << 16) -> float:
    """Cross-entropy (nats) of the val tokens under the train split's token frequencies. Reads
    the (possibly memory-mapped) arrays in chunks, so it never holds a whole split in memory."""
    counts = np.zeros(vocab_size, dtype=np.float64)
    for i in range(0, len(train_ids), chunk):
        counts += np.bincount(np.asarray(train_ids[i:i + chunk]), minlength=vocab_size)[:vocab_size]
    log_probs = np.log((counts + 1) / (counts.sum() + vocab_size))  # add-one: unseen stay finite
    total = sum(log_probs[np.asarray(val_ids[i:i + chunk])].sum() for i in range(0, len(val_ids), chunk))
    return float(-total / len(val_ids))


@torch.no_grad()
def whole_split_loss(model, ids, batch: int = 256) -> float:
    """Mean loss over ids cut into non-overlapping block_size windows (a last partial window is
    left out): the whole split, free of the sampling noise of a 20-batch estimate. model is any
    module mapping (idx, targets) to (_, loss) with a config.block_size."""
    T = model.config.block_size
    n = (len(ids) - 1) // T
    device = next(model.parameters()).device
    x = torch.from_numpy(np.asarray(ids[:n * T], dtype=np.int64).reshape(n, T)).to(device)
    y = torch.from_numpy(np.asarray(ids[1:n * T + 1], dtype=np.int64).reshape(n, T)).to(device)
    was_training = model.training
    model.eval()
    total = 0.0
    with progress(n, "scoring the whole split", "windows") as bar:
        for i in range(0, n, batch):
            total += model(x[i:i + batch], y[i:i + batch])[1].item() * len(x[i:i + batch])
            bar.update(len(x[i:i + batch]))
    model.train(was_training)
    return total / n


def position_similarity(h: torch.Tensor) -> float:
    """Mean cosine similarity between the vectors of different positions, h: (B, T, C).
    1 means every position carries the same vector."""
    B, T, _ = h.shape
    if T < 2:
        return 1.0
    unit = torch.nn.functional.normalize(h.float(), dim=-1)
    sims = unit @ unit.transpose(1, 2)                                  # (B, T, T)
    off_diagonal = sims.sum(dim=(1, 2)) - sims.diagonal(dim1=1, dim2=2).sum(dim=1)
    return (off_diagonal / (T * (T - 1))).mean().item()


def attention_entropy(weights: torch.Tensor) -> list[float]:
    """Entropy (nats) of each head's attention rows, averaged over batch and positions;
    weights: (B, nh, T, T). A row uniform over its t + 1 visible keys has entropy log(t + 1)."""
    w = weights.float()
    ent = -(w * torch.log(w.clamp_min(1e-12))).sum(dim=-1)              # (B, nh, T)
    return ent.mean(dim=(0, 2)).tolist()


def update_ratios(blocks, optimizer: AdamW | MuonAdamW) -> list[float]:
    """Per block, ||update|| / ||weights|| of the step the optimizer's stored state makes at the
    group's current lr (the loop sets this step's before evaluating). AdamW's: lr * (m_hat /
    (sqrt(v_hat) + eps) + weight_decay * w); Muon's: its orthogonalised momentum (gpt/muon.py).
    Around 1e-3 is AdamW's usual healthy range; much larger means the weights are being rewritten
    each step, much smaller that the block has stalled."""
    groups = {id(p): g for g in optimizer.param_groups for p in g["params"]}
    states = optimizer.state
    ratios = []
    for block in blocks:
        update_sq, weight_sq = 0.0, 0.0
        for p in block.parameters():
            state, group = states.get(p), groups[id(p)]
            weight_sq += p.detach().float().pow(2).sum().item()
            if state and "momentum_buffer" in state:
                update = muon_update(p, state["momentum_buffer"], group, optimizer.rows[id(p)])
                update_sq += 0.0 if update is None else update.pow(2).sum().item()
                continue
            if not state or float(state["step"]) == 0:      # no step taken yet
                continue
            beta1, beta2 = group["betas"]
            step = float(state["step"])
            m_hat = state["exp_avg"].float() / (1 - beta1 ** step)
            v_hat = state["exp_avg_sq"].float() / (1 - beta2 ** step)
            update = m_hat / (v_hat.sqrt() + group["eps"]) + group["weight_decay"] * p.detach().float()
            update_sq += (group["lr"] * update).pow(2).sum().item()
        ratios.append(math.sqrt(update_sq / weight_sq) if weight_sq > 0 else 0.0)
    return ratios


def measure(model: GPT, x: torch.Tensor, y: torch.Tensor,
            optimizer: AdamW | MuonAdamW | None = None) -> dict:
    """Diagnostics on one batch; leaves the model's .grad fields and RNG untouched."""
    was_training = model.training
    model.eval()                         # no dropout: the same batch always measures the same
    blocks = list(model.transformer.h)
    outputs = []
    hooks = [b.register_forward_hook(lambda m, i, o: outputs.append(o)) for b in blocks]
    for b in blocks:
        b.attn.keep_weights = True
    try:
        _, loss = model(x, y)
        params = [list(b.parameters()) for b in blocks]
        grads = torch.autograd.grad(loss, [p for ps in params for p in ps], allow_unused=True)
        entropies = [attention_entropy(b.attn.weights) for b in blocks]
    finally:
        for h in hooks:
            h.remove()
        for b in blocks:
            b.attn.keep_weights, b.attn.weights = False, None
        model.train(was_training)
    grad_norms, i = [], 0
    for ps in params:
        g = [gr for gr in grads[i:i + len(ps)] if gr is not None]
        grad_norms.append(torch.sqrt(sum((gr.float() ** 2).sum() for gr in g)).item())
        i += len(ps)
    result = {
        "block_grad_norm": grad_norms,
        "block_rms": [o.detach().float().pow(2).mean().sqrt().item() for o in outputs],
        "block_pos_sim": [position_similarity(o.detach()) for o in outputs],
        "head_entropy": entropies,
    }
    if optimizer is not None:
        result["block_update_ratio"] = update_ratios(blocks, optimizer)
    return result


# grad-depth's measures: key in its rows, column heading, number format
GRAD_DEPTH_MEASURES = (("block0_grad_norm", "grad of block 0's params", ".2e"),
                       ("input_grad_norm", "grad at block 0's input", ".2e"),
                       ("last_pos_sim", "similarity after last block", ".2f"))


def init_measures(model: GPT, x: torch.Tensor, y: torch.Tensor) -> dict:
    """On batch (x, y): the gradient norm of block 0's parameters, the norm of the gradient
    reaching block 0's input (the embeddings after dropout), and position_similarity of the last
    block's output (before ln_f, which post-norm does not have)."""
    blocks = model.transformer.h
    seen = {}

    def keep_input(module, args):
        seen["input"] = args[0]

    def keep_output(module, args, output):
        seen["last"] = output

    hooks = [blocks[0].register_forward_pre_hook(keep_input), blocks[-1].register_forward_hook(keep_output)]
    try:
        _, loss = model(x, y)
    finally:
        for h in hooks:
            h.remove()
    input_grad, *param_grads = torch.autograd.grad(loss, [seen["input"], *blocks[0].parameters()])
    return {"block0_grad_norm": math.sqrt(sum((g.double() ** 2).sum().item() for g in param_grads)),
            "input_grad_norm": input_grad.double().norm().item(),
            "last_pos_sim": position_similarity(seen["last"].detach())}


def aggregate_seeds(rows: list[dict]) -> list[dict]:
    """One row per setting (every key but "seed" and the measures), in first-seen order, with
    the seeds it was measured at and, per measure, the mean, min, max and per-seed values."""
    measures = [key for key, _, _ in GRAD_DEPTH_MEASURES]
    groups = {}
    for r in rows:
        setting = tuple((k, v) for k, v in r.items() if k != "seed" and k not in measures)
        groups.setdefault(setting, []).append(r)
    out = []
    for setting, group in groups.items():
        row = dict(setting, seeds=[r["seed"] for r in group])
        for key in measures:
            values = [r[key] for r in group]
            row[key] = {"mean": sum(values) / len(values), "min": min(values), "max": max(values),
                        "per_seed": values}
        out.append(row)
    return out


def grad_depth_shapes(depths, widths, head_size: int, block_size: int, vocab_size: int) -> dict:
    """The GPTConfig of each (depth, width), heads = width / head_size; refuses, before any model
    is built, a width head_size does not divide and a largest model beyond the machine's memory."""
    for width in widths:
        if width % head_size:
            raise UserError(f"--widths: width {width} is not a multiple of --head_size={head_size}; "
                            "pick widths that are, or another head size")
    shapes = {(d, w): build(GPTConfig, dict(vocab_size=vocab_size, block_size=block_size, n_layer=d,
                                            n_head=w // head_size, n_embd=w)) for d in depths for w in widths}
    largest = shapes[(max(depths), max(widths))]
    need, total = 8 * largest.num_params(), device_memory("cpu")
    if total is not None and need > total:     # each model is built while the last one still lives
        raise UserError(f"--depths, --widths: the largest model (depth {largest.n_layer}, width "
                        f"{largest.n_embd}) needs at least {need / 2**30:,.1f} GiB (8 bytes a parameter), "
                        f"more than the {total / 2**30:,.1f} GiB here; lower them")
    return shapes


def grad_depth(depths=(5, 10, 20, 40), widths=(64, 128, 256), head_size=16, seeds=(0, 1, 2),
               block_size=64, vocab_size=65, batch_size=8) -> list[dict]:
    """init_measures at each depth, width, residual on/off and pre/post norm, over seeds,
    aggregated by aggregate_seeds. A seed fixes the weights and one random batch, which every
    model of that seed sees."""
    shapes = grad_depth_shapes(depths, widths, head_size, block_size, vocab_size)
    batches = {}
    for seed in seeds:
        gen = torch.Generator().manual_seed(seed)
        batches[seed] = (torch.randint(vocab_size, (batch_size, block_size), generator=gen),
                         torch.randint(vocab_size, (batch_size, block_size), generator=gen))
    settings = list(itertools.product(shapes, (True, False), ("pre", "post"), seeds))
    rows = []
    with progress(len(settings), "measuring models at initialisation", "models") as bar:
        for (depth, width), residual, placement, seed in settings:
            torch.manual_seed(seed)
            model = GPT(dataclasses.replace(shapes[(depth, width)], residual=residual,
                                            norm_placement=placement))
            rows.append({"depth": depth, "width": width, "residual": residual, "norm_placement": placement,
                         "seed": seed, **init_measures(model, *batches[seed])})
            bar.update()
    return aggregate_seeds(rows)


def positive_ints(parser: Parser, option: str, text: str) -> list[int]:
    """A comma-separated option's values, or the parser's one-line error."""
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        parser.error(f"{option} {text!r} should be integers separated by commas")
    if min(values) < 1:
        parser.error(f"{option} must be positive")
    return values


def print_grad_depth(rows: list[dict], seeds: list[int], head_size: int) -> None:
    count = f"{len(seeds)} seeds" if len(seeds) > 1 else "1 seed"
    print(f"at initialisation, mean (min..max) over {count} ({seeds[0]}..{seeds[-1]}); "
          f"head size {head_size} (heads = width / {head_size})")
    print(f"{'depth':>5}  {'width':>5}  {'residual':>8}  {'norm':>4}"
          + "".join(f"  {label:>29}" for _, label, _ in GRAD_DEPTH_MEASURES))
    for r in rows:
        cells = (f"{r[key]['mean']:{fmt}} ({r[key]['min']:{fmt}}..{r[key]['max']:{fmt}})"
                 for key, _, fmt in GRAD_DEPTH_MEASURES)
        print(f"{r['depth']:>5}  {r['width']:>5}  {str(r['residual']):>8}  {r['norm_placement']:>4}"
              + "".join(f"  {cell:>29}" for cell in cells))


# options grad-depth no longer takes, and what replaced them
REPLACED = {"--n_embd": "--widths, a comma-separated list of widths",
            "--n_head": "--head_size (heads = width / head_size)"}


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="python -m gpt.diagnostics")
    sub = parser.add_subparsers(dest="command", required=True)
    gd = sub.add_parser("grad-depth", help="gradients and position similarity vs depth and width, at init")
    gd.add_argument("--depths", default="5,10,20,40", help="comma-separated depths")
    gd.add_argument("--widths", default="64,128,256", help="comma-separated widths (n_embd)")
    gd.add_argument("--head_size", type=int, default=16, help="width of each head, the same at every width")
    gd.add_argument("--seeds", type=int, default=3, help="how many seeds, from --seed upward")
    gd.add_argument("--seed", type=int, default=0, help="the first seed")
    gd.add_argument("--json", action="store_true", help="print JSON rows instead of a table")
    for old in REPLACED:
        gd.add_argument(old, help=argparse.SUPPRESS)   # to say what replaced it, not "unrecognized"
    args = parser.parse_args(argv)
    for old, new in REPLACED.items():
        if getattr(args, old[2:]) is not None:
            gd.error(f"{old} is replaced by {new}")
    depths = positive_ints(gd, "--depths", args.depths)
    widths = positive_ints(gd, "--widths", args.widths)
    for option in ("head_size", "seeds"):
        if getattr(args, option) < 1:
            gd.error(f"--{option} must be positive")
    seeds = list(range(args.seed, args.seed + args.seeds))
    try:
        check_seed(seeds[0])
        check_seed(seeds[-1])
        with out_of_memory_in_one_line("lower --widths or the --depths"):
            rows = grad_depth(depths, widths, head_size=args.head_size, seeds=seeds)
    except UserError as e:
        gd.error(str(e))
    if args.json:
        print(to_json(rows))
    else:
        print_grad_depth(rows, seeds, args.head_size)
    return 0


if __name__ == "__main__":
    # | head: no traceback for the reader going away; Ctrl-C: one line
    with interrupt_in_one_line(), output_may_close(product=True):
        sys.exit(main())
