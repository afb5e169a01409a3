"""The command-line layer every command shares: arguments declared as dataclasses and read by transformers'
`HfArgumentParser`, and one exit style for the user's mistakes (`NAME: error: message` on stderr, exit status 1 or,
for arguments that do not parse, argparse's 2 with the usage line). The library raises `vaswani.checks.UsageError`;
this layer reports it."""

import contextlib
import functools
import sys
from pathlib import Path

from transformers import HfArgumentParser

from .checks import UsageError, check_extra, remove_empty_created_dirs
from .progress import quiet_library_bars


def parse_arguments(dataclass_types, argv=None, description=None, **parser_options):
    """Parse `argv` into one instance of each dataclass with transformers' `HfArgumentParser` (a flag per field,
    `--field_name` and `--field-name`; a field's metadata holds its help and any other `add_argument` option), as
    transformers' example scripts read theirs. A dataclass's `__post_init__` may raise `UsageError`, which is reported
    like any argument that does not parse (usage line, exit status 2). `parser_options` (epilog, usage,
    formatter_class) go to the parser."""
    parser = HfArgumentParser(dataclass_types, description=description, **parser_options)
    with usage_errors_of(parser):
        *parsed, unknown = parser.parse_args_into_dataclasses(
            args=argv, return_remaining_strings=True, look_for_args_file=False
        )
    if unknown:  # argparse's own message and exit status, as for any argument that does not parse
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    return parsed


@contextlib.contextmanager
def usage_errors_of(parser):
    """A `UsageError` from a dataclass's checks, reported as `parser` reports its own errors (usage line, status 2)."""
    try:
        yield
    except UsageError as error:
        parser.error(str(error))


def command(main=None, *, extra=None, needs=()):
    """Decorate a command's `main(argv=None, **options)`: a `UsageError` ends it with `NAME: error: message`, exit
    status 1. `options` are for callers from Python (e.g. vaswani-train's `callbacks`).

    Called with `argv` (from Python), it returns what `main` returns. Called without, as the console entry point does
    (`sys.exit(main())`), it returns None, so that a finished command exits with status 0 whatever `main` returns.

    `@command(extra="export", needs=("ctranslate2",))`: the command needs the modules `needs`, which the install extra
    `extra` brings; without them it ends at once (--help too) with a message that names the extra to install, and a
    module found missing later (an import in `main`) is reported the same way, not as a traceback.
    """
    if main is None:
        return functools.partial(command, extra=extra, needs=needs)

    @functools.wraps(main)
    def run(argv=None, **options):
        name = Path(sys.argv[0]).name
        try:
            return run_main(name, argv, options)
        except BaseException:
            remove_empty_created_dirs()  # a failed command leaves no empty --output_dir behind
            raise

    def run_main(name, argv, options):
        try:
            if extra is not None:
                check_extra(name, extra, needs)
            quiet_library_bars()
            try:
                result = main(sys.argv[1:] if argv is None else [str(argument) for argument in argv], **options)
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
