"""Build the English-Spanish parallel corpus the Transformer is trained on.

The paper trains on WMT 2014 English-German and English-French (section 5.1).
Those are too big for a small machine and cannot be downloaded here, so the
default corpus is a Bible aligned verse by verse: the World English Bible
(English) and the Reina-Valera 1909 (Spanish), both public domain, read from
the SWORD modules that Debian ships as `sword-text-web` and `sword-text-sparv`.
A verse is a natural sentence-sized unit and both books number their verses
(almost) the same way, so verse "Gen.1.1" in one translates "Gen.1.1" in the
other: about 31,000 verse pairs, of which about 30,000 pass the filters below.

Steps:
  1. fetch: `apt-get download` the two .deb files and unpack them with
     `dpkg-deb -x` into a cache folder (reused on later runs).
  2. read: `pysword` yields each verse's raw OSIS markup; we strip it ourselves
     (footnotes, section headings, speaker labels and Strong's-number word tags
     go; canonical psalm titles stay, because the Spanish keeps them in verse 1),
     then NFC-normalise and collapse whitespace.
  3. filter: a pair is dropped, and counted by reason, when
       invalid_text            a side has non-UTF-8 bytes or control characters
       empty                   a side is empty (verses one translation omits)
       too_long                a side has more than --max_chars characters
       length_ratio            (longer + 10) / (shorter + 10) > --max_ratio in
                               characters: the halves are unlikely to say the
                               same thing (the +10 keeps "Amen."-sized verses
                               from being judged on a few characters)
       versification_mismatch  the verse sits in a chapter where the two number
                               the verses differently, so neighbouring verses
                               are shifted against each other: a chapter where
                               one translation has a verse the other lacks,
                               the chapter right after one, or a chapter with
                               two or more length_ratio failures
  4. split: whole CHAPTERS are assigned to a split, never single verses, so no
     test verse sits in a chapter the model trained on. A chapter goes to
         test        if u < test_fraction,
         validation  if u < test_fraction + valid_fraction,
         train       otherwise,
     where u = first 8 bytes of sha256("{seed}:{book} {chapter}") / 2**64, a
     number in [0, 1) that is the same on every machine and Python version.
     The defaults (seed 0) give 1,111 test pairs from 46 chapters, 1,178
     validation pairs from 43 chapters and 27,732 training pairs.
  5. write: a datasets.DatasetDict with train / validation / test, each row
     {"id": "Gen.1.1", "translation": {"en": ..., "es": ...}} (the standard
     Hugging Face translation layout), saved with save_to_disk(--output_dir).

Other sources, with the same cleaning, filters and output layout:
  --files SRC TGT     two plain-text files, one sentence per line, line N of
                      one translating line N of the other. Ids are "line.N".
  --dataset NAME      any Hugging Face dataset with a `translation` column
                      (datasets.load_dataset(NAME, --dataset_config)): a Hub
                      name such as wmt14, or a local folder of Parquet or JSON
                      files in the same layout. Splits it has are kept; missing
                      validation/test splits are carved from train. Ids are
                      "SPLIT.N" unless the dataset has an `id` column.
  For these, the hashed unit is the source sentence instead of the chapter, so
  a sentence repeated in the corpus always lands in one split. They may be of
  any size (WMT14 English-French has 36M pairs): the pairs stream from Arrow
  files through `datasets.map` (--num_proc processes) and `filter` into the
  saved folder, and are never held in Python lists. The Bible, 31,000 verses
  whose versification checks look at whole chapters, is built in memory.

Usage:
  python scripts/prepare_data.py --output_dir data/bible
  python scripts/prepare_data.py --output_dir data/mine --files train.en train.es
"""

import argparse
import collections
import functools
import hashlib
import html
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unicodedata
from pathlib import Path

import datasets
import pyarrow.compute as pc
from pysword.modules import SwordModules

from vaswani.training.data import translation_languages

SPLITS = ("train", "validation", "test")

# Which Debian package holds which SWORD module, per language.
SWORD_SOURCES = {
    "en": ("sword-text-web", "engWEB2015eb"),
    "es": ("sword-text-sparv", "spaRV1909eb"),
}

# ---------------------------------------------------------------------------
# 1. Fetch the SWORD modules (Debian packages) into a cache folder
# ---------------------------------------------------------------------------


