"""scripts/convert_fairseq.py checked against fairseq itself: small random fairseq Transformers of each supported
variant are built, saved and run by fairseq (tests/fairseq_reference.py, in the virtual environment that
scripts/install.sh makes with scripts/install_fairseq.sh, or the Python VASWANI_FAIRSEQ_PYTHON names), converted, and
compared: tokenization, encoder output and decoder log-probabilities
within 1e-5 in float32, greedy and beam outputs identical; then the converted folder is used as users use one."""

import os
import subprocess
import sys
import textwrap

import datasets
import pytest
import torch
from conftest import REPO_ROOT
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, LogitsProcessorList, pipeline

from vaswani.modeling.generation_vaswani import SourceLengthLimit
from vaswani.scripts import convert_fairseq, finetune
from vaswani.training.export import export, translate_ids, vocabulary


FAIRSEQ_PYTHON = os.environ.get("VASWANI_FAIRSEQ_PYTHON") or (
    str(REPO_ROOT / ".fairseq-venv" / "bin" / "python") if (REPO_ROOT / ".fairseq-venv").is_dir() else None
)
pytestmark = pytest.mark.skipif(
    not FAIRSEQ_PYTHON, reason="no Python with fairseq: run scripts/install_fairseq.sh (scripts/install.sh does)"
)
SUPPORTED = ["wmt_en_de_shared", "vaswani_big_shared", "decoder_tied", "untied", "old_style_args"]
REFUSED = {
    "pre_norm": "encoder_normalize_before=True, decoder_normalize_before=True",
    "learned_positions": "encoder_learned_pos=True, decoder_learned_pos=True",
    "layer_drop": "encoder_layerdrop=0.1",
    "gelu": "activation_fn='gelu'",
}
SENTENCES = ["The cat sat on the mat.", "A well-known dog jumps over the quick fox, and said it.", "Attention!"]
MAX_LEN_B = 12  # fairseq_reference.py's
EOS, PAD = 2, 1


@pytest.fixture(scope="module")
def fairseq_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fairseq")
    subprocess.run([FAIRSEQ_PYTHON, str(REPO_ROOT / "tests" / "fairseq_reference.py"), str(folder)], check=True)
    return folder


