"""vaswani.corpora.dataset and .bible, and scripts/prepare_data.py: OSIS cleaning, filtering, chapter-level splits,
--files, Hugging Face datasets."""

import sys
import types

import datasets
import pytest
from helpers import run_command, run_script, write_wmt14_folder

from vaswani.checks import UsageError
from vaswani.corpora import bible
from vaswani.corpora import dataset as corpus
from vaswani.scripts import prepare_data


BOOKS = ("Gen", "Ps", "Matt", "Rev")


def verse_text(book, chapter, verse):
    return (
        f"In {book} chapter {chapter} verse {verse} the word was spoken.",
        f"En {book} capítulo {chapter} versículo {verse} la palabra fue dicha.",
    )


def make_records():
    """160 chapters of made-up verses, with a few bad pairs planted in known places."""
    records = []
    for book in BOOKS:
        for chapter in range(1, 41):
            for verse in range(1, 6 + chapter % 7):
                en, es = verse_text(book, chapter, verse)
                records.append([book, chapter, verse, en, es])

    def plant(book, chapter, verse, en=None, es=None):
        record = next(r for r in records if r[:3] == [book, chapter, verse])
        record[3] = record[3] if en is None else en
        record[4] = record[4] if es is None else es

    plant("Gen", 3, 2, en="")  # one side missing: Gen 3 and Gen 4 are mismatched
    plant("Ps", 10, 1, en="", es="")  # both sides missing: just an empty pair
    plant("Ps", 11, 1, es="x" * 1001)  # too long
    plant("Matt", 5, 1, es="Sí.")  # one length-ratio failure: only this pair goes
    plant("Matt", 6, 1, es="Sí.")  # two length-ratio failures: Matt 6 is mismatched
    plant("Matt", 6, 2, es="No.")
    plant("Rev", 1, 1, en="Bad\x00byte")  # control character
    plant("Rev", 1, 2, es="caf\ufffd")  # replacement character from a bad decode
    return [tuple(r) for r in records]


def chapter_size(book, chapter):
    return len(range(1, 6 + chapter % 7))


def test_bible_examples_counts_dropped_pairs_by_reason():
    records = make_records()
    examples, dropped = bible.bible_examples(records, max_chars=1000, max_ratio=2.0)

    mismatched = chapter_size("Gen", 3) - 1 + chapter_size("Gen", 4) + chapter_size("Matt", 6) - 2
    assert dropped == {
        "empty": 2,
        "too_long": 1,
        "length_ratio": 3,
        "invalid_text": 2,
        "versification_mismatch": mismatched,
    }
    assert len(examples) + sum(dropped.values()) == len(records)
    groups = {e["group"] for e in examples}
    assert not groups & {"Gen 3", "Gen 4", "Matt 6"}
    assert {"Gen 2", "Gen 5", "Matt 5", "Matt 7"} <= groups
    first = examples[0]
    assert first == {
        "id": "Gen.1.1",
        "group": "Gen 1",
        "translation": dict(zip(("en", "es"), verse_text("Gen", 1, 1))),
    }


def test_bible_splits_keep_whole_chapters_apart():
    examples, _ = bible.bible_examples(make_records())
    splits = corpus.split_examples(examples, seed=0, valid_fraction=0.15, test_fraction=0.15)

    assert sum(len(rows) for rows in splits.values()) == len(examples)
    assert all(splits[name] for name in corpus.SPLITS)
    chapters = {name: {e["group"] for e in rows} for name, rows in splits.items()}
    ids = {name: {e["id"] for e in rows} for name, rows in splits.items()}
    for a, b in (("train", "validation"), ("train", "test"), ("validation", "test")):
        assert not chapters[a] & chapters[b]
        assert not ids[a] & ids[b]
    # Every verse of a chapter lands together: a test chapter is complete in test.
    for example in examples:
        split = corpus.assign_split(example["group"], 0, 0.15, 0.15)
        assert example in splits[split]


