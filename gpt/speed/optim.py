"""AdamW (Loshchilov & Hutter, 2019) on torch's fused kernel and Muon, without torch.optim's start-up; and clipping.

torch.optim.AdamW(fused=True) runs the same kernel to the same losses, but its step takes 1.2 to
1.4 times as long on a CPU, and building it imports torch._dynamo, which a short run pays for in
start-up time and memory (docs/performance.md). The kernel is private, so pyproject.toml bounds
torch below its next version and a test fails there. This class keeps what training needs: parameter groups with
their own weight decay, a learning rate set before each step, and state_dict / load_state_dict
in torch.optim's layout, so state saved from torch.optim.AdamW loads here. Hyperparameters are
not read from saved state: the run's config is their one source. Muon below is torch.optim.Muon's
step to the bit, for the same reason: building torch.optim.Muon imports torch._dynamo too.
"""

from __future__ import annotations

import math

import torch

from ..errors import UserError

# torch.optim.Muon's defaults: the quintic iteration's coefficients, its steps, and the norm's floor
NS_COEFFICIENTS, NS_STEPS, NS_EPS = (3.4445, -4.7750, 2.0315), 5, 1e-7


class TorchLayout:
    """An optimizer's param_groups and per-parameter state, zeroed and saved as torch.optim does."""
    param_groups: list[dict]
    state: dict

    def zero_grad(self, set_to_none: bool = True) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                if set_to_none:
                    p.grad = None
                elif p.grad is not None:
                    p.grad.zero_()

    def _params(self) -> list[torch.Tensor]:
        return [p for g in self.param_groups for p in g["params"]]

    def state_dict(self) -> dict:
        index = {p: i for i, p in enumerate(self._params())}
        groups, start = [], 0
        for g in self.param_groups:
            groups.append({**{k: v for k, v in g.items() if k != "params"},
                           "params": list(range(start, start + len(g["params"])))})
            start += len(g["params"])
        return {"state": {index[p]: dict(s) for p, s in self.state.items()}, "param_groups": groups}

    def load_state_dict(self, saved: dict) -> None:
        """Each parameter's state from saved, in torch.optim's layout; its hyperparameters are not read."""
        params = self._params()
        sizes = [len(g["params"]) for g in saved["param_groups"]]
        if sizes != [len(g["params"]) for g in self.param_groups]:
            raise UserError(f"the optimizer state has parameter groups of sizes {sizes}, this model "
                            f"{[len(g['params']) for g in self.param_groups]}; it belongs to another model")
        for i, p in enumerate(params):
            s = saved["state"].get(i)
            if s is None:           # saved before this parameter ever had a gradient: it starts afresh
                for value in self.state[p].values():
                    value.zero_()
                continue
            for key, value in self.state[p].items():
                got = torch.as_tensor(s[key], dtype=value.dtype)
                if got.shape != value.shape:
                    raise UserError(f"optimizer state {i} has shape {tuple(got.shape)} but the "
                                    f"parameter has {tuple(p.shape)}; it belongs to another model")
                value.copy_(got)


# where a step reads its non-finite flag rather than leave it on the device: a CPU has no queue to
# wait on, and torch's MPS kernel has ignored found_inf
READ_FLAG_ON = ("cpu", "mps")


