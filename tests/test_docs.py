"""The README and docs/ say only what the checkout holds: every relative link and every backticked path of the project
names a file or folder that exists, every command line of a ```bash block that runs one of the project's commands
uses only flags that command takes, every ```python block compiles, and every figure shows the record value it is tied
to."""

import argparse
import importlib
import importlib.metadata
import re
import shlex

import figures
import pytest
from helpers import REPO_ROOT
from transformers import HfArgumentParser

from vaswani.finetuning.trainer import FinetuningArguments


PAGES = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]
# The pages of docs/benchmarks/ written by hand; the others there are rendered from a record by benchmarks/.
BENCHMARK_PAGES = [
    REPO_ROOT / "docs" / "benchmarks" / name
    for name in ("README.md", "tests.md", "gpu_h200_2026-12-04/README.md", "gpu_h200_2026-12-04b/README.md")
]
# The pages whose figures docs/figures.txt ties to records.
FIGURE_PAGES = [*PAGES, *BENCHMARK_PAGES]
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


@pytest.mark.parametrize("page", FIGURE_PAGES, ids=page_id)
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


# --- Figures: each one a page quotes shows the record value docs/figures.txt ties it to (tests/figures.py). ---

TIES = figures.ties()


def test_every_page_and_no_other_has_its_figures_tied():
    assert set(TIES) == {page_id(page) for page in FIGURE_PAGES}, "docs/figures.txt names other pages than these"


def test_every_page_of_docs_benchmarks_is_rendered_from_a_record_or_has_its_figures_tied():
    """A page beside its record (STEM.md by STEM.json) or named by a tool of benchmarks/ is that tool's rendering; any
    other, a README among them, is written by hand and belongs in BENCHMARK_PAGES."""
    tools = "".join(path.read_text() for path in sorted((REPO_ROOT / "benchmarks").glob("*.[ps][yh]")))
    benchmark_pages = set((REPO_ROOT / "docs" / "benchmarks").rglob("*.md"))
    rendered = {
        page
        for page in benchmark_pages
        if page.with_suffix(".json").exists() or (page.name != "README.md" and page.name in tools)
    }
    assert benchmark_pages - rendered == set(BENCHMARK_PAGES), "a hand-written page of docs/benchmarks/ is untied"


@pytest.mark.parametrize("page", FIGURE_PAGES, ids=page_id)
def test_every_figure_a_page_quotes_shows_the_record_value_it_is_tied_to(page):
    """A figure no record holds is stale or unrecorded: measure it into a record, or move it to CHANGELOG.md as
    history. One that is no measurement (a setting, a name) is tied to `-`."""
    problems = figures.untied(page.read_text(), TIES[page_id(page)])
    assert not problems, f"{page_id(page)}: {problems}"


def one_digit_off(printed):
    """The figure with its last digit one higher (a 9 one lower)."""
    return printed[:-1] + str(int(printed[-1]) + 1 if printed[-1] != "9" else 8)


@pytest.mark.parametrize("page", FIGURE_PAGES, ids=page_id)
def test_no_figure_one_digit_off_would_show_the_record_value(page):
    tied = zip(figures.figures(page.read_text()), TIES[page_id(page)], strict=True)
    passing = [
        f"line {line}: {one_digit_off(printed)}"
        for (line, printed, approximate), (_, source, expression) in tied
        if source != "-" and figures.prints_as(figures.value(source, expression), one_digit_off(printed), approximate)
    ]
    assert not passing, f"{page_id(page)}: figures one digit off pass: {passing}"


