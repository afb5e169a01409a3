"""scripts/convert_fairseq.py checked against fairseq itself: small random fairseq Transformers of each supported
variant are built, saved and run by fairseq (tests/fairseq_reference.py, in the virtual environment
scripts/install_fairseq.sh makes at .fairseq-venv, built by the first run of these tests and kept, or the Python
VASWANI_FAIRSEQ_PYTHON names), converted, and compared: tokenization, encoder output and decoder log-probabilities
within 1e-5 in float32, greedy and beam outputs identical; then the converted folder is used as users use one."""

import json
import subprocess
import sys
import textwrap

import datasets
import pytest
import torch
from helpers import REPO_ROOT, run_command, script_command, script_env
from hub_server import HubServer
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, LogitsProcessorList, pipeline

from vaswani import VaswaniTranslationPipeline
from vaswani.export.ctranslate2 import export, translate_ids, vocabulary
from vaswani.modeling.generation_vaswani import SourceLengthLimit
from vaswani.scripts import convert_fairseq, finetune


# Building fairseq takes minutes, once: the tests run with the slow ones (.ci/run, docs/testing.md).
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("fairseq")]  # one worker builds .fairseq-venv
SUPPORTED = ["wmt_en_de_shared", "vaswani_big_shared", "decoder_tied", "untied", "old_style_args"]
REFUSED = {
    "pre_norm": "encoder_normalize_before=True, decoder_normalize_before=True",
    "learned_positions": "encoder_learned_pos=True, decoder_learned_pos=True",
    "layer_drop": "encoder_layerdrop=0.1",
    "gelu": "activation_fn='gelu'",
}
HUB_TOKEN = "hf_aliceSecretToken0123456789"
SENTENCES = ["The cat sat on the mat.", "A well-known dog jumps over the quick fox, and said it.", "Attention!"]
MAX_LEN_B = 12  # fairseq_reference.py's
EOS, PAD = 2, 1
# Raw text with what Moses normalisation, escaping and hyphen splitting would change: straight and curly quotes,
# apostrophes, hyphens, & < >, and special-token look-alikes, which fairseq reads as text.
MOSES_SENTENCES = [
    'He said "hello" and left.',
    "She said \u201chello\u201d \u2013 it\u2019s the state-of-the-art, isn\u2019t it?",
    "It's a well-known fact: the cat doesn't fly -- or does it?",
    "Tom & Jerry: 3 < 4 > 2 && x-ray &amp; AT&T.",
    "\u2018Single\u2019 and 'straight' quotes\u2026 a <unk> or </s> tag, and <s>.",
]
# fairseq-train's --tokenizer options as the checkpoint records them (new-style cfg or old-style args). "unrecorded"
# records none (a model trained on text tokenized beforehand): fairseq-interactive is given --tokenizer moses and the
# model's languages, and the converter gives fairseq's defaults.
MOSES_VARIANTS = {
    "unrecorded": ({}, "cfg"),
    "moses": ({"tokenizer": "moses"}, "cfg"),
    "no_escape": ({"tokenizer": "moses", "moses_no_escape": True}, "cfg"),
    "no_dash_splits": ({"tokenizer": "moses", "moses_no_dash_splits": True}, "cfg"),
    "old_style_args": ({"tokenizer": "moses", "moses_no_escape": True, "moses_no_dash_splits": True}, "args"),
    "space": ({"tokenizer": "space"}, "cfg"),  # refused: no reference
}
# Run with fairseq's Python: fairseq_reference.py's model, saved as fairseq's trainer saves it with the options above,
# loaded back by fairseq's hub interface, which builds its tokenizer from the checkpoint's recorded options (as
# fairseq-interactive builds it from its command line), and encodes and decodes raw text as fairseq-interactive does:
# Moses (fairseq/data/encoders/moses_tokenizer.py), subword-nmt, the dictionary.
MOSES_REFERENCE = textwrap.dedent(
    """
    import argparse, json, sys
    from pathlib import Path
    import torch
    sys.path.insert(0, sys.argv[1])
    from fairseq_reference import build_model, save
    from fairseq.models.transformer import TransformerModel

    data, root = Path(sys.argv[2]), Path(sys.argv[3])
    sentences, variants = json.loads(sys.argv[4]), json.loads(sys.argv[5])
    torch.serialization.add_safe_globals([argparse.Namespace])
    torch.manual_seed(0)
    for name, (options, style) in variants.items():
        (root / name).mkdir(parents=True)
        model, args = build_model(data, "transformer_wmt_en_de", {"share_all_embeddings": True, **options})
        save(model, args, root / name / "checkpoint.pt", style)
        if options.get("tokenizer") not in (None, "moses"):
            continue
        overrides = {"bpe": "subword_nmt", "bpe_codes": str(data / "bpecodes")}
        if not options:
            overrides.update(tokenizer="moses", source_lang="en", target_lang="de")
        hub = TransformerModel.from_pretrained(
            str(root / name), checkpoint_file="checkpoint.pt", data_name_or_path=str(data), **overrides
        )
        ids = [hub.encode(sentence) for sentence in sentences]
        reference = {
            "pieces": [hub.apply_bpe(hub.tokenize(sentence)).split() for sentence in sentences],
            "ids": [sentence.tolist() for sentence in ids],
            "decoded": [hub.decode(sentence[:-1]) for sentence in ids],
        }
        (root / name / "reference.json").write_text(json.dumps(reference))
    """
)


