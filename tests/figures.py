"""The figures a page quotes and the record value each one shows (a plain module, imported by test_docs.py).

A figure is a number a reader takes as measured or counted: one with a decimal point or a thousands separator, a
percentage, a ratio ("1.30x"), a count of millions ("63.0M"), an approximate number ("~3,800", "about 750"), either
end of a range ("0.61-0.70 s"), a whole number followed by a unit ("3 minutes", "28 times"), alone in a table's cell
or counting a share ("580 of 1,111"). Any other whole number ("2 CPU cores", "700 steps", "beam 4") is a setting or
a name, and dates and versions are names: none is a figure. Figures are read from prose, tables, inline code that is
no command or path, and the comments of ```bash blocks.

docs/figures.txt ties each figure of a page, in the order the page prints them, to what it shows:

    # docs/speed.md
    4,035     cpu_small_float32.json  rows.0.train_tokens_per_s.median
    1.30      cpu_small_float32.json  rows.0.train_tokens_per_s.median / rows.1.train_tokens_per_s.median
    50.0      decoding_cpu.json  {rows.vaswani, the paper's beam search (default).seconds}
    32,000    -  setting

The record is a JSON file under docs/benchmarks/. The expression is arithmetic (+ - * / and brackets, `mean`, `min`,
`max`, `count`) over the record's keys: dotted paths with list indices (`rows.3.dev_bleu.0`), `*` for every item of a
list, braces where a key has spaces, another record's key (`paper.json:training.base.hours`), and counts of the code
(`parameters("big", 37000)`: a row of Table 3 at a vocabulary size; `model` in the record's place names no record).
The figure must print exactly as the value does at its own decimals and separators, or, where approximate, at its
significant digits. `-` marks a number that measures nothing: a `setting` (an argument, a default, a size chosen)
or a `name` (a section of the paper, a version). Nothing else may be `-`.
"""

import ast
import functools
import json
import operator
import re
from decimal import ROUND_HALF_UP, Decimal

from helpers import REPO_ROOT


RECORDS = REPO_ROOT / "docs" / "benchmarks"
TIES = REPO_ROOT / "docs" / "figures.txt"
NOT_MEASURED = ("setting", "name")

UNITS = r"s|ms|µs|min|minutes?|h|hours?|days?|seconds?|GB|GiB|MB|MiB|KB|KiB|times|tokens/s|sentences/s"
PACKAGES = (
    r"torch|Python|CUDA|cuDNN|transformers|[Aa]ccelerate|datasets|peft|sacreBLEU|sacrebleu|tokenizers|"
    r"fairseq|onnxruntime|onnx|deepspeed|DeepSpeed|gradio|numpy|ruff|pytest|Debian|Ubuntu|opset|safetensors"
)
# Names, not figures: a package's version (with the versions listed after it), any three-part version, a date, a
# section or table of the paper.
NAMES = re.compile(
    rf"\b(?:{PACKAGES})[ =<>]+v?\d+(?:\.\d+)*\S*(?:(?:/|, | or | and | to )\d+(?:\.\d+)+)*"
    r"|\bv?\d+\.\d+\.\d+\S*|\b\d{4}-\d{2}-\d{2}\b|\b(?:[Ss]ections?|Table|Tables|§|arXiv:)\s?\d+(?:\.\d+)?"
    r"|^\| \d\.\d "
)
NUMBER = re.compile(
    r"(?<![\w.,/+=:#\\])(?<![^\d\s(]-)(?P<approx>~|about )?"
    r"(?P<number>\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?)(?P<suffix>x|%|M\b)?"
    rf"(?![\w]|\.\d|,\d{{3}})(?P<unit> (?:{UNITS})(?![\w]))?"
)
RANGE = r"-|–| to "
CODE_SPAN = re.compile(r"`([^`\n]*)`")


def prose(text):
    """The page's text where figures are read, line for line: fenced blocks blanked but for their shell comments,
    links' targets, URLs, HTML comments and the inline code of commands and paths dropped, names cut out."""

    def fenced(block):
        language, body = block[1], block[2]
        lines = body.split("\n")
        kept = [line.partition(" # ")[2] if language == "bash" else "" for line in lines]
        return "\n" + "\n".join(kept)

    text = re.sub(r"<!--.*?-->", "", text, flags=re.DOTALL)
    text = re.sub(r"^```(\w*)\n(.*?)\n```", lambda block: fenced(block) + "\n", text, flags=re.DOTALL | re.M)
    text = re.sub(r"\]\([^)]*\)|https?://\S+", "]", text)
    text = CODE_SPAN.sub(lambda span: "" if re.search(r"[=(]|--|^[^\s/]*/[^\s]*$", span[1]) else span[1], text)
    return [NAMES.sub(" ", line) for line in text.split("\n")]


def figures(text):
    """(line number, figure as printed, approximate) of each figure of a page, in order."""
    for number, line in enumerate(prose(text), 1):
        for match in NUMBER.finditer(line):
            if is_figure(match, line):
                yield number, match["number"], bool(match["approx"])


def is_figure(match, line):
    """Whether a number is a figure rather than a setting or a name (see the module's docstring)."""
    marked = "." in match["number"] or "," in match["number"] or match["approx"] or match["suffix"] or match["unit"]
    in_range = re.search(rf"\d(?:{RANGE})$", line[: match.start()]) or re.match(rf"(?:{RANGE})\d", line[match.end() :])
    a_cell = line[: match.start()].endswith("| ") and line[match.end() :].startswith(" |")
    a_share = re.match(r" of \d", line[match.end() :])  # "580 of 1,111"
    return bool(marked or in_range or a_cell or a_share)