def apt_download(packages, dest):
    """Download .deb files with `apt-get download` into `dest`.

    On a fresh machine apt's package lists may be empty and the download fails;
    as root we refresh them once and retry, otherwise we say what to run.
    """
    if shutil.which("apt-get") is None:
        sys.exit("error: apt-get not found. The default corpus comes from Debian packages; "
                 "on other systems use --files SRC TGT or --dataset NAME instead.")
    command = ["apt-get", "download", *packages]
    result = subprocess.run(command, cwd=dest, capture_output=True, text=True)
    if result.returncode != 0 and os.geteuid() == 0:
        print("apt-get download failed; refreshing the package lists with `apt-get update` and retrying")
        subprocess.run(["apt-get", "update"], capture_output=True, text=True)
        result = subprocess.run(command, cwd=dest, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"error: `{' '.join(command)}` failed:\n{result.stderr.strip()}\n"
                 "apt's package lists are probably empty or stale: run `sudo apt-get update` once, then rerun.")


def fetch_sword_modules(cache_dir):
    """Return a SWORD data folder (with mods.d/) holding the English and Spanish modules.

    The .deb files go to cache_dir/debs and are unpacked into cache_dir/root;
    both are reused when they are already there.
    """
    cache_dir = Path(cache_dir)
    sword_dir = cache_dir / "root" / "usr" / "share" / "sword"
    wanted = [module for _, module in SWORD_SOURCES.values()]
    if all((sword_dir / "mods.d" / f"{module.lower()}.conf").exists() for module in wanted):
        return sword_dir

    deb_dir = cache_dir / "debs"
    deb_dir.mkdir(parents=True, exist_ok=True)
    packages = [package for package, _ in SWORD_SOURCES.values()]
    missing = [p for p in packages if not list(deb_dir.glob(f"{p}_*.deb"))]
    if missing:
        print(f"downloading {', '.join(missing)} with apt-get into {deb_dir}")
        apt_download(missing, deb_dir)
    for package in packages:
        deb = sorted(deb_dir.glob(f"{package}_*.deb"))[-1]
        subprocess.run(["dpkg-deb", "-x", str(deb), str(cache_dir / "root")], check=True)
    return sword_dir


# ---------------------------------------------------------------------------
# 2. Read verses and strip the OSIS markup
# ---------------------------------------------------------------------------

# Elements whose text is not part of the verse: footnotes and cross references
# (with their nested references and alternative readings) and speaker labels.
# The body may not run past its own end tag, so one match is one element.
DROPPED_ELEMENT = r"<(note|speaker)\b[^>]*>(?:(?!</\1>).)*</\1>"
DROP_WITH_CONTENT = re.compile(DROPPED_ELEMENT, re.S)
# The same, followed (past spaces and tags) by closing punctuation: removed
# together with the spaces around it, so no space is left before the "?".
DROP_BEFORE_PUNCTUATION = re.compile(r"\s*" + DROPPED_ELEMENT + r"\s*(?=(?:<[^>]*>)*[,.;:!?”’)\]])", re.S)
# Section headings are editorial; canonical titles (psalm superscriptions) are text.
EDITORIAL_TITLE = re.compile(r'<title\b(?![^>]*canonical="true")[^>]*>.*?</title>', re.S)
# Tags that wrap words inside a line: removing them must not add a space,
# e.g. <w lemma="strong:H7225">EN el principio</w>.
INLINE_TAG = re.compile(r"</?(w|transChange|q|seg|name|hi|divineName|foreign|reference)\b[^>]*>")
ANY_TAG = re.compile(r"<[^>]*>")


def clean_text(text):
    """NFC-normalise and collapse every run of whitespace to one space."""
    return " ".join(unicodedata.normalize("NFC", text).split())


def clean_osis(raw):
    """Turn one verse of OSIS markup into plain text."""
    # Whatever follows the chapter's end marker (book ends, the WEB glossary
    # after Revelation 22:21) is not verse text.
    text = raw.split("<chapter eID", 1)[0]
    text = DROP_BEFORE_PUNCTUATION.sub("", text)
    # A footnote usually sits between two words with no space around it.
    text = DROP_WITH_CONTENT.sub(" ", text)
    text = EDITORIAL_TITLE.sub(" ", text)
    text = INLINE_TAG.sub("", text)
    # Line, paragraph, list and milestone tags separate words.
    text = ANY_TAG.sub(" ", text)
    return clean_text(html.unescape(text))