@pytest.fixture(scope="module")
def fairseq_dir(fairseq_python, tmp_path_factory):
    folder = tmp_path_factory.mktemp("fairseq")
    subprocess.run([fairseq_python, str(REPO_ROOT / "tests" / "fairseq_reference.py"), str(folder)], check=True)
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


@pytest.fixture(scope="module")
def moses_dir(fairseq_python, fairseq_dir, tmp_path_factory):
    folder = tmp_path_factory.mktemp("moses")
    subprocess.run(
        [fairseq_python, "-c", MOSES_REFERENCE, str(REPO_ROOT / "tests"), str(fairseq_dir / "data"), str(folder),
         json.dumps(MOSES_SENTENCES), json.dumps(MOSES_VARIANTS)],
        check=True,
    )  # fmt: skip
    return folder


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


def loaded_without_the_package(source, env, cwd):
    """REMOTE's answer: what a fresh process without the package makes of SENTENCES[0] with the model of `source`,
    a folder or a Hub repo."""
    done = subprocess.run(
        [sys.executable, "-c", REMOTE, str(source), SENTENCES[0]], env=env, cwd=cwd, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip().splitlines()[-1]


def translated_here(folder):
    """REMOTE's answer, as this process gives it with the package."""
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForSeq2SeqLM.from_pretrained(folder).eval()
    options = {"min_new_tokens": 4, "max_new_tokens": 6, "num_beams": 4}
    ours = model.generate(**tokenizer([SENTENCES[0]], return_tensors="pt"), **options)
    translate = pipeline("translation", model=folder, pipeline_class=VaswaniTranslationPipeline, **options)
    expected = (ours[0].tolist(), translate(SENTENCES[0])[0]["translation_text"])
    assert expected[1] == tokenizer.decode(ours[0], skip_special_tokens=True)
    return repr(expected)


def test_converted_folder_loads_with_remote_code_and_in_the_pipeline(converted, tmp_path):
    folder = converted / "wmt_en_de_shared"
    env = {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf_home"), "PATH": "/usr/bin:/bin"}
    assert loaded_without_the_package(folder, env, tmp_path) == translated_here(folder)


def test_a_pushed_converted_model_loads_from_the_hub_as_from_its_folder(converted, tmp_path):
    """vaswani-push-to-hub uploads what a converted folder holds beyond a trained one (vocab-src.json, vocab-tgt.json
    and the Moses tokenizer's code): a process without the package loads it by repo id, through the Hub's HTTP API
    (tests/hub_server.py), and translates as the folder does."""
    folder = converted / "wmt_en_de_shared"
    with HubServer(users={"alice": HUB_TOKEN}) as hub:
        env = script_env(
            HF_ENDPOINT=hub.url, HF_HUB_DISABLE_XET="1", HF_HOME=str(tmp_path / "hf_home"), HF_TOKEN=HUB_TOKEN
        )
        push = script_command("push_to_hub", "--model_dir", folder, "--repo_id", "alice/fairseq-en-de")
        run_command(push, env=env, check=True)
        assert loaded_without_the_package("alice/fairseq-en-de", env, tmp_path) == translated_here(folder)


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


@pytest.mark.parametrize("variant", [name for name, (options, _) in MOSES_VARIANTS.items() if name != "space"])
def test_raw_text_is_read_as_fairseq_reads_it(fairseq_dir, moses_dir, variant, tmp_path):
    """The converted tokenizer follows the Moses options the checkpoint records: raw text gets the very BPE pieces
    and ids fairseq gives it (no punctuation normalisation; escaping and hyphen splitting as recorded), and ids decode
    to fairseq's text."""
    convert_fairseq.main(
        ["--checkpoint", moses_dir / variant / "checkpoint.pt", "--data_dir", fairseq_dir / "data",
         "--output_dir", tmp_path]
    )  # fmt: skip
    reference = json.loads((moses_dir / variant / "reference.json").read_text())
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)  # no trust_remote_code: `import vaswani` registered it
    assert type(tokenizer).__name__ == "FairseqMosesTokenizer"
    # FSMTTokenizer's end-of-word marks in fairseq's continuation marks: ("wor", "ld</w>") is "wor@@ ld".
    pieces = [
        [token.removesuffix("</w>") if token.endswith("</w>") else token + "@@" for token in tokenizer.tokenize(text)]
        for text in MOSES_SENTENCES
    ]
    assert pieces == reference["pieces"]
    assert [tokenizer(text).input_ids for text in MOSES_SENTENCES] == reference["ids"]
    assert [tokenizer.decode(ids[:-1]) for ids in reference["ids"]] == reference["decoded"]


def test_the_sentences_tell_the_moses_options_apart(moses_dir):
    """Each option changes the pieces of these sentences, so that the test above sees a converter that ignores one;
    and fairseq keeps the curly quotes, which Moses punctuation normalisation would have made straight."""
    pieces = {
        name: json.loads((moses_dir / name / "reference.json").read_text())["pieces"]
        for name in ("unrecorded", "moses", "no_escape", "no_dash_splits", "old_style_args")
    }
    assert pieces["unrecorded"] == pieces["moses"]
    assert len({json.dumps(value) for name, value in pieces.items() if name != "unrecorded"}) == 4
    moses = " ".join(" ".join(sentence) for sentence in pieces["moses"]).replace("@@ ", "")  # the BPE undone
    assert "\u201c" in moses and "\u2019" in moses and "&quot;" in moses and "&apos;" in moses and "&amp;" in moses
    assert "state @-@ of @-@ the @-@ art" in moses and "x @-@ ray" in moses


def test_other_tokenizers_are_refused_by_name(fairseq_dir, moses_dir, tmp_path):
    with pytest.raises(SystemExit, match="trained with fairseq's --tokenizer space"):
        convert_fairseq.main(
            ["--checkpoint", moses_dir / "space" / "checkpoint.pt", "--data_dir", fairseq_dir / "data",
             "--output_dir", tmp_path]
        )  # fmt: skip


def test_the_attention_explorer_serves_a_converted_model(converted):
    """vaswani-demo's page on a converted folder (its Moses + BPE tokenizer, remote code): the pipeline's translation
    and n-best list, the attention maps labelled with the Moses tokens, the beam search's steps."""
    from vaswani.inspection.app import Explorer

    folder = converted / "wmt_en_de_shared"
    shown = Explorer(str(folder)).translate(SENTENCES[0], num_beams=4, length_penalty=0.6, nbest=2)
    model, tokenizer = AutoModelForSeq2SeqLM.from_pretrained(folder).eval(), AutoTokenizer.from_pretrained(folder)
    translate = VaswaniTranslationPipeline(model=model, tokenizer=tokenizer)
    expected = translate(SENTENCES[0], num_beams=4, length_penalty=0.6, num_return_sequences=2, return_scores=True)
    assert shown.text == expected[0]["translation_text"]
    assert [row[2] for row in shown.nbest] == [answer["translation_text"] for answer in expected]
    assert len(shown.maps.source_tokens) == len(tokenizer(SENTENCES[0]).input_ids)
    assert shown.maps.source_tokens[-1] == "</s>" and len(shown.maps.encoder_decoder) == model.config.decoder_layers
    assert shown.beam_steps and shown.beam_steps[0][0] == 1
