"""The commands' common shape: every console entry point exists and answers --help, arguments that do not parse end
with argparse's usage and status 2, and a mistake in the input ends a command with `NAME: error: message`."""

import importlib.metadata
import sys
from dataclasses import dataclass

import pytest
from helpers import run_command

from vaswani.training.checks import UsageError
from vaswani.training.cli import command, parse_arguments


ENTRY_POINTS = [point for point in importlib.metadata.entry_points(group="console_scripts")
                if point.value.startswith("vaswani.scripts.")]  # fmt: skip


def test_every_command_is_a_console_entry_point():
    names = {point.name for point in ENTRY_POINTS}
    assert names == {"vaswani-prepare-data", "vaswani-train-tokenizer", "vaswani-train", "vaswani-evaluate",
                     "vaswani-finetune", "vaswani-push-to-hub", "vaswani-export-ctranslate2", "vaswani-visualize",
                     "vaswani-convert-fairseq", "vaswani-translate"}  # fmt: skip


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


def test_where_transformers_argument_parser_needs_more_of_transformers_transformers_is_imported_for_it(tmp_path):
    """The commands load transformers/hf_argparser.py by itself (it needs only the standard library and yaml) to answer
    at once; a release whose file imports more of transformers gets the library's HfArgumentParser, whole."""
    moved = tmp_path / "transformers"
    moved.mkdir()
    (moved / "__init__.py").write_text("")
    (moved / "hf_argparser.py").write_text("from .utils import logging\n")
    code = f"""
import importlib.util, sys
from importlib.machinery import ModuleSpec
find_spec = importlib.util.find_spec
moved = ModuleSpec("transformers", None, origin={str(moved / "__init__.py")!r})
importlib.util.find_spec = lambda name, *rest: moved if name == "transformers" else find_spec(name, *rest)
from vaswani.training.cli import argument_parser_class
parser = argument_parser_class()
import transformers
print(parser is transformers.HfArgumentParser, [name for name in sys.modules if name.endswith("_hf_argparser")])
"""
    result = run_command([sys.executable, "-c", code], check=True)
    assert result.stdout.split() == ["True", "[]"]


def test_transformers_argument_parser_answers_without_importing_transformers():
    code = """
import sys
from vaswani.training.cli import argument_parser_class
parser = argument_parser_class()
print(parser.__module__, "transformers" in sys.modules)
"""
    result = run_command([sys.executable, "-c", code], check=True)
    assert result.stdout.split() == ["vaswani.training.cli._hf_argparser", "False"]
