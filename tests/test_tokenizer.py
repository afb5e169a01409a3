"""vaswani.corpora.tokenizer and scripts/train_tokenizer.py: the shared BPE vocabulary, its special ids, lossless
decoding, and the checked loading of a tokenizer."""

import itertools
import json

import datasets
import pytest
from helpers import run_command, script_command, word_tokenizer
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from vaswani.checks import UsageError, check_source_lengths, token_bound
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


# --- The bound on a source's tokens that lets a file's length check skip tokenizing. ---


def trained(normalizer, pre_tokenizer, model, trainer, byte_fallback=False):
    """A fast tokenizer of these parts, trained on the corpus above, that ends every sequence with </s>; a Unigram
    model with `byte_fallback` spells a character out of its vocabulary in byte pieces (training drops the flag)."""
    backend = Tokenizer(model)
    backend.normalizer, backend.pre_tokenizer = normalizer, pre_tokenizer
    english, spanish = parallel_corpus()
    backend.train_from_iterator(english + spanish, trainer)
    if byte_fallback:
        unigram = json.loads(backend.to_str())["model"]
        vocab = [tuple(entry) for entry in unigram["vocab"]]
        backend.model = models.Unigram(vocab, unk_id=unigram["unk_id"], byte_fallback=True)
    backend.post_processor = processors.TemplateProcessing(
        single="$A </s>", special_tokens=[("</s>", backend.token_to_id("</s>"))]
    )
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="</s>", unk_token="<unk>")


SPECIALS = ["<pad>", "<s>", "</s>", "<unk>"]
BYTES = [f"<0x{byte:02X}>" for byte in range(256)]
TOKENIZERS = {
    "sentencepiece-like: NFKC, lower case, Metaspace, Unigram with byte fallback": lambda: trained(
        normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()]),
        pre_tokenizers.Metaspace(),
        models.Unigram(),
        trainers.UnigramTrainer(vocab_size=600, special_tokens=SPECIALS + BYTES, unk_token="<unk>"),
        byte_fallback=True,
    ),
    "BERT-like: its normalizer and pre-tokenizer, WordPiece": lambda: trained(
        normalizers.BertNormalizer(),
        pre_tokenizers.BertPreTokenizer(),
        models.WordPiece(unk_token="<unk>"),
        trainers.WordPieceTrainer(vocab_size=200, special_tokens=SPECIALS),
    ),
}
# Characters that normalizers lengthen the most: NFKC's longest (18 characters), a composition exclusion that NFC
# decomposes into three, a ligature, the capital whose lower case is two characters, a CJK character (BERT spaces it).
LENGTHENED = "\ufdfa\U0001d160\ufb03\u0130\u6771 \u00e9e\u0301"


@pytest.fixture(scope="module", params=["project's BPE", *TOKENIZERS])
def any_tokenizer(request, tokenizer):
    return tokenizer if request.param == "project's BPE" else TOKENIZERS[request.param]()


@settings(max_examples=300, deadline=None)
@given(text=st.text(st.characters(codec="utf-8"), max_size=40) | st.text(st.sampled_from(LENGTHENED), max_size=40))
def test_the_bound_on_a_sources_tokens_is_never_below_them(any_tokenizer, text):
    bound = token_bound(any_tokenizer)
    assert bound is not None
    assert bound(text) >= len(any_tokenizer(text).input_ids)


def test_no_bound_where_a_normalizer_may_lengthen_ascii(tokenizer):
    replacing = trained(
        normalizers.Replace("a", "aaaa"),
        pre_tokenizers.Metaspace(),
        models.Unigram(),
        trainers.UnigramTrainer(vocab_size=200, special_tokens=SPECIALS, unk_token="<unk>"),
    )
    assert token_bound(replacing) is None
    # Byte fallback where Metaspace's "▁" is not a piece: each space becomes three byte tokens.
    spelled = Tokenizer(models.Unigram([("<unk>", 0.0), ("a", -1.0), *((piece, -2.0) for piece in BYTES)], 0, True))
    spelled.pre_tokenizer = pre_tokenizers.Metaspace()
    spelled = PreTrainedTokenizerFast(tokenizer_object=spelled, unk_token="<unk>")
    assert len(spelled("a a a").input_ids) > len("a a a") + 1
    assert token_bound(spelled) is None
    assert token_bound(word_tokenizer(words=["a"])) is not None


class Counting:
    """A tokenizer that keeps every text it is asked to tokenize."""

    def __init__(self, tokenizer):
        self.tokenizer, self.texts = tokenizer, []

    def __getattr__(self, name):
        return getattr(self.tokenizer, name)

    def __call__(self, texts, **kwargs):
        self.texts += texts
        return self.tokenizer(texts, **kwargs)


def test_a_length_check_tokenizes_only_the_lines_the_bound_leaves_open(tokenizer):
    """Sentences far shorter than the model's positions are checked without tokenizing one (a file's check costs a
    read); a line that may be too long is tokenized, and refused by its number."""
    english, spanish = parallel_corpus()
    lines, counting = english + spanish, Counting(tokenizer)
    check_source_lengths(counting, lines, 256, None)
    assert counting.texts == []
    long_line = " ".join(english[:60])
    lines.insert(200, long_line)
    with pytest.raises(UsageError, match=r"^line 201 of --input is \d+ tokens long, more than the model's 256 "):
        check_source_lengths(counting, lines, 256, None)
    assert counting.texts == [long_line]