def test_figures_are_told_from_settings_and_names():
    text = """torch 2.13 and transformers 5.25.0 on 2026-12-04 (section 5.1), 2 CPU cores, beam 4, d_k=16, 1e-4:
`vaswani-train --max_steps 700` ([page](gpu_h200_2026-12-04/gpu.md)).
```bash
python3 scripts/train.py --batch_tokens 25000   # 2.5 s a step
```
| 239 | 0.61-0.70 s, 63.0M, 3 minutes, 2.2 times, `BLEU 8.78`, 580 of 1,111, ~3,800, 44%, 16-25% and 4 to 9 GB |
"""
    assert [(line, printed) for line, printed, _ in figures.figures(text)] == [
        (4, "2.5"),
        *[(6, printed) for printed in "239 0.61 0.70 63.0 3 2.2 8.78 580 1,111 3,800 44 16 25 4 9".split()],
    ]
    assert [approximate for _, printed, approximate in figures.figures(text) if printed == "3,800"] == [True]


# One wrong figure at a time, of each kind a page prints: (page, the text around it, the same text made wrong).
WRONG_FIGURES = [
    ("README.md", "| 10.37 sacreBLEU", "| 10.44 sacreBLEU"),  # a decimal
    ("README.md", "1.30x tokens/s at small", "1.90x tokens/s at small"),  # a ratio
    ("README.md", "1.01x at base", "1.30x at base"),  # another figure of the same page
    ("README.md", "base has 63.0M parameters", "base has 63.5M parameters"),  # millions
    ("README.md", "| 3,207 tokens/s", "| 3,270 tokens/s"),  # thousands
    ("README.md", "training (15 min", "training (16 min"),  # minutes, in a shell comment
    ("docs/speed.md", "| 18.5 s; bfloat16", "| 18.9 s; bfloat16"),  # seconds
    ("docs/speed.md", "521,634 tokens/s, 44.0% MFU", "521,634 tokens/s, 43.3% MFU"),  # a percentage
    ("docs/speed.md", "(vaswani 1.30x)", "(vaswani 2.75x)"),
    ("docs/speed.md", "decoding takes 1.4 times", "decoding takes 1.9 times"),  # N times
    ("docs/speed.md", "holds 16-25% less", "holds 16-29% less"),  # a range's end
    ("docs/speed.md", "| batch 1, greedy | 239 |", "| batch 1, greedy | 249 |"),  # a whole number alone in a cell
    ("docs/speed.md", "matrix products 45%", "matrix products 54%"),  # a whole percentage
    ("docs/quality.md", "| **3.092** (3.082-3.101)", "| **3.029** (3.082-3.101)"),  # a mean of seeds, in bold
    ("docs/quality.md", "(20.18-21.33)", "(20.18-21.38)"),  # a range's end, in brackets
    ("docs/quality.md", "8 of 13 findings", "9 of 13 findings"),  # a count of a share
    ("docs/quality.md", "N=2: 48.80 | yes, by 3% |", "N=2: 48.80 | yes, by 4% |"),  # a derived percentage
    ("docs/training.md", "0.48 to 0.60 GB", "0.48 to 0.66 GB"),  # a range written with "to", gigabytes
    ("docs/training.md", "| 406 s |", "| 460 s |"),  # whole seconds in a cell
    ("docs/training.md", "about 11 minutes", "about 13 minutes"),  # approximate minutes
    ("docs/training.md", "`small` (7.6M", "`small` (7.9M"),  # millions, after inline code
    ("docs/training.md", "~3,800 tokens", "~3,900 tokens"),  # approximate, to two significant digits
    ("docs/training.md", "BLEU 8.78;", "BLEU 8.87;"),  # inside inline code
    ("docs/training.md", "big has 1.2-4.2M fewer", "big has 1.2-2.4M fewer"),  # a range of millions
    ("docs/decoding.md", "| 579 of 1,111 |", "| 597 of 1,111 |"),  # a count derived from a record
    ("docs/decoding.md", "costs 0.01 BLEU", "costs 0.10 BLEU"),  # a difference
    ("docs/exports.md", "fastest path: 0.69x", "fastest path: 0.96x"),
    ("docs/finetuning.md", "| 7,568,384 |", "| 7,586,384 |"),  # a parameter count
    ("docs/evaluation.md", "(BLEU 10.37)", "(BLEU 10.73)"),
    ("docs/benchmarks/README.md", "15.8 s at 1M", "18.5 s at 1M"),  # seconds
    ("docs/benchmarks/README.md", "47.9% vs 36.8%", "47.9% vs 38.6%"),  # a percentage
    ("docs/benchmarks/README.md", "1,578 of the 2,000", "1,587 of the 2,000"),  # a thousands count
    ("docs/benchmarks/README.md", "768 to 782 MiB", "768 to 728 MiB"),  # a range's end, over a record's rows
    ("docs/benchmarks/README.md", "| 0.98 GB |", "| 0.89 GB |"),  # a figure alone in a table's cell
    ("docs/benchmarks/README.md", "about 59", "about 69"),  # approximate, derived from another record
    ("docs/benchmarks/README.md", "lose 0.11 to 0.49", "lose 0.11 to 0.59"),  # a difference of a curve's points
    ("docs/benchmarks/gpu_h200_2026-12-04/README.md", "took 8.2 minutes", "took 9.2 minutes"),  # a sum of records
    ("docs/benchmarks/gpu_h200_2026-12-04b/README.md", "at 0.40 s each", "at 0.04 s each"),
]


