"""The command line: argv parsed into typed values, and the --help text.

`--name=value` overrides any field of the sections a command takes; `--config NAME` reads a
shipped config (configs/) or a TOML file first (config_files.py); `--sweep name=a,b` and a file's
[sweep] table give the axes of a sweep.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import sys
from dataclasses import dataclass

from .config import REPLACED, GPTConfig, SweepConfig, TrainConfig, build, field_type
from .config_files import (LINK, SECTIONS, available_configs, convert, fields_of, linked_values, read_config_file,
                           replacement, shown, tune_grid, unknown_name_message)
from .errors import UserError, say_error

# a sweep sets these itself, and takes its own options (seeds, jobs, launcher, slurm_*) once
RESERVED_AXES = ("seed", "out_dir", "resume", "overwrite", *SweepConfig.__dataclass_fields__)

@dataclass
class Args:
    """A parsed command line: the config file's values, then the overrides on top."""
    values: dict                      # field name -> typed value, file first, then overrides
    sweep: dict[str, list]            # axis name -> values to try ("a:b" -> (a, b) pairs: linked)
    config_name: str | None = None    # --config: where the values not given on the command line came from
    from_file: tuple[str, ...] = ()   # those values' names
    tune: dict[str, list] = dataclasses.field(default_factory=dict)   # option -> grid, tuned per setting

    def blame(self, message: str) -> str:
        """A validation message that names values (name=value), with the file that set them: a
        value checked against others is wrong where it was written, not where it is checked."""
        named = [n for n in dict.fromkeys(re.findall(r"\b([a-z][a-z0-9_]*)=", message))
                 if n in self.from_file]
        return f"{message} ({', '.join(named)} set by --config {self.config_name})" if named else message


def parse_argv(argv: list[str], sections=SECTIONS) -> Args:
    """The values, axes and config file a command line gives a command taking `sections`."""
    fields = fields_of(sections)
    config_name, raw, sweep, tune = read_tokens(argv, fields, sections)
    values, file_sweep, file_tune = read_config_file(config_name) if config_name else ({}, {}, {})
    source = dict(config_name=config_name,
                  from_file=tuple(n for n in (*values, *file_sweep) if n not in raw and n not in sweep))
    values.update(raw)
    check_given(fields, values, raw, sweep, file_sweep, config_name, sections)
    if SweepConfig not in sections:     # a command that runs one setting: each axis needs a value
        unset = [name for name in dict.fromkeys([*file_sweep, *file_tune]) if name not in raw]
        if unset:
            picks = " ".join(f"--{name}={shown({**file_tune, **file_sweep}[name][0])}" for name in unset
                             if LINK not in name)
            raise UserError(f"{config_name} sweeps {', '.join(unset)}; this command runs one "
                            f"setting: pick one value for each, e.g. {picks}")
        return Args(values=values, sweep={}, **source)
    axes = {**file_sweep, **sweep}
    for name in sweep:      # a command line's linked axis replaces the file's axes of its options
        for old in [key for key in file_sweep if key != name and set(key.split(LINK)) & set(name.split(LINK))]:
            axes.pop(old)
    check_axes(raw, sweep, file_sweep, config_name)
    for name in tune:       # a command line's tuning replaces the file's axis of that option
        if name in file_sweep and name not in sweep:
            axes.pop(name)
    tune = {**file_tune, **tune}
    check_tune(raw, axes, tune)
    return Args(values=values, sweep=axes, tune=tune, **source)