def prints_as(value, printed, approximate):
    """Whether `value` prints as `printed`: rounded half up to its decimals, with its thousands separators; where
    approximate, to its significant digits."""
    exact = Decimal(repr(float(value)))
    shown = Decimal(printed.replace(",", ""))
    if approximate:
        digits = printed.replace(",", "").replace(".", "").lstrip("0")
        significant = len(digits.rstrip("0")) if "." not in printed else len(digits)
        exponent = exact.adjusted() - max(significant, 1) + 1
        return exact.scaleb(-exponent).quantize(Decimal(1), ROUND_HALF_UP).scaleb(exponent) == shown
    decimals = len(printed.partition(".")[2])
    rounded = exact.quantize(Decimal(1).scaleb(-decimals), ROUND_HALF_UP)
    return (f"{rounded:,f}" if "," in printed else f"{rounded:f}") == printed


@functools.cache
def record(name):
    return json.loads((RECORDS / name).read_text())


def lookup(data, path):
    """The value at a dotted path; `*` takes every item of a list, and the rest of the path of each."""
    key, _, rest = path.partition(".")
    if key == "*":
        return [lookup(item, rest) if rest else item for item in data]
    data = data[int(key)] if isinstance(data, list) else data[key]
    return lookup(data, rest) if rest else data


@functools.cache
def parameters(row, vocab_size):
    """A row of Table 3's parameter count ("base" and "big" among them) at a vocabulary size, counted on the meta
    device (no memory, no time)."""
    import torch

    from vaswani import VaswaniForConditionalGeneration
    from vaswani.configuration.table3 import TABLE3

    (config,) = [candidate.config(vocab_size=vocab_size) for candidate in TABLE3 if candidate.name == row]
    with torch.device("meta"):
        return VaswaniForConditionalGeneration(config).num_parameters()


FUNCTIONS = {
    "mean": lambda *values: sum(values) / len(values),
    "min": min,
    "max": max,
    "count": lambda *values: sum(map(bool, values)),  # how many are true or non-zero
    "parameters": parameters,
}
OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}
# A string (an argument of a function), or a key: maybe another record's, braced where it has spaces.
REFERENCE = re.compile(
    r'"[^"]*"'
    r"|(?<![\w.])(?:(?P<file>[\w./+-]+\.json):)?"
    r"(?:\{(?P<braced>[^}]*)\}|(?P<path>[A-Za-z_][\w+-]*(?:\.(?:\*|[\w+-]+))*)(?![\w(]))"
)


def value(source, expression):
    """The value an expression over a record's keys and the code's counts comes to."""
    values = []

    def name(reference):
        if reference[0].startswith('"') or reference["path"] in FUNCTIONS:
            return reference[0]
        found = lookup(record(reference["file"] or source), reference["braced"] or reference["path"])
        values.append(found)
        return f"_{len(values) - 1}"

    code = REFERENCE.sub(name, expression)
    return evaluate(ast.parse(code, mode="eval").body, values)


def evaluate(node, values):
    """The value of an expression's tree; `values` holds its keys' values, named `_0`, `_1`, ... in the tree."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        return values[int(node.id[1:])]
    if isinstance(node, ast.BinOp):
        return OPERATORS[type(node.op)](evaluate(node.left, values), evaluate(node.right, values))
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in FUNCTIONS:
        arguments = [evaluate(argument, values) for argument in node.args]
        if len(arguments) == 1 and isinstance(arguments[0], list):
            arguments = arguments[0]
        return FUNCTIONS[node.func.id](*arguments)
    raise ValueError(f"not an expression over a record: {ast.unparse(node)}")


def ties():
    """{page: [(figure as printed, source, expression)]} from docs/figures.txt."""
    tied, page = {}, None
    for line in TIES.read_text().splitlines():
        if line.startswith("# "):
            page = tied.setdefault(line[2:].strip(), [])
        elif line.strip():
            printed, source, expression = line.split(maxsplit=2)
            page.append((printed, source, expression))
    return tied


def untied(text, tied):
    """What is wrong with a page's figures against its ties: each problem a line of text (none when all hold)."""
    problems = []
    found = list(figures(text))
    for index in range(max(len(found), len(tied))):
        if index >= len(found):
            problems.append(f"tie {index + 1} ({tied[index][0]}): the page has no more figures")
            continue
        line, printed, approximate = found[index]
        if index >= len(tied):
            problems.append(f"line {line}: {printed} is tied to no record")
            continue
        expected, source, expression = tied[index]
        if printed != expected:
            problems.append(f"line {line}: {printed} where the ties have {expected} (a figure added or removed?)")
        elif source == "-":
            if expression not in NOT_MEASURED:
                problems.append(f"line {line}: {printed} is `-` but neither {' nor '.join(NOT_MEASURED)}")
        else:
            try:
                shown = value(source, expression)
            except (OSError, KeyError, IndexError, ValueError, TypeError, ZeroDivisionError, SyntaxError) as error:
                problems.append(f"line {line}: {printed}: {source} {expression} does not resolve ({error!r})")
                continue
            if not prints_as(shown, printed, approximate):
                problems.append(f"line {line}: {printed}, but {source} {expression} is {shown}")
    return problems
