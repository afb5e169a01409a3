"""The translation pipeline: `pipeline("translation", ...)` on a saved folder (the package's pipeline, or the folder's
remote code without the package), a model in memory, batches of similar length as `translate()` decodes them, and
transformers' own refusal of the task for the models of other libraries."""

import json
import subprocess
import sys

import pytest
import torch
from helpers import word_tokenizer
from transformers import AutoTokenizer, MarianConfig, MarianMTModel, T5Config, T5ForConditionalGeneration, pipeline

from vaswani import VaswaniConfig, VaswaniForConditionalGeneration, VaswaniTranslationPipeline
from vaswani.evaluation.bleu import translations


TEXTS = ["the red cat", "a dog sees the big house"]
OPTIONS = {"num_beams": 2, "max_new_tokens": 6}
# Lengths out of order, so that sorting them changes the batches.
SENTENCES = [
    "the cat",
    "a dog sees the big red house",
    "the big house",
    "a red cat sees the dog",
    "the dog",
    "a cat sees the big red dog and the house",
    "the house",
]


def saved_model(folder):
    tokenizer = AutoTokenizer.from_pretrained(word_tokenizer(folder))
    torch.manual_seed(0)
    model = VaswaniForConditionalGeneration(VaswaniConfig.from_preset("tiny", vocab_size=len(tokenizer))).eval()
    model.save_pretrained(folder)
    return model, tokenizer


def test_a_saved_folder_declares_the_task_and_the_package_serves_it_without_remote_code(tmp_path):
    model, tokenizer = saved_model(tmp_path / "model")
    # The folder declares its pipeline, so that transformers accepts the task name for it...
    saved = json.loads((tmp_path / "model" / "config.json").read_text())
    assert saved["custom_pipelines"]["translation"]["impl"] == "pipeline_vaswani.VaswaniTranslationPipeline"
    # ...which the installed package serves with its own classes, no remote code run...
    translate = pipeline("translation", model=str(tmp_path / "model"), pipeline_class=VaswaniTranslationPipeline)
    assert type(translate) is VaswaniTranslationPipeline and type(translate.model) is VaswaniForConditionalGeneration
    in_memory = VaswaniTranslationPipeline(model=model, tokenizer=tokenizer)
    assert translate.task == in_memory.task == "translation"  # what evaluate's evaluator checks
    assert translate(TEXTS, **OPTIONS) == in_memory(TEXTS, **OPTIONS)
    # ...while without either, transformers asks to trust the folder's code, as for any custom pipeline.
    with pytest.raises(ValueError, match="trust_remote_code=True"):
        pipeline("translation", model=str(tmp_path / "model"))


def marian(folder):
    config = MarianConfig(
        vocab_size=40, d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, pad_token_id=0, eos_token_id=1,
        decoder_start_token_id=0, max_position_embeddings=64,
    )  # fmt: skip
    MarianMTModel(config).save_pretrained(folder)


def t5(folder):
    config = T5Config(vocab_size=40, d_model=16, d_kv=8, d_ff=32, num_layers=1, num_heads=2)
    T5ForConditionalGeneration(config).save_pretrained(folder)


@pytest.mark.parametrize("save", [marian, t5], ids=["MarianMTModel", "T5"])
def test_the_models_of_other_libraries_get_transformers_own_refusal_of_the_task(save, tmp_path):
    """vaswani's registration gives the task to vaswani folders only: a Marian or T5 folder meets the refusal it meets
    without the package (this process has imported vaswani)."""
    save(tmp_path / "model")
    with pytest.raises(KeyError, match="The task translation has been removed from transformers"):
        pipeline("translation", model=str(tmp_path / "model"))


