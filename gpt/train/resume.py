"""Starting a run in its folder: afresh, replacing an earlier run only where allowed, or exactly where ckpt.pt left it."""

from __future__ import annotations

import copy
import dataclasses
import math
import random
import uuid
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from .. import checkpoint
from ..config_files import shown
from ..config import GPTConfig, TrainConfig, build
from ..errors import UserError
from ..integrity import elsewhere
from .metrics import read_jsonl
from .rundir import run_record


def rng_state(device: str) -> dict:
    """Every random stream, as tensors and lists (loadable with weights_only). All processes of a
    DDP run are seeded alike and draw alike, so rank 0's state stands for every rank's."""
    np_state = np.random.get_state()
    py_state = random.getstate()
    cuda = torch.device(device).type == "cuda"
    # the gauss entries: each generator keeps the second of a pair of normal draws for the next call
    return {"torch": torch.get_rng_state(), "python": list(py_state[1]), "python_gauss": py_state[2],
            "numpy": torch.from_numpy(np_state[1].astype(np.int64)), "numpy_pos": int(np_state[2]),
            "numpy_gauss": [int(np_state[3]), float(np_state[4])],
            "cuda": torch.cuda.get_rng_state(device) if cuda else None}


def set_rng_state(state: dict, device: str) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate((3, tuple(state["python"]), state.get("python_gauss")))     # older: none kept
    np.random.set_state(("MT19937", state["numpy"].numpy().astype(np.uint32), state["numpy_pos"],
                         *state.get("numpy_gauss", [0, 0.0])))
    if state["cuda"] is not None and torch.device(device).type == "cuda":
        torch.cuda.set_rng_state(state["cuda"], device)



def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def configs_for_run(values: dict) -> tuple[GPTConfig, TrainConfig]:
    """Typed configs from parsed values. A resume starts from the checkpoint's own configs,
    so `--resume --out_dir=DIR` alone continues a run; given values still apply on top."""
    base_model, base_train = None, None
    # only the merged config is checked: a value given is valid against the run's own settings
    if values.get("resume", TrainConfig.resume):
        path = Path(values.get("out_dir", TrainConfig.out_dir)) / "ckpt.pt"
        if not path.exists():
            if checkpoint.is_sweep(path.parent):
                raise UserError(f"--resume: {path.parent} is a sweep; run the sweep's own command "
                                "again, without --resume, to continue its runs")
            if path.parent.is_dir():
                with checkpoint.hold_folder(path.parent):   # a run not yet at its first checkpoint
                    pass
            best = path.with_name("ckpt_best.pt")
            hint = f" ({best.name} is: copy it to {path.name} to continue from it)" if best.exists() else ""
            raise UserError(f"--resume: nothing to resume, {path} does not exist{hint}")
        ckpt = checkpoint.load(path, mmap=True, needs=checkpoint.RESUME_KEYS,   # only configs are read
                               verify=("model_config", "train_config"))
        base_model, base_train = ckpt["model_config"], ckpt["train_config"]
        if isinstance(base_train, dict):    # how that run was started is not how this one is
            base_train = {k: v for k, v in base_train.items() if k not in ("resume", "overwrite", "pause_at")}
            base_train.setdefault("thread_split", "ops")    # saved before the split: go on as it ran
            base_train.setdefault("muon_dtype", "bfloat16")     # the same: Muon iterated in bfloat16
    return build(GPTConfig, values, base=base_model), build(TrainConfig, values, base=base_train)


NOT_SAVED = "checkpoint not saved"      # the event a failed save logs


def _check_replaceable(out_dir: Path, theirs: list[str]) -> None:
    """Refuse a fresh run where it would replace what is not a run of this project (another
    program's config.json, say), or the evaluations of a run whose checkpoints were removed."""
    ours = {"model", "train"} <= run_record(out_dir / "config.json").keys()
    if (out_dir / "config.json").exists() and not ours:
        raise UserError(f"{out_dir} holds a config.json that no run of this project wrote; replace it "
                        "with --overwrite=true, or choose another --out_dir")
    if theirs and not ours:
        raise UserError(f"{out_dir} holds {', '.join(theirs)} but no run of this project (no "
                        "config.json); remove them, replace them with --overwrite=true, or choose "
                        "another --out_dir")
    rows = read_jsonl(out_dir / "metrics.jsonl") if "metrics.jsonl" in theirs else []
    unsaved = {r["iter"] for r in rows if r.get("event") == NOT_SAVED}
    # each finite evaluation past 0 saved a checkpoint, unless its save failed and said so
    saved = [r["iter"] for r in rows if r["kind"] == "eval" and r["iter"] > 0 and r["iter"] not in unsaved
             and math.isfinite(r["val_loss"]) and math.isfinite(r.get("train_loss", 0.0))]
    if saved:
        raise UserError(f"{out_dir} holds an earlier run's metrics.jsonl, evaluated up to iteration "
                        f"{max(saved)}, but not its checkpoints; replace the run with --overwrite=true, "
                        "or choose another --out_dir")