def read_sword_module(sword_dir, module):
    """Return {(book, chapter, verse): cleaned text} for every verse slot of a module, in book order."""
    modules = SwordModules(str(sword_dir))
    modules.parse_modules()
    bible = modules.get_bible_from_module(module)
    # pysword decompresses the whole book for every verse it returns; keeping the
    # last blocks around makes reading a Bible take a second instead of a minute.
    bible._decompressed_text = functools.lru_cache(maxsize=2)(bible._decompressed_text)

    verses = {}
    for books in bible.get_structure().get_books().values():
        for book in books:
            for chapter, n_verses in enumerate(book.chapter_lengths, start=1):
                for verse in range(1, n_verses + 1):
                    raw = bible.get(books=book.osis_name, chapters=chapter, verses=verse, clean=False)
                    verses[(book.osis_name, chapter, verse)] = clean_osis(raw)
    return verses


def bible_records(en_verses, es_verses):
    """Yield (book, chapter, verse, en, es) for the books both modules contain.

    A verse slot that only one versification has gets "" on the other side.
    Books only one module has (the WEB's deuterocanon) are skipped.
    """
    en_books = list(dict.fromkeys(book for book, _, _ in en_verses))
    es_books = set(book for book, _, _ in es_verses)
    book_order = {book: i for i, book in enumerate(b for b in en_books if b in es_books)}
    keys = {key for key in (*en_verses, *es_verses) if key[0] in book_order}
    for book, chapter, verse in sorted(keys, key=lambda k: (book_order[k[0]], k[1], k[2])):
        key = (book, chapter, verse)
        yield book, chapter, verse, en_verses.get(key, ""), es_verses.get(key, "")


# ---------------------------------------------------------------------------
# 3. Filter pairs
# ---------------------------------------------------------------------------


# Unicode's control characters (category Cc) and surrogates (Cs), as one regular expression: a scan per character
# in Python would be the slowest step at WMT scale.
CONTROL_OR_SURROGATE = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")


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


def bible_examples(records, max_chars=1000, max_ratio=2.0):
    """Pair up Bible verses: (book, chapter, verse, en, es) records -> (examples, dropped).

    Each example is {"id": "Gen.1.1", "group": "Gen 1", "translation": {"en", "es"}},
    `group` being the unit the split assigns. `dropped` counts dropped pairs by reason.
    """
    records = [(b, c, v, clean_text(en or ""), clean_text(es or "")) for b, c, v, en, es in records]

    # Find chapters whose verses are shifted against each other. A verse one
    # side has and the other lacks means the two number the verses differently
    # there (one merges two verses, or moves one across a chapter break), so
    # what follows in that chapter and the next may be shifted: distrust both.
    # A shift without a missing verse shows up as several pairs in one chapter
    # failing the length ratio: distrust that chapter.
    mismatched, ratio_failures = set(), collections.Counter()
    for book, chapter, _, en, es in records:
        if bool(en) != bool(es):
            mismatched.update({(book, chapter), (book, chapter + 1)})
        if drop_reason(en, es, max_chars, max_ratio) == "length_ratio":
            ratio_failures[(book, chapter)] += 1
    mismatched.update(chapter for chapter, count in ratio_failures.items() if count >= 2)

    examples, dropped = [], collections.Counter()
    for book, chapter, verse, en, es in records:
        reason = drop_reason(en, es, max_chars, max_ratio)
        if reason is None and (book, chapter) in mismatched:
            reason = "versification_mismatch"
        if reason:
            dropped[reason] += 1
            continue
        examples.append({
            "id": f"{book}.{chapter}.{verse}",
            "group": f"{book} {chapter}",
            "translation": {"en": en, "es": es},
        })
    return examples, dropped


# ---------------------------------------------------------------------------
# 4. Split by a stable hash of the group (chapter or source sentence)
# ---------------------------------------------------------------------------