def test_a_list_is_translated_in_batches_of_similar_length_and_answered_in_its_own_order(tmp_path):
    model, tokenizer = saved_model(tmp_path / "model")
    batches = []  # the source ids each generate() call encodes, padding left out (a hook on the encoder)

    def recorded(encoder, args, kwargs):
        ids, mask = kwargs["input_ids"], kwargs["attention_mask"].bool()
        batches.append([row[keep].tolist() for row, keep in zip(ids, mask)])

    model.get_encoder().register_forward_pre_hook(recorded, with_kwargs=True)
    answers = VaswaniTranslationPipeline(model=model, tokenizer=tokenizer, batch_size=3)(SENTENCES, **OPTIONS)

    longest_first = tokenizer(sorted(SENTENCES, key=len, reverse=True))["input_ids"]
    assert batches == [longest_first[:3], longest_first[3:6], longest_first[6:]]
    expected = translations(model, tokenizer, SENTENCES, batch_size=3, num_beams=2, max_new_tokens=6)
    assert answers == [hypotheses[0] for hypotheses in expected]


def test_batch_size_at_construction_or_in_the_call_gives_translate_s_answers(tmp_path):
    """n-best lists with scores and a prefix per text, in batches: the answers of the batched `translate()`, the same
    batches giving the same scores."""
    model, tokenizer = saved_model(tmp_path / "model")
    prefixes = ["the", "a", "the big", "a", "the", "a cat", "the"]
    options = {"num_beams": 3, "length_penalty": 0.6, "max_new_tokens": 6, "num_return_sequences": 2}
    expected = translations(
        model, tokenizer, SENTENCES, batch_size=3, prefixes=prefixes, return_scores=True, **options
    )
    assert all(hypotheses[0]["translation_text"].startswith(prefixes[i]) for i, hypotheses in enumerate(expected))
    folder = str(tmp_path / "model")
    built = pipeline("translation", model=folder, pipeline_class=VaswaniTranslationPipeline, batch_size=3)
    assert built(SENTENCES, prefix=prefixes, return_scores=True, **options) == expected
    called = VaswaniTranslationPipeline(model=model, tokenizer=tokenizer)
    assert called(SENTENCES, batch_size=3, prefix=prefixes, return_scores=True, **options) == expected


def test_dtype_at_construction_decodes_in_half_precision_as_the_model_loaded_in_it(tmp_path):
    """`pipeline(..., dtype=torch.bfloat16)`, as decoding.md gives it: the weights in bfloat16, and the translations of
    the model loaded in bfloat16."""
    saved_model(tmp_path / "model")
    folder = str(tmp_path / "model")
    translate = pipeline("translation", model=folder, pipeline_class=VaswaniTranslationPipeline, dtype=torch.bfloat16)
    assert translate.model.dtype == torch.bfloat16
    model = VaswaniForConditionalGeneration.from_pretrained(folder, dtype=torch.bfloat16).eval()
    expected = VaswaniTranslationPipeline(model=model, tokenizer=translate.tokenizer)(SENTENCES, **OPTIONS)
    assert translate(SENTENCES, **OPTIONS) == expected


REMOTE_PIPELINE = """
import json, sys
from transformers import pipeline
translate = pipeline("translation", model=sys.argv[1], trust_remote_code=True, batch_size=2)
print(json.dumps([type(translate).__module__, translate(json.loads(sys.argv[2]), **json.loads(sys.argv[3]))]))
"""


@pytest.mark.slow  # a fresh process without the package (tests/test_save_load.py's remote-code run is in the default suite)
def test_without_the_package_the_folder_brings_its_pipeline_as_remote_code(tmp_path):
    """A Python without vaswani (the remote-code test's isolation: -S and no site-packages of this package), batching
    its texts."""
    model, tokenizer = saved_model(tmp_path / "model")
    hidden = tmp_path / "no_vaswani.pth"
    code = (
        "import sys, importlib.abc\n"
        "class Hide(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'vaswani' or name.startswith('vaswani.'):\n"
        "            raise ModuleNotFoundError(name)\n"
        "sys.meta_path.insert(0, Hide())\n" + REMOTE_PIPELINE
    )
    hidden.write_text(code)
    env = {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf_home"), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, str(hidden), str(tmp_path / "model"), json.dumps(SENTENCES[:3]), json.dumps(OPTIONS)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    module, answers = json.loads(done.stdout.strip().splitlines()[-1])
    assert module.startswith("transformers_modules.")  # the folder's copy of pipeline_vaswani.py
    assert answers == VaswaniTranslationPipeline(model=model, tokenizer=tokenizer)(SENTENCES[:3], **OPTIONS)
