"""gpt/cli.py and gpt/config_files.py: the command line, TOML config files, values as typed, and --help."""

import dataclasses
import re
from pathlib import Path

import pytest

from gpt.cli import help_text, parse_argv
from gpt.config_files import CONFIG_DIR, available_configs, convert, read_config_file, shown
from gpt.config import GPTConfig, SampleConfig, TrainConfig, build
from gpt.errors import UserError


def test_overrides_are_typed_and_win_over_the_file():
    args = parse_argv(["--config", "shakespeare_char", "--n_layer=4", "--learning_rate=3e-4",
                       "--compile", "--dropout", "0.1", "--device=cpu"])
    assert args.values["n_layer"] == 4 and isinstance(args.values["n_layer"], int)
    assert args.values["learning_rate"] == pytest.approx(3e-4)
    assert args.values["compile"] is True
    assert args.values["dropout"] == pytest.approx(0.1)
    assert args.values["n_embd"] == 384          # from the file


def test_shakespeare_char_is_the_baseline_recipe():
    values, sweep, _ = read_config_file("shakespeare_char")
    model, train = build(GPTConfig, values), build(TrainConfig, values)
    assert (model.n_layer, model.n_head, model.n_embd, model.block_size, model.dropout) == (6, 6, 384, 256, 0.2)
    assert (train.batch_size, train.learning_rate, train.warmup_iters, train.min_lr) == (64, 1e-3, 100, 1e-4)
    assert (train.lr_decay_iters, train.max_iters, train.beta2, train.weight_decay) == (5000, 5000, 0.99, 0.1)
    assert (train.grad_clip, train.eval_interval) == (1.0, 250)
    assert sweep == {}


@pytest.mark.parametrize("name", available_configs())
def test_every_shipped_config_loads(name):
    values, sweep, tune = read_config_file(name)
    for cls in (GPTConfig, TrainConfig):
        build(cls, values)
        fields = {f.name for f in dataclasses.fields(cls)}
        for axis, options in {**sweep, **tune}.items():
            for option in options if axis in fields else ():   # every grid point must be a valid config too
                build(cls, {**values, axis: option})


def test_each_study_at_its_second_size_is_the_study_with_only_the_size_changed():
    wide = [name for name in available_configs() if name.startswith("sweeps/wide/")]
    assert {w.replace("wide/", "") for w in wide} == {
        f"sweeps/{s}" for s in ("heads", "positions", "activations", "block", "sandwich", "norm_residual",
                                 "optimizer", "relu2", "softcap", "zero_init")}
    for name in wide:
        values, sweep, _ = read_config_file(name)
        base_values, base_sweep, _ = read_config_file(name.replace("wide/", ""))
        changed = {k for k in values.keys() | base_values.keys() if values.get(k) != base_values.get(k)}
        assert changed == {"n_embd", "out_dir"} and sweep == base_sweep, name
        assert values["n_embd"] == 2 * base_values["n_embd"]
        assert values["out_dir"] == base_values["out_dir"].replace("runs/", "runs/wide/")


def _changed(name: str, base: str) -> tuple[set, dict, dict, dict]:
    values, sweep, tune = read_config_file(name)
    base_values, base_sweep, base_tune = read_config_file(base)
    assert tune == base_tune, name
    return {k for k in values.keys() | base_values.keys() if values.get(k) != base_values.get(k)}, values, sweep, base_sweep


