"""The shape every command shares: arguments declared as dataclasses and parsed by `transformers.HfArgumentParser`,
and one exit style for the user's mistakes (`NAME: error: message` on stderr, exit status 1 or, for arguments that
do not parse, argparse's 2 with the usage line)."""

import functools
import importlib.util
import sys
from pathlib import Path

from .checks import UsageError, check_extra


def argument_parser_class():
    """transformers' `HfArgumentParser`, without importing transformers if it is not imported yet.

    Its module, transformers/hf_argparser.py, needs only the standard library and yaml, while `import transformers`
    takes a second or more (the package's own start-up): every command's --help, and every mistake in its arguments,
    would wait that long for nothing. So, unless transformers is already imported, that one file is loaded from the
    installed transformers by itself, under a name of this package; where it imports more (another transformers
    version), transformers is imported as usual."""
    name = f"{__name__}._hf_argparser"
    if name in sys.modules:
        return sys.modules[name].HfArgumentParser
    if "transformers" not in sys.modules:
        found = importlib.util.find_spec("transformers")
        file = Path(found.origin).with_name("hf_argparser.py") if found and found.origin else None
        spec = importlib.util.spec_from_file_location(name, file) if file and file.is_file() else None
        if spec is not None:
            module = sys.modules[name] = importlib.util.module_from_spec(spec)
            try:
                spec.loader.exec_module(module)
                return module.HfArgumentParser
            except (ImportError, AttributeError):
                del sys.modules[name]
    from transformers import HfArgumentParser

    return HfArgumentParser


def parse_arguments(dataclass_types, argv=None, description=None, *, more=None, **parser_options):
    """Parse `argv` into one instance of each dataclass; a dataclass's `__post_init__` may raise `UsageError`, which
    is reported like any argument that does not parse. A dataclass's `_argument_group_name` heads its --help;
    `parser_options` (epilog, usage) go to the argument parser.

    `more`, a function that returns one more dataclass, is for a command whose other flags belong to a dataclass that
    is slow to import (fine-tuning's Seq2SeqTrainingArguments imports torch): it is called once the command's own
    flags have parsed, and the flags left over are parsed into it. --help, and a mistake in the command's own flags,
    answer without it; the epilog tells the user what those other flags are."""
    parser = argument_parser_class()(
        dataclass_types, description=description, allow_abbrev=more is None, **parser_options
    )
    try:
        *parsed, unknown = parser.parse_args_into_dataclasses(
            args=argv, look_for_args_file=False, return_remaining_strings=True
        )
    except UsageError as error:
        parser.error(str(error))
    if more is not None:
        return [*parsed, *parse_arguments([more()], unknown, usage="%(prog)s ... (%(prog)s --help tells the flags)")]
    if unknown:  # HfArgumentParser would raise a bare ValueError; this is argparse's own message and exit status
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    return parsed


def command(main=None, *, extra=None, needs=()):
    """Decorate a command's `main(argv=None)`: a `UsageError` ends it with `NAME: error: message`, exit status 1.

    Called with `argv` (from Python), it returns what `main` returns. Called without, as the console entry point does
    (`sys.exit(main())`), it returns None, so that a finished command exits with status 0 whatever `main` returns.

    `@command(extra="export", needs=("ctranslate2",))`: the command needs the modules `needs`, which the install extra
    `extra` brings; without them it ends at once (--help too) with a message that names the extra to install, and a
    module found missing later (an import in `main`) is reported the same way, not as a traceback.
    """
    if main is None:
        return functools.partial(command, extra=extra, needs=needs)

    @functools.wraps(main)
    def run(argv=None):
        name = Path(sys.argv[0]).name
        try:
            if extra is not None:
                check_extra(name, extra, needs)
            try:
                result = main(sys.argv[1:] if argv is None else [str(argument) for argument in argv])
            except ModuleNotFoundError as error:
                if extra is None or error.name is None or error.name.split(".")[0] == "vaswani":
                    raise
                raise UsageError(
                    f"{name} needs {error.name.split('.')[0]}, which is not installed: pip install 'vaswani[{extra}]'"
                ) from error
        except UsageError as error:
            raise SystemExit(f"{name}: error: {error}") from None
        return None if argv is None else result

    return run