def assign_split(group, seed=0, valid_fraction=0.035, test_fraction=0.04):
    """Map a group key to "train", "validation" or "test", the same way on every machine."""
    digest = hashlib.sha256(f"{seed}:{group}".encode("utf-8")).digest()
    u = int.from_bytes(digest[:8], "big") / 2**64
    if u < test_fraction:
        return "test"
    if u < test_fraction + valid_fraction:
        return "validation"
    return "train"


def split_examples(examples, seed=0, valid_fraction=0.035, test_fraction=0.04):
    """Distribute examples over train/validation/test by their group, keeping input order."""
    splits = {name: [] for name in SPLITS}
    for example in examples:
        splits[assign_split(example["group"], seed, valid_fraction, test_fraction)].append(example)
    return splits


# ---------------------------------------------------------------------------
# 5. The other sources, at any size: local parallel files, Hugging Face datasets
# ---------------------------------------------------------------------------


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
            yield {"id": f"line.{number}",
                   "translation": {source_lang: decode_line(source), target_lang: decode_line(target)}}


def parallel_files_dataset(source_path, target_path, source_lang, target_lang, cache_dir):
    """A DatasetDict with a train split streamed from two line-aligned files into Arrow files in `cache_dir`."""
    counts = {path: count_lines(path) for path in (source_path, target_path)}
    if counts[source_path] != counts[target_path]:
        raise ValueError(f"--files expects line-aligned files, but {source_path} has {counts[source_path]} lines "
                         f"and {target_path} has {counts[target_path]} lines")
    features = datasets.Features({"id": datasets.Value("string"),
                                  "translation": datasets.Translation(languages=[source_lang, target_lang])})
    train = datasets.Dataset.from_generator(
        parallel_file_rows, features=features, cache_dir=str(cache_dir),
        gen_kwargs={"source_path": str(source_path), "target_path": str(target_path), "source_lang": source_lang,
                    "target_lang": target_lang})
    return datasets.DatasetDict({"train": train})


def clean_pairs(batch, indices, split, source_lang, target_lang, carved, max_chars, max_ratio, **split_args):
    """`datasets.map` function: each pair cleaned, with the reason it is dropped ("" to keep it) and its split.

    A kept pair of the train split goes where its source sentence hashes to, if that is a split in `carved` (one the
    dataset lacks), else to train; the pairs of the dataset's own validation and test splits stay there.
    """
    ids = batch["id"] if "id" in batch else [f"{split}.{i}" for i in indices]
    columns = {"id": ids, "translation": [], "reason": [], "split": []}
    for pair in batch["translation"]:
        pair = pair or {}  # a row without a translation is an invalid pair, dropped and counted
        source, target = (clean_text(text) if isinstance(text, str) else None
                          for text in (pair.get(source_lang), pair.get(target_lang)))
        reason = drop_reason(source, target, max_chars, max_ratio) or ""
        assigned = split
        if split == "train" and not reason:
            assigned = assign_split(source, **split_args)
            assigned = assigned if assigned in carved else "train"
        columns["translation"].append({source_lang: source or "", target_lang: target or ""})
        columns["reason"].append(reason)
        columns["split"].append(assigned)
    return columns


def kept_in(reasons, splits, name):
    """`datasets.filter` predicate: the kept pairs assigned to split `name`."""
    return [not reason and split == name for reason, split in zip(reasons, splits)]


