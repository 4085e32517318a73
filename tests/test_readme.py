"""Every train.py, sample.py and gpt.bench command README.md shows must parse into valid configs,
so the README cannot drift from the options the code has."""

import dataclasses
import re
import shlex

import pytest

from conftest import ROOT
from gpt.bench import BenchConfig
from gpt.cli import parse_argv
from gpt.config import GPTConfig, SampleConfig, SweepConfig, TrainConfig, build

SCRIPTS = {  # how a command starts -> the config sections it takes
    "train.py": (GPTConfig, TrainConfig, SweepConfig),
    "sample.py": (SampleConfig,),
    "-m gpt.bench": (GPTConfig, TrainConfig, BenchConfig),
}


def readme_commands() -> list[tuple[str, list[str]]]:
    text = (ROOT / "README.md").read_text()
    pieces = re.findall(r"```[a-z]*\n(.*?)```", text, flags=re.S)
    pieces += re.findall(r"(?<!`)`([^`]+)`(?!`)", re.sub(r"```.*?```", "", text, flags=re.S))
    commands = []
    for piece in pieces:
        for line in piece.replace("\\\n", " ").replace("\n  ", " ").splitlines():
            line = line.split("  #")[0].strip()
            match = re.match(r"(?:python|torchrun(?: --\S+)*) (train\.py|sample\.py|-m gpt\.bench)\b(.*)", line)
            if match and "NAME" not in line and "..." not in line and "--help" not in line:
                commands.append((match.group(1), shlex.split(match.group(2))))
    return commands


def test_the_readme_shows_commands_of_each_script():
    found = readme_commands()
    assert {script for script, _ in found} == set(SCRIPTS)
    assert len(found) >= 15


@pytest.mark.parametrize("script, argv", readme_commands(),
                         ids=lambda value: value if isinstance(value, str) else " ".join(value)[:60])
def test_a_readme_command_parses_into_valid_configs(script, argv):
    sections = SCRIPTS[script]
    values = parse_argv(argv, sections).values
    for cls in sections:
        build(cls, values)


def test_the_model_flag_table_lists_every_model_field():
    text = (ROOT / "README.md").read_text()
    missing = [f.name for f in dataclasses.fields(GPTConfig) if f"| `{f.name}` |" not in text]
    assert missing == []