def test_splits_are_deterministic_and_salted_by_seed():
    def run(seed):
        examples, dropped = bible.bible_examples(make_records())
        splits = corpus.split_examples(examples, seed=seed, valid_fraction=0.15, test_fraction=0.15)
        return {name: [e["id"] for e in rows] for name, rows in splits.items()}, dropped

    assert run(0) == run(0)
    assert run(0)[0]["test"] != run(1)[0]["test"]


def test_assign_split_is_a_stable_hash_with_the_requested_fractions():
    # Pinned values: the split must not change across machines or Python versions
    # (Python's own hash() of a str changes from one process to the next).
    held_out = {c: split for c in range(1, 51) if (split := corpus.assign_split(f"Gen {c}")) != "train"}
    assert held_out == {18: "validation", 26: "test", 33: "test", 34: "validation", 45: "test"}

    groups = [f"group {i}" for i in range(20000)]
    assigned = [corpus.assign_split(g, seed=0, valid_fraction=0.1, test_fraction=0.2) for g in groups]
    assert assigned.count("test") / len(groups) == pytest.approx(0.2, abs=0.01)
    assert assigned.count("validation") / len(groups) == pytest.approx(0.1, abs=0.01)


def test_clean_osis_strips_markup_notes_and_headings():
    raw = (
        '<title type="section">The Creation</title>'
        '<div type="x-milestone" subType="x-preverse" sID="pv1"/>'
        '<title canonical="true" type="psalm">A Psalm.</title> <lg sID="g1"/><l level="1" sID="g2"/>'
        '<w lemma="strong:H1">In</w> <w lemma="strong:H2">the</w> beginning, '
        '<w lemma="strong:H3">God</w><note placement="foot"><reference type="annotateRef">1:1 </reference>'
        'The word <rdg type="alternate">Elohim</rdg>.</note><w lemma="strong:H4">created</w>'
        '<l eID="g2"/><l sID="g3"/>the <transChange type="added">whole</transChange> earth '
        '<note placement="foot">a note before a question mark</note> <q who="x">?</q> &amp; '
        '<speaker>Beloved</speaker> cafe\u0301   done.  <chapter eID="Gen.1"/><div type="glossary"/> Glossary text'
    )
    assert bible.clean_osis(raw) == "A Psalm. In the beginning, God created the whole earth? & café done."


def test_bible_records_join_the_two_modules_verse_by_verse():
    en = {("Gen", 1, 1): "In the beginning.", ("Gen", 1, 2): "Void.", ("Tob", 1, 1): "Tobit."}
    es = {("Gen", 1, 1): "En el principio.", ("Gen", 1, 3): "Luz."}
    assert list(bible.bible_records(en, es)) == [
        ("Gen", 1, 1, "In the beginning.", "En el principio."),
        ("Gen", 1, 2, "Void.", ""),
        ("Gen", 1, 3, "", "Luz."),
    ]


class PyswordStandIn:
    """pysword's SwordModules over one module of two chapters (Gen 1:1-2, Gen 2:1), counting the verses it returns."""

    reads = 0

    def __init__(self, path):
        pass

    def parse_modules(self):
        pass

    def get_bible_from_module(self, module):
        return self

    def get_structure(self):
        genesis = types.SimpleNamespace(osis_name="Gen", chapter_lengths=[2, 1])
        return types.SimpleNamespace(get_books=lambda: {"ot": [genesis]})

    def get(self, books, chapters, verses, clean):
        type(self).reads += 1
        return f"<w>{books} {chapters}:{verses}</w> <note>a note</note>"


def test_a_bible_is_read_through_pysword_once_and_then_from_the_cache(tmp_path, monkeypatch):
    pytest.importorskip("pysword")
    monkeypatch.setattr("pysword.modules.SwordModules", PyswordStandIn)
    monkeypatch.setattr(PyswordStandIn, "reads", 0)
    (tmp_path / "mods.d").mkdir()
    (tmp_path / "mods.d" / "module.conf").write_text("[Module]\nVersion=1\n")
    expected = {("Gen", 1, 1): "Gen 1:1", ("Gen", 1, 2): "Gen 1:2", ("Gen", 2, 1): "Gen 2:1"}
    assert bible.read_sword_module(tmp_path, "Module") == expected
    assert PyswordStandIn.reads == 3
    assert bible.read_sword_module(tmp_path, "Module") == expected
    assert PyswordStandIn.reads == 3
    (tmp_path / "mods.d" / "module.conf").write_text("[Module]\nVersion=2\n")  # another version of the module
    assert bible.read_sword_module(tmp_path, "Module") == expected
    assert PyswordStandIn.reads == 6