def read_tokens(argv: list[str], fields: dict, sections) -> tuple[str | None, dict, dict[str, list], dict[str, list]]:
    """(--config's name, --name=value overrides, --sweep axes, --tune grids) as typed values."""
    config_name, raw, sweep, tune = None, {}, {}, {}
    tokens = list(argv)
    for token in tokens:
        if not token.isascii():     # bytes a shell passed on that are not UTF-8 become surrogates
            try:
                token.encode("utf-8")
            except UnicodeEncodeError:
                raise UserError(f"{token!r} is not UTF-8 text (\\udcXX marks a byte that is not); "
                                "give names and paths in UTF-8") from None
    while tokens:
        token = tokens.pop(0)
        if not token.startswith("--"):
            raise UserError(f"unexpected argument {token!r}; options look like --name=value")
        name, eq, value = token[2:].partition("=")
        if not eq:
            if tokens and not tokens[0].startswith("--"):
                value = tokens.pop(0)
            elif name in fields and field_type(*fields[name]) is bool:
                value = "true"
            elif name not in fields and name not in ("config", "sweep", "tune"):
                raise UserError(unknown_name_message(name, fields))
            else:
                raise UserError(f"--{name} needs a value: --{name}=VALUE")
        if name in ("sweep", "tune") and SweepConfig not in sections:
            raise UserError(f"--{name}: this command runs one setting; sweeps run with python train.py")
        if name == "config" and TrainConfig not in sections:
            raise UserError("--config: this command takes the model's settings from the checkpoint "
                            "in --out_dir")
        if name == "config":
            if not value:
                raise UserError("--config is empty; give a config's name or a .toml path")
            if config_name is not None:
                raise UserError(f"--config is given twice ({config_name}, {value}); give one file, and "
                                "the values to change as --name=value")
            config_name = value
        elif name == "tune":
            option, eq, values = value.partition("=")
            if not eq or not values:
                raise UserError(f"--tune {value!r} should look like --tune learning_rate=3e-3,1e-2,3e-2")
            if option in tune:
                raise UserError(f"--tune {option} is given twice; list all its values in one")
            tune[option] = tune_grid(option, values.split(","), "--tune")
        elif name == "sweep":
            axis, eq, values = value.partition("=")
            if not eq or not values:
                raise UserError(f"--sweep {value!r} should look like --sweep name=v1,v2")
            for part in axis.split(LINK):
                check_axis_name(part, fields)
            if len(set(axis.split(LINK))) != len(axis.split(LINK)):
                raise UserError(f"--sweep {axis} links an option with itself; link two different options")
            if axis in sweep:
                raise UserError(f"--sweep {axis} is given twice; list all its values in one: "
                                f"--sweep {axis}=v1,v2")
            if LINK in axis:
                sweep[axis] = linked_values(axis, values.split(","),
                                            lambda n, v: convert(n, v, fields, axis=True), "--sweep")
            else:
                sweep[axis] = [convert(axis, v, fields, axis=True) for v in values.split(",")]
        else:
            raw[name] = convert(name, value, fields)
    return config_name, raw, sweep, tune


def check_axis_name(axis: str, fields: dict) -> None:
    if axis in REPLACED:
        raise UserError(f"--sweep {axis}: {axis} was replaced; use {replacement(axis)}")
    if axis not in fields:
        close = difflib.get_close_matches(axis, list(fields), n=1)
        hint = f"; did you mean {close[0]}?" if close else "; see --help for the fields"
        raise UserError(f"--sweep {axis}: not a config field{hint}")


def check_given(fields: dict, values: dict, raw: dict, sweep: dict, file_sweep: dict,
                config_name: str | None, sections) -> None:
    """Refuse a value no command may set (the vocabulary size), and --resume with a config file."""
    for name, (cls, f) in fields.items():
        if "given_by" in f.metadata and name in {**values, **file_sweep, **sweep}:
            where = (f"--{name}" if name in raw else f"--sweep {name}" if name in sweep
                     else f"{config_name} sets {name}")
            raise UserError(f"{where}: {name} is set by {f.metadata['given_by']}, not by hand; remove it")
    if config_name and values.get("resume") and not (sweep or file_sweep) and SweepConfig in sections:
        # the file's values would silently replace the run's own (its warmup, its schedule); for
        # train.py alone, as the bench refuses --resume in its own words
        folder = values.get("out_dir", TrainConfig.out_dir)
        raise UserError(f"--resume continues a run with the settings in its checkpoint, which "
                        f"{config_name}'s would replace; run train.py --out_dir={shown(folder)} "
                        "--resume, adding only what should change (e.g. --max_iters)")


def check_axes(raw: dict, sweep: dict, file_sweep: dict, config_name: str | None) -> None:
    """Refuse axes the sweep sets itself, a value listed twice, an axis also given one value, and
    an option on two axes."""
    on_axis = {}
    for name, listed in {**file_sweep, **sweep}.items():
        where = "--sweep" if name in sweep else config_name
        for part in name.split(LINK):
            if part in RESERVED_AXES:
                hint = "; use --seeds=N for seeds" if part.startswith("seed") else ""
                raise UserError(f"{f'--sweep {name}' if name in sweep else f'{config_name} sweeps {name}'}: "
                                f"the sweep sets {part} itself{hint}")
            if part in on_axis and on_axis[part] != name:
                raise UserError(f"{part} is on two axes ({on_axis[part]} and {name}); give it on one")
            on_axis[part] = name
        twice = [v for i, v in enumerate(listed) if v in listed[:i]]
        if twice:   # 1 and true, or 1e-3 and 0.001, are one value once typed
            value = LINK.join(map(shown, twice[0])) if LINK in name else shown(twice[0])
            raise UserError(f"{where} lists {name}={value} twice; list each value once")
        for part in (p for p in name.split(LINK) if p in raw):      # the axis would win unseen
            if LINK in name:
                raise UserError(f"--{part}={shown(raw[part])} is also swept by {where} ({name}); give one or "
                                "the other")
            axis = ",".join(shown(v) for v in sweep.get(name, file_sweep.get(name)))
            fix = ("give one or the other" if name in sweep else
                   f"to run only some values, give them as --sweep {name}={shown(raw[name])}")
            raise UserError(f"--{name}={shown(raw[name])} is also swept by {where} ({name}={axis}); {fix}")


