"""Measurements that explain why a setting trains or fails.

At each evaluation the training loop calls `measure` on one fixed batch, outside the training step:
per block, the gradient norm of its parameters, the size of the update AdamW's stored moments
make at this step's learning rate relative to its weights, the RMS of the residual stream after
it, and how alike its output vectors at different positions are; per head, the entropy of its
attention. `unigram_loss` gives the loss of a model that knows only character frequencies: the
level a model that learned nothing sits at.

`python -m gpt.diagnostics grad-depth` measures how much gradient reaches the first block of
freshly initialised models of growing depth, with residuals on and off, pre- and post-norm.
"""

from __future__ import annotations

from .console import interrupt_quietly_while_loading

interrupt_quietly_while_loading(__name__)      # before torch loads

import dataclasses
import math
import sys

import numpy as np
import torch

from .config import GPTConfig, check_seed
from .console import Parser, interrupt_in_one_line, output_may_close, to_json
from .cpu.optim import AdamW
from .errors import UserError
from .memory import device_memory, out_of_memory_in_one_line
from .model import GPT
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


def update_ratios(blocks, optimizer: AdamW) -> list[float]:
    """Per block, ||update|| / ||weights|| of the step AdamW's stored moments make at the group's
    current lr (the loop sets this step's before evaluating): lr * (m_hat /
    (sqrt(v_hat) + eps) + weight_decay * w). Around 1e-3 is the usual healthy range; much larger
    means the weights are being rewritten each step, much smaller that the block has stalled."""
    groups = {id(p): g for g in optimizer.param_groups for p in g["params"]}
    ratios = []
    for block in blocks:
        update_sq, weight_sq = 0.0, 0.0
        for p in block.parameters():
            state, group = optimizer.state.get(p), groups[id(p)]
            weight_sq += p.detach().float().pow(2).sum().item()
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
            optimizer: AdamW | None = None) -> dict:
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


def grad_depth(depths=(5, 10, 20, 40), n_embd=64, n_head=4, block_size=64, vocab_size=65,
               batch_size=8, seed=0) -> list[dict]:
    """Gradient norm reaching the first block at initialisation, for each depth, residual on/off
    and pre/post norm. Every model sees the same random batch."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randint(vocab_size, (batch_size, block_size), generator=gen)
    y = torch.randint(vocab_size, (batch_size, block_size), generator=gen)
    total = device_memory("cpu")
    shapes = {depth: GPTConfig(vocab_size=vocab_size, block_size=block_size, n_layer=depth, n_head=n_head,
                               n_embd=n_embd) for depth in depths}
    for depth, shape in shapes.items():     # each model is built while the last one still lives
        need = 8 * shape.num_params()
        if total is not None and need > total:
            raise UserError(f"--depths: a model of depth {depth} needs at least {need / 2**30:,.1f} GiB (8 "
                            f"bytes a parameter), more than the {total / 2**30:,.1f} GiB here; lower it or "
                            "--n_embd")
    rows = []
    for depth in depths:
        for residual in (True, False):
            for placement in ("pre", "post"):
                torch.manual_seed(seed)
                model = GPT(dataclasses.replace(shapes[depth], residual=residual, norm_placement=placement))
                _, loss = model(x, y)
                first = list(model.transformer.h[0].parameters())
                grads = torch.autograd.grad(loss, first)
                norm = math.sqrt(sum((g.double() ** 2).sum().item() for g in grads))
                rows.append({"depth": depth, "residual": residual, "norm_placement": placement,
                             "grad_norm": norm})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="python -m gpt.diagnostics")
    sub = parser.add_subparsers(dest="command", required=True)
    gd = sub.add_parser("grad-depth", help="gradient reaching the first block vs depth, at init")
    gd.add_argument("--depths", default="5,10,20,40", help="comma-separated depths")
    gd.add_argument("--n_embd", type=int, default=64, help="width of the model")
    gd.add_argument("--n_head", type=int, default=4, help="attention heads; they divide n_embd")
    gd.add_argument("--seed", type=int, default=0)
    gd.add_argument("--json", action="store_true", help="print JSON rows instead of a table")
    args = parser.parse_args(argv)
    try:
        depths = [int(d) for d in args.depths.split(",")]
    except ValueError:
        gd.error(f"--depths {args.depths!r} should be integers separated by commas")
    if min(depths) < 1:
        gd.error("--depths must be positive")
    try:
        check_seed(args.seed)
        with out_of_memory_in_one_line("lower --n_embd or the --depths"):
            rows = grad_depth(depths, n_embd=args.n_embd, n_head=args.n_head, seed=args.seed)
    except UserError as e:
        gd.error(str(e))
    if args.json:
        print(to_json(rows))
        return 0
    print(f"{'depth':>5}  {'residual':>8}  {'norm':>4}  {'grad norm at block 0':>20}")
    for r in rows:
        print(f"{r['depth']:>5}  {str(r['residual']):>8}  {r['norm_placement']:>4}  {r['grad_norm']:>20.3e}")
    return 0


if __name__ == "__main__":
    # | head: no traceback for the reader going away; Ctrl-C: one line
    with interrupt_in_one_line(), output_may_close(product=True):
        sys.exit(main())
