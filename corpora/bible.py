"""The default corpus: an English-Spanish Bible, aligned verse by verse.

The paper trains on WMT 2014 English-German and English-French (section 5.1). Those are too big for a small machine
and cannot be downloaded everywhere, so the default corpus is the World English Bible (English) and the Reina-Valera
1909 (Spanish), both public domain, read from the SWORD modules that Debian ships as `sword-text-web` and
`sword-text-sparv`. A verse is a natural sentence-sized unit and both books number their verses (almost) the same
way, so verse "Gen.1.1" in one translates "Gen.1.1" in the other: about 31,000 verse pairs, of which about 30,000 pass
the filters of `vaswani.corpora.dataset`.

Steps:
  1. fetch: `apt-get download` the two .deb files and unpack them with `dpkg-deb -x` into a cache folder (reused on
     later runs).
  2. read: `pysword` yields each verse's raw OSIS markup (once: the verses are kept in the cache folder); we strip it
     ourselves (footnotes, section headings, speaker labels and Strong's-number word tags go; canonical psalm titles
     stay, because the Spanish keeps them in verse 1), then NFC-normalise and collapse whitespace.
  3. filter: the filters of `vaswani.corpora.dataset` (invalid_text, empty, too_long, length_ratio), and
       versification_mismatch  the verse sits in a chapter where the two number the verses differently, so
                               neighbouring verses are shifted against each other: a chapter where one translation
                               has a verse the other lacks, the chapter right after one, or a chapter with two or more
                               length_ratio failures
  4. split: whole CHAPTERS are assigned to a split, never single verses, so no test verse sits in a chapter the model
     trained on. The defaults (seed 0) give 1,111 test pairs from 46 chapters, 1,178 validation pairs from 43
     chapters and 27,732 training pairs.
The corpus is 31,000 verses whose versification checks look at whole chapters, so it is built in memory.
"""

import collections
import hashlib
import html
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

from ..checks import UsageError
from .dataset import clean_text, drop_reason, split_examples, to_dataset_dict


# Which Debian package holds which SWORD module, per language.
SWORD_SOURCES = {
    "en": ("sword-text-web", "engWEB2015eb"),
    "es": ("sword-text-sparv", "spaRV1909eb"),
}

# Elements whose text is not part of the verse: footnotes and cross references (with their nested references and
# alternative readings) and speaker labels. The body may not run past its own end tag, so one match is one element.
DROPPED_ELEMENT = r"<(note|speaker)\b[^>]*>(?:(?!</\1>).)*</\1>"
DROP_WITH_CONTENT = re.compile(DROPPED_ELEMENT, re.S)
# The same, followed (past spaces and tags) by closing punctuation: removed together with the spaces around it, so no
# space is left before the "?".
DROP_BEFORE_PUNCTUATION = re.compile(r"\s*" + DROPPED_ELEMENT + r"\s*(?=(?:<[^>]*>)*[,.;:!?”’)\]])", re.S)
# Section headings are editorial; canonical titles (psalm superscriptions) are text.
EDITORIAL_TITLE = re.compile(r'<title\b(?![^>]*canonical="true")[^>]*>.*?</title>', re.S)
# Tags that wrap words inside a line: removing them must not add a space, e.g. <w lemma="strong:H7225">EN el
# principio</w>.
INLINE_TAG = re.compile(r"</?(w|transChange|q|seg|name|hi|divineName|foreign|reference)\b[^>]*>")
ANY_TAG = re.compile(r"<[^>]*>")


# ---------------------------------------------------------------------------------------------------------------------
# 1. Fetch the SWORD modules (Debian packages) into a cache folder.
# ---------------------------------------------------------------------------------------------------------------------


def apt_download(packages, dest):
    """Download .deb files with `apt-get download` into `dest`.

    On a fresh machine apt's package lists may be empty and the download fails; as root we refresh them once and
    retry, otherwise we say what to run.
    """
    if shutil.which("apt-get") is None:
        raise UsageError(
            "apt-get not found. The default corpus comes from Debian packages; "
            "on other systems use --files SRC TGT or --dataset NAME instead."
        )
    command = ["apt-get", "download", *packages]
    result = subprocess.run(command, cwd=dest, capture_output=True, text=True)
    if result.returncode != 0 and os.geteuid() == 0:
        print("apt-get download failed; refreshing the package lists with `apt-get update` and retrying")
        subprocess.run(["apt-get", "update"], capture_output=True, text=True)
        result = subprocess.run(command, cwd=dest, capture_output=True, text=True)
    if result.returncode != 0:
        raise UsageError(
            f"`{' '.join(command)}` failed:\n{result.stderr.strip()}\n"
            "apt's package lists are probably empty or stale: run `sudo apt-get update` once, then rerun."
        )