def test_parallel_files_count_undecodable_and_empty_lines(tmp_path):
    (tmp_path / "b.en").write_bytes(b"Good morning.\r\n\xff\xfe broken\n\nThank you very much.")
    (tmp_path / "b.es").write_text("Buenos d\u00edas.\nRoto.\nVac\u00edo.\nMuchas gracias.\n", encoding="utf-8")
    source = corpus.parallel_files_dataset(tmp_path / "b.en", tmp_path / "b.es", "en", "es", tmp_path / "c")
    assert source["train"]["id"] == ["line.1", "line.2", "line.3", "line.4"]
    assert source["train"][1]["translation"] == {"en": None, "es": "Roto."}  # not UTF-8: None, never a guess
    dataset, dropped = corpus.prepare_translation_dataset(source, "en", "es", valid_fraction=0, test_fraction=0)
    assert dropped == {"invalid_text": 1, "empty": 1}
    assert dataset["train"]["translation"] == [
        {"en": "Good morning.", "es": "Buenos días."},
        {"en": "Thank you very much.", "es": "Muchas gracias."},
    ]
    assert dataset["train"]["id"] == ["line.1", "line.4"]


def test_is_valid_text_refuses_exactly_unicode_control_characters_and_surrogates():
    import unicodedata

    for code in range(0x10000):
        char = chr(code)
        assert corpus.is_valid_text(f"a{char}b") == (
            unicodedata.category(char) not in ("Cc", "Cs") and char != "\ufffd"
        ), hex(code)
    assert not corpus.is_valid_text(None)


def write_corpus(folder, n=60):
    source = [f"The {i} red houses are  near the river." for i in range(n)]
    target = [f"Las {i} casas rojas están cerca del río." for i in range(n)]
    source[7] = ""
    (folder / "train.en").write_text("\n".join(source) + "\n", encoding="utf-8")
    (folder / "train.es").write_text("\n".join(target) + "\n", encoding="utf-8")
    return source, target


def test_script_with_files_writes_a_loadable_dataset_dict(tmp_path):
    write_corpus(tmp_path)
    out = tmp_path / "data"
    files = ["--files", tmp_path / "train.en", tmp_path / "train.es"]
    result = run_script(
        "prepare_data", "--output_dir", out, *files, *"--valid_fraction 0.2 --test_fraction 0.2".split()
    )
    assert "kept 59 pairs" in result.stdout and "empty" in result.stdout
    assert "%|" not in result.stderr  # to a pipe, as to a log: no bar of datasets' maps and saves (vaswani.progress)

    dataset = datasets.load_from_disk(str(out))
    assert set(dataset) == {"train", "validation", "test"}
    assert sum(len(split) for split in dataset.values()) == 59
    assert all(len(split) > 0 for split in dataset.values())
    assert sorted(path.name for path in out.iterdir()) == ["dataset_dict.json", "test", "train", "validation"]
    rows = [row for split in dataset.values() for row in split]
    assert set(rows[0]) == {"id", "translation"}
    by_id = {row["id"]: row["translation"] for row in rows}
    assert "line.8" not in by_id
    assert by_id["line.1"] == {
        "en": "The 0 red houses are near the river.",
        "es": "Las 0 casas rojas están cerca del río.",
    }


def test_script_reports_mismatched_files_clearly(tmp_path):
    (tmp_path / "x.en").write_text("one\ntwo\nthree\n", encoding="utf-8")
    (tmp_path / "x.es").write_text("uno\ndos\n", encoding="utf-8")
    # main() exits with the message (no traceback) rather than raising UsageError.
    with pytest.raises(SystemExit, match=r": error: --files .*x\.en has 3 lines and .*x\.es has 2 lines"):
        prepare_data.main(
            ["--output_dir", str(tmp_path / "out"), "--files", str(tmp_path / "x.en"), str(tmp_path / "x.es")]
        )
    assert not (tmp_path / "out").exists()


