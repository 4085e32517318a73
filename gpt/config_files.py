"""Config files and values by field name: configs/NAME.toml or a TOML path read into typed values,
a command-line string or TOML value turned into its field's type, and a value shown as typed.

The command line (cli.py) parses argv over these; checkpoints, a run's time estimate and the sweep
read config files and show values through here alone, so none of them imports the command line.
"""

from __future__ import annotations

import dataclasses
import datetime
import difflib
import math
import re
import tomllib
from pathlib import Path

from .config import REPLACED, REPO_ROOT, SPELLED, GPTConfig, SweepConfig, TrainConfig, field_type, user_path
from .errors import UserError

CONFIG_DIR = REPO_ROOT / "configs"

SECTIONS = (GPTConfig, TrainConfig, SweepConfig)


def fields_of(sections) -> dict:
    return {f.name: (cls, f) for cls in sections for f in dataclasses.fields(cls)}


FIELDS = fields_of(SECTIONS)


def replacement(name: str, toml: bool = False, axis: bool = False) -> str:
    """How to say what the replaced option `name` said: on the command line, in a TOML file, or
    as an axis of a TOML file's [sweep] table."""
    field, values = REPLACED[name]
    if axis:
        return f"{field} = [...], with " + ", ".join(f'"{new}" for {shown(old)}' for old, new in values.items())
    said = (f'{field} = "{new}"' if toml else f"--{field}={new}" for new in values.values())
    return ", ".join(f"{s} for {shown(old)}" for s, old in zip(said, values))


def convert(name: str, value, fields: dict = FIELDS, axis: bool = False):
    """Turn a command-line string or a TOML value into the type of field `name`. A folder keeps
    its ~ on a sweep axis, where it names the run folders; the runs expand it."""
    if name not in fields:
        raise UserError(unknown_name_message(name, fields))
    kind = field_type(*fields[name])
    if kind is bool:
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in ("true", "1", "yes", "on"):
            return True
        if text in ("false", "0", "no", "off"):
            return False
    elif kind is int and not isinstance(value, bool):
        try:
            return int(str(value).strip())
        except ValueError:
            pass
        try:    # 1e4 and 5000.0 are whole numbers too; float() alone would round past 2**53
            number = float(value)
            if number == int(number):
                return int(number)
        except (TypeError, ValueError, OverflowError):
            pass
    elif kind is float and not isinstance(value, bool):
        try:
            number = float(value)
            if math.isfinite(number):
                return number
        except (TypeError, ValueError, OverflowError):
            pass
    elif kind is str:   # a folder given by the user is taken as the shell would have it
        folder = name.endswith("_dir") and str(value).strip() and not axis
        return user_path(str(value), name) if folder else str(value)
    given = value.isoformat() if isinstance(value, (datetime.date, datetime.time)) else repr(value)  # TOML's
    raise UserError(f"{name}={given} is not a valid {kind.__name__}; give {SPELLED.get(kind, kind.__name__)}")


def unknown_name_message(name: str, fields: dict = FIELDS) -> str:
    classes = {cls for cls, _ in fields.values()}
    if name in REPLACED and name not in fields and TrainConfig in classes:
        return f"--{name} was replaced; use {replacement(name)}"
    extra = ["config"] * (TrainConfig in classes) + ["sweep"] * (SweepConfig in classes)
    close = difflib.get_close_matches(name, list(fields) + extra, n=1)
    hint = f"; did you mean --{close[0]}?" if close else "; see --help for the list"
    return f"unknown option --{name}{hint}"


def available_configs() -> list[str]:
    return sorted(str(p.relative_to(CONFIG_DIR).with_suffix("")) for p in CONFIG_DIR.rglob("*.toml"))


