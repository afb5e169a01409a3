"""vaswani.corpora.tokenizer and scripts/train_tokenizer.py: the shared BPE vocabulary, its special ids, lossless
decoding, and the checked loading of a tokenizer."""

import itertools

import datasets
import pytest
from helpers import run_command, script_command, word_tokenizer
from transformers import AutoTokenizer

from vaswani.checks import UsageError
from vaswani.corpora.tokenizer import SplitSentences, load_tokenizer, sample_pairs, train_bpe_tokenizer
from vaswani.scripts import train_tokenizer
from vaswani.training.data import load_translation_dataset


VOCAB_SIZE = 600

EN_SUBJECTS = ["The child", "My mother", "The old teacher", "Our neighbour", "The king", "A young girl"]
ES_SUBJECTS = ["El niño", "Mi madre", "El viejo profesor", "Nuestro vecino", "El rey", "Una niña"]
EN_VERBS = ["reads a book", "eats bread", "sings a song", "writes a letter", "opens the door"]
ES_VERBS = ["lee un libro", "come pan", "canta una canción", "escribe una carta", "abre la puerta"]
EN_PLACES = ["in the garden.", "at home!", "near the river?", "on Sunday, quietly.", "in Spain (again)."]
ES_PLACES = ["en el jardín.", "en casa!", "¿cerca del río?", "el domingo, en silencio.", "en España (otra vez)."]


def parallel_corpus():
    """150 English-Spanish sentence pairs built from the templates above."""
    english, spanish = [], []
    for (s_en, s_es), (v_en, v_es), (p_en, p_es) in itertools.product(
        zip(EN_SUBJECTS, ES_SUBJECTS), zip(EN_VERBS, ES_VERBS), zip(EN_PLACES, ES_PLACES)
    ):
        english.append(f"{s_en} {v_en} {p_en}")
        spanish.append(f"¡{s_es} {v_es} {p_es}")
    return english, spanish


ROUND_TRIP = [
    "",
    "The child reads a book in the garden.",
    "¿Dónde está el pingüino? ¡Aquí, señor Muñoz!",
    "Él comió açaí y pidió más: á é í ó ú ü ñ Á É Í Ó Ú Ü Ñ.",
    "  Two  spaces,\ttabs and a trailing space ",
    "Quotes “like this” and ‘this’ — 42.5% (approx.) [sic] ...",
    "Unseen script: Ωμέγα, Москва, 東京 and an emoji 🙂",
]


@pytest.fixture(scope="module")
def tokenizer():
    english, spanish = parallel_corpus()
    return train_bpe_tokenizer(english + spanish, VOCAB_SIZE)


def test_special_tokens_have_the_fixed_ids(tokenizer):
    assert (tokenizer.pad_token, tokenizer.bos_token, tokenizer.eos_token, tokenizer.unk_token) == (
        "<pad>",
        "<s>",
        "</s>",
        "<unk>",
    )
    assert (tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.unk_token_id) == (
        0,
        1,
        2,
        3,
    )
    assert tokenizer.convert_ids_to_tokens([0, 1, 2, 3]) == ["<pad>", "<s>", "</s>", "<unk>"]


def test_vocabulary_is_shared_and_learned(tokenizer):
    # 4 special tokens + 256 bytes, then merges learned from both languages.
    assert 4 + 256 < len(tokenizer) <= VOCAB_SIZE
    # Words frequent in either language became single tokens (plus </s>).
    assert len(tokenizer(" canción").input_ids) == 2
    assert len(tokenizer(" teacher").input_ids) == 2


@pytest.mark.parametrize("text", ROUND_TRIP)
def test_decoding_gives_back_the_text(tokenizer, text):
    ids = tokenizer(text).input_ids
    assert tokenizer.unk_token_id not in ids
    assert tokenizer.decode(ids, skip_special_tokens=True) == text


def test_text_is_nfc_normalised(tokenizer):
    decomposed = "cafe\u0301"
    assert tokenizer(decomposed).input_ids == tokenizer("caf\u00e9").input_ids
    assert tokenizer.decode(tokenizer(decomposed).input_ids, skip_special_tokens=True) == "caf\u00e9"


def test_sequences_end_in_eos_without_bos(tokenizer):
    ids = tokenizer("El rey come pan.").input_ids
    assert ids[-1] == 2 and 2 not in ids[:-1]
    assert 1 not in ids
    assert tokenizer("").input_ids == [2]


def test_text_target_gives_labels_ending_in_eos(tokenizer):
    english, spanish = parallel_corpus()
    batch = tokenizer(english[:4], text_target=spanish[:4])
    assert set(batch) == {"input_ids", "attention_mask", "labels"}
    for source, target, input_ids, labels in zip(english, spanish, batch["input_ids"], batch["labels"]):
        assert input_ids[-1] == 2 and labels[-1] == 2
        assert 1 not in input_ids and 1 not in labels
        assert tokenizer.decode(input_ids, skip_special_tokens=True) == source
        assert tokenizer.decode(labels, skip_special_tokens=True) == target