def check_resume(ckpt: dict, model_cfg: GPTConfig, meta: dict) -> None:
    saved = ckpt.get("meta", {})
    if (saved.get("tokenizer"), saved.get("chars")) != (meta.get("tokenizer"), meta.get("chars")):
        raise UserError(f"cannot resume: the dataset's vocabulary ({meta.get('vocab_size')} tokens) "
                        f"differs from the checkpoint's ({saved.get('vocab_size')} tokens)")
    now = dataclasses.asdict(model_cfg)
    then = dataclasses.asdict(checkpoint.model_config(ckpt))    # fields newer than it at their defaults
    diffs = [f"{k}={shown(then[k])} in the checkpoint but {shown(now[k])} now"
             for k in now if k != "dropout" and then[k] != now[k]]
    if diffs:
        raise UserError("cannot resume with a different model: " + "; ".join(diffs) + ". Leave "
                        "those options out to continue the run, or train the new model in another "
                        "--out_dir")


def rescore(model: torch.nn.Module, val_loss: Callable[[torch.nn.Module], float], out_dir: Path,
            start_iter: int, best_iter: int | None, windows_before: int, windows_now: int) -> tuple[float, int]:
    """On resuming with other evaluation windows: (best val loss, its iteration) on the new ones,
    from the state resumed (ckpt.pt) and ckpt_best.pt, so that the best checkpoint is chosen on
    one text; ckpt_best.pt becomes a copy of ckpt.pt if that scores better."""
    scores = {start_iter: val_loss(model)}
    best_path = out_dir / "ckpt_best.pt"
    if best_iter != start_iter and best_path.exists():  # there is none when iteration 0 was best
        other = copy.deepcopy(model)    # not a new model: building one draws random numbers
        try:    # mapped: its weights alone reach the device, not its optimizer state
            saved = checkpoint.load(best_path, mmap=True, needs=(*checkpoint.MODEL_KEYS, "iter"))
            checkpoint.load_weights(other, saved)
            scores[saved["iter"]] = val_loss(other)
        except UserError:
            pass    # a damaged copy, or another model's: ckpt.pt's state replaces it
        del other
    said = ", ".join(f"iteration {it} {loss:.4f}" for it, loss in sorted(scores.items()))
    note = (f"note: evaluations now score {windows_now} windows, before {windows_before}, "
            f"so the val losses before and after compare other text; on the new ones {said}")
    finite = {it: loss for it, loss in scores.items() if math.isfinite(loss)}
    if not finite:      # ckpt_best.pt stays; any finite evaluation will replace it
        print(f"{note}: no score is finite, so the next finite evaluation becomes ckpt_best.pt", flush=True)
        return float("inf"), best_iter
    best = min(finite, key=finite.get)
    if best == start_iter and start_iter != best_iter:
        checkpoint.save_copy(out_dir / "ckpt.pt", best_path)
    print(f"{note}: ckpt_best.pt holds iteration {best}, and later evaluations must beat "
          f"{finite[best]:.4f}", flush=True)
    return finite[best], best



# what a fresh run removes of an earlier run in its folder, so that nothing stale mixes in
EARLIER_RUN = ("metrics.jsonl", "command.txt", "ckpt.pt", "ckpt_best.pt", "ckpt.pt.tmp", "ckpt_best.pt.tmp",
               "config.json.tmp", "metrics.jsonl.tmp", "dashboard.png", "attention.png")


def start_afresh(out_dir: Path, cfg: TrainConfig) -> None:
    """Clear out_dir of an earlier run's files, where that run may be replaced."""
    old = [p for p in (out_dir / name for name in EARLIER_RUN) if p.exists()]
    theirs = [p.name for p in old if not p.name.endswith(".tmp")]
    if not cfg.overwrite:
        _check_replaceable(out_dir, theirs)
    for path in old:
        try:
            path.unlink()
        except OSError as e:    # a folder of that name, or no permission
            raise UserError(f"{path} cannot be replaced ({e.strerror}); remove it, or choose "
                            "another --out_dir") from None
    if any(p.name.startswith("ckpt") for p in old):
        print(f"starting afresh in {out_dir}: removed the earlier run's checkpoints", flush=True)


