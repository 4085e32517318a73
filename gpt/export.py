"""Write a trained model as a Hugging Face GPT-2 folder: python -m gpt.export --out_dir=DIR --to=FOLDER [--ckpt=best|latest] [--overwrite=true]

FOLDER gets config.json, generation_config.json (generate stops at block_size), model.safetensors
and the tokenizer's files, which transformers.AutoModelForCausalLM and AutoTokenizer load, giving
the logits this model gives.
Only models GPT-2 computes exactly are written: learned positions (fixed sinusoids go in as the
table they are, no positions as a table of zeros), pre-norm blocks with residuals, LayerNorm, GELU
(exact or tanh), ReLU or squared ReLU, any MLP width, one key/value head per query head, a tied or
untied head, uncapped logits, the standard parametrization (or μP at its base width); biases a model lacks are written as zeros, and norm gains as ones.
Anything else is refused, naming the settings in the way. gpt.pretrained (from_pretrained, --init_from) reads the folder back.

The tokenizer's files come from gpt/hf_tokenizers.py.

FOLDER is written whole or not at all: the files go to a temporary folder beside it, which then
takes its place. A FOLDER that already holds anything is replaced only with --overwrite=true.
Needs the [hf] extra (safetensors, tokenizers): pip install -e ".[hf]".
"""

from __future__ import annotations

from .console import interrupt_quietly_while_loading

interrupt_quietly_while_loading(__name__)      # before torch loads

import contextlib
import dataclasses
import os
import secrets
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from . import checkpoint
from .cli import run_command
from .config import GPTConfig, _check_choices, _named, check_types, opt, user_path
from .config_files import shown
from .console import interrupt_in_one_line, output_may_close
from .errors import UserError, first_line
from .hf_tokenizers import dumps, tokenizer_files

NEEDS = 'python -m gpt.export needs safetensors and tokenizers: pip install -e ".[hf]"'


@dataclass
class ExportConfig:
    out_dir: str = opt("out", "run folder whose checkpoint is exported")
    ckpt: str = opt("best", "best: ckpt_best.pt, the lowest val loss, the one to share; latest: "
                    "ckpt.pt, the last saved", choices=("best", "latest"))
    to: str = opt("", "(required) folder to write the Hugging Face model into (config.json, model.safetensors, "
                  "the tokenizer's files); made if missing")
    overwrite: bool = opt(False, "replace --to when it already holds anything: the whole folder, "
                          "files of other origins too; without it only a missing or empty folder "
                          "is written")

    def __post_init__(self):
        check_types(self)
        _check_choices(self)
        _named(self, "out_dir")
        if not self.to.strip():
            raise UserError("--to is missing or empty; give the folder to write the Hugging Face "
                            "model into, e.g. --to=hf/my-model")
        self.to = user_path(self.to, "to")


# ---------------------------------------------------------------- the model

