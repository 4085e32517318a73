"""The optimizer a run steps with: AdamW on every parameter, or Muon on the blocks' matrices beside AdamW on the rest.

Muon (Jordan et al. 2024, https://kellerjordan.github.io/posts/muon/) updates a weight matrix by
its momentum made orthogonal (every singular value near 1, by a few Newton-Schulz iterations), so
each step moves the matrix by the same amount in every direction it has a gradient in. It is made
for the 2-D weights of hidden layers; embeddings, the head, norm gains and biases stay with AdamW,
the split nanochat and the modded-nanogpt speedrun use. gpt/speed/optim.py's Muon computes it as
torch.optim.Muon does, or, where muon_split cuts the matrices into blocks orthogonalised apart,
gpt/muon.py's SplitMuon.
"""

from __future__ import annotations

import torch

from .config import GPTConfig, TrainConfig
from .speed import optim as speed_optim
from .speed.optim import AdamW, Muon
from .speed.precision import muon_dtype
from .errors import UserError
from .muon import SplitMuon, row_blocks


def decay_groups(params: list[torch.Tensor], weight_decay: float) -> list[dict]:
    """Weight decay on matrices and embeddings (dim >= 2), none on biases and norm gains."""
    return [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]


def mup_groups(groups: list[dict], model: torch.nn.Module) -> list[dict]:
    """Under parametrization=mup, the hidden matrices AdamW trains (none under Muon, whose shape
    factor already scales with width) moved to groups of their own at lr_scale base/width
    (Tensor Programs V, Table 8), each keeping its weight decay; groups as they are under sp."""
    config = model.config
    if config.parametrization != "mup":
        return groups
    hidden = {id(p) for p in model.hidden_matrices()}
    kept = [{**g, "params": [p for p in g["params"] if id(p) not in hidden]} for g in groups]
    moved = [{**g, "params": [p for p in g["params"] if id(p) in hidden], "lr_scale": config.mup_ratio}
             for g in groups]
    return kept + [g for g in moved if g["params"]]


def own_rates(model: torch.nn.Module, cfg: TrainConfig) -> dict[int, float]:
    """embed_lr and head_lr: each parameter with a rate of its own, by id, as a multiple of
    learning_rate (a tied head is the token embedding, and trains at embed_lr)."""
    named = dict(model.named_parameters())
    scales = {}
    if cfg.head_lr and "lm_head.weight" in named:
        scales[id(named["lm_head.weight"])] = cfg.head_lr / cfg.learning_rate
    if cfg.embed_lr:
        for name in ("transformer.wte.weight", "transformer.wpe.weight"):
            if name in named:
                scales[id(named[name])] = cfg.embed_lr / cfg.learning_rate
    return scales


def rate_groups(groups: list[dict], model: torch.nn.Module, cfg: TrainConfig) -> list[dict]:
    """The embeddings and an untied head moved to groups of their own at the rates embed_lr and
    head_lr give them (nanochat's AdamW part), each keeping its weight decay; groups as they are
    where neither is set."""
    scales = own_rates(model, cfg)
    if not scales:
        return groups
    kept = [{**g, "params": [p for p in g["params"] if id(p) not in scales]} for g in groups]
    moved = [{**g, "params": [p for p in g["params"] if scales.get(id(p)) == scale],
              "lr_scale": scale * g.get("lr_scale", 1.0)}
             for scale in sorted(set(scales.values())) for g in groups]
    return kept + [g for g in moved if g["params"]]


def check_optimizer(model_cfg: GPTConfig, cfg: TrainConfig) -> None:
    """Refuse what the optimizer cannot do with this model: a head_lr that no parameter would
    train at (with tie_weights the head is the token embedding), and head groups that do not
    divide the heads."""
    if cfg.head_lr and model_cfg.tie_weights:
        raise UserError(f"head_lr={cfg.head_lr} sets the rate of an untied head, but tie_weights=true makes "
                        "the head the token embedding; pass --tie_weights=false, or set embed_lr for both")
    group, kv = cfg.muon_head_group, model_cfg.kv_heads
    if cfg.optimizer == "muon" and cfg.muon_split == "groups" and (model_cfg.n_head % group or kv % group):
        raise UserError(f"muon_head_group={group} does not divide n_head={model_cfg.n_head} and the {kv} key "
                        "and value heads; give a divisor of both")


def momentum_at(it: int, cfg: TrainConfig) -> float:
    """Muon's momentum at step it: muon_momentum, reached linearly from muon_momentum_start over the
    first muon_momentum_warmup steps (nanochat's warmup)."""
    if it >= cfg.muon_momentum_warmup:
        return cfg.muon_momentum
    share = it / cfg.muon_momentum_warmup
    return (1 - share) * cfg.muon_momentum_start + share * cfg.muon_momentum


def muon_params(model: torch.nn.Module) -> list[torch.Tensor]:
    """What Muon takes: the weight matrices inside the blocks (c_attn, c_proj, c_fc)."""
    return [p for name, p in model.named_parameters()
            if p.requires_grad and name.startswith("transformer.h.") and p.dim() == 2]


