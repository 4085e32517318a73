"""metrics.jsonl, one JSON object per line, and its mirror in Weights & Biases."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import NamedTuple

from ..config import TrainConfig
from ..console import NONFINITE, to_json
from ..errors import UserError, first_line
from .rundir import append_line, how_to_continue, not_a_pipe, write_atomic


def json_line(row: dict) -> str:
    return to_json(row) + "\n"


def _numbers(value):
    if isinstance(value, list):
        return [_numbers(v) for v in value]
    return float(value) if isinstance(value, str) and value in NONFINITE else value


class Log(NamedTuple):
    """A metrics.jsonl as read: its rows, and the lines left out."""
    path: Path
    rows: list[dict]
    skipped: dict[int, str]     # line number -> why it was left out

    def problems(self) -> list[str]:
        """One line for each line left out, as PATH:LINE: why."""
        return [f"{self.path}:{number}: {why}; the line is skipped" for number, why in self.skipped.items()]


def read_metrics(path: Path) -> Log:
    """The rows of a metrics.jsonl, non-finite numbers as floats again, and the lines that are not
    ones a run writes (cut short by a kill, or edited by hand), by line number."""
    rows, skipped = [], {}
    not_a_pipe(Path(path))
    try:
        text = Path(path).read_text(errors="replace")
    except OSError as e:
        raise UserError(f"cannot read {path} ({e.strerror})") from None
    lines = text.removesuffix("\n").split("\n") if text else []     # numbered as an editor numbers them
    for number, line in enumerate(lines, 1):
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            cut = number == len(lines) and not text.endswith("\n")
            skipped[number] = "not valid JSON" + (" (the file ends within the line)" if cut else "")
            continue
        if not (isinstance(row, dict) and isinstance(row.get("kind"), str) and type(row.get("iter")) is int):
            skipped[number] = 'not a metrics row (a text "kind" and a whole-number "iter")'
            continue
        row = {key: _numbers(value) for key, value in row.items()}
        if row["kind"] == "eval" and type(row.get("val_loss")) not in (int, float):
            skipped[number] = "an evaluation without a val_loss number"
            continue
        rows.append(row)
    return Log(Path(path), rows, skipped)


def read_jsonl(path: Path) -> list[dict]:
    """The rows alone, each line left out said on stderr as PATH:LINE: why (a resume's trim drops
    it from the file: a line cut short by a kill is expected, one edited by hand is not)."""
    log = read_metrics(path)
    for problem in log.problems():
        print(problem, file=sys.stderr)
    return log.rows


def flatten(row: dict) -> dict:
    """Numbers only, lists spread out: {"block_rms": [a, b]} -> {"block_rms/0": a, "block_rms/1": b}."""
    flat = {}
    for key, value in row.items():
        if isinstance(value, list):
            flat.update(flatten({f"{key}/{i}": v for i, v in enumerate(value)}))
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            flat[key] = value
    return flat


class Metrics:
    """metrics.jsonl, one JSON object per line, mirrored to wandb when asked."""

    def __init__(self, path: Path, wandb_run=None):
        self.path, self.wandb = path, wandb_run

    def trim(self, last_iter: int) -> None:
        """Drop lines a killed run wrote after its checkpoint, so a resume does not repeat them."""
        if not self.path.exists():
            return
        def per_step(row):      # logged with the index of the step, not the count of steps done
            return row["kind"] == "train" or row.get("event") == "nonfinite"
        keep = [row for row in read_jsonl(self.path)
                if row["iter"] <= (last_iter - 1 if per_step(row) else last_iter)]
        write_atomic(self.path, "".join(json_line(row) for row in keep))

    def log(self, row: dict) -> None:
        try:
            append_line(self.path, json_line(row))
        except UserError as e:      # the checkpoints already saved are whole
            folder = self.path.parent
            kept = (f"ckpt.pt is whole: once the file can be written, {how_to_continue(folder)}"
                    if (folder / "ckpt.pt").exists() else "no checkpoint had been saved yet")
            raise UserError(f"{e}; the run stopped, and {kept}") from None
        if self.wandb is not None:
            try:
                self.wandb.log(flatten(row), step=row["iter"])
            except Exception as e:   # a logging service must never stop training
                print(f"warning: wandb logging failed ({e}); continuing without it", file=sys.stderr)
                self.wandb = None


def start_wandb(cfg: TrainConfig, config: dict):
    if not cfg.wandb:
        return None
    try:
        import wandb
        return wandb.init(project=cfg.wandb_project, name=cfg.wandb_run_name or Path(cfg.out_dir).name,
                          config=config, dir=cfg.out_dir, group=cfg.wandb_group or None,
                          job_type=cfg.wandb_job_type or None,
                          tags=[t.strip() for t in cfg.wandb_tags.split(",") if t.strip()] or None)
    except Exception as e:
        print(f"warning: wandb could not start ({first_line(e)}); "
              "training goes on without it", file=sys.stderr)
        return None

