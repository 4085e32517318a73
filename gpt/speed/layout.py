"""Weight layout for CPU matrix-vector products: widening layers keep their weight stored transposed."""

from __future__ import annotations

from torch import nn


def lay_out_weights(model: nn.Module) -> nn.Module:
    """Store the weight of each Linear that widens (c_attn, c_fc, an untied head over more tokens
    than n_embd) as its transpose, contiguous: a Linear multiplies by the transpose, so a one-token
    sampling step, a matrix-vector product per layer, then reads memory in order (about twice as
    fast on a CPU); a narrowing layer is faster as it is. Values and gradients do not change (a
    gradient takes its weight's layout), and state dicts load either way; code that wants
    contiguous tensors (safetensors' save_file, .view) needs .contiguous() first. Returns model."""
    for module in model.modules():
        if (isinstance(module, nn.Linear) and module.out_features > module.in_features
                and module.weight is not model.transformer.wte.weight):
            module.weight.data = module.weight.data.t().contiguous().t()
    return model
