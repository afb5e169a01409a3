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
                      (datasets.load_dataset(NAME, --dataset_config)). Splits it
                      has are kept; missing validation/test splits are carved
                      from train.
  For these, the hashed unit is the source sentence instead of the chapter, so
  a sentence repeated in the corpus always lands in one split.

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
from pysword.modules import SwordModules

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


def is_valid_text(text):
    """False for undecodable lines (None), replacement characters, control characters or surrogates."""
    if text is None or "\ufffd" in text:
        return False
    return not any(unicodedata.category(ch) in ("Cc", "Cs") for ch in text)


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


def parallel_examples(pairs, source_lang, target_lang, max_chars=1000, max_ratio=2.0):
    """Filter (id, source, target) pairs from a sentence-aligned corpus -> (examples, dropped).

    A source or target of None stands for a line that could not be decoded;
    like any other value that is not text, it makes the pair invalid_text.
    The split unit (`group`) is the source sentence itself.
    """
    examples, dropped = [], collections.Counter()
    for example_id, source, target in pairs:
        source = clean_text(source) if isinstance(source, str) else None
        target = clean_text(target) if isinstance(target, str) else None
        reason = drop_reason(source, target, max_chars, max_ratio)
        if reason:
            dropped[reason] += 1
            continue
        examples.append({
            "id": example_id,
            "group": source,
            "translation": {source_lang: source, target_lang: target},
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
# 5. The other sources: local parallel files, Hugging Face datasets
# ---------------------------------------------------------------------------


def read_lines(path):
    """The lines of a file as str, or None where a line is not valid UTF-8."""
    data = Path(path).read_bytes()
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    decoded = []
    for line in lines:
        try:
            decoded.append(line.rstrip(b"\r").decode("utf-8"))
        except UnicodeDecodeError:
            decoded.append(None)
    return decoded


def read_parallel_files(source_path, target_path):
    """(id, source, target) triples from two line-aligned files; an error if the line counts differ."""
    source_lines, target_lines = read_lines(source_path), read_lines(target_path)
    if len(source_lines) != len(target_lines):
        raise ValueError(
            f"--files expects line-aligned files, but {source_path} has {len(source_lines)} lines "
            f"and {target_path} has {len(target_lines)} lines")
    return [(f"line.{n}", s, t) for n, (s, t) in enumerate(zip(source_lines, target_lines), start=1)]


def hf_pairs(dataset, source_lang, target_lang, name="dataset"):
    """(id, source, target) triples per split of a DatasetDict with a `translation` column."""
    if "train" not in dataset:
        raise ValueError(f"{name} has splits {sorted(dataset)}; a 'train' split is needed")
    pairs = {}
    for split, rows in dataset.items():
        if "translation" not in rows.column_names:
            raise ValueError(f"{name} split '{split}' has columns {rows.column_names}; "
                             "expected a 'translation' column of {language: text} dicts")
        if len(rows) == 0:
            pairs[split] = []
            continue
        languages = sorted(rows[0]["translation"] or {})
        missing = [lang for lang in (source_lang, target_lang) if lang not in languages]
        if missing:
            raise ValueError(f"{name} split '{split}' has translation languages {languages}, "
                             f"not {missing}; pick --source_lang/--target_lang from these")
        # A row without a translation (None) is kept as an invalid pair, to be dropped and counted.
        pairs[split] = [(f"{split}.{i}", (row or {}).get(source_lang), (row or {}).get(target_lang))
                        for i, row in enumerate(rows["translation"])]
    return pairs


def hf_splits(dataset, source_lang, target_lang, seed=0, valid_fraction=0.035, test_fraction=0.04,
              max_chars=1000, max_ratio=2.0, name="dataset"):
    """Filter and split a translation DatasetDict -> (splits, dropped).

    Validation/test splits the dataset has are kept; a missing one is carved
    from train by hash, and what would have gone to a split the dataset
    already provides stays in train.
    """
    pairs = hf_pairs(dataset, source_lang, target_lang, name)
    train, dropped = parallel_examples(pairs["train"], source_lang, target_lang, max_chars, max_ratio)
    splits = split_examples(train, seed, valid_fraction, test_fraction)
    for split in ("validation", "test"):
        if split in pairs:
            splits["train"].extend(splits[split])
            splits[split], split_dropped = parallel_examples(
                pairs[split], source_lang, target_lang, max_chars, max_ratio)
            dropped.update(split_dropped)
    return splits, dropped


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
    existing = next(folder for folder in (path, *path.parents) if folder.exists())
    if not existing.is_dir():
        sys.exit(f"error: cannot write to --output_dir {path}: {existing} is a file")
    try:
        Path(tempfile.mkdtemp(prefix=".write_test_", dir=existing)).rmdir()
    except OSError as error:
        sys.exit(f"error: cannot write to --output_dir {path} ({error})")


def print_summary(splits, dropped, group_label):
    kept = sum(len(rows) for rows in splits.values())
    print(f"kept {kept} pairs, dropped {sum(dropped.values())}")
    for reason, count in sorted(dropped.items(), key=lambda item: -item[1]):
        print(f"  dropped {reason:<24} {count:>7}")
    for split in SPLITS:
        groups = len({e["group"] for e in splits[split]})
        print(f"  {split:<10} {len(splits[split]):>7} pairs from {groups:>6} {group_label}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output_dir", required=True, help="where the DatasetDict is saved (save_to_disk)")
    parser.add_argument("--source_lang", default="en")
    parser.add_argument("--target_lang", default="es")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--dataset", help="a Hugging Face translation dataset instead of the Bible")
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
    args = parser.parse_args(argv)

    if args.source_lang == args.target_lang:
        parser.error("--source_lang and --target_lang must differ")
    check_output_dir(args.output_dir)
    split_args = dict(seed=args.seed, valid_fraction=args.valid_fraction, test_fraction=args.test_fraction)
    filter_args = dict(max_chars=args.max_chars, max_ratio=args.max_ratio)

    try:
        if args.files:
            pairs = read_parallel_files(*args.files)
            examples, dropped = parallel_examples(pairs, args.source_lang, args.target_lang, **filter_args)
            splits, group_label = split_examples(examples, **split_args), "distinct sources"
        elif args.dataset:
            dataset = datasets.load_dataset(args.dataset, args.dataset_config)
            splits, dropped = hf_splits(dataset, args.source_lang, args.target_lang, **split_args,
                                        **filter_args, name=args.dataset)
            group_label = "distinct sources"
        else:
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
            examples, dropped = bible_examples(records, **filter_args)
            splits, group_label = split_examples(examples, **split_args), "chapters"
    except (ValueError, OSError) as error:
        sys.exit(f"error: {error}")

    print_summary(splits, dropped, group_label)
    empty = [split for split in SPLITS if not splits[split]]
    if empty:
        # datasets cannot load back a saved split without rows, so none is written.
        sys.exit(f"error: the {' and '.join(empty)} split would be empty: {sum(map(len, splits.values()))} pairs "
                 "are too few for --valid_fraction/--test_fraction; add data or raise the fractions")
    example = splits["train"][0]
    print(f"first training pair, {example['id']}:")
    for lang in (args.source_lang, args.target_lang):
        print(f"  {lang}: {example['translation'][lang]}")
    to_dataset_dict(splits, args.source_lang, args.target_lang).save_to_disk(args.output_dir)
    print(f"saved to {args.output_dir}")


if __name__ == "__main__":
    main()