@pytest.mark.parametrize(("page", "right", "wrong"), WRONG_FIGURES, ids=lambda value: value)
def test_a_wrong_figure_is_caught(page, right, wrong):
    """The ties in docs/figures.txt are rewritten to print the wrong figure too, as an edit of both would: only the
    record's value can catch it."""
    text = (REPO_ROOT / page).read_text()
    assert text.count(right) == 1, f"{page} does not print {right!r} once"
    assert not figures.untied(text, TIES[page])
    changed = text.replace(right, wrong)
    retied = [(printed, *tie[1:]) for (_, printed, _), tie in zip(figures.figures(changed), TIES[page], strict=True)]
    assert retied != TIES[page]
    assert figures.untied(changed, retied), f"{page} with {wrong!r} passes"


# --- Sentences a reader takes in at once. ---

LONGEST_SENTENCE = 45  # words


def sentences(text):
    """The sentences of a page's prose, list items and table cells (code, headings and table rules left out)."""
    blocks, block = [], []
    for line in re.sub(r"```.*?```", "", text, flags=re.DOTALL).splitlines():
        line = line.strip()
        starts_item = re.match(r"([-*]|\d+\.) ", line)
        if not line or line.startswith(("#", "|")) or starts_item:
            blocks.append(" ".join(block))
            block = []
        if line.startswith("|") and not re.match(r"\|?\s*-{3}", line):
            blocks += line.strip("|").split("|")
        elif line and not line.startswith(("#", "|")):
            block.append(line[starts_item.end() :] if starts_item else line)
    blocks.append(" ".join(block))
    return [sentence for block in blocks for sentence in re.split(r"(?<=[.!?])\s+(?=[A-Z`(\[*])", block.strip())]


@pytest.mark.parametrize("page", [*PAGES, REPO_ROOT / "configs" / "README.md"], ids=page_id)
def test_no_sentence_runs_past_45_words(page):
    long = [sentence[:80] for sentence in sentences(page.read_text()) if len(sentence.split()) > LONGEST_SENTENCE]
    assert not long, f"{page_id(page)} has sentences of more than {LONGEST_SENTENCE} words: {long}"


def test_the_readmes_extras_table_names_every_extra_of_pyproject():
    declared = set(importlib.metadata.metadata("vaswani").get_all("Provides-Extra"))
    table = (REPO_ROOT / "README.md").read_text().split("| extra | adds | for |")[1].split("\n\n")[0]
    listed = {name for row in table.strip().splitlines() for name in re.findall(r"`([a-z0-9]+)`", row.split("|")[1])}
    assert listed == declared, f"README's extras table lists {sorted(listed)}; pyproject.toml has {sorted(declared)}"


def test_the_pages_stay_short():
    """The README and docs/*.md answer their questions in at most 110 KB together: history goes to CHANGELOG.md."""
    total = sum(len(page.read_bytes()) for page in PAGES)
    assert total <= 110_000, f"README.md and docs/*.md hold {total:,} bytes: move history to CHANGELOG.md"