def test_each_tuned_study_at_another_size_or_length_changes_only_that():
    names = available_configs()
    wide = [n for n in names if n.startswith("sweeps/tuned/wide/")]
    long = [n for n in names if n.startswith("sweeps/tuned/long/")]
    w256 = [n for n in names if n.startswith("sweeps/tuned/w256/")]
    assert len(wide) >= 10 and len(long) >= 2 and len(w256) >= 2
    for name in w256:
        changed, values, sweep, base_sweep = _changed(name, name.replace("w256/", ""))
        assert values["out_dir"] == f"runs/{name.removeprefix('sweeps/')}", name
        assert changed == {"n_embd", "out_dir"} and sweep == base_sweep and values["n_embd"] == 256, name
    for name in wide:
        changed, values, sweep, base_sweep = _changed(name, name.replace("wide/", ""))
        assert values["out_dir"] == f"runs/{name.removeprefix('sweeps/')}", name
        if "n_layer:n_embd" in sweep:       # the next size of a depth-width pair: each width doubled
            assert changed == {"out_dir"}
            assert sweep["n_layer:n_embd"] == [(d, 2 * w) for d, w in base_sweep["n_layer:n_embd"]]
        else:
            assert changed == {"n_embd", "out_dir"} and sweep == base_sweep, name
    for name in long:
        changed, values, sweep, base_sweep = _changed(name, name.replace("long/", ""))
        base_values = read_config_file(name.replace("long/", ""))[0]
        # tune_halving: the long studies still to run halve their tuning grids; muon_dtype: the long
        # Muon study leaves it at auto, for a CPU that only emulates bfloat16
        assert changed <= {"max_iters", "lr_decay_iters", "eval_interval", "out_dir", "tune_halving",
                           "muon_dtype"}, name
        assert sweep == base_sweep, name
        assert values["max_iters"] == values["lr_decay_iters"] == 4 * base_values["max_iters"]


def test_the_config_list_reaches_into_subfolders():
    names = available_configs()
    assert {"shakespeare_char", "shakespeare_char_cpu", "shakespeare_char_fast", "shakespeare",
            "sweeps/norm_residual"} <= set(names)
    assert all((CONFIG_DIR / f"{n}.toml").is_file() for n in names)


@pytest.mark.parametrize("argv, message", [
    (["--n_layers=4"], r"unknown option --n_layers; did you mean --n_layer\?"),
    (["--learning_rat=1"], r"did you mean --learning_rate\?"),
    (["--n_layer=2.5"], r"n_layer='2.5' is not a valid int"),
    (["--compile=maybe"], r"compile='maybe' is not a valid bool"),
    (["--n_layer=four"], r"n_layer='four' is not a valid int"),
    (["--learning_rate=fast"], r"learning_rate='fast' is not a valid float"),
    (["--config", "nope"], r"no config named 'nope'; available: .*shakespeare_char"),
    (["n_layer=4"], r"unexpected argument 'n_layer=4'"),
    (["--sweep", "n_layer"], r"should look like --sweep name=v1,v2"),
    (["--sweep", "n_layr=1,2"], r"--sweep n_layr: not a config field; did you mean n_layer\?"),
    (["--learning_rate=nan"], r"learning_rate='nan' is not a valid float"),
    (["--grad_clip=inf"], r"grad_clip='inf' is not a valid float"),
    (["--n_layer"], r"--n_layer needs a value"),
    (["--vocab_size=100"], r"^--vocab_size: vocab_size is set by the dataset"),
    (["--sweep", "vocab_size=50,60"], r"^--sweep vocab_size: vocab_size is set by the dataset"),
    (["--sweep", "n_layer=1,2", "--sweep", "n_layer=3"], r"--sweep n_layer is given twice"),
    (["--sweep", "qk_norm=true,1"], r"--sweep lists qk_norm=true twice; list each value once"),
    (["--sweep", "learning_rate=1e-3,0.001"], r"--sweep lists learning_rate=0.001 twice"),
    (["--config", "shakespeare_chr"], r"did you mean shakespeare_char\?"),
    (["--config", "sweeps/heads", "--n_head=2"],
     re.escape("--n_head=2 is also swept by sweeps/heads (n_head=1,2,4,8); to run only some values, give them "
               "as --sweep n_head=2")),
    (["--n_head=8", "--sweep", "n_head=2,4"], re.escape("--n_head=8 is also swept by --sweep (n_head=2,4); "
                                                        "give one or the other")),
    (["--config", "shakespeare_chr.toml"], re.escape("no such file, nor a shipped config of that name "
                                                     "'shakespeare_chr.toml'; did you mean shakespeare_char?")),
])
def test_bad_command_lines_name_the_problem(argv, message):
    with pytest.raises(UserError, match=message):
        parse_argv(argv)


def test_sweep_axes_parse_to_typed_lists():
    args = parse_argv(["--sweep", "residual=true,false", "--sweep=n_head=1,2,4", "--seeds=3"])
    assert args.sweep == {"residual": [True, False], "n_head": [1, 2, 4]}
    assert args.values["seeds"] == 3
    # a --sweep on the command line replaces the file's axis of the same name
    assert parse_argv(["--config", "sweeps/heads", "--sweep", "n_head=2,4"]).sweep["n_head"] == [2, 4]


