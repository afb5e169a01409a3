"""Any translation corpus made ready to train on: cleaned, filtered and split into train / validation / test.

The output is a `datasets.DatasetDict` with train / validation / test splits, each row
{"id": ..., "translation": {source_lang: ..., target_lang: ...}} (the Hugging Face translation layout), which
`save_to_disk` writes and `vaswani.training.data.load_translation_dataset` memory-maps.

Cleaning: each training pair's sides are NFC-normalised and every run of whitespace collapsed to one space. A pair is
then dropped, and counted by reason, when
    invalid_text  a side is not text (None, or bytes that were not UTF-8) or holds control characters
    empty         a side is empty
    too_long      a side has more than `max_chars` characters
    length_ratio  (longer + 10) / (shorter + 10) > `max_ratio` in characters: the halves are unlikely to say the same
                  thing (the +10 keeps "Amen."-sized pairs from being judged on a few characters)

Splitting: a unit (a Bible chapter, or a source sentence) goes to
    test        if u < test_fraction,
    validation  if u < test_fraction + valid_fraction,
    train       otherwise,
where u = first 8 bytes of sha256("{seed}:{unit}") / 2**64, a number in [0, 1) that is the same on every machine and
Python version. All pairs of a unit land in one split, so a sentence repeated in the corpus is never both trained
on and tested.

Two sources are read here (the default corpus, the Bible, is `vaswani.corpora.bible`):
- two plain-text files, one sentence per line, line N of one translating line N of the other
  (`parallel_files_dataset`; ids "line.N");
- any DatasetDict with a `translation` column, e.g. from `datasets.load_dataset("wmt14", "de-en")`
  (`prepare_translation_dataset`; ids "SPLIT.N" unless it has an `id` column). Its own validation and test splits
  are kept whole, as published: only training pairs are cleaned and filtered. Missing validation/test splits are
  carved from the cleaned training pairs.
They may be of any size (WMT14 English-French has 36M pairs): the pairs stream from Arrow files through
`datasets.map` and `filter`, and are never held in Python lists.
"""

import collections
import contextlib
import hashlib
import re
import shutil
import tempfile
import unicodedata
from pathlib import Path

import datasets
import numpy as np
import pyarrow.compute as pc

from ..checks import UsageError, check_writable_dir
from ..training.data import translation_languages


SPLITS = ("train", "validation", "test")

# Unicode's control characters (category Cc) and surrogates (Cs), as one regular expression: a scan per character
# in Python would be the slowest step at WMT scale.
CONTROL_OR_SURROGATE = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")


# ---------------------------------------------------------------------------------------------------------------------
# Cleaning and filtering one pair.
# ---------------------------------------------------------------------------------------------------------------------


def clean_text(text):
    """NFC-normalise and collapse every run of whitespace to one space."""
    return " ".join(unicodedata.normalize("NFC", text).split())


def is_valid_text(text):
    """False for undecodable lines (None), replacement characters, control characters or surrogates."""
    if text is None or "\ufffd" in text:
        return False
    return CONTROL_OR_SURROGATE.search(text) is None


def drop_reason(source, target, max_chars, max_ratio):
    """Why a (cleaned) pair should be dropped, or None to keep it."""
    if not (is_valid_text(source) and is_valid_text(target)):
        return "invalid_text"
    if not source or not target:
        return "empty"
    longer, shorter = max(len(source), len(target)), min(len(source), len(target))
    if longer > max_chars:
        return "too_long"
    if (longer + 10) / (shorter + 10) > max_ratio:
        return "length_ratio"
    return None


# ---------------------------------------------------------------------------------------------------------------------
# Splitting by a stable hash of the unit (chapter or source sentence).
# ---------------------------------------------------------------------------------------------------------------------


def assign_split(group, seed=0, valid_fraction=0.035, test_fraction=0.04):
    """Map a group key to "train", "validation" or "test", the same way on every machine."""
    digest = hashlib.sha256(f"{seed}:{group}".encode()).digest()
    u = int.from_bytes(digest[:8], "big") / 2**64
    if u < test_fraction:
        return "test"
    if u < test_fraction + valid_fraction:
        return "validation"
    return "train"


def split_examples(examples, seed=0, valid_fraction=0.035, test_fraction=0.04):
    """Distribute in-memory examples ({"id", "group", "translation"} dicts) over SPLITS by their group, in order."""
    splits = {name: [] for name in SPLITS}
    for example in examples:
        splits[assign_split(example["group"], seed, valid_fraction, test_fraction)].append(example)
    return splits


