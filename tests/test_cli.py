"""The commands' common shape: every console entry point exists and answers --help, the flags are transformers'
`HfArgumentParser`'s of the commands' dataclasses, arguments that do not parse end with argparse's usage and status 2,
and a mistake in the input ends a command with `NAME: error: message`."""

import importlib.metadata
import sys
from dataclasses import dataclass, field
from typing import Literal

import pytest
from helpers import run_command

from vaswani.checks import UsageError
from vaswani.cli import command, parse_arguments


ENTRY_POINTS = [point for point in importlib.metadata.entry_points(group="console_scripts")
                if point.value.startswith("vaswani.scripts.")]  # fmt: skip


def test_every_command_is_a_console_entry_point():
    names = {point.name for point in ENTRY_POINTS}
    assert names == {"vaswani-prepare-data", "vaswani-train-tokenizer", "vaswani-train", "vaswani-evaluate",
                     "vaswani-finetune", "vaswani-push-to-hub", "vaswani-export-ctranslate2", "vaswani-visualize",
                     "vaswani-convert-fairseq", "vaswani-translate", "vaswani-demo"}  # fmt: skip


@pytest.mark.parametrize("point", ENTRY_POINTS, ids=lambda point: point.name)
def test_every_entry_point_answers_help(point, capsys):
    with pytest.raises(SystemExit) as raised:
        point.load()(["--help"])
    assert raised.value.code == 0
    assert "--help" in capsys.readouterr().out


@dataclass
class Arguments:
    steps: int = 1

    def __post_init__(self):
        if self.steps < 1:
            raise UsageError("--steps must be at least 1")


@pytest.mark.parametrize(
    "argv,message",
    [(["--nope", "1"], "unrecognized arguments: --nope 1"), (["--steps", "0"], "--steps must be at least 1")],
)
def test_arguments_that_do_not_parse_end_with_the_usage(argv, message, capsys):
    with pytest.raises(SystemExit) as raised:
        parse_arguments([Arguments], argv)
    assert raised.value.code == 2
    error = capsys.readouterr().err
    assert error.startswith("usage: ") and f"error: {message}" in error and "Traceback" not in error


def test_a_finished_command_exits_with_status_0_whatever_it_returns(monkeypatch):
    @command
    def main(argv):
        return {"bleu": 27.3}  # what the tests read; an entry point's sys.exit() would print it and exit with 1

    monkeypatch.setattr("sys.argv", ["/usr/local/bin/vaswani-evaluate"])
    assert main() is None
    assert main(["--steps", "1"]) == {"bleu": 27.3}


def test_a_usage_error_ends_a_command_with_its_message(monkeypatch):
    @command
    def main(argv):
        (args,) = parse_arguments([Arguments], argv)
        raise UsageError(f"no data for {args.steps} steps")

    monkeypatch.setattr("sys.argv", ["/usr/local/bin/vaswani-train"])
    with pytest.raises(SystemExit) as raised:
        main(["--steps", "3"])
    assert raised.value.code == "vaswani-train: error: no data for 3 steps"  # printed to stderr, exit status 1


def test_hooks_for_tests_stay_out_of_help(capsys):
    """(The benchmark's worker flags: tests/test_benchmark.py.)"""
    from vaswani.scripts import train

    with pytest.raises(SystemExit):
        train.main(["--help"])
    assert "--stop_after" not in capsys.readouterr().out


@dataclass
class EveryKind:
    """One field of each type the commands' dataclasses use."""

    _argument_group_name = "kinds"
    name: str = field(metadata={"help": "required: no default"})
    count: int = 3
    rate: float | None = None
    flag: bool = False
    on: bool = field(default=True, metadata={"help": "on unless switched off"})
    mode: Literal["filter", "truncate"] = "filter"
    scheme: Literal["bart", "fairseq"] | None = None
    words: list[str] = field(default_factory=lambda: ["a", "b"])
    resume: str | None = field(default=None, metadata={"nargs": "?", "const": "latest"})


@pytest.mark.parametrize(
    "argv,expected",
    [
        (["--name", "x"], EveryKind("x")),
        (["--name=x", "--count", "5", "--rate", "0.5"], EveryKind("x", count=5, rate=0.5)),
        (["--name", "x", "--flag"], EveryKind("x", flag=True)),
        (["--name", "x", "--flag", "no", "--on", "False"], EveryKind("x", flag=False, on=False)),
        (["--name", "x", "--no_on"], EveryKind("x", on=False)),
        (["--name", "x", "--no-on"], EveryKind("x", on=False)),
        (["--name", "x", "--mode", "truncate", "--scheme", "bart"], EveryKind("x", mode="truncate", scheme="bart")),
        (["--name", "x", "--words", "c d", "e"], EveryKind("x", words=["c d", "e"])),
        (["--name", "x", "--resume"], EveryKind("x", resume="latest")),
        (["--name", "x", "--resume", "run/7"], EveryKind("x", resume="run/7")),
    ],
)
def test_every_field_type_becomes_its_flag(argv, expected):
    assert parse_arguments([EveryKind], argv) == [expected]


@pytest.mark.parametrize(
    "argv,message",
    [
        ([], "the following arguments are required: --name"),
        (["--name", "x", "--count", "many"], "argument --count: invalid int value: 'many'"),
        (["--name", "x", "--flag", "maybe"], "got maybe but expected one of yes/no, true/false, t/f, y/n, 1/0"),
        (
            ["--name", "x", "--mode", "cut"],
            "argument --mode: invalid choice: 'cut' (choose from 'filter', 'truncate')",
        ),
        (["--name", "x", "--words"], "argument --words: expected at least one argument"),
    ],
)
def test_a_value_of_the_wrong_kind_ends_with_the_usage(argv, message, capsys):
    with pytest.raises(SystemExit) as raised:
        parse_arguments([EveryKind], argv)
    assert raised.value.code == 2
    assert message in capsys.readouterr().err


def test_help_lists_each_flag_with_its_help_default_choices_and_group(capsys):
    with pytest.raises(SystemExit):
        parse_arguments([EveryKind], ["--help"], description="What the command does.")
    text = " ".join(capsys.readouterr().out.split())
    assert "What the command does." in text and "kinds:" in text
    assert "--name NAME required: no default" in text
    assert "--on [ON] on unless switched off (default: True)" in text and "--no_on, --no-on on unless" in text
    assert "--mode {filter,truncate}" in text and "--scheme {bart,fairseq}" in text
    assert "--words WORDS [WORDS ...]" in text and "--resume [RESUME]" in text


def test_parsing_the_commands_arguments_imports_none_of_the_training_extras():
    """The commands' flags are read by argparse over their dataclasses' fields, before the libraries of the training
    extras (datasets, evaluate, sacreBLEU, matplotlib) are imported: `import vaswani` brings torch and transformers,
    which its registration with the Auto classes needs, and nothing more."""
    code = """
import sys
from vaswani.training.arguments import TrainArguments
from vaswani.cli import parse_arguments
(args,) = parse_arguments([TrainArguments], ["--dataset_dir", "d", "--tokenizer", "t", "--output_dir", "o"])
print(args.preset, sorted({"datasets", "evaluate", "sacrebleu", "matplotlib", "pyarrow"} & set(sys.modules)))
"""
    result = run_command([sys.executable, "-c", code], check=True)
    assert result.stdout.split() == ["base", "[]"]