@pytest.fixture(scope="module")
def converted(fairseq_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("converted")
    for variant in SUPPORTED:
        convert_fairseq.main(
            ["--checkpoint", fairseq_dir / variant / "checkpoint.pt", "--data_dir", fairseq_dir / "data",
             "--output_dir", root / variant]
        )  # fmt: skip
    return root


def padded(sequences, pad=PAD):
    batch = torch.nn.utils.rnn.pad_sequence(sequences, batch_first=True, padding_value=pad)
    return batch, (batch != pad).long()


def fairseq_like(model, input_ids, attention_mask, **options):
    """generate() with fairseq SequenceGenerator's rules: never pad, no </s> first, </s> forced after max_len_b
    tokens; beam search scored with |Y| ** alpha and ended once beam_size hypotheses are finished."""
    return model.generate(
        input_ids,
        attention_mask=attention_mask,
        paper_decoding=False,
        early_stopping=True,
        max_new_tokens=MAX_LEN_B + 1,
        min_new_tokens=1,
        suppress_tokens=[PAD],
        logits_processor=LogitsProcessorList([SourceLengthLimit(torch.full((len(input_ids),), MAX_LEN_B + 1), EOS)]),
        return_dict_in_generate=True,
        output_scores=True,
        **options,
    )


def hypothesis(sequence):
    tokens = sequence[1:].tolist()
    return tokens[: tokens.index(EOS) + 1]


@pytest.mark.parametrize("variant", SUPPORTED)
def test_converted_model_computes_what_fairseq_computes(fairseq_dir, converted, variant):
    reference = torch.load(fairseq_dir / variant / "reference.pt")
    tokenizer = AutoTokenizer.from_pretrained(converted / variant)
    model = AutoModelForSeq2SeqLM.from_pretrained(converted / variant).eval()

    # Moses + subword-nmt, as fairseq's hub interface encodes and decodes.
    for sentence, source, decoded in zip(SENTENCES, reference["sources"], reference["decoded"]):
        assert tokenizer(sentence).input_ids == source.tolist()
        assert tokenizer.decode(source[:-1]) == decoded  # fairseq keeps <unk> and drops the final </s>

    input_ids, attention_mask = padded(reference["sources"])
    with torch.no_grad():
        encoder_out = model.get_encoder()(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        mask = attention_mask.bool()
        torch.testing.assert_close(encoder_out[mask], reference["encoder_out"][mask], atol=1e-5, rtol=1e-5)
        logits = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=reference["previous"])
        target_mask = reference["target"] != PAD
        torch.testing.assert_close(logits.logits[target_mask], reference["logits"][target_mask], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(
            logits.logits.log_softmax(-1)[target_mask], reference["log_probs"][target_mask], atol=1e-5, rtol=1e-5
        )

        greedy = fairseq_like(model, input_ids, attention_mask, num_beams=1)
        assert [hypothesis(s) for s in greedy.sequences] == [h[0][0].tolist() for h in reference["greedy"]]
        beam = fairseq_like(model, input_ids, attention_mask, num_beams=4, num_return_sequences=4, length_penalty=0.6)
    expected = [h[0].tolist() for sentence in reference["beam"] for h in sentence]
    assert [hypothesis(s) for s in beam.sequences] == expected
    expected_scores = torch.stack([h[1] for sentence in reference["beam"] for h in sentence])
    torch.testing.assert_close(beam.sequences_scores, expected_scores, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("variant", REFUSED)
def test_features_of_other_models_are_refused_by_name(fairseq_dir, variant, tmp_path):
    with pytest.raises(SystemExit, match="not the paper's Transformer.*" + REFUSED[variant].replace("(", r"\(")):
        convert_fairseq.main(
            ["--checkpoint", fairseq_dir / variant / "checkpoint.pt", "--data_dir", fairseq_dir / "data",
             "--output_dir", tmp_path]
        )  # fmt: skip


REMOTE = textwrap.dedent(
    """
    import sys
    sys.modules["vaswani"] = None  # this process must not find the package
    import torch
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, pipeline

    folder, sentence = sys.argv[1], sys.argv[2]
    OPTIONS = {"min_new_tokens": 4, "max_new_tokens": 6, "num_beams": 4}  # random weights: no early </s>
    tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
    model = AutoModelForSeq2SeqLM.from_pretrained(folder, trust_remote_code=True).eval()
    assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
    output = model.generate(**tokenizer([sentence], return_tensors="pt"), **OPTIONS)
    translate = pipeline("translation", model=folder, trust_remote_code=True, **OPTIONS)
    print(repr((output[0].tolist(), translate(sentence)[0]["translation_text"])))
    """
)


def test_converted_folder_loads_with_remote_code_and_in_the_pipeline(converted, tmp_path):
    folder = converted / "wmt_en_de_shared"
    env = {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf_home"), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-c", REMOTE, str(folder), SENTENCES[0]],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForSeq2SeqLM.from_pretrained(folder).eval()
    options = {"min_new_tokens": 4, "max_new_tokens": 6, "num_beams": 4}
    ours = model.generate(**tokenizer([SENTENCES[0]], return_tensors="pt"), **options)
    translate = pipeline("translation", model=folder, **options)
    expected = (ours[0].tolist(), translate(SENTENCES[0])[0]["translation_text"])
    assert done.stdout.strip().splitlines()[-1] == repr(expected)
    assert expected[1] == tokenizer.decode(ours[0], skip_special_tokens=True)


def test_converted_model_exports_to_ctranslate2(converted, tmp_path):
    import ctranslate2

    folder = converted / "untied"  # three embedding matrices and attention biases
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForSeq2SeqLM.from_pretrained(folder).eval()
    translator = ctranslate2.Translator(str(export(model, tmp_path / "ct2", tokenizer)), device="cpu")
    batch = [tokenizer(sentence).input_ids for sentence in SENTENCES]
    theirs = translate_ids(translator, vocabulary(model, tokenizer), batch, length=6)
    for ids, expected in zip(batch, theirs):
        ours = model.generate(torch.tensor([ids]), num_beams=1, min_new_tokens=6, max_new_tokens=6)[0, 1:].tolist()
        assert ours == expected


def test_converted_model_fine_tunes(converted, tmp_path):
    pairs = [{"en": sentence, "de": sentence.upper()} for sentence in SENTENCES] * 4
    split = datasets.Dataset.from_dict({"translation": pairs})
    datasets.DatasetDict(train=split, validation=split).save_to_disk(tmp_path / "data")
    metrics = finetune.main(
        ["--model", converted / "decoder_tied", "--dataset_dir", tmp_path / "data", "--output_dir", tmp_path / "out",
         "--source_lang", "en", "--target_lang", "de", "--use_cpu", "--report_to", "none", "--max_steps", "3",
         "--generation_num_beams", "1", "--generation_max_length", "8", "--eval_strategy", "no",
         "--save_strategy", "no", "--warmup_steps", "0", "--learning_rate", "1e-3"]
    )  # fmt: skip
    assert metrics is not None
    reloaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "out")
    assert not reloaded.config.share_encoder_decoder_embeddings and reloaded.config.attention_bias
    original = AutoModelForSeq2SeqLM.from_pretrained(converted / "decoder_tied")
    assert not torch.equal(reloaded.lm_head.weight, original.lm_head.weight)  # trained, and still tied:
    assert reloaded.lm_head.weight is reloaded.model.decoder.embed_tokens.weight