def config_path(name: str) -> Path:
    """A config shipped in configs/ or a TOML file, '.toml' optional. A name that reads as a path
    (a .toml suffix, or a start of /, ./, ../ or ~) is looked up as a file first, a bare name
    in configs/ first."""
    stem = name.removesuffix(".toml")
    as_path = name.endswith(".toml") or name.startswith(("/", "./", "../", "~"))
    places = [Path(user_path(f"{stem}.toml", "--config")), CONFIG_DIR / f"{stem}.toml"]
    for candidate in places if as_path else places[::-1]:
        if candidate.is_file():
            return candidate
    if as_path and (places[0].is_dir() or Path(user_path(name, "--config")).is_dir()):
        raise UserError(f"--config {name!r} is a folder; give a TOML file in it, or a shipped config's name")
    close = difflib.get_close_matches(stem, available_configs(), n=1)
    hint = f"did you mean {close[0]}? " if close else ""
    what = "no such file, nor a shipped config of that name" if as_path else "no config named"
    raise UserError(f"{what} {name!r}; {hint}available: {', '.join(available_configs())}")


def read_config_file(name: str) -> tuple[dict, dict[str, list], dict[str, list]]:
    """Return (field values, sweep axes, tuned options) from a TOML config; `[sweep]` holds the
    axes (a key "a:b" links two, its values [a, b] pairs), `[tune]` each tuned option's grid."""
    path = config_path(name)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8-sig"))
    except tomllib.TOMLDecodeError as e:
        raise UserError(f"{path}: {twice_set(path, e) or e}") from None
    except UnicodeDecodeError:
        raise UserError(f"{path} is not UTF-8 text; is it a TOML config?") from None
    except OSError as e:
        raise UserError(f"{path} cannot be read ({e.strerror})") from None
    axes, tune = data.pop("sweep", {}), data.pop("tune", {})
    if not isinstance(axes, dict):
        raise UserError(f"{path}: [sweep] must be a table of axis = [values]")
    if not isinstance(tune, dict) or not all(isinstance(v, list) for v in tune.values()):
        raise UserError(f"{path}: [tune] must be a table of option = [values], e.g. learning_rate = [3e-3, 1e-2, 3e-2]")

    def typed(key, value, axis=False):
        if key in REPLACED:
            raise UserError(f"{path}: {'[sweep] ' * axis}{key} was replaced; use "
                            f"{replacement(key, toml=True, axis=axis)}")
        if isinstance(value, dict):     # [model], [train]: sections this file format has not
            raise UserError(f"{path}: [{'sweep.' * axis}{key}] is a table; settings go at the top "
                            "level, name = value, and axes in [sweep], name = [values]")
        if key not in FIELDS:
            close = difflib.get_close_matches(key, list(FIELDS), n=1)
            raise UserError(f"{path}: {key} is not a setting"
                            f"{f'; did you mean {close[0]}?' if close else '; see --help for the list'}")
        try:
            return convert(key, value, axis=axis)
        except UserError as e:
            raise UserError(f"{path}: {e}") from None
    values = {key: typed(key, value) for key, value in data.items()}
    sweep = {}
    for key, value in axes.items():
        if LINK in key:
            sweep[key] = linked_values(key, value, lambda k, v: typed(k, v, axis=True), f"{path}: [sweep]")
            continue
        option = key in SweepConfig.__dataclass_fields__
        listed = value if isinstance(value, list) and not option else [value]
        if not listed:
            raise UserError(f"{path}: [sweep] {key} = [] lists no values; give at least one")
        # [sweep] replaces a top-level value in every run: one it does not list would be lost unseen
        if key in data and values[key] not in [typed(key, v) for v in listed]:
            swept = ", ".join(shown(typed(key, v)) for v in listed)
            raise UserError(f"{path}: {key} = {shown(values[key])} at the top level is replaced by [sweep]'s "
                            f"{key} = {swept if option else f'[{swept}]'} in every run; keep one of the two")
        if option:
            values[key] = typed(key, value)
        else:
            sweep[key] = [typed(key, v, axis=True) for v in listed]
    return values, sweep, {key: tune_grid(key, listed, f"{path}: [tune]") for key, listed in tune.items()}