def test_whole_numbers_parse_exactly():
    assert convert("max_iters", "9007199254740993") == 2 ** 53 + 1        # float() would round it
    assert convert("max_iters", "1e4") == convert("max_iters", 5000.0) * 2 == 10000


@pytest.mark.parametrize("argv, where", [
    (["--decay_lr=false"], "--decay_lr was replaced"),
    (["--sweep", "decay_lr=true,false"], "--sweep decay_lr: decay_lr was replaced"),
    (["--decay_lr"], "--decay_lr was replaced"),         # a bool given bare meant true
])
def test_a_replaced_option_names_its_successor(argv, where):
    with pytest.raises(UserError, match=f"{where}; use --lr_schedule=cosine for true, "
                                        "--lr_schedule=constant for false"):
        parse_argv(argv)


def test_resume_refuses_a_config_file_whose_values_would_replace_the_runs(tmp_path):
    # the advice keeps the run folder the file named, which dropping --config alone would lose
    with pytest.raises(UserError, match=r"^--resume continues a run with the settings in its checkpoint, "
                                        r"which shakespeare_char_cpu's would replace; run train.py "
                                        r"--out_dir=out/shakespeare_char_cpu --resume, adding only what"):
        parse_argv(["--config", "shakespeare_char_cpu", "--resume", "--max_iters=80"])
    path = tmp_path / "resumes.toml"
    path.write_text('resume = true\nwarmup_iters = 5\n')         # said in the file: refused alike
    with pytest.raises(UserError, match=r"--out_dir=out --resume"):
        parse_argv(["--config", str(path)])


def test_a_validation_message_names_the_config_file_only_for_values_it_set():
    args = parse_argv(["--config", "sweeps/heads", "--n_layer=3"])
    assert args.blame("n_embd=64 is not divisible by n_head=3") == (
        "n_embd=64 is not divisible by n_head=3 (n_embd, n_head set by --config sweeps/heads)")
    assert args.blame("n_layer=3 is too deep") == "n_layer=3 is too deep"     # given on the command line
    assert parse_argv(["--n_head=3"]).blame("n_head=3 is odd") == "n_head=3 is odd"
    # the file's axis replaced by a plain value (gpt.bench runs one config), or a file's value by an axis
    args = parse_argv(["--config", "sweeps/heads", "--n_head=3"], (GPTConfig, TrainConfig))
    assert args.blame("n_embd=64 is not divisible by n_head=3") == (
        "n_embd=64 is not divisible by n_head=3 (n_embd set by --config sweeps/heads)")
    args = parse_argv(["--config", "shakespeare_char_cpu", "--sweep", "n_head=3,4"])
    assert args.blame("n_embd=128 is not divisible by n_head=3") == (
        "n_embd=128 is not divisible by n_head=3 (n_embd set by --config shakespeare_char_cpu)")


def test_a_replaced_option_is_unknown_to_commands_without_it():
    with pytest.raises(UserError, match=r"^unknown option --decay_lr; see --help for the list$"):
        parse_argv(["--decay_lr=false"], (SampleConfig,))


def test_a_replaced_option_in_a_config_file_names_its_successor(tmp_path):
    path = tmp_path / "old.toml"
    path.write_text("decay_lr = false\n")
    with pytest.raises(UserError, match=r'old.toml: decay_lr was replaced; use lr_schedule = "cosine" for '
                                        r'true, lr_schedule = "constant" for false'):
        parse_argv(["--config", str(path)])
    path.write_text("[sweep]\ndecay_lr = [true, false]\n")     # an axis is told an axis's spelling
    with pytest.raises(UserError, match=re.escape('old.toml: [sweep] decay_lr was replaced; use lr_schedule = '
                                                  '[...], with "cosine" for true, "constant" for false')):
        parse_argv(["--config", str(path)])


def test_help_lists_every_field_with_default_and_meaning():
    text = help_text("train.py")
    for cls in (GPTConfig, TrainConfig):
        for f in dataclasses.fields(cls):
            default = f.default
            shown = (str(default).lower() if isinstance(default, bool) else
                     repr(default) if default == "" or default == "\n" else str(default))
            if "given_by" in f.metadata:    # no command may set it
                assert f"--{f.name}=" not in text
                continue
            assert f"--{f.name}={shown}" in text and f.metadata["help"] in text
    # defaults as they would be typed on the command line
    assert "  --bias=true  " in text and "--pos_encoding=learned [" in text and "--wandb_run_name=''" in text
    assert "--sweep name=v1,v2" in text and "sweeps/norm_residual" in text
    assert "--sweep" not in help_text("sample.py", (SampleConfig,))