def test_flags_that_cannot_work_together_are_usage_errors(tmp_path, capsys):
    (tmp_path / "x.en").write_text("one\n", encoding="utf-8")
    for arguments, message in (
        (["--dataset", "wmt14", "--files", "x.en", "x.es"], "argument --files: not allowed with argument --dataset"),
        (["--files", "x.en"], "argument --files: expected 2 files, SRC and TGT, not 1"),
        (["--target_lang", "en"], "--source_lang and --target_lang must differ"),
    ):
        with pytest.raises(SystemExit) as raised:
            prepare_data.main(["--output_dir", str(tmp_path / "out"), *arguments])
        assert raised.value.code == 2 and message in capsys.readouterr().err  # argparse's usage line and exit status
    with pytest.raises(SystemExit, match=r": error: --files: .*x\.es is not a file"):
        prepare_data.main(["--output_dir", str(tmp_path / "out"), "--files", tmp_path / "x.en", tmp_path / "x.es"])
    assert sorted(path.name for path in tmp_path.iterdir()) == ["x.en"]


def test_the_command_runs_as_a_module_of_the_package(tmp_path):
    result = run_command([sys.executable, "-m", "vaswani.scripts.prepare_data", "--help"], timeout=120)
    assert result.returncode == 0, result.stderr
    for flag in ("--output_dir", "--files SRC [TGT ...]", "--dataset_config", "salt of the split hash (default: 0)"):
        assert flag in result.stdout


def translation_dataset(pairs, languages=("en", "es")):
    features = datasets.Features({"translation": datasets.Translation(languages=list(languages))})
    return datasets.Dataset.from_list(
        [{"translation": dict(zip(languages, pair))} for pair in pairs], features=features
    )


def sentence_pairs(n, offset=0):
    return [(f"Sentence number {i} is here.", f"La oración número {i} está aquí.") for i in range(offset, offset + n)]


def test_hf_dataset_without_validation_or_test_gets_them_carved_from_train():
    dataset = datasets.DatasetDict({"train": translation_dataset(sentence_pairs(200))})
    splits, dropped = corpus.prepare_translation_dataset(dataset, "en", "es", valid_fraction=0.1, test_fraction=0.1)
    assert not dropped
    assert sum(len(rows) for rows in splits.values()) == 200
    assert all(len(splits[name]) for name in corpus.SPLITS)
    for name, rows in splits.items():  # each pair where the hash of its source sentence sends it
        assert {corpus.assign_split(pair["en"], 0, 0.1, 0.1) for pair in rows["translation"]} == {name}
    again, _ = corpus.prepare_translation_dataset(dataset, "en", "es", valid_fraction=0.1, test_fraction=0.1)
    assert all(again[name].to_dict() == splits[name].to_dict() for name in corpus.SPLITS)


def test_hf_dataset_keeps_its_own_test_split():
    test_pairs = sentence_pairs(5, offset=1000)
    dataset = datasets.DatasetDict(
        {"train": translation_dataset(sentence_pairs(200)), "test": translation_dataset(test_pairs)}
    )
    splits, _ = corpus.prepare_translation_dataset(dataset, "en", "es", valid_fraction=0.1, test_fraction=0.1)
    assert [(e["translation"]["en"], e["translation"]["es"]) for e in splits["test"]] == test_pairs
    assert [e["id"] for e in splits["test"]] == [f"test.{i}" for i in range(5)]
    assert len(splits["train"]) + len(splits["validation"]) == 200
    assert len(splits["validation"])


def test_hf_dataset_errors_name_the_missing_language_or_column():
    german = datasets.DatasetDict({"train": translation_dataset([("Hallo.", "Hello.")], ("de", "en"))})
    with pytest.raises(UsageError, match=r"^wmt_toy split 'train': language 'es' is not in the translation column"):
        corpus.prepare_translation_dataset(german, "en", "es", name="wmt_toy")
    plain = datasets.DatasetDict({"train": datasets.Dataset.from_dict({"en": ["Hi."], "es": ["Hola."]})})
    with pytest.raises(UsageError, match=r"split 'train' has no 'translation' column \(columns: \['en', 'es'\]\)"):
        corpus.prepare_translation_dataset(plain, "en", "es")


