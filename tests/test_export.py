"""CTranslate2 export: the same weights give the same scores and the same greedy translations."""

import subprocess
import sys

import ctranslate2
import pytest
import torch
from conftest import REPO_ROOT

from vaswani import VaswaniConfig, VaswaniForConditionalGeneration
from vaswani.training.export import export, translate_ids, vocabulary
from vaswani.training.tokenizer import train_bpe_tokenizer


PAIRS = [
    ("In the beginning God created the heavens and the earth.", "En el principio creó Dios los cielos y la tierra."),
    ("Jesus wept.", "Y lloró Jesús."),
    ("The Lord is my shepherd.", "El Señor es mi pastor."),
    ("Love is patient and kind.", "El amor es sufrido, es benigno."),
]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny model that has learnt four translations by heart, saved with its tokenizer."""
    tokenizer = train_bpe_tokenizer([text for pair in PAIRS for text in pair] * 20, vocab_size=300)
    config = VaswaniConfig.from_preset("tiny", vocab_size=len(tokenizer), max_position_embeddings=128, dropout=0.0)
    torch.manual_seed(0)
    model = VaswaniForConditionalGeneration(config)
    batch = tokenizer([s for s, _ in PAIRS], text_target=[t for _, t in PAIRS], padding=True, return_tensors="pt")
    batch["labels"][batch["labels"] == tokenizer.pad_token_id] = -100
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(150):
        optimizer.zero_grad()
        model(**batch).loss.backward()
        optimizer.step()
    folder = tmp_path_factory.mktemp("model")
    model.eval().save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return model, tokenizer, folder


def test_scores_match_transformers(trained, tmp_path):
    model, tokenizer, _ = trained
    translator = ctranslate2.Translator(str(export(model, tmp_path, tokenizer)), device="cpu")
    tokens = vocabulary(model, tokenizer)
    source, target = tokenizer(PAIRS[0][0]).input_ids, tokenizer(PAIRS[0][1]).input_ids  # both end in </s>
    (scored,) = translator.score_batch([[tokens[i] for i in source]], [[tokens[i] for i in target[:-1]]])
    with torch.no_grad():
        log_probs = model(input_ids=torch.tensor([source]), labels=torch.tensor([target])).logits.log_softmax(-1)[0]
    expected = log_probs[torch.arange(len(target)), torch.tensor(target)]
    torch.testing.assert_close(torch.tensor(scored.log_probs), expected, atol=1e-4, rtol=1e-4)


def test_greedy_translations_are_identical(trained, tmp_path):
    model, tokenizer, _ = trained
    translator = ctranslate2.Translator(str(export(model, tmp_path, tokenizer)), device="cpu")
    batch = [tokenizer(source).input_ids for source, _ in PAIRS]
    theirs = translate_ids(translator, vocabulary(model, tokenizer), batch)
    ours = [model.generate(torch.tensor([ids]), num_beams=1)[0, 1:].tolist() for ids in batch]
    ours = [[i for i in ids if i not in (tokenizer.eos_token_id, tokenizer.pad_token_id)] for ids in ours]
    assert theirs == ours
    assert [tokenizer.decode(ids) for ids in theirs] == [target for _, target in PAIRS]  # it did learn them


def test_script_exports_int8_and_checks(trained, tmp_path):
    _, _, folder = trained
    done = subprocess.run(
        [
            sys.executable,
            str(REPO_ROOT / "scripts" / "export_ctranslate2.py"),
            "--model",
            str(folder),
            "--output_dir",
            str(tmp_path / "ct2"),
            "--check",
            "--check_sentences",
            *[source for source, _ in PAIRS],
        ],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert "Greedy outputs identical on 4 sentences" in done.stdout
    done = subprocess.run(
        [
            sys.executable,
            str(REPO_ROOT / "scripts" / "export_ctranslate2.py"),
            "--model",
            str(folder),
            "--output_dir",
            str(tmp_path / "ct2_int8"),
            "--quantization",
            "int8",
        ],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "ct2_int8" / "model.bin").stat().st_size < (tmp_path / "ct2" / "model.bin").stat().st_size


def test_the_unknown_token_is_the_tokenizers_own(trained, tmp_path):
    """CTranslate2 maps input outside the vocabulary to the unk token: the tokenizer's, whatever its spelling; a
    tokenizer without one is refused rather than given <pad> in its place."""
    import json

    model, tokenizer, _ = trained
    renamed = train_bpe_tokenizer([text for pair in PAIRS for text in pair] * 20, vocab_size=300)
    renamed.backend_tokenizer.add_special_tokens(["[UNK]"])
    renamed.unk_token = "[UNK]"
    spelled = VaswaniForConditionalGeneration(VaswaniConfig.from_preset("tiny", vocab_size=len(renamed)))
    export(spelled, tmp_path / "renamed", renamed)
    assert json.loads((tmp_path / "renamed" / "config.json").read_text())["unk_token"] == "[UNK]"
    renamed.unk_token = None
    with pytest.raises(ValueError, match="The tokenizer has no unk token"):
        export(spelled, tmp_path / "none", renamed)
    export(model, tmp_path / "placeholders")  # no tokenizer: the benchmark's placeholder vocabulary has one
    assert json.loads((tmp_path / "placeholders" / "config.json").read_text())["unk_token"] == "<unk>"