def to_dataset_dict(splits, source_lang, target_lang):
    """A datasets.DatasetDict with columns `id` and `translation` from `split_examples`'s lists (the group goes)."""
    features = datasets.Features(
        {"id": datasets.Value("string"), "translation": datasets.Translation(languages=[source_lang, target_lang])}
    )
    return datasets.DatasetDict(
        {
            split: datasets.Dataset.from_dict(
                {
                    "id": [e["id"] for e in splits[split]],
                    "translation": [
                        {lang: e["translation"][lang] for lang in (source_lang, target_lang)} for e in splits[split]
                    ],
                },
                features=features,
            )
            for split in SPLITS
        }
    )


# ---------------------------------------------------------------------------------------------------------------------
# Corpora of any size: two line-aligned files, or a DatasetDict, cleaned and split in Arrow.
# ---------------------------------------------------------------------------------------------------------------------


def count_lines(path):
    """Lines of a file (a last line without a newline counts), read in 1 MiB blocks."""
    count, last = 0, b"\n"
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(2**20), b""):
            count, last = count + block.count(b"\n"), block[-1:]
    return count + (last != b"\n")


def decode_line(line):
    """A line of bytes as str without its line ending, or None where it is not valid UTF-8."""
    try:
        return line.rstrip(b"\n").rstrip(b"\r").decode("utf-8")
    except UnicodeDecodeError:
        return None


def parallel_file_rows(source_path, target_path, source_lang, target_lang):
    """Rows {"id": "line.N", "translation": {...}} from two line-aligned files, one line of each at a time."""
    with open(source_path, "rb") as sources, open(target_path, "rb") as targets:
        for number, (source, target) in enumerate(zip(sources, targets), start=1):
            yield {
                "id": f"line.{number}",
                "translation": {source_lang: decode_line(source), target_lang: decode_line(target)},
            }


def parallel_files_dataset(source_path, target_path, source_lang, target_lang, cache_dir):
    """A DatasetDict with a train split streamed from two line-aligned files into Arrow files in `cache_dir`."""
    for path in (source_path, target_path):
        if not Path(path).is_file():
            raise UsageError(f"--files: {path} is not a file")
    counts = {path: count_lines(path) for path in (source_path, target_path)}
    if counts[source_path] != counts[target_path]:
        raise UsageError(
            f"--files expects line-aligned files, but {source_path} has {counts[source_path]} lines "
            f"and {target_path} has {counts[target_path]} lines"
        )
    features = datasets.Features(
        {"id": datasets.Value("string"), "translation": datasets.Translation(languages=[source_lang, target_lang])}
    )
    train = datasets.Dataset.from_generator(
        parallel_file_rows,
        features=features,
        cache_dir=str(cache_dir),
        gen_kwargs={
            "source_path": str(source_path),
            "target_path": str(target_path),
            "source_lang": source_lang,
            "target_lang": target_lang,
        },
    )
    return datasets.DatasetDict({"train": train})


def clean_pairs(batch, indices, split, source_lang, target_lang, carved, max_chars, max_ratio, **split_args):
    """`datasets.map` function: each pair cleaned, with the reason it is dropped ("" to keep it) and its split.

    A kept pair of the train split goes where its source sentence hashes to, if that is a split in `carved` (one the
    dataset lacks), else to train. The pairs of the dataset's own validation and test splits stay there as published,
    neither cleaned nor dropped: a score on the whole set compares with others' on it.
    """
    ids = batch["id"] if "id" in batch else [f"{split}.{i}" for i in indices]
    columns = {"id": ids, "translation": [], "reason": [], "split": []}
    for pair in batch["translation"]:
        pair = pair or {}  # a row without a translation is an invalid pair, dropped and counted
        texts = (pair.get(source_lang), pair.get(target_lang))
        if split != "train":
            columns["translation"].append(dict(zip((source_lang, target_lang), texts)))
            columns["reason"].append("")
            columns["split"].append(split)
            continue
        source, target = (clean_text(text) if isinstance(text, str) else None for text in texts)
        reason = drop_reason(source, target, max_chars, max_ratio) or ""
        assigned = "train"
        if not reason:
            assigned = assign_split(source, **split_args)
            assigned = assigned if assigned in carved else "train"
        columns["translation"].append({source_lang: source or "", target_lang: target or ""})
        columns["reason"].append(reason)
        columns["split"].append(assigned)
    return columns


def kept_in(reasons, splits, name):
    """`datasets.filter` predicate: the kept pairs assigned to split `name`."""
    return [not reason and split == name for reason, split in zip(reasons, splits)]