def test_a_local_folder_in_the_wmt14_layout_goes_through_load_dataset_like_a_hub_name(tmp_path, capsys):
    write_wmt14_folder(tmp_path / "wmt14", {"train": 300, "validation": 7, "test": 9})
    out = tmp_path / "data"
    options = "--dataset_config de-en --source_lang en --target_lang de --num_proc 2".split()
    result = run_script("prepare_data", "--output_dir", out, "--dataset", tmp_path / "wmt14", *options)
    assert "kept 316 pairs, dropped 0" in result.stdout
    dataset = datasets.load_from_disk(str(out))
    assert {name: len(rows) for name, rows in dataset.items()} == {"train": 300, "validation": 7, "test": 9}
    assert dataset["test"][8] == {"id": "test.8", "translation": {"en": "Sentence test 8.", "de": "Satz test 8."}}
    assert dataset["train"].features["translation"] == datasets.Translation(languages=["en", "de"])
    # A JSON Lines folder without a card: the languages come from the struct of the rows.
    (tmp_path / "jsonl").mkdir()
    dataset["train"].select(range(50)).to_json(str(tmp_path / "jsonl" / "train.jsonl"))
    from_json = ["--output_dir", tmp_path / "from_json", "--dataset", tmp_path / "jsonl", "--source_lang", "de"]
    prepare_data.main([*from_json, *"--target_lang en --valid_fraction 0.2 --test_fraction 0.2".split()])
    assert "kept 50 pairs, dropped 0" in capsys.readouterr().out
    with pytest.raises(
        SystemExit, match=r"train split: language 'fr' is not in the translation column \(it has \['de', 'en'\]\)"
    ):
        prepare_data.main([*from_json, "--target_lang", "fr"])


def test_distinct_sources_are_counted_across_the_batches_they_are_hashed_in(monkeypatch):
    """The summary's "from N distinct sources": a source repeated in other batches counts once."""
    monkeypatch.setattr(corpus, "HASHED_AT_ONCE", 7)
    sources = [f"sentence {i % 20}" for i in range(50)] + ["sentence 0 ", "Sentence 0"]
    split = datasets.Dataset.from_dict({"translation": [{"en": text, "es": "frase"} for text in sources]})
    assert corpus.distinct_sources(split, "en") == 22
    assert corpus.distinct_sources(split, "es") == 1
    assert corpus.distinct_sources(split.select([]), "en") == 0


def test_to_dataset_dict_uses_the_translation_layout():
    examples = [
        {"id": f"line.{i}", "group": es, "translation": {"es": es, "en": en}}
        for i, (es, en) in enumerate([("Hola.", "Hello."), ("Adiós.", "Bye."), ("Sí.", "Yes.")], start=1)
    ]
    splits = {"train": examples[:2], "validation": examples[2:], "test": examples[2:]}
    dataset = corpus.to_dataset_dict(splits, "es", "en")
    assert dataset["train"].column_names == ["id", "translation"]
    assert dataset["train"].features["translation"] == datasets.Translation(languages=["es", "en"])
    assert dataset["train"][1] == {"id": "line.2", "translation": {"es": "Adiós.", "en": "Bye."}}
    assert len(dataset["test"]) == 1


def test_too_small_a_corpus_is_an_error_not_an_empty_split(tmp_path):
    (tmp_path / "s.en").write_text("Hello.\nBye.\n", encoding="utf-8")
    (tmp_path / "s.es").write_text("Hola.\nAdiós.\n", encoding="utf-8")
    with pytest.raises(SystemExit, match="split would be empty"):
        prepare_data.main(
            ["--output_dir", str(tmp_path / "out"), "--files", str(tmp_path / "s.en"), str(tmp_path / "s.es")]
        )
    assert not (tmp_path / "out").exists()
