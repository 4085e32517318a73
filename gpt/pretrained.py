"""GPT-2 weights from Hugging Face: its config.json read into a GPTConfig, its tensors into our names."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import torch

from .config import GPTConfig, build
from .errors import UserError, first_line
from .model import GPT


HUB_NAMES = ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl")


def gpt2_folder(path: str) -> Path:
    """A local Hugging Face GPT-2 folder: path itself, or a hub name fetched (needs network)."""
    folder = Path(path).expanduser()
    if folder.is_dir():
        return folder
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise UserError(f"{path!r} is not a folder, and fetching it from the hub needs "
                        "huggingface_hub: pip install -e \".[hf]\"") from None
    try:
        return Path(snapshot_download(path, allow_patterns=["config.json", "*.safetensors", "pytorch_model.bin"]))
    except Exception as e:      # the hub's errors have no common base worth naming
        raise UserError(f"{path!r} is not a folder, and the hub could not give it: {first_line(e)}") from None


def from_pretrained(path: str) -> GPT:
    """A GPT holding a Hugging Face GPT-2 checkpoint: a local folder with config.json and
    model.safetensors or pytorch_model.bin, or a hub name such as "gpt2" (needs network)."""
    folder = gpt2_folder(path)
    model = GPT(gpt2_config(folder / "config.json"))
    model.load_state_dict(gpt2_state(folder, model.state_dict()))
    return model


def gpt2_state(folder: Path, expected: dict) -> dict:
    """The weights of a Hugging Face GPT-2 folder under this model's names, checked to fit the
    state_dict `expected`."""
    if not any((folder / name).is_file() for name in ("model.safetensors", "pytorch_model.bin")):
        raise UserError(f"{folder} has no model.safetensors or pytorch_model.bin to load")
    file, weights = read_weights(folder)
    state = {}
    for key, value in weights.items():
        key = key.removeprefix("transformer.")
        if key.endswith((".attn.bias", ".attn.masked_bias")):    # causal-mask buffers
            continue
        if key.endswith(("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight",
                         "mlp.c_proj.weight")):
            value = value.t()       # GPT-2's Conv1D stores (in, out); Linear wants (out, in)
        state[key if key.startswith("lm_head") else f"transformer.{key}"] = value
    if "transformer.wte.weight" in state:
        state.setdefault("lm_head.weight", state["transformer.wte.weight"])
    problem = weights_mismatch(state, expected)
    if problem:
        raise UserError(f"the weights in {file} do not fit {folder / 'config.json'}: {problem}")
    return state


def weights_mismatch(state: dict, expected: dict) -> str:
    """How state differs from the state_dict `expected`: the first few tensors missing, unexpected
    or of another shape, each named; empty when it fits. torch's own message lists every key."""
    problems = {
        "missing": [k for k in expected if k not in state],
        "unexpected": [k for k in state if k not in expected],
        "of another shape": [f"{k} {tuple(v.shape)}, not {tuple(expected[k].shape)}"
                             for k, v in state.items() if k in expected and v.shape != expected[k].shape],
    }
    return "; ".join(f"{len(names)} {kind} ({', '.join(names[:3])}{', ...' * (len(names) > 3)})"
                     for kind, names in problems.items() if names)


def read_weights(folder: Path) -> tuple[Path, dict]:
    """The tensors of a Hugging Face folder's model.safetensors, else of its pytorch_model.bin."""
    file = folder / "model.safetensors"
    if file.exists():
        try:
            from safetensors.torch import load_file as read
        except ImportError:
            raise UserError("reading model.safetensors needs safetensors: pip install -e \".[hf]\"") from None
    else:
        file, read = folder / "pytorch_model.bin", partial(torch.load, map_location="cpu", weights_only=True)
    try:
        return file, read(file)
    except Exception as e:      # safetensors, pickle and zip each raise their own kinds
        raise UserError(f"cannot read {file} ({type(e).__name__}); it is damaged or not a weights "
                        "file, download it again") from None


HF_ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu", "relu": "relu",
                  "relu2": "relu2"}
# GPT-2 options this model has no counterpart for, at the values it matches
HF_FIXED = {"layer_norm_epsilon": 1e-5, "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False}


def gpt2_config(path: Path) -> GPTConfig:
    """Our config for a Hugging Face GPT-2 config.json; any option we cannot honour is refused,
    since loading the weights anyway would give other logits."""
    try:
        hf = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise UserError(f"cannot read {path} ({e}); give a Hugging Face GPT-2 folder") from None
    if not isinstance(hf, dict) or hf.get("model_type") != "gpt2":
        kind = hf.get("model_type") if isinstance(hf, dict) else None
        raise UserError(f"{path} describes a {kind!r} model, not 'gpt2'; only GPT-2 loads here")
    activation = hf.get("activation_function", "gelu_new")
    unsupported = [f"{k}={hf[k]!r}" for k, v in HF_FIXED.items() if hf.get(k, v) != v]
    if activation not in HF_ACTIVATIONS:
        unsupported.append(f"activation_function={activation!r}")
    n_embd, n_inner = hf.get("n_embd", 0), hf.get("n_inner")
    if n_inner is not None and not (isinstance(n_inner, int) and n_embd and n_inner % n_embd == 0 and n_inner > 0):
        unsupported.append(f"n_inner={n_inner!r} (not a multiple of n_embd={n_embd})")
    if unsupported:
        raise UserError(f"{path}: {', '.join(unsupported)} has no counterpart here; this model "
                        f"would give other logits")
    missing = [k for k in ("vocab_size", "n_layer", "n_head", "n_embd") if k not in hf]
    if missing:     # checked here, so that a KeyError from GPTConfig stays a bug, not the file's fault
        raise UserError(f"{path} lacks {', '.join(missing)}")
    return build(GPTConfig, dict(vocab_size=hf["vocab_size"], block_size=hf.get("n_positions", 1024),
                                 n_layer=hf["n_layer"], n_head=hf["n_head"], n_embd=hf["n_embd"], bias=True,
                                 activation=HF_ACTIVATIONS[activation],
                                 tie_weights=hf.get("tie_word_embeddings", True),
                                 mlp_ratio=n_inner // n_embd if n_inner else 4))