def make_optimizer(model: torch.nn.Module, cfg: TrainConfig) -> AdamW | MuonAdamW:
    """cfg.optimizer's optimizer over the model's trainable parameters, each in exactly one part."""
    matrices = muon_params(model) if cfg.optimizer == "muon" else []
    taken = {id(p) for p in matrices}
    rest = [p for p in model.parameters() if p.requires_grad and id(p) not in taken]
    groups = rate_groups(mup_groups(decay_groups(rest, cfg.weight_decay), model), model, cfg)
    adamw = AdamW(groups, lr=cfg.learning_rate, betas=(cfg.beta1, cfg.beta2))
    rows = row_blocks(model, cfg.muon_split, cfg.muon_head_group)
    return MuonAdamW(matrices, rows, adamw, cfg) if matrices else adamw


class MuonAdamW:
    """Muon on the blocks' matrices and AdamW on the rest, stepped as one optimizer.
    Muon's learning rate follows the run's schedule at muon_lr / learning_rate times AdamW's.
    rows: the row blocks each matrix is orthogonalised by (gpt/muon.py's row_blocks), by id."""

    def __init__(self, matrices: list[torch.Tensor], rows: dict[int, tuple[int, ...]], adamw: AdamW,
                 cfg: TrainConfig):
        self.adamw = adamw
        self.hyper = {"momentum": cfg.muon_momentum, "weight_decay": cfg.muon_weight_decay}
        self.rows = {id(p): rows.get(id(p), (p.size(0),)) for p in matrices}
        ns_dtype = muon_dtype(cfg.muon_dtype, matrices[0].device)
        if rows:
            self.muon = SplitMuon(matrices, rows, lr=cfg.muon_lr, nesterov=True, ns_dtype=ns_dtype,
                                  **self.hyper)
        else:   # every matrix whole: torch.optim.Muon's step, as runs made before muon_split
            self.muon = Muon(matrices, lr=cfg.muon_lr, nesterov=True, ns_dtype=ns_dtype, **self.hyper)
        self.ratio = cfg.muon_lr / cfg.learning_rate
        self.kept = None        # where a GPU keeps Muon's tensors aside, made at its first step

    @property
    def param_groups(self) -> list[dict]:
        return self.adamw.param_groups + self.muon.param_groups

    @property
    def state(self) -> dict:
        return {**self.adamw.state, **self.muon.state}

    def muon_tensors(self) -> list[torch.Tensor]:
        """Everything a Muon step writes: its matrices and their momentum."""
        params = [p for g in self.muon.param_groups for p in g["params"]]
        return params + [self.muon.state[p]["momentum_buffer"] for p in params]

    def set_lr(self, lr: float) -> None:
        """The schedule's learning rate for this step: AdamW's; Muon's in proportion."""
        self.adamw.set_lr(lr)
        for group in self.muon.param_groups:
            group["lr"] = lr * self.ratio

    def set_momentum(self, momentum: float) -> None:
        """Muon's momentum for this step (momentum_at)."""
        for group in self.muon.param_groups:
            group["momentum"] = momentum

    @torch.no_grad()
    def step(self, found_inf: torch.Tensor | None = None) -> None:
        """One update of both parts; with found_inf non-zero, none. A CPU or Apple GPU reads the flag;
        on a GPU AdamW's kernel skips itself, and Muon's matrices and momentum are put back on the
        device, without waiting to read it."""
        if found_inf is not None and found_inf.device.type in speed_optim.READ_FLAG_ON:    # as AdamW does there
            if found_inf.item():
                return
            found_inf = None
        self.adamw.step(found_inf)
        if found_inf is None:
            self.muon.step()
            return
        tensors = self.muon_tensors()
        if self.kept is None:
            self.kept = [torch.empty_like(t) for t in tensors]
        torch._foreach_copy_(self.kept, tensors)
        self.muon.step()
        bad = found_inf.bool()
        torch._foreach_copy_(tensors, [torch.where(bad, kept, t) for kept, t in zip(self.kept, tensors)])

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.adamw.zero_grad(set_to_none)
        self.muon.zero_grad(set_to_none)

    def state_dict(self) -> dict:
        """AdamW's state in torch.optim's layout, with Muon's beside it under "muon"."""
        return {**self.adamw.state_dict(), "muon": self.muon.state_dict()}

    def load_state_dict(self, saved: dict) -> None:
        if "muon" not in saved:
            raise UserError("the optimizer state has no Muon part: it was saved by a run with "
                            "optimizer=adamw; resume it with --optimizer=adamw")
        self.adamw.load_state_dict({k: v for k, v in saved.items() if k != "muon"})
        self.muon.load_state_dict(saved["muon"])
        for group in self.muon.param_groups:    # the run's config, not the saved one, sets these
            group.update(self.hyper)