def fetch_sword_modules(cache_dir):
    """Return a SWORD data folder (with mods.d/) holding the English and Spanish modules.

    The .deb files go to cache_dir/debs and are unpacked into cache_dir/root; both are reused when they are already
    there.
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


# ---------------------------------------------------------------------------------------------------------------------
# 2. Read verses and strip the OSIS markup.
# ---------------------------------------------------------------------------------------------------------------------


def clean_osis(raw):
    """Turn one verse of OSIS markup into plain text."""
    # Whatever follows the chapter's end marker (book ends, the WEB glossary after Revelation 22:21) is not verse
    # text.
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
    return {key: clean_osis(raw) for key, raw in raw_verses(sword_dir, module).items()}


def raw_verses(sword_dir, module):
    """{(book, chapter, verse): OSIS markup} of every verse slot of a module, in book order.

    pysword decompresses the whole book for every verse it returns, so reading a Bible through it takes minutes: it is
    read once, and the verses are kept in sword_dir/verses/, under a key of the modules' configuration files (their
    versions), for every later run."""
    sword_dir = Path(sword_dir)
    configurations = b"".join(path.read_bytes() for path in sorted((sword_dir / "mods.d").glob("*.conf")))
    cache_file = sword_dir / "verses" / f"{module}-{hashlib.sha256(configurations).hexdigest()[:16]}.json"
    if cache_file.is_file():
        return {(book, chapter, verse): raw for book, chapter, verse, raw in json.loads(cache_file.read_text())}
    # Imported here, so that the other corpora (--files, --dataset) need no pysword.
    from pysword.modules import SwordModules

    modules = SwordModules(str(sword_dir))
    modules.parse_modules()
    bible = modules.get_bible_from_module(module)
    verses = {}
    for books in bible.get_structure().get_books().values():
        for book in books:
            for chapter, n_verses in enumerate(book.chapter_lengths, start=1):
                for verse in range(1, n_verses + 1):
                    raw = bible.get(books=book.osis_name, chapters=chapter, verses=verse, clean=False)
                    verses[(book.osis_name, chapter, verse)] = raw
    cache_file.parent.mkdir(exist_ok=True)
    partial = cache_file.with_suffix(f".{os.getpid()}.partial")  # complete or absent, whoever reads it
    partial.write_text(json.dumps([[*key, raw] for key, raw in verses.items()], ensure_ascii=False))
    partial.replace(cache_file)
    return verses


def bible_records(en_verses, es_verses):
    """Yield (book, chapter, verse, en, es) for the books both modules contain.

    A verse slot that only one versification has gets "" on the other side. Books only one module has (the WEB's
    deuterocanon) are skipped.
    """
    en_books = list(dict.fromkeys(book for book, _, _ in en_verses))
    es_books = {book for book, _, _ in es_verses}
    book_order = {book: i for i, book in enumerate(b for b in en_books if b in es_books)}
    keys = {key for key in (*en_verses, *es_verses) if key[0] in book_order}
    for book, chapter, verse in sorted(keys, key=lambda k: (book_order[k[0]], k[1], k[2])):
        key = (book, chapter, verse)
        yield book, chapter, verse, en_verses.get(key, ""), es_verses.get(key, "")


# ---------------------------------------------------------------------------------------------------------------------
# 3. Filter pairs, including the verses of chapters the two translations number differently.
# ---------------------------------------------------------------------------------------------------------------------


def bible_examples(records, max_chars=1000, max_ratio=2.0):
    """Pair up Bible verses: (book, chapter, verse, en, es) records -> (examples, dropped).

    Each example is {"id": "Gen.1.1", "group": "Gen 1", "translation": {"en", "es"}}, `group` being the unit the
    split assigns. `dropped` counts dropped pairs by reason.
    """
    records = [(b, c, v, clean_text(en or ""), clean_text(es or "")) for b, c, v, en, es in records]

    # Find chapters whose verses are shifted against each other. A verse one side has and the other lacks means the
    # two number the verses differently there (one merges two verses, or moves one across a chapter break), so what
    # follows in that chapter and the next may be shifted: distrust both. A shift without a missing verse shows up
    # as several pairs in one chapter failing the length ratio: distrust that chapter.
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
        examples.append(
            {"id": f"{book}.{chapter}.{verse}", "group": f"{book} {chapter}", "translation": {"en": en, "es": es}}
        )
    return examples, dropped


def bible_pairs(cache_dir, max_chars=1000, max_ratio=2.0):
    """Every verse pair of the two SWORD modules (fetched into `cache_dir`) that the filters keep, in the Bible's
    order -> (examples as `bible_examples` gives them, dropped counts by reason)."""
    sword_dir = fetch_sword_modules(cache_dir)
    verses = {}
    for lang, (_, module) in SWORD_SOURCES.items():
        print(f"reading {module} ({lang}) from {sword_dir}")
        verses[lang] = read_sword_module(sword_dir, module)
    records = list(bible_records(verses["en"], verses["es"]))
    print(f"{len(records)} verse slots in the books both translations contain")
    return bible_examples(records, max_chars=max_chars, max_ratio=max_ratio)


# ---------------------------------------------------------------------------------------------------------------------
# 4. The corpus, split by chapter.
# ---------------------------------------------------------------------------------------------------------------------


def bible_dataset(
    cache_dir,
    source_lang="en",
    target_lang="es",
    seed=0,
    valid_fraction=0.035,
    test_fraction=0.04,
    max_chars=1000,
    max_ratio=2.0,
):
    """The two SWORD modules (fetched into `cache_dir`), aligned verse by verse and split by chapter ->
    (DatasetDict of train / validation / test, dropped counts by reason, chapters per split)."""
    unknown = {source_lang, target_lang} - set(SWORD_SOURCES)
    if unknown:
        raise UsageError(
            f"the Bible corpus has languages {sorted(SWORD_SOURCES)}, not {sorted(unknown)}; "
            "use --files or --dataset for other languages"
        )
    examples, dropped = bible_pairs(cache_dir, max_chars=max_chars, max_ratio=max_ratio)
    splits = split_examples(examples, seed=seed, valid_fraction=valid_fraction, test_fraction=test_fraction)
    chapters = {split: len({e["group"] for e in rows}) for split, rows in splits.items()}
    return to_dataset_dict(splits, source_lang, target_lang), dropped, chapters