def prepare_translation_dataset(dataset, source_lang, target_lang, seed=0, valid_fraction=0.035,
                                test_fraction=0.04, max_chars=1000, max_ratio=2.0, num_proc=None, name="dataset"):
    """Clean, filter and split a translation DatasetDict of any size -> (DatasetDict of SPLITS, dropped counts).

    Validation/test splits the dataset has are kept; a missing one is carved from train by hash of the source
    sentence, and what would have gone to a split the dataset already provides stays in train. Everything runs in
    `datasets.map` and `filter` over Arrow files.
    """
    if "train" not in dataset:
        raise ValueError(f"{name} has splits {sorted(dataset)}; a 'train' split is needed")
    for split, rows in dataset.items():
        if "translation" not in rows.column_names:
            raise ValueError(f"{name} split '{split}' has columns {rows.column_names}; "
                             "expected a 'translation' column of {language: text} dicts")
        languages = translation_languages(rows, f"{name} split '{split}'")
        missing = [lang for lang in (source_lang, target_lang) if lang not in languages]
        if missing:
            raise ValueError(f"{name} split '{split}' has translation languages {languages}, "
                             f"not {missing}; pick --source_lang/--target_lang from these")
    features = datasets.Features({"id": datasets.Value("string"),
                                  "translation": datasets.Translation(languages=[source_lang, target_lang]),
                                  "reason": datasets.Value("string"), "split": datasets.Value("string")})
    carved = [split for split in ("validation", "test") if split not in dataset]
    cleaned = [rows.map(clean_pairs, batched=True, with_indices=True, remove_columns=rows.column_names,
                        features=features, num_proc=num_proc if len(rows) > 10_000 else None,
                        desc=f"cleaning {split}",
                        fn_kwargs=dict(split=split, source_lang=source_lang, target_lang=target_lang, carved=carved,
                                       max_chars=max_chars, max_ratio=max_ratio, seed=seed,
                                       valid_fraction=valid_fraction, test_fraction=test_fraction))
               for split, rows in dataset.items() if split in SPLITS]
    dropped = collections.Counter()
    for rows in cleaned:
        for entry in pc.value_counts(rows.with_format("arrow")["reason"]).to_pylist():
            if entry["values"]:
                dropped[entry["values"]] += entry["counts"]
    splits = {}
    for split in SPLITS:
        parts = [rows.filter(kept_in, input_columns=["reason", "split"], batched=True, fn_kwargs={"name": split},
                             desc=f"keeping {split}") for rows in cleaned]
        splits[split] = datasets.concatenate_datasets(parts).remove_columns(["reason", "split"])
    return datasets.DatasetDict(splits), dropped


# ---------------------------------------------------------------------------
# 6. Write the DatasetDict and report
# ---------------------------------------------------------------------------


def to_dataset_dict(splits, source_lang, target_lang):
    """A datasets.DatasetDict with columns `id` and `translation` (the group key is dropped)."""
    features = datasets.Features({
        "id": datasets.Value("string"),
        "translation": datasets.Translation(languages=[source_lang, target_lang]),
    })
    return datasets.DatasetDict({
        split: datasets.Dataset.from_dict({
            "id": [e["id"] for e in splits[split]],
            "translation": [{lang: e["translation"][lang] for lang in (source_lang, target_lang)}
                            for e in splits[split]],
        }, features=features)
        for split in SPLITS
    })


def check_output_dir(path):
    """Exit before any work if `path` cannot be created or written; the check itself leaves nothing behind."""
    path = Path(path).absolute()
    existing = nearest_existing_folder(path)
    if not existing.is_dir():
        sys.exit(f"error: cannot write to --output_dir {path}: {existing} is a file")
    try:
        Path(tempfile.mkdtemp(prefix=".write_test_", dir=existing)).rmdir()
    except OSError as error:
        sys.exit(f"error: cannot write to --output_dir {path} ({error})")


def nearest_existing_folder(path):
    path = Path(path).absolute()
    return next(folder for folder in (path, *path.parents) if folder.exists())


def distinct_sources(split, source_lang):
    """How many different source sentences a split holds (the unit its pairs were assigned by)."""
    sources = split.select_columns(["translation"]).with_format("arrow")[:].column("translation")
    return pc.count_distinct(pc.struct_field(sources, source_lang)).as_py()


def print_summary(dataset, dropped, groups, group_label):
    print(f"kept {sum(len(rows) for rows in dataset.values())} pairs, dropped {sum(dropped.values())}")
    for reason, count in sorted(dropped.items(), key=lambda item: -item[1]):
        print(f"  dropped {reason:<24} {count:>7}")
    for split in SPLITS:
        print(f"  {split:<10} {len(dataset[split]):>7} pairs from {groups[split]:>6} {group_label}")