def prepare_translation_dataset(
    dataset,
    source_lang,
    target_lang,
    seed=0,
    valid_fraction=0.035,
    test_fraction=0.04,
    max_chars=1000,
    max_ratio=2.0,
    num_proc=None,
    name="dataset",
):
    """Clean, filter and split a translation DatasetDict of any size -> (DatasetDict of SPLITS, dropped counts).

    Validation/test splits the dataset has are kept; a missing one is carved from train by hash of the source
    sentence, and what would have gone to a split the dataset already provides stays in train. Everything runs in
    `datasets.map` and `filter` over Arrow files.
    """
    if "train" not in dataset:
        raise UsageError(f"{name} has splits {sorted(dataset)}; a 'train' split is needed")
    for split, rows in dataset.items():
        translation_languages(rows, f"{name} split '{split}'", required=(source_lang, target_lang))
    features = datasets.Features(
        {
            "id": datasets.Value("string"),
            "translation": datasets.Translation(languages=[source_lang, target_lang]),
            "reason": datasets.Value("string"),
            "split": datasets.Value("string"),
        }
    )
    carved = [split for split in ("validation", "test") if split not in dataset]
    cleaned = [
        rows.map(
            clean_pairs,
            batched=True,
            with_indices=True,
            remove_columns=rows.column_names,
            features=features,
            num_proc=num_proc if len(rows) > 10_000 else None,
            desc=f"cleaning {split}",
            fn_kwargs={
                "split": split,
                "source_lang": source_lang,
                "target_lang": target_lang,
                "carved": carved,
                "max_chars": max_chars,
                "max_ratio": max_ratio,
                "seed": seed,
                "valid_fraction": valid_fraction,
                "test_fraction": test_fraction,
            },
        )
        for split, rows in dataset.items()
        if split in SPLITS
    ]
    dropped = collections.Counter()
    for rows in cleaned:
        for entry in pc.value_counts(rows.with_format("arrow")["reason"]).to_pylist():
            if entry["values"]:
                dropped[entry["values"]] += entry["counts"]
    splits = {}
    for split in SPLITS:
        parts = [
            rows.filter(
                kept_in,
                input_columns=["reason", "split"],
                batched=True,
                fn_kwargs={"name": split},
                desc=f"keeping {split}",
            )
            for rows in cleaned
        ]
        splits[split] = datasets.concatenate_datasets(parts).remove_columns(["reason", "split"])
    return datasets.DatasetDict(splits), dropped


HASHED_AT_ONCE = 100_000  # rows whose sources are Python strings at once, while distinct_sources hashes them


def distinct_sources(split, source_lang):
    """How many different source sentences a split holds (the unit its pairs were assigned by), counted by their
    64-bit hashes (pandas') 100,000 rows at a time: 8 bytes a pair rather than every sentence in one hash table,
    which at 36M pairs needed more memory than the machine (two of 36M sentences share a hash with odds of about 1 in
    30,000, and the count is one less)."""
    from pandas.util import hash_array

    hashes = [
        hash_array(pc.struct_field(batch.column("translation"), source_lang).to_numpy(zero_copy_only=False))
        for batch in split.select_columns(["translation"]).with_format("arrow").iter(batch_size=HASHED_AT_ONCE)
    ]
    return len(np.unique(np.concatenate(hashes))) if hashes else 0


# ---------------------------------------------------------------------------------------------------------------------
# The prepared corpus: what it holds, and where it is written.
# ---------------------------------------------------------------------------------------------------------------------


def summary(dataset, dropped, groups, group_label):
    """Lines that say what was kept and dropped, by reason, and how big each split is in pairs and `groups`."""
    lines = [f"kept {sum(len(rows) for rows in dataset.values())} pairs, dropped {sum(dropped.values())}"]
    lines += [f"  dropped {reason:<24} {count:>7}" for reason, count in sorted(dropped.items(), key=lambda i: -i[1])]
    lines += [
        f"  {split:<10} {len(dataset[split]):>7} pairs from {groups[split]:>6} {group_label}" for split in SPLITS
    ]
    return "\n".join(lines)


def check_splits_not_empty(dataset):
    """datasets cannot load back a saved split without rows, so a corpus with an empty split is not written."""
    empty = [split for split in SPLITS if not len(dataset[split])]
    if empty:
        raise UsageError(
            f"the {' and '.join(empty)} split would be empty: {sum(len(rows) for rows in dataset.values())} pairs are "
            "too few for --valid_fraction/--test_fraction; add data or raise the fractions"
        )


@contextlib.contextmanager
def scratch_dir(output_dir):
    """Check that `output_dir` can be written, then lend a temporary folder inside it.

    The Arrow files made on the way can be as large as the corpus, so they go where the output goes, not to /tmp. A
    run that fails leaves nothing behind: the temporary folder goes, and so do the folders that the check created.
    """
    output_dir = Path(output_dir).absolute()
    created = next((folder for folder in (*reversed(output_dir.parents), output_dir) if not folder.exists()), None)
    try:
        check_writable_dir(output_dir)
        with tempfile.TemporaryDirectory(prefix=".prepare_data_", dir=output_dir) as scratch:
            yield Path(scratch)
    except BaseException:
        if created is not None:
            shutil.rmtree(created, ignore_errors=True)
        raise
