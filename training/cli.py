"""The shape every command shares: arguments declared as dataclasses and read by an `argparse` parser built from
their fields (`DataclassArgumentParser`, the flags transformers' `HfArgumentParser` makes of a dataclass, without
importing transformers), and one exit style for the user's mistakes (`NAME: error: message` on stderr, exit status 1
or, for arguments that do not parse, argparse's 2 with the usage line)."""

import argparse
import contextlib
import dataclasses
import functools
import sys
import typing
from pathlib import Path

from .checks import UsageError, check_extra, remove_empty_created_dirs


BOOLEANS = {
    **dict.fromkeys(("yes", "true", "t", "y", "1"), True),
    **dict.fromkeys(("no", "false", "f", "n", "0"), False),
}


def string_to_bool(text):
    """A boolean flag's value: yes/no, true/false, t/f, y/n, 1/0, in any case."""
    if text.lower() not in BOOLEANS:
        raise argparse.ArgumentTypeError(f"expected one of yes/no, true/false, t/f, y/n, 1/0, not {text!r}")
    return BOOLEANS[text.lower()]


class DataclassArgumentParser(argparse.ArgumentParser):
    """An `argparse.ArgumentParser` whose flags are the fields of dataclasses, one flag per field, named as
    transformers' `HfArgumentParser` names them: `--field_name` and `--field-name`. A field's metadata holds its help
    and any other `add_argument` option (nargs, const, metavar); its type gives the rest:

    - `X | None` is read as `X`;
    - `bool`: `--flag`, `--flag true/false` (`string_to_bool`), and `--no_flag` where the default is True;
    - `Literal[...]`: one of its values;
    - `list[X]`: one or more values;
    - `str`, `int`, `float`: one value.

    A field without a default is a required flag. A dataclass's `_argument_group_name` heads its flags in --help."""

    def __init__(self, dataclass_types, **options):
        options.setdefault("formatter_class", argparse.ArgumentDefaultsHelpFormatter)
        super().__init__(**options)
        self.dataclass_types = list(dataclass_types)
        for dataclass_type in self.dataclass_types:
            name = getattr(dataclass_type, "_argument_group_name", None)
            group = self if name is None else self.add_argument_group(name)
            hints = typing.get_type_hints(dataclass_type)
            for field in dataclasses.fields(dataclass_type):
                if field.init:
                    add_field_argument(group, field, hints[field.name])

    def parse_into_dataclasses(self, argv):
        """(one instance of each dataclass, the arguments left over)."""
        namespace, unknown = self.parse_known_args(argv)
        values = vars(namespace)
        instances = [
            dataclass_type(
                **{field.name: values[field.name] for field in dataclasses.fields(dataclass_type) if field.init}
            )
            for dataclass_type in self.dataclass_types
        ]
        return instances, unknown


def add_field_argument(parser, field, hint):
    """The flag of one dataclass field (`DataclassArgumentParser`)."""
    flags = flag_names(field.name)
    options = dict(field.metadata)
    arguments = typing.get_args(hint)
    if type(None) in arguments and len(arguments) == 2:  # X | None
        hint = next(argument for argument in arguments if argument is not type(None))
    if field.default is not dataclasses.MISSING:
        options["default"] = field.default
    elif field.default_factory is not dataclasses.MISSING:
        options["default"] = field.default_factory()
    else:
        options["required"] = True
    origin = typing.get_origin(hint)
    if origin is typing.Literal:
        options["choices"] = typing.get_args(hint)
    elif hint is bool:
        options.update(type=string_to_bool, nargs="?", const=True)
    elif origin is list:
        options.update(type=typing.get_args(hint)[0], nargs="+")
    elif hint in (str, int, float):
        options["type"] = hint
    else:
        raise TypeError(f"{field.name}: {hint} has no command-line form (DataclassArgumentParser)")
    parser.add_argument(*flags, **options)
    if hint is bool and options.get("default") is True:
        parser.add_argument(
            *flag_names(f"no_{field.name}"),
            action="store_false",
            dest=field.name,
            default=argparse.SUPPRESS,
            help=f"{flags[0]} false",
        )


def flag_names(name):
    """`--name_with_underscores` and `--name-with-underscores`."""
    return [f"--{name}"] + ([f"--{name.replace('_', '-')}"] if "_" in name else [])


def parse_arguments(dataclass_types, argv=None, description=None, *, more=None, **parser_options):
    """Parse `argv` into one instance of each dataclass (`DataclassArgumentParser`); a dataclass's `__post_init__`
    may raise `UsageError`, which is reported like any argument that does not parse. `parser_options` (epilog, usage,
    formatter_class) go to the argument parser.

    `more`, a function that returns one more dataclass, is for a command whose other flags belong to one of
    transformers' argument dataclasses, slow to import (fine-tuning's Seq2SeqTrainingArguments imports torch): it is
    called once the command's own flags have parsed, and the flags left over are parsed into it by transformers'
    `HfArgumentParser`. --help, and a mistake in the command's own flags, answer without it; the epilog tells the
    user what those other flags are."""
    parser = DataclassArgumentParser(
        dataclass_types, description=description, allow_abbrev=more is None, **parser_options
    )
    with usage_errors_of(parser):
        parsed, unknown = parser.parse_into_dataclasses(argv)
    if more is not None:
        from transformers import HfArgumentParser

        parser = HfArgumentParser([more()], usage="%(prog)s ... (%(prog)s --help tells the flags)")
        with usage_errors_of(parser):
            *others, unknown = parser.parse_args_into_dataclasses(
                args=unknown, look_for_args_file=False, return_remaining_strings=True
            )
        parsed = [*parsed, *others]
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