HF_ACTIVATION = {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu", "relu2": "relu2"}   # erf; tanh

# each setting GPT-2 has one way of: (whether config's value is that way, what GPT-2 does)
GPT2_HAS = {
    "n_kv_head": (lambda c: c.kv_heads == c.n_head, "a key/value head per query head"),
    "pos_encoding": (lambda c: c.pos_encoding in ("learned", "sinusoidal", "none"),
                     "a table of positions added to the tokens"),
    "norm_placement": (lambda c: c.norm_placement == "pre", "pre-norm"),
    "residual": (lambda c: c.residual, "residuals"),
    "norm_type": (lambda c: c.norm_type == "layernorm", "LayerNorm"),
    "parallel": (lambda c: not c.parallel, "attention, then the MLP"),
    "qk_norm": (lambda c: not c.qk_norm, "no QK-norm"),
    "activation": (lambda c: c.activation in HF_ACTIVATION, "GELU or (squared) ReLU, ungated"),
    "scale_embeddings": (lambda c: not c.scale_embeddings, "unscaled embeddings"),
    "embed_norm": (lambda c: not c.embed_norm, "no norm on the embeddings"),
    "logit_softcap": (lambda c: not c.logit_softcap, "uncapped logits"),
    # μP's output multiplier and 1/head_size scores, which are sp's at the base width
    "parametrization": (lambda c: c.parametrization == "sp" or c.n_embd == c.mup_base_width,
                        "the standard parametrization, with unscaled logits and scores by 1/sqrt(head "
                        "size), which mup is only at n_embd=mup_base_width"),
}


def refusals(config: GPTConfig) -> list[tuple[str, str]]:
    """(setting=value, what GPT-2 has instead) for every setting of config GPT-2 cannot compute
    exactly, in the config's own order; empty when it can."""
    return [(f"{f.name}={shown(getattr(config, f.name))}", GPT2_HAS[f.name][1])
            for f in dataclasses.fields(config) if f.name in GPT2_HAS and not GPT2_HAS[f.name][0](config)]


def check_expressible(config: GPTConfig, run: Path) -> None:
    found = refusals(config)
    if found:
        raise UserError(f"{run}'s model cannot be written as GPT-2: {', '.join(s for s, _ in found)} "
                        f"(GPT-2 has {'; '.join(h for _, h in found)})")


def hf_config(config: GPTConfig, eps: float, eos: int | None) -> dict:
    """GPT-2's config.json for a model of config whose LayerNorms divide by sqrt(var + eps); eos:
    the end-of-text id, if the tokenizer has one."""
    return {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": config.vocab_size,
        "n_positions": config.block_size,
        "n_embd": config.n_embd,
        "n_layer": config.n_layer,
        "n_head": config.n_head,
        "n_inner": config.mlp_hidden,
        "activation_function": HF_ACTIVATION[config.activation],
        "layer_norm_epsilon": eps,
        "scale_attn_weights": True,                 # 1/sqrt(head size), as SDPA's default
        "scale_attn_by_inverse_layer_idx": False,
        "reorder_and_upcast_attn": False,
        "resid_pdrop": config.dropout,              # the same three places as here
        "embd_pdrop": config.dropout,
        "attn_pdrop": config.dropout,
        "tie_word_embeddings": config.tie_weights,
        "bos_token_id": eos,
        "eos_token_id": eos,
        "initializer_range": 0.02,
        "use_cache": True,
        "dtype": "float32",
    }


def hf_weights(model) -> dict[str, torch.Tensor]:
    """The model's tensors under GPT-2's names and layouts (Conv1D keeps (in, out)), float32,
    contiguous: wpe holds the fixed sinusoids, or zeros without positions, and each bias the
    model lacks is zeros. The head is written only when it is not the token table."""
    config, parts = model.config, model.transformer
    C = config.n_embd
    out: dict[str, torch.Tensor] = {"transformer.wte.weight": parts.wte.weight}
    if "wpe" in parts:
        out["transformer.wpe.weight"] = parts.wpe.weight
    elif config.pos_encoding == "sinusoidal":
        out["transformer.wpe.weight"] = model.pos_table
    else:
        out["transformer.wpe.weight"] = torch.zeros(config.block_size, C)

    def norm(name: str, module) -> None:     # a norm without a gain is one with a gain of 1
        out[f"{name}.weight"] = module.weight if module.weight is not None else torch.ones(C)
        out[f"{name}.bias"] = module.bias if module.bias is not None else torch.zeros(C)

    def conv1d(name: str, linear) -> None:
        out[f"{name}.weight"] = linear.weight.t()
        out[f"{name}.bias"] = (linear.bias if linear.bias is not None
                               else torch.zeros(linear.out_features))

    for i, block in enumerate(parts.h):
        h = f"transformer.h.{i}"
        norm(f"{h}.ln_1", block.ln_1)
        conv1d(f"{h}.attn.c_attn", block.attn.c_attn)
        conv1d(f"{h}.attn.c_proj", block.attn.c_proj)
        norm(f"{h}.ln_2", block.ln_2)
        conv1d(f"{h}.mlp.c_fc", block.mlp.c_fc)
        conv1d(f"{h}.mlp.c_proj", block.mlp.c_proj)
    norm("transformer.ln_f", parts.ln_f)
    if not config.tie_weights:
        out["lm_head.weight"] = model.lm_head.weight
    return {k: v.detach().to("cpu", torch.float32).contiguous() for k, v in out.items()}


# ---------------------------------------------------------------- the folder

def need_hf_parts() -> None:
    try:
        import safetensors.torch  # noqa: F401
        import tokenizers  # noqa: F401
    except ImportError:
        raise UserError(NEEDS) from None


def check_destination(dest: Path, run: Path, overwrite: bool) -> None:
    """Refuse a --to that is a file or a link, holds the run, or holds anything without overwrite."""
    if dest.is_symlink():
        raise UserError(f"--to={dest} is a link; give the folder itself")
    if dest.exists() and not dest.is_dir():
        raise UserError(f"--to={dest} is a file, not a folder; give a folder to write the model into")
    here, there = dest.resolve(), run.resolve()
    if there == here or there.is_relative_to(here):
        raise UserError(f"--to={dest} holds the run folder {run}, whose checkpoints the export would "
                        "replace; give another folder")
    if Path.cwd().resolve().is_relative_to(here):
        raise UserError(f"--to={dest} is or holds the current folder, which the export would replace; "
                        "give a folder inside it, e.g. --to=hf")
    if dest.is_dir() and not overwrite:
        held = sorted(p.name for p in dest.iterdir())
        if held:
            more = f" and {len(held) - 3} more" if len(held) > 3 else ""
            raise UserError(f"--to={dest} already holds {', '.join(held[:3])}{more}; give "
                            "--overwrite=true to replace the whole folder, or another --to")


def fsync(path: Path) -> None:
    with contextlib.suppress(OSError):  # some file systems cannot sync a folder
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def made_parents(folder: Path) -> list[Path]:
    """Make folder's missing parents; those made, deepest first, to remove if nothing comes of it."""
    missing = [p for p in folder.parents if not p.exists()]
    folder.parent.mkdir(parents=True, exist_ok=True)
    return missing


def new_folder(beside: Path, tag: str) -> Path:
    """A new empty folder next to `beside`, hidden, made as mkdir makes one (the umask's
    permissions, which the export keeps, not mkdtemp's 0700)."""
    while True:
        path = beside.parent / f".{beside.name[:64]}.{secrets.token_hex(4)}.{tag}"
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue


def write_folder(dest: Path, write) -> None:
    """Call write(tmp) to fill a new folder beside dest, then put it in dest's place: dest ends
    up whole and new, or as it was, whatever stops the export (an error, Ctrl-C). A dest there
    already is moved aside first and deleted only once the new one is in."""
    parents: list[Path] = []
    tmp = aside = None
    done = False

    def put_back() -> None:
        """The old dest back in its place, if it was moved aside and the new one is not in."""
        if aside is not None and (aside / dest.name).exists() and not dest.exists():
            os.replace(aside / dest.name, dest)

    try:
        parents = made_parents(dest)
        tmp = new_folder(dest, "export")
        write(tmp)
        for path in tmp.iterdir():
            fsync(path)
        fsync(tmp)
        if dest.exists():
            aside = new_folder(dest, "old")
            os.replace(dest, aside / dest.name)
        os.replace(tmp, dest)
        done = True
        fsync(dest.parent)
    except OSError as e:
        reason = e.strerror or first_line(e)
        try:
            put_back()
        except OSError:
            raise UserError(f"cannot write {dest} ({reason}), nor put the old one back: it is in "
                            f"{aside / dest.name}") from None
        kept = f"{dest} is as it was" if dest.exists() else "nothing was written"
        raise UserError(f"cannot write {dest} ({reason}); {kept}") from None
    finally:
        if not done:
            with contextlib.suppress(OSError):
                put_back()      # stopped between the two moves
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
            for parent in parents:      # deepest first; one holding anything else stays
                with contextlib.suppress(OSError):
                    parent.rmdir()
        if aside is not None and (done or not (aside / dest.name).exists()):
            shutil.rmtree(aside, ignore_errors=True)    # never the old folder while it is not back


@contextlib.contextmanager
def as_os_error():
    """A writer's own error (safetensors' and tokenizers' Rust ones: a full disk) as an OSError."""
    try:
        yield
    except OSError:
        raise
    except Exception as e:
        raise OSError(first_line(e)) from e


def export(cfg: ExportConfig) -> dict:
    """Write cfg.out_dir's model to cfg.to; what was written, for the report."""
    need_hf_parts()
    from safetensors.torch import save_file
    run, dest = Path(cfg.out_dir), Path(cfg.to)
    check_destination(dest, run, cfg.overwrite)
    name, otherwise = checkpoint.chosen(run, cfg.ckpt, "exports")
    model, ckpt = checkpoint.load_for_inference(run, "cpu", name, otherwise)
    check_expressible(model.config, run)
    texts, tokenizer, eos, kind = tokenizer_files(ckpt["meta"], model.config.block_size)
    weights = hf_weights(model)

    config = hf_config(model.config, model.transformer.ln_f.eps, eos)
    # generate() past n_positions fails deep in torch (IndexError); this stops it at block_size
    generation = {"max_length": model.config.block_size, "bos_token_id": eos, "eos_token_id": eos}

    def write(folder: Path) -> None:
        (folder / "config.json").write_text(dumps(config), encoding="utf-8")
        (folder / "generation_config.json").write_text(dumps(generation), encoding="utf-8")
        with as_os_error():
            save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
            tokenizer.save(str(folder / "tokenizer.json"))
        # safetensors makes its file private (0600); the folder's other files are as the umask says
        os.chmod(folder / "model.safetensors", (folder / "config.json").stat().st_mode & 0o777)
        for file, text in texts.items():
            (folder / file).write_text(text, encoding="utf-8")

    write_folder(Path(os.path.abspath(dest)), write)     # "." and ".." have no name to put beside
    return {"folder": str(dest), "checkpoint": str(run / name), "tokenizer": kind,
            "params": sum(t.numel() for t in weights.values()),
            "files": sorted(p.name for p in dest.iterdir())}


def export_text(result: dict) -> str:
    return (f"wrote {result['folder']}: {result['checkpoint']} as GPT-2 ({result['params']:,} parameters) "
            f"with its {result['tokenizer']} tokenizer; {', '.join(result['files'])}")


def main(argv: list[str] | None = None) -> int:
    return run_command("-m gpt.export", ExportConfig, argv, export,
                       lambda cfg, result: export_text(result))


if __name__ == "__main__":
    # Ctrl-C, kill or a closed terminal mid-write: one line, and the temporary folder removed
    with interrupt_in_one_line(terminate=True), output_may_close():
        sys.exit(main())
