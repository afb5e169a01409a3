"""The shape every command shares: arguments declared as dataclasses and parsed by `transformers.HfArgumentParser`,
and one exit style for the user's mistakes (`NAME: error: message` on stderr, exit status 1 or, for arguments that
do not parse, argparse's 2 with the usage line)."""

import functools
import sys
from pathlib import Path

from transformers import HfArgumentParser

from .checks import UsageError


def parse_arguments(dataclass_types, argv=None, description=None):
    """Parse `argv` into one instance of each dataclass; a dataclass's `__post_init__` may raise `UsageError`, which
    is reported like any argument that does not parse. A dataclass's `_argument_group_name` heads its --help."""
    parser = HfArgumentParser(dataclass_types, description=description)
    try:
        *parsed, unknown = parser.parse_args_into_dataclasses(
            args=argv, look_for_args_file=False, return_remaining_strings=True
        )
    except UsageError as error:
        parser.error(str(error))
    if unknown:  # HfArgumentParser would raise a bare ValueError; this is argparse's own message and exit status
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    return parsed


def command(main):
    """Decorate a command's `main(argv=None)`: a `UsageError` ends it with `NAME: error: message`, exit status 1.

    Called with `argv` (from Python), it returns what `main` returns. Called without, as the console entry point does
    (`sys.exit(main())`), it returns None, so that a finished command exits with status 0 whatever `main` returns.
    """

    @functools.wraps(main)
    def run(argv=None):
        try:
            result = main(sys.argv[1:] if argv is None else [str(argument) for argument in argv])
        except UsageError as error:
            raise SystemExit(f"{Path(sys.argv[0]).name}: error: {error}") from None
        return None if argv is None else result

    return run