@dataclasses.dataclass
class Position:
    """Where a run stands: its next iteration, its best evaluation, and its saves."""
    start_iter: int = 0
    best_val: float = float("inf")
    best_iter: int | None = None
    last_eval: int = -1             # the iteration last evaluated
    last_saved: int | None = None   # the iteration ckpt.pt holds
    elapsed_before: float = 0.0     # seconds trained before this start
    mended: int | None = None       # the iteration copied to ckpt_best.pt, which did not hold it
    run_id: str = dataclasses.field(default_factory=lambda: uuid.uuid4().hex[:12])  # in config.json and each save


def check_identity(ckpt: dict, out_dir: Path, adopt: bool) -> None:
    """Refuse a ckpt.pt another run saved (copied into this folder by hand): resumed, it would train
    on under this folder's record and its metrics.jsonl would mix the two runs' curves. With adopt,
    the folder's metrics.jsonl is set aside and the checkpoint's run goes on here."""
    theirs, ours = ckpt.get("run_id"), run_record(out_dir / "config.json").get("run_id")
    if not (isinstance(theirs, str) and isinstance(ours, str)) or theirs == ours:
        return      # one of them older than run ids: nothing to compare
    if not adopt:
        raise UserError(f"{out_dir / 'ckpt.pt'} was saved by run {theirs}, but {out_dir} holds run {ours} "
                        "(config.json): the checkpoint was copied from another run; put back this run's "
                        "own, or pass --adopt_checkpoint=true to continue that run here, with this "
                        "folder's metrics.jsonl set aside")
    log = out_dir / "metrics.jsonl"
    if log.exists():
        log.rename(out_dir / f"metrics.{ours}.jsonl")
        print(f"adopting run {theirs}'s checkpoint: this folder's log of run {ours} is now "
              f"{out_dir / f'metrics.{ours}.jsonl'}", flush=True)


def restore(ckpt: dict, model, optimizer, batches, model_cfg: GPTConfig, cfg: TrainConfig, meta: dict,
            device: str, master: bool, world: int) -> Position:
    """Load ckpt.pt's weights, optimizer, random streams and position into this run."""
    out_dir = Path(cfg.out_dir)
    check_resume(ckpt, model_cfg, meta)
    if (seed := ckpt["train_config"].get("seed", cfg.seed)) != cfg.seed:
        raise UserError(f"cannot resume with seed={cfg.seed}: the run's batches and dropout follow "
                        f"its seed={seed}; leave --seed out to continue it, or train with the new "
                        "seed in another --out_dir")
    if (trained_by := ckpt["train_config"].get("optimizer", "adamw")) != cfg.optimizer:
        raise UserError(f"cannot resume with optimizer={cfg.optimizer}: ckpt.pt holds the state of "
                        f"optimizer={trained_by}; leave --optimizer out to continue the run, or train "
                        f"with {cfg.optimizer} in another --out_dir")
    checkpoint.load_weights(model, ckpt)
    damage = state_damage(ckpt, optimizer.state_dict(), batches.state())
    if damage:
        raise UserError(f"{out_dir / 'ckpt.pt'} cannot be resumed: damage in its {damage[0]} ({damage[1]}); "
                        f"no step of training leaves that, so the file is damaged{elsewhere(out_dir / 'ckpt.pt')}")
    optimizer.load_state_dict(ckpt["optimizer"])
    at = Position(start_iter=ckpt["iter"], best_val=ckpt["best_val_loss"], last_eval=ckpt["last_eval_iter"],
                  last_saved=ckpt["iter"], best_iter=ckpt.get("best_iter"))
    if isinstance(ckpt.get("run_id"), str):     # older checkpoints have none: the run takes a new one
        at.run_id = ckpt["run_id"]
    at.elapsed_before = ckpt.get("elapsed_s")
    if at.elapsed_before is None:      # a checkpoint of an older version: its log has the time
        metrics_path = out_dir / "metrics.jsonl"
        logged = [r["elapsed_s"] for r in read_jsonl(metrics_path) if r["kind"] == "eval"
                  and r["iter"] <= at.start_iter and "elapsed_s" in r] if metrics_path.exists() else []
        at.elapsed_before = logged[-1] if logged else 0.0
    set_rng_state(ckpt["rng"], device)
    batches.set_state(ckpt["batch_rng"])
    at.mended = checkpoint.make_best_good(out_dir, ckpt) if master else None
    if at.mended is not None:
        print(f"ckpt_best.pt did not hold the best iteration, {at.mended}: copied it from ckpt.pt",
              flush=True)
    if world > 1:   # every rank must end the same way
        flag = torch.tensor(float(at.mended is not None), device=device)
        torch.distributed.broadcast(flag, 0)
        at.mended = at.start_iter if flag.item() > 0 else None
    return at