class AdamW(TorchLayout):
    def __init__(self, groups: list[dict], lr: float, betas: tuple[float, float], eps: float = 1e-8):
        """groups: each its params and weight_decay, and where it trains at a multiple of the
        schedule's rate (μP's hidden matrices), that multiple as lr_scale."""
        self.param_groups = [{"params": list(g["params"]), "weight_decay": g["weight_decay"],
                              "lr": lr, "betas": betas, "eps": eps, **scale_of(g)} for g in groups]
        self.set_lr(lr)
        # the kernel wants the step count as a float tensor beside each parameter
        self.state = {p: {"step": torch.zeros((), dtype=torch.float32, device=p.device),
                          "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
                          "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format)}
                      for g in self.param_groups for p in g["params"]}

    def set_lr(self, lr: float) -> None:
        for group in self.param_groups:
            group["lr"] = lr * group.get("lr_scale", 1.0)     # times 1.0 is exact: sp's rate unchanged

    @torch.no_grad()
    def step(self, found_inf: torch.Tensor | None = None) -> None:
        """One update; with found_inf (a float tensor on the parameters' device) non-zero, none: the
        kernel skips the update itself, so the caller need not read the flag back from the device."""
        if found_inf is not None and found_inf.device.type in READ_FLAG_ON:
            if found_inf.item():
                return
            found_inf = None
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            states = [self.state[p] for p in params]
            steps = [s["step"] for s in states]
            torch._foreach_add_(steps, 1)
            beta1, beta2 = group["betas"]
            torch._fused_adamw_(params, [p.grad for p in params], [s["exp_avg"] for s in states],
                                [s["exp_avg_sq"] for s in states], [], steps, amsgrad=False,
                                lr=group["lr"], beta1=beta1, beta2=beta2,
                                weight_decay=group["weight_decay"], eps=group["eps"], maximize=False,
                                found_inf=found_inf)
            if found_inf is not None:   # a skipped update does not count as a step
                torch._foreach_sub_(steps, [found_inf] * len(steps))


class Muon(TorchLayout):
    """torch.optim.Muon's step: Nesterov momentum, each matrix's update orthogonalised whole by the
    quintic Newton-Schulz iteration in bfloat16 and scaled by sqrt(max(1, rows / cols)), decoupled
    weight decay. The same operations in the same order, so the same bits; ns_dtype float32 runs
    the iteration in float32 instead, for a CPU that only emulates bfloat16."""

    def __init__(self, params: list[torch.Tensor], lr: float, momentum: float, weight_decay: float,
                 nesterov: bool = True, ns_dtype: torch.dtype = torch.bfloat16):
        params = list(params)
        self.ns_dtype = ns_dtype
        self.param_groups = [{"params": params, "lr": lr, "weight_decay": weight_decay, "momentum": momentum,
                              "nesterov": nesterov, "ns_coefficients": NS_COEFFICIENTS, "eps": NS_EPS,
                              "ns_steps": NS_STEPS, "adjust_lr_fn": None}]
        self.state = {p: {"momentum_buffer": torch.zeros_like(p)} for p in params}

    @torch.no_grad()
    def step(self) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                buf = self.state[p]["momentum_buffer"]
                buf.lerp_(p.grad, 1 - group["momentum"])
                update = p.grad.lerp(buf, group["momentum"]) if group["nesterov"] else buf
                update = orthogonal_whole(update, group["ns_coefficients"], group["ns_steps"], group["eps"],
                                          self.ns_dtype)
                p.mul_(1 - group["lr"] * group["weight_decay"])
                p.add_(update, alpha=-group["lr"] * math.sqrt(max(1, p.size(0) / p.size(1))))


def orthogonal_whole(g: torch.Tensor, coefficients: tuple[float, float, float], steps: int,
                     eps: float, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """The matrix g's orthogonal factor, nearly, by torch.optim.Muon's iteration in its own order,
    in dtype."""
    a, b, c = coefficients
    x = g.to(dtype, copy=True)      # divided in place below: never the momentum itself
    tall = g.size(0) > g.size(1)
    if tall:
        x = x.T
    x.div_(x.norm().clamp(min=eps))     # spectral norm at most 1
    for _ in range(steps):
        gram = x @ x.T
        x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.T if tall else x


def scale_of(group: dict) -> dict:
    """A group's lr_scale entry, where it has one, to keep in the optimizer's group."""
    return {"lr_scale": group["lr_scale"]} if "lr_scale" in group else {}


@torch.no_grad()
def clip_grad_norm(params, max_norm: float) -> torch.Tensor:
    """The global L2 norm of the gradients, as a tensor on their device (reading it would wait for
    the device); above max_norm they are scaled in place by max_norm / (norm + 1e-6),
    torch.nn.utils.clip_grad_norm_'s factor, computed in float64 as Python would, else by 1."""
    params = list(params)
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.zeros((), device=params[0].device if params else None)
    norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
    if max_norm != float("inf"):
        wide = norm if norm.device.type == "mps" else norm.double()    # MPS has no float64
        scale = torch.where(wide > max_norm, torch.full_like(wide, max_norm) / (wide + 1e-6), 1.0).float()
        torch._foreach_mul_(grads, scale)
    return norm
