"""Every train.py, sample.py, gpt.evaluate, gpt.export and gpt.bench command that README.md and docs/*.md show must parse into
valid configs, and the option tables must list every field, so the documentation cannot drift
from the options the code has. README.md stays short and links every page of docs/."""

import dataclasses
import re
import shlex
from pathlib import Path

import pytest

from conftest import ROOT
from gpt.bench import BenchConfig
from gpt.cli import parse_argv
from gpt.config import GPTConfig, SampleConfig, SweepConfig, TrainConfig, build
from gpt.evaluate import EvaluateConfig
from gpt.export import ExportConfig

SCRIPTS = {  # how a command starts -> the config sections it takes
    "train.py": (GPTConfig, TrainConfig, SweepConfig),
    "sample.py": (SampleConfig,),
    "-m gpt.bench": (GPTConfig, TrainConfig, BenchConfig),
    "-m gpt.evaluate": (EvaluateConfig,),
    "-m gpt.export": (ExportConfig,),
}
OPTIONS_PAGE = ROOT / "docs" / "options.md"     # holds the table of every option
README_MAX_LINES = 200


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def page_commands(text: str) -> list[tuple[str, list[str]]]:
    pieces = re.findall(r"```[a-z]*\n(.*?)```", text, flags=re.S)
    pieces += re.findall(r"(?<!`)`([^`]+)`(?!`)", re.sub(r"```.*?```", "", text, flags=re.S))
    commands = []
    for piece in pieces:
        for line in piece.replace("\\\n", " ").replace("\n  ", " ").splitlines():
            for part in line.split("  #")[0].split("&&"):     # `pip install -e . && python ...` too
                part = part.strip()
                match = re.match(r"(?:python|torchrun(?: --\S+)*) (train\.py|sample\.py|-m gpt\.bench|-m gpt\.evaluate|-m gpt\.export)\b(.*)", part)
                if match and "NAME" not in part and "..." not in part and "--help" not in part:
                    commands.append((match.group(1), shlex.split(match.group(2))))
    return commands


def doc_commands() -> list[tuple[str, str, list[str]]]:
    return [(page.relative_to(ROOT).as_posix(), script, argv)
            for page in pages() for script, argv in page_commands(page.read_text())]


def test_the_docs_show_commands_of_each_script():
    found = doc_commands()
    assert {script for _, script, _ in found} == set(SCRIPTS)
    assert len(found) >= 15


def test_the_readme_shows_commands_of_each_script_but_the_bench():
    found = {script for script, _ in page_commands((ROOT / "README.md").read_text())}
    assert {"train.py", "sample.py"} <= found


@pytest.mark.parametrize("page, script, argv", doc_commands(),
                         ids=lambda value: value if isinstance(value, str) else " ".join(value)[:60])
def test_a_documented_command_parses_into_valid_configs(page, script, argv):
    sections = SCRIPTS[script]
    values = parse_argv(argv, sections).values
    for cls in sections:
        build(cls, values)


def test_the_model_flag_table_lists_every_model_field():
    text = OPTIONS_PAGE.read_text()
    missing = [f.name for f in dataclasses.fields(GPTConfig) if f"| `{f.name}` |" not in text]
    assert missing == []


@pytest.mark.parametrize("cls", [TrainConfig, SweepConfig, SampleConfig, EvaluateConfig, ExportConfig, BenchConfig],
                         ids=lambda c: c.__name__)
def test_the_option_tables_list_every_field(cls):
    text = OPTIONS_PAGE.read_text()
    missing = [f.name for f in dataclasses.fields(cls) if f"| `{f.name}` |" not in text]
    assert missing == []


def test_the_readme_is_short_and_shows_the_test_command():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES
    assert any("pytest" in line and line.startswith(("pip ", "python")) for line in lines)


def test_the_readme_links_every_docs_page_and_each_link_exists():
    linked = set(re.findall(r"\]\((docs/[^)#\s]+\.md)(?:#[^)]*)?\)", (ROOT / "README.md").read_text()))
    assert len(list((ROOT / "docs").glob("*.md"))) >= 5
    assert [link for link in sorted(linked) if not (ROOT / link).is_file()] == []
    assert linked == {page.relative_to(ROOT).as_posix() for page in (ROOT / "docs").glob("*.md")}


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


@pytest.mark.parametrize("page", pages(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_and_anchor_resolves(page):
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
        if re.match(r"[a-z]+:", target):
            continue                                    # http(s), mailto: not checked offline
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(target)
        elif anchor and dest.suffix == ".md":
            headings = re.findall(r"^#+ (.+)$", re.sub(r"```.*?```", "", dest.read_text(), flags=re.S), flags=re.M)
            if anchor not in {slug(h) for h in headings}:
                broken.append(target)
    assert broken == []


def test_an_install_holds_every_subpackage():
    import tomllib

    import setuptools
    include = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    packages = {str(p.parent.relative_to(ROOT)).replace("/", ".") for p in (ROOT / "gpt").rglob("__init__.py")}
    assert len(packages) > 1 and set(setuptools.find_packages(str(ROOT), include=include)) == packages