def bible_dataset(args):
    """The default corpus: the two SWORD modules, aligned verse by verse, split by chapter -> (dataset, dropped,
    chapters per split)."""
    unknown = {args.source_lang, args.target_lang} - set(SWORD_SOURCES)
    if unknown:
        raise ValueError(f"the Bible corpus has languages {sorted(SWORD_SOURCES)}, not {sorted(unknown)}; "
                         "use --files or --dataset for other languages")
    sword_dir = fetch_sword_modules(args.cache_dir or Path(args.output_dir) / "sword_cache")
    verses = {}
    for lang, (_, module) in SWORD_SOURCES.items():
        print(f"reading {module} ({lang}) from {sword_dir}")
        verses[lang] = read_sword_module(sword_dir, module)
    records = list(bible_records(verses["en"], verses["es"]))
    print(f"{len(records)} verse slots in the books both translations contain")
    examples, dropped = bible_examples(records, max_chars=args.max_chars, max_ratio=args.max_ratio)
    splits = split_examples(examples, seed=args.seed, valid_fraction=args.valid_fraction,
                            test_fraction=args.test_fraction)
    chapters = {split: len({e["group"] for e in rows}) for split, rows in splits.items()}
    return to_dataset_dict(splits, args.source_lang, args.target_lang), dropped, chapters


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output_dir", required=True, help="where the DatasetDict is saved (save_to_disk)")
    parser.add_argument("--source_lang", default="en")
    parser.add_argument("--target_lang", default="es")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--dataset", help="a Hugging Face translation dataset (Hub name or local folder of Parquet "
                                          "or JSON files) instead of the Bible")
    source.add_argument("--files", nargs=2, metavar=("SRC", "TGT"),
                        help="two line-aligned plain-text files instead of the Bible")
    parser.add_argument("--dataset_config", default=None, help="configuration name for --dataset, e.g. de-en")
    parser.add_argument("--cache_dir", default=None,
                        help="where the Debian packages are downloaded and unpacked (default: OUTPUT_DIR/sword_cache)")
    parser.add_argument("--max_chars", type=int, default=1000, help="drop pairs with a longer side (characters)")
    parser.add_argument("--max_ratio", type=float, default=2.0,
                        help="drop pairs with (longer + 10) / (shorter + 10) above this (characters)")
    parser.add_argument("--seed", type=int, default=0, help="salt of the split hash")
    parser.add_argument("--valid_fraction", type=float, default=0.035)
    parser.add_argument("--test_fraction", type=float, default=0.04)
    parser.add_argument("--num_proc", type=int, default=os.cpu_count() or 1,
                        help="processes that clean --dataset / --files corpora")
    args = parser.parse_args(argv)

    if args.source_lang == args.target_lang:
        parser.error("--source_lang and --target_lang must differ")
    check_output_dir(args.output_dir)
    # --files are first streamed into Arrow files here, removed once the dataset is saved.
    with tempfile.TemporaryDirectory(prefix=".prepare_data_", dir=nearest_existing_folder(args.output_dir)) as tmp:
        try:
            if args.files or args.dataset:
                if args.files:
                    source = parallel_files_dataset(*args.files, args.source_lang, args.target_lang, cache_dir=tmp)
                else:
                    source = datasets.load_dataset(args.dataset, args.dataset_config)
                dataset, dropped = prepare_translation_dataset(
                    source, args.source_lang, args.target_lang, seed=args.seed, valid_fraction=args.valid_fraction,
                    test_fraction=args.test_fraction, max_chars=args.max_chars, max_ratio=args.max_ratio,
                    num_proc=args.num_proc, name=args.dataset or "--files")
                groups = {split: distinct_sources(rows, args.source_lang) for split, rows in dataset.items()}
                group_label = "distinct sources"
            else:
                dataset, dropped, groups = bible_dataset(args)
                group_label = "chapters"
        except (ValueError, OSError) as error:
            sys.exit(f"error: {error}")

        print_summary(dataset, dropped, groups, group_label)
        empty = [split for split in SPLITS if not len(dataset[split])]
        if empty:
            # datasets cannot load back a saved split without rows, so none is written.
            sys.exit(f"error: the {' and '.join(empty)} split would be empty: "
                     f"{sum(len(rows) for rows in dataset.values())} pairs are too few for "
                     "--valid_fraction/--test_fraction; add data or raise the fractions")
        example = dataset["train"][0]
        print(f"first training pair, {example['id']}:")
        for lang in (args.source_lang, args.target_lang):
            print(f"  {lang}: {example['translation'][lang]}")
        dataset.save_to_disk(args.output_dir)
    print(f"saved to {args.output_dir}")


if __name__ == "__main__":
    main()