class Entries(dict):
    """A table of which a saved copy may hold only some entries: an optimizer's state, where a
    parameter that never had a gradient has none."""


def state_damage(ckpt: dict, optimizer: dict, batch_rng: torch.Tensor) -> tuple[str, str] | None:
    """(part, what) where the optimizer or random states in ckpt lack a part that this run's own
    (optimizer, its state_dict(); batch_rng, its batches' generator state) holds, or hold one of
    another kind; else None. Checked before they are applied: what fails later is this code's fault."""
    def layout(state: dict) -> dict:    # what a load reads: each group's parameters, each entry
        parts = {"state": Entries(state["state"]),
                 "param_groups": [{"params": g["params"]} for g in state["param_groups"]]}
        return parts | ({"muon": layout(state["muon"])} if "muon" in state else {})
    own_rng = rng_state("cpu")
    own_rng.pop("python_gauss")     # None or a number, whichever this process holds now
    own_rng.pop("numpy_gauss")      # older checkpoints lack it
    for part, saved, own in (("optimizer state", ckpt["optimizer"], layout(optimizer)),
                             ("random states", {**ckpt["rng"], "batch_rng": ckpt["batch_rng"]},
                              {**own_rng, "batch_rng": batch_rng})):
        what = _unlike(saved, own)
        if what:
            return part, what
    what = bad_moments(ckpt["optimizer"])
    return ("optimizer state", what) if what else None


def bad_moments(state: dict, name: str = "") -> str | None:
    """A moment no training could have left: not finite, or a second moment below zero."""
    for index, entry in state["state"].items():
        for key, value in entry.items():
            if not isinstance(value, torch.Tensor) or not value.is_floating_point() or key == "step":
                continue
            where = f"{name}state[{index!r}][{key!r}]"
            if not torch.isfinite(value).all():
                return f"{where} holds nan or inf"
            if key.endswith("_sq") and (value < 0).any():
                return f"{where} holds a negative second moment"
    return bad_moments(state["muon"], "muon ") if "muon" in state else None


def _unlike(saved, own, name: str = "") -> str | None:
    """How saved differs in kind from own, at name (a path of keys; "" at the top): a key missing,
    another type, a tensor of another shape, a list of another length. Where own is None (CUDA's
    state on a CPU), anything goes."""
    if own is None:
        return None
    if isinstance(own, torch.Tensor):
        if own.dim() == 0 and (type(saved) in (int, float) or isinstance(saved, torch.Tensor) and saved.dim() == 0):
            return None     # a count, as a number in older checkpoints
        if not isinstance(saved, torch.Tensor) or saved.is_floating_point() != own.is_floating_point():
            return f"{name} is not a tensor of {'floats' if own.is_floating_point() else 'integers'}"
        return None if saved.shape == own.shape else f"{name} has shape {tuple(saved.shape)}, not {tuple(own.shape)}"
    if isinstance(own, dict):
        if not isinstance(saved, dict):
            return f"{name} is not a table"
        inner = {k: f"{name}[{k!r}]" if name else str(k) for k in own}
        missing = [k for k in own if k not in saved and not isinstance(own, Entries)]
        if missing:
            return f"{inner[missing[0]]} is missing"
        return next(filter(None, (_unlike(saved[k], own[k], inner[k]) for k in own if k in saved)), None)
    if isinstance(own, (list, tuple)):
        if not isinstance(saved, (list, tuple)) or len(saved) != len(own):
            return f"{name} is not a list of {len(own)}"
        return next(filter(None, (_unlike(s, o, f"{name}[{i}]") for i, (s, o) in enumerate(zip(saved, own)))), None)
    if type(own) is int and type(saved) is not int or type(own) is float and type(saved) not in (int, float):
        return f"{name}={saved!r} is not a number"
    return None


def windows_scored(train_config: dict) -> int:
    """How many windows an evaluation of a run with this saved training config scores: they depend
    on their number alone (Batches.evenly_spaced)."""
    return train_config.get("eval_iters", TrainConfig.eval_iters) * (
        train_config.get("eval_batch_size") or train_config.get("batch_size", TrainConfig.batch_size))