def test_help_groups_the_options_under_headings_one_line_each():
    from gpt.cli import TRAIN_GROUPS
    grouped = [name for names in TRAIN_GROUPS.values() for name in names]
    assert sorted(grouped) == sorted(f.name for f in dataclasses.fields(TrainConfig))     # each once
    text = help_text("train.py")
    headings = [line[:-1] for line in text.splitlines() if line.endswith(":") and not line.startswith(" ")]
    assert headings == ["model", "data", "optimisation", "schedule", "evaluation and checkpoints", "logging",
                        "system", "sweep"]
    for cls in (GPTConfig, TrainConfig):
        for f in dataclasses.fields(cls):
            lines = [line for line in text.splitlines() if line.startswith(f"  --{f.name}=")]
            assert len(lines) == ("given_by" not in f.metadata), f.name
            assert all(line.endswith(f.metadata["help"]) for line in lines), f.name
    assert text.index("  --n_layer=") < text.index("data:") < text.index("  --dataset=") < text.index("optimisation:")
    assert text.index("system:") < text.index("  --device=") < text.index("sweep:") < text.index("  --seeds=")


@pytest.mark.parametrize("argv, message", [
    (["--config", "shakespeare_char"], "--config: this command takes the model's settings from the "
     "checkpoint in --out_dir"),
    (["--sweep", "n_layer=1,2"], "--sweep: this command runs one setting; sweeps run with python train.py"),
    (["--seed=99999999999999999999"], "seed=99999999999999999999 must be in [0, 2**32)"),
])
def test_sample_takes_neither_configs_nor_sweeps(argv, message):
    with pytest.raises(UserError, match=re.escape(message)):
        build(SampleConfig, parse_argv(argv, (SampleConfig,)).values)


def test_a_command_for_one_setting_needs_a_value_for_each_axis_of_a_sweep_config():
    sections = (GPTConfig, TrainConfig)
    with pytest.raises(UserError, match=re.escape("sweeps/norm_residual sweeps norm_placement, residual, "
                                                  "learning_rate, warmup_iters; this command runs one "
                                                  "setting: pick one value for each, e.g. --norm_placement=pre")):
        parse_argv(["--config", "sweeps/norm_residual"], sections)
    args = parse_argv(["--config", "sweeps/heads", "--n_head=2"], sections)
    assert args.values["n_head"] == 2 and args.sweep == {}


def test_a_config_file_may_not_sweep_what_the_sweep_sets_itself(tmp_path):
    (tmp_path / "s.toml").write_text("[sweep]\nseed = [1, 2]\n")
    with pytest.raises(UserError, match=re.escape(f"{tmp_path / 's.toml'} sweeps seed: the sweep sets "
                                                  "seed itself; use --seeds=N for seeds")):
        parse_argv(["--config", str(tmp_path / "s.toml")])


@pytest.mark.parametrize("content, message", [
    (b"\xff\xfe", "is not UTF-8 text; is it a TOML config?"),
    (b'config = "x"', "c.toml: config is not a setting; see --help"),
    (b"n_layr = 2", "c.toml: n_layr is not a setting; did you mean n_layer?"),
    (b'n_layer = "x"', "c.toml: n_layer='x' is not a valid int"),
    (b"[model]\nn_layer = 2", "c.toml: [model] is a table; settings go at the top level, name = value, "
                              "and axes in [sweep], name = [values]"),
    (b"[sweep.model]\nn_layer = [2]", "c.toml: [sweep.model] is a table; settings go at the top level"),
    (b"max_iters = 2024-01-01", "c.toml: max_iters=2024-01-01 is not a valid int"),    # as written
])
def test_a_bad_config_file_is_named_in_the_error(content, message, tmp_path):
    (tmp_path / "c.toml").write_bytes(content)
    with pytest.raises(UserError, match=re.escape(message)):
        parse_argv(["--config", str(tmp_path / "c.toml")])
    with pytest.raises(UserError, match=re.escape(f"no such file, nor a shipped config of that name "
                                                  f"'{tmp_path / 'x.toml'}'")):
        parse_argv(["--config", str(tmp_path / "x.toml")])
    for folder in (tmp_path / "d.toml", tmp_path / "d"):
        folder.mkdir()
        with pytest.raises(UserError, match=re.escape(f"--config '{folder}' is a folder; give a TOML file "
                                                      "in it, or a shipped config's name")):
            parse_argv(["--config", str(folder)])


