"""The README and docs/ say only what the checkout holds: every relative link and every backticked path of the project
names a file or folder that exists, every command line of a ```bash block that runs one of the project's commands
uses only flags that command takes, and every ```python block compiles."""

import argparse
import importlib
import importlib.metadata
import re
import shlex

import pytest
from helpers import REPO_ROOT
from transformers import HfArgumentParser

from vaswani.finetuning.trainer import FinetuningArguments


PAGES = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]
# What a run creates, not the checkout.
CREATED_BY_RUNS = ("outputs/",)
# Commands whose flags go on to a library's own parser once theirs have parsed: its dataclasses.
LIBRARY_FLAGS = {"vaswani.scripts.finetune": FinetuningArguments}
ENTRY_POINTS = {
    entry.name: entry.value
    for entry in importlib.metadata.entry_points(group="console_scripts")
    if entry.value.startswith("vaswani.scripts.")
}


def fenced_blocks(page, language):
    """(line number, source) of each ```language block of a page."""
    text = page.read_text()
    return [
        (text.count("\n", 0, match.start()) + 2, match[1])
        for match in re.finditer(rf"^```{language}\n(.*?)^```", text, re.DOTALL | re.MULTILINE)
    ]


def page_id(page):
    return str(page.relative_to(REPO_ROOT))


def links(page):
    """(target, path it names) of each relative markdown link, and of each backticked path whose first folder is one
    of the checkout's."""
    text = page.read_text()
    top = {entry.name for entry in REPO_ROOT.iterdir()} - {".git"}
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if not re.match(r"[a-z]+:|#", target):
            yield target, page.parent / target.split("#")[0]
    for path in re.findall(r"`([^`\s]+/[^`\s]*)`", text):
        path = path.split("::")[0]
        if path.split("/")[0] in top and not path.startswith(CREATED_BY_RUNS) and not re.search(r"[*{}]", path):
            yield path, REPO_ROOT / path


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_every_link_and_path_names_what_the_checkout_holds(page):
    missing = [target for target, path in links(page) if not path.exists()]
    assert not missing, f"{page_id(page)} names what the checkout does not hold: {missing}"


def command_lines():
    """(page, line number, module, arguments) of each command line of a ```bash block that runs a project command:
    its entry point, `python scripts/NAME.py` or `accelerate launch ... scripts/NAME.py`."""
    for page in PAGES:
        for first_line, block in fenced_blocks(page, "bash"):
            for line_number, line in logical_lines(block, first_line):
                for words in commands_in(line):
                    found = project_command(words)
                    if found is not None:
                        yield page, line_number, *found


def logical_lines(block, first_line):
    """(line number, line) of each shell line of a block, its continuation lines joined."""
    pending, start = [], first_line
    for number, line in enumerate(block.splitlines(), start=first_line):
        if not pending:
            start = number
        pending.append(line.rstrip().removesuffix("\\"))
        if not line.rstrip().endswith("\\"):
            yield start, " ".join(pending)
            pending = []


def commands_in(line):
    """The words of each command of a shell line (split at `&&`, `||`, `;` and `|`; comments and the brackets that
    mark an optional flag left out)."""
    words = [word.strip("[]") for word in shlex.split(line, comments=True)]
    command = []
    for word in words:
        if word in ("&&", "||", ";", "|"):
            yield command
            command = []
        elif word:
            command.append(word)
    yield command


def project_command(words):
    """(module, arguments) when `words` run a project command, else None."""
    while words and re.fullmatch(r"\w+=\S*", words[0]):  # environment variables
        words = words[1:]
    if not words:
        return None
    if words[0] in ENTRY_POINTS:
        return ENTRY_POINTS[words[0]].split(":")[0], words[1:]
    if words[0] in ("python", "python3") or words[:2] == ["accelerate", "launch"]:
        for index, word in enumerate(words):
            if re.fullmatch(r"scripts/\w+\.py", word):
                return f"vaswani.scripts.{word[len('scripts/') : -len('.py')]}", words[index + 1 :]
    return None


def option_lines(help_text):
    """The flags of the option lines of an argparse help (each option's line starts two spaces in)."""
    return {
        flag for line in help_text.splitlines() if line.startswith("  -") for flag in re.findall(r"--[\w-]+", line)
    }


def accepted_flags(module, capsys):
    """The flags a command takes, from its own parser: its --help, and the library's parser it hands the rest to."""
    with pytest.raises(SystemExit) as exited:
        importlib.import_module(module).main(["--help"])
    assert exited.value.code == 0
    flags = option_lines(capsys.readouterr().out)
    if module in LIBRARY_FLAGS:
        flags |= option_lines(HfArgumentParser([LIBRARY_FLAGS[module]]).format_help())
    return flags


COMMANDS = list(command_lines())


@pytest.fixture(autouse=True)
def wide_help(monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # one option per line, whatever the terminal


@pytest.mark.parametrize(
    ("page", "line_number", "module", "arguments"),
    COMMANDS,
    ids=[f"{page_id(page)}:{line}:{module.split('.')[-1]}" for page, line, module, _ in COMMANDS],
)
def test_every_documented_command_uses_only_flags_it_takes(page, line_number, module, arguments, capsys):
    flags = {word.split("=")[0] for word in arguments if word.startswith("--")}
    unknown = flags - accepted_flags(module, capsys)
    assert not unknown, f"{page_id(page)}, line {line_number}: {module} takes no {sorted(unknown)}"


def test_the_documented_commands_are_found():
    """The parsing above finds the commands it checks: each page's way of writing them, every script."""
    modules = {module for _, _, module, _ in COMMANDS}
    assert {"vaswani.scripts.train", "vaswani.scripts.finetune", "vaswani.scripts.convert_fairseq"} <= modules
    assert any(arguments[:1] == ["..."] for _, _, module, arguments in COMMANDS if module == "vaswani.scripts.train")


@pytest.mark.parametrize(
    ("page", "line_number", "source"),
    [(page, line, source) for page in PAGES for line, source in fenced_blocks(page, "python")],
    ids=lambda value: (
        page_id(value) if hasattr(value, "relative_to") else str(value) if isinstance(value, int) else ""
    ),
)
def test_every_python_block_compiles(page, line_number, source):
    compile(source, f"{page_id(page)}:{line_number}", "exec")


def test_the_option_lines_of_a_help_are_its_flags():
    parser = argparse.ArgumentParser(prog="x", description="see --not_a_flag")
    parser.add_argument("--dataset_dir", "--dataset-dir", help="read by --also_not_a_flag")
    parser.add_argument("--long_name_that_pushes_its_help_to_the_next_line_of_the_help", action="store_true")
    assert option_lines(parser.format_help()) == {
        "--help",
        "--dataset_dir",
        "--dataset-dir",
        "--long_name_that_pushes_its_help_to_the_next_line_of_the_help",
    }