def test_padding_is_on_the_right_with_id_0(tokenizer):
    batch = tokenizer(["Sí.", "El viejo profesor escribe una carta."], padding=True)
    short, long = batch["input_ids"]
    assert len(short) == len(long)
    n = len(tokenizer("Sí.").input_ids)
    assert short[n - 1] == 2 and set(short[n:]) == {0}
    assert batch["attention_mask"][0] == [1] * n + [0] * (len(short) - n)
    assert tokenizer.model_max_length == 1024


def test_saved_tokenizer_reloads_with_autotokenizer(tokenizer, tmp_path):
    tokenizer.save_pretrained(tmp_path)
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    english, spanish = parallel_corpus()
    texts = english + spanish + ROUND_TRIP
    assert reloaded(texts).input_ids == tokenizer(texts).input_ids
    assert reloaded.get_vocab() == tokenizer.get_vocab()
    assert (reloaded.pad_token_id, reloaded.bos_token_id, reloaded.eos_token_id, reloaded.unk_token_id) == (0, 1, 2, 3)
    assert reloaded.padding_side == "right" and reloaded.model_max_length == 1024
    assert reloaded.clean_up_tokenization_spaces is False
    for text in ROUND_TRIP:
        assert reloaded.decode(reloaded(text).input_ids, skip_special_tokens=True) == text


def test_script_trains_on_both_sides_of_the_train_split(tmp_path, capsys):
    english, spanish = parallel_corpus()
    rows = [
        {"id": f"line.{i}", "translation": {"en": en, "es": es}} for i, (en, es) in enumerate(zip(english, spanish))
    ]
    held_out = [{"id": "x.1", "translation": {"en": "Zebra xylophone.", "es": "Cebra xilófono."}}]
    datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_list(rows),
            "validation": datasets.Dataset.from_list(held_out),
            "test": datasets.Dataset.from_list(held_out),
        }
    ).save_to_disk(str(tmp_path / "data"))

    train = load_translation_dataset(tmp_path / "data", "en", "es", splits=("train",))["train"]
    sentences = SplitSentences(train, ("en", "es"), batch_size=7)
    assert [text for batch in sentences for text in batch] == english + spanish  # one language, then the other
    assert (sentences.sentences, sentences.skipped, len(sentences)) == (2 * len(english), 0, 2 * len(english))
    sample = sample_pairs(train, 5, seed=3)
    assert len(sample) == 5 and sample["id"] == sorted(sample["id"], key=lambda name: int(name[5:]))
    assert sample["id"] == sample_pairs(train, 5, 3)["id"]

    train_tokenizer.main(
        ["--dataset_dir", tmp_path / "data", "--vocab_size", VOCAB_SIZE, "--output_dir", tmp_path / "tok"]
    )
    assert "vocabulary size" in capsys.readouterr().out
    reloaded = AutoTokenizer.from_pretrained(tmp_path / "tok")
    assert reloaded.convert_ids_to_tokens([0, 1, 2, 3]) == ["<pad>", "<s>", "</s>", "<unk>"]
    # Frequent words of both languages became single tokens, so both sides were trained on.
    assert len(reloaded(" canción").input_ids) == 2 and len(reloaded(" teacher").input_ids) == 2
    assert reloaded.decode(reloaded(spanish[0]).input_ids, skip_special_tokens=True) == spanish[0]


@pytest.mark.slow  # two fresh processes of the command, run by its path
def test_the_script_runs_by_path_and_checks_its_flags(tmp_path):
    def run(*arguments):
        return run_command(
            script_command("train_tokenizer", "--dataset_dir", tmp_path / "data", *arguments), timeout=120
        )

    result = run("--output_dir", tmp_path / "tok", "--max_sentences", "0")
    assert result.returncode == 2 and "train_tokenizer.py: error: --max_sentences must be at least 1" in result.stderr
    result = run("--output_dir", tmp_path / "tok")
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert f"train_tokenizer.py: error: --dataset_dir {tmp_path / 'data'} does not exist; create it" in result.stderr
    assert not (tmp_path / "tok").exists()


def test_load_tokenizer_refuses_what_the_model_cannot_use(tokenizer, tmp_path):
    tokenizer.save_pretrained(tmp_path / "good")
    assert load_tokenizer(tmp_path / "good").get_vocab() == tokenizer.get_vocab()
    with pytest.raises(
        UsageError, match=r"^--tokenizer .*nowhere does not exist; create it with scripts/train_tokenizer"
    ):
        load_tokenizer(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(UsageError, match=r"^cannot load a tokenizer from --tokenizer .*empty \("):
        load_tokenizer(tmp_path / "empty")

    # Tokenizers of one word, "a", with neither a pre-tokenizer nor a post-processor: they do not append </s>.
    no_bos = word_tokenizer(tmp_path / "no_bos", words=["a"], bare=True, bos_token=None)
    with pytest.raises(UsageError, match=r"no_bos has no bos_token; the model needs <pad>, <s> \(the decoder start\)"):
        load_tokenizer(no_bos)
    no_eos = word_tokenizer(tmp_path / "no_eos", words=["a"], bare=True)
    with pytest.raises(UsageError, match=r"no_eos does not end sequences with </s> \(id 2\)"):
        load_tokenizer(no_eos)