def test_a_shipped_config_may_be_named_with_its_suffix():
    assert parse_argv(["--config", "sweeps/heads.toml"]).sweep == parse_argv(["--config", "sweeps/heads"]).sweep


def test_a_config_file_path_may_leave_out_its_suffix(tmp_path: Path, monkeypatch):
    (tmp_path / "mine.toml").write_text("n_layer = 3\n")
    monkeypatch.chdir(tmp_path)
    for name in ("./mine", "mine", str(tmp_path / "mine")):
        assert parse_argv(["--config", name]).values["n_layer"] == 3
    (tmp_path / "shakespeare_char.toml").write_text("n_layer = 3\n")
    for name, n_layer in (("shakespeare_char", 6), ("./shakespeare_char", 3), ("shakespeare_char.toml", 3),
                          (str(tmp_path / "shakespeare_char"), 3)):    # a bare name is a shipped config
        assert parse_argv(["--config", name]).values["n_layer"] == n_layer, name
    for missing in ("./nothere", "~nosuchuser/x"):
        with pytest.raises(UserError, match=rf"^no such file, nor a shipped config of that name '{missing}'; "):
            parse_argv(["--config", missing])


def test_a_config_file_path_works(tmp_path: Path):
    path = tmp_path / "mine.toml"
    path.write_text('n_layer = 3\nlearning_rate = 1\n[sweep]\nresidual = [true, false]\nseeds = 2\n')
    values, sweep, _ = read_config_file(str(path))
    assert values == {"n_layer": 3, "learning_rate": 1.0, "seeds": 2}
    assert sweep == {"residual": [True, False]}
    path.write_text("n_layer = [\n")
    with pytest.raises(UserError, match="mine.toml"):
        read_config_file(str(path))


def test_values_are_shown_as_typed_and_quoted_where_spaces_or_commas_would_blur_them():
    values = (True, 0.001, "learned", "", "a, b", " x", "a,b")
    assert [shown(v) for v in values] == ["true", "0.001", "learned", "''", "'a, b'", "' x'", "'a,b'"]


@pytest.mark.parametrize("argv, message", [
    (["--config="], "--config is empty; give a config's name or a .toml path"),
    (["--config", "shakespeare_char_cpu", "--config", "shakespeare_char_fast"],
     "--config is given twice (shakespeare_char_cpu, shakespeare_char_fast)"),
])
def test_an_empty_or_repeated_config_is_refused(argv, message):
    with pytest.raises(UserError, match=f"^{re.escape(message)}"):
        parse_argv(argv)


def test_a_config_file_may_not_set_what_the_dataset_sets(tmp_path):
    path = tmp_path / "padded.toml"
    for text in ("vocab_size = 50304\n", "[sweep]\nvocab_size = [64, 128]\n"):
        path.write_text(text)
        with pytest.raises(UserError, match=r"padded.toml sets vocab_size: vocab_size is set by the dataset"):
            parse_argv(["--config", str(path)])


@pytest.mark.e2e
def test_an_argument_that_is_not_utf8_gets_one_line(tmp_path, capsys):
    import train
    folder = str(tmp_path) + b"/\xffdir".decode("utf-8", "surrogateescape")     # as Python hands it over
    for argv in ([f"--out_dir={folder}"], ["--out_dir", folder]):
        assert train.main([*argv, "--max_iters=2"]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: {argv[-1]!r} is not UTF-8 text") and err.count("\n") == 1, err
    assert list(tmp_path.iterdir()) == []
    assert parse_argv(["--out_dir", "/tmp/\u00e9t\u00e9"]).values["out_dir"] == "/tmp/\u00e9t\u00e9"


def test_a_config_file_saved_with_a_byte_order_mark_loads(tmp_path):
    path = tmp_path / "bom.toml"
    path.write_bytes(b"\xef\xbb\xbfn_layer = 2\n")
    assert parse_argv(["--config", str(path)]).values["n_layer"] == 2