def check_tune(raw: dict, axes: dict, tune: dict) -> None:
    """Refuse a tuned option the sweep sets itself, one that is also an axis, and one also given a
    single value on the command line."""
    swept = {part for name in axes for part in name.split(LINK)}
    for name in tune:
        if name in RESERVED_AXES:
            raise UserError(f"--tune {name}: the sweep sets {name} itself; tune a setting such as learning_rate")
        if name in swept:
            raise UserError(f"--tune {name}: {name} is also an axis of the sweep; each setting is tuned over "
                            f"{name} alone or compared along it, not both: drop it from one")
        if name in raw:
            raise UserError(f"--{name}={shown(raw[name])} is also tuned by --tune {name}; give one or the other")


# --help's headings for the training options, in the order a run is thought through
TRAIN_GROUPS = {
    "data": ("dataset", "data_dir", "data_url", "init_from"),
    "optimisation": ("batch_size", "gradient_accumulation_steps", "max_iters", "optimizer", "learning_rate",
                     "weight_decay", "beta1", "beta2", "muon_lr", "muon_momentum", "muon_weight_decay",
                     "muon_split", "muon_dtype", "muon_head_group", "muon_momentum_warmup", "muon_momentum_start",
                     "embed_lr", "head_lr", "grad_clip", "skip_nonfinite", "stop_hopeless"),
    "schedule": ("lr_schedule", "warmup_iters", "lr_decay_iters", "min_lr", "min_lr_ratio", "cooldown_frac"),
    "evaluation and checkpoints": ("eval_interval", "eval_iters", "eval_train", "eval_batch_size", "out_dir",
                                   "resume", "overwrite", "adopt_checkpoint", "pause_at"),
    "logging": ("log_interval", "diagnostics", "wandb", "wandb_project", "wandb_run_name", "wandb_group",
                "wandb_job_type", "wandb_tags"),
    "system": ("device", "dtype", "matmul_precision", "compile", "threads", "flush_denormal", "thread_split",
               "seed"),
}


def help_groups(sections) -> list[tuple[str, list]]:
    """(heading, fields) for --help: the model's, the training options by TRAIN_GROUPS, then each
    other section's under its own name (SampleConfig: sample)."""
    groups = []
    for cls in sections:
        fields = {f.name: f for f in dataclasses.fields(cls)}
        if cls is TrainConfig:
            groups += [(heading, [fields[name] for name in names]) for heading, names in TRAIN_GROUPS.items()]
        else:
            heading = "model" if cls is GPTConfig else cls.__name__.removesuffix("Config").lower()
            groups.append((heading, list(fields.values())))
    return groups


def help_text(prog: str, sections=SECTIONS, hidden=()) -> str:
    """--help: each field of sections, one line each under its heading, with its default, its
    choices and its help; but those named in hidden."""
    configs, sweeps = TrainConfig in sections, SweepConfig in sections
    lines = [f"usage: python {prog}{' [--config NAME]' if configs else ''} [--name=value ...]"
             f"{' [--sweep name=v1,v2 ...]' if sweeps else ''}", ""]
    if configs:
        lines.append(f"--config NAME: one of {', '.join(available_configs())}, or a .toml path")
    if sweeps:
        lines.append("--sweep name=v1,v2: run every combination of the listed values (see sweep below); "
                     "--sweep a:b=1:2,3:4 moves a and b together")
        lines.append("--tune name=v1,v2,...: train each setting at every value (tuning seeds), then its seeds at "
                     "its best value (docs/sweeps.md, Tuning)")
    if configs:
        lines.append("")
    for heading, fields in help_groups(sections):
        shown_fields = [f for f in fields if "given_by" not in f.metadata and f.name not in hidden]
        if not shown_fields:
            continue
        lines.append(f"{heading}:")
        for f in shown_fields:
            choices = f.metadata.get("choices")
            option = f"--{f.name}={shown(f.default)}" + (f" [{' | '.join(choices)}]" if choices else "")
            lines.append(f"  {option:<32} {f.metadata['help']}")
        lines.append("")
    lines.append("docs/options.md tells each option at length.")
    return "\n".join(lines)


def run_command(prog: str, config_type, argv: list[str] | None, act, show) -> int:
    """The main() of a command over one config section: --help, or the arguments built into
    config_type and act(cfg)'s result printed as show(cfg, result); a UserError is one line on
    stderr and exit status 2."""
    argv = sys.argv[1:] if argv is None else argv
    if "-h" in argv or "--help" in argv:
        print(help_text(prog, (config_type,)))
        return 0
    try:
        cfg = build(config_type, parse_argv(argv, (config_type,)).values)
        result = act(cfg)
    except UserError as e:
        say_error(e)
        return 2
    print(show(cfg, result))
    return 0