LINK = ":"      # an axis named n_layer:n_embd moves both options together, value by value


def linked_values(key: str, listed, typed, where: str) -> list[tuple]:
    """A linked axis's values as tuples, one part per option: from TOML pairs [2, 128] or text 2:128."""
    names = key.split(LINK)
    if len(set(names)) != len(names):
        raise UserError(f"{where} {key} links an option with itself; link two different options")
    if not isinstance(listed, list) or not listed:
        raise UserError(f"{where} {key} lists no values; give them as [{', '.join(['...'] * len(names))}] lists")
    out = []
    for value in listed:
        parts = value.split(LINK) if isinstance(value, str) else value
        if not isinstance(parts, list) or len(parts) != len(names):
            given = LINK.join(map(str, parts)) if isinstance(parts, list) else shown(value)
            example = LINK.join(f"<{n}>" for n in names)
            raise UserError(f"{where} {key}: the value {given} has {len(parts) if isinstance(parts, list) else 1} "
                            f"part(s) for {len(names)} linked options; give each as {example}")
        out.append(tuple(typed(n, p) for n, p in zip(names, parts)))
    return out


def tune_grid(name: str, listed: list, where: str) -> list:
    """The values a tuned option is tried at: numbers of its field's type, two or more, each once."""
    if name not in FIELDS or FIELDS[name][0] is SweepConfig:
        close = difflib.get_close_matches(name, [n for n, (cls, _) in FIELDS.items() if cls is not SweepConfig], n=1)
        raise UserError(f"{where} {name}: not a setting a run reads"
                        f"{f'; did you mean {close[0]}?' if close else ''}")
    if field_type(*FIELDS[name]) not in (int, float):
        raise UserError(f"{where} {name}: only a numeric option can be tuned ({name} is "
                        f"{SPELLED.get(field_type(*FIELDS[name]), 'not a number')})")
    values = []
    for v in listed:
        if isinstance(v, bool) or not isinstance(v, (int, float, str)):
            raise UserError(f"{where} {name}={shown(v)} is not a number; give a list such as 3e-3,1e-2,3e-2")
        try:
            number = convert(name, v)
        except UserError:
            raise UserError(f"{where} {name}={shown(v)} is not a number; give a list such as "
                            "3e-3,1e-2,3e-2") from None
        if number in values:
            raise UserError(f"{where} {name} lists {shown(number)} twice; list each value once")
        values.append(number)
    if len(values) < 2:
        raise UserError(f"{where} {name}={','.join(map(shown, values))} is a grid of one value, which tunes nothing; "
                        f"give 2 or more (3e-3,1e-2,3e-2), or set --{name} alone")
    return sorted(values)


def twice_set(path: Path, error: tomllib.TOMLDecodeError) -> str | None:
    """'KEY is set twice' for tomllib's error on a key given twice, which names only the line (or
    the document's end, on a last line without a newline); None for any other error."""
    found = re.match(r"Cannot overwrite a value \(at (?:line (\d+)|end of document)", str(error))
    if not found:
        return None
    lines = path.read_text(encoding="utf-8-sig").splitlines()
    at = int(found.group(1)) if found.group(1) else len(lines)
    for number in range(min(at, len(lines)), 0, -1):    # a value over several lines ends below its key
        key = re.match(r"\s*([\w.\-\"' ]+?)\s*=", lines[number - 1])
        if key:
            table = next((m.group(1) for line in reversed(lines[:number])
                          if (m := re.match(r"\s*\[([^\[\]]+)\]", line))), None)
            where = f"[{table.strip()}] " if table else ""
            return f"{where}{key.group(1)} is set twice (again at line {number}); keep one of the two"
    return None


def shown(value) -> str:
    """A value as it would be typed: true, 0.001, learned; quoted when spaces or commas would blur it."""
    if isinstance(value, bool):
        return str(value).lower()
    text = str(value)
    return repr(text) if text != text.strip() or not text or "," in text or " " in text else text
