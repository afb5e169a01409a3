"""CTranslate2 export: the same weights give the same scores and the same greedy translations."""

import subprocess
import sys

import ctranslate2
import pytest
import torch
from helpers import PAIRS, REPO_ROOT

from vaswani import VaswaniConfig, VaswaniForConditionalGeneration
from vaswani.corpora.tokenizer import train_bpe_tokenizer
from vaswani.export.ctranslate2 import export, translate_ids, vocabulary
from vaswani.scripts import export_ctranslate2


def test_scores_match_transformers(trained_text_model, tmp_path):
    model, tokenizer, _ = trained_text_model
    translator = ctranslate2.Translator(str(export(model, tmp_path, tokenizer)), device="cpu")
    tokens = vocabulary(model, tokenizer)
    source, target = tokenizer(PAIRS[0][0]).input_ids, tokenizer(PAIRS[0][1]).input_ids  # both end in </s>
    (scored,) = translator.score_batch([[tokens[i] for i in source]], [[tokens[i] for i in target[:-1]]])
    with torch.no_grad():
        log_probs = model(input_ids=torch.tensor([source]), labels=torch.tensor([target])).logits.log_softmax(-1)[0]
    expected = log_probs[torch.arange(len(target)), torch.tensor(target)]
    torch.testing.assert_close(torch.tensor(scored.log_probs), expected, atol=1e-4, rtol=1e-4)


def test_greedy_translations_are_identical(trained_text_model, tmp_path):
    model, tokenizer, _ = trained_text_model
    translator = ctranslate2.Translator(str(export(model, tmp_path, tokenizer)), device="cpu")
    batch = [tokenizer(source).input_ids for source, _ in PAIRS]
    theirs = translate_ids(translator, vocabulary(model, tokenizer), batch)
    ours = [model.generate(torch.tensor([ids]), num_beams=1)[0, 1:].tolist() for ids in batch]
    ours = [[i for i in ids if i not in (tokenizer.eos_token_id, tokenizer.pad_token_id)] for ids in ours]
    assert theirs == ours
    assert [tokenizer.decode(ids) for ids in theirs] == [target for _, target in PAIRS]  # it did learn them


@pytest.mark.slow  # two exports in fresh processes, each checked against the model
def test_script_exports_int8_and_checks(trained_text_model, tmp_path):
    _, _, folder = trained_text_model
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


def test_the_unknown_token_is_the_tokenizers_own(trained_text_model, tmp_path):
    """CTranslate2 maps input outside the vocabulary to the unk token: the tokenizer's, whatever its spelling; a
    tokenizer without one is refused rather than given <pad> in its place."""
    import json

    model, tokenizer, _ = trained_text_model
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


@pytest.mark.parametrize("quantization", [None, "float16", "int8", "int8_float32", "int16"])
def test_export_leaves_the_model_untouched(trained_tiny_model, tmp_path, quantization):
    """CTranslate2 quantises the arrays it is handed in place (int8, int16: `value *= scale`); the exporter hands it
    copies, never views of the model's parameters. Trained weights, so that a rescaled row shows: every tensor of the
    live model is bit-identical after the export."""
    before = {name: tensor.clone() for name, tensor in trained_tiny_model.state_dict().items()}
    export(trained_tiny_model, tmp_path, quantization=quantization)
    after = trained_tiny_model.state_dict()
    assert after.keys() == before.keys()
    changed = [name for name, tensor in before.items() if not torch.equal(after[name], tensor)]
    assert changed == []


def test_float32_is_a_quantization_by_name_and_writes_what_no_flag_writes(trained_text_model, tmp_path):
    _, _, folder = trained_text_model
    export_ctranslate2.main(["--model", folder, "--output_dir", tmp_path / "default"])
    export_ctranslate2.main(["--model", folder, "--output_dir", tmp_path / "float32", "--quantization", "float32"])
    assert (tmp_path / "float32" / "model.bin").read_bytes() == (tmp_path / "default" / "model.bin").read_bytes()


@pytest.mark.parametrize("quantization", [None, "float16", "int8"])
def test_check_passes_for_every_quantization(trained_text_model, tmp_path, capsys, quantization):
    """`vaswani-export-ctranslate2 --check` compares CTranslate2 with the model it exported, which the export left as
    it was: a trained model passes whatever the quantization."""
    _, _, folder = trained_text_model
    arguments = ["--model", folder, "--output_dir", tmp_path / "ct2", "--check", "--check_sentences"]
    arguments += [source for source, _ in PAIRS]
    if quantization is not None:
        arguments += ["--quantization", quantization]
    assert export_ctranslate2.main(arguments) == tmp_path / "ct2"
    assert "Greedy outputs identical on 4 sentences" in capsys.readouterr().out


def test_vaswani_translate_translates_with_the_export_in_one_command(trained_text_model, tmp_path, capsys):
    """`vaswani-translate --ctranslate2 CT2`: the fastest engine on CPUs, one command from the exported folder, with the
    model's tokenizer; the lines keep their order through length-sorted batches and a blank line stays blank, and what
    it cannot write is refused by name."""
    from vaswani.scripts import translate

    model, tokenizer, folder = trained_text_model
    export_ctranslate2.main(["--model", folder, "--output_dir", tmp_path / "ct2"])
    sources = [source for source, _ in PAIRS[::-1]] + [""]
    (tmp_path / "in.txt").write_text("".join(line + "\n" for line in sources), encoding="utf-8")
    paths = ["--model", folder, "--input", tmp_path / "in.txt", "--output", tmp_path / "out.txt"]
    translate.main([*paths, "--ctranslate2", tmp_path / "ct2", "--batch_size", "2"])
    lines = (tmp_path / "out.txt").read_text(encoding="utf-8").splitlines()
    assert lines == [target for _, target in PAIRS[::-1]] + [""]  # the model learnt these by heart
    assert (
        "with CTranslate2 (float32)" in capsys.readouterr().err
    )  # the summary: standard output may be the translations
    translate.main([*paths, "--ctranslate2", tmp_path / "ct2", "--int8"])  # CTranslate2's int8, from the same export
    assert (tmp_path / "out.txt").read_text(encoding="utf-8").splitlines() == lines
    assert "with CTranslate2 (int8" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:  # the message the command exits with (status 1)
        translate.main([*paths, "--ctranslate2", tmp_path / "ct2", "--nbest", "2", "--num_beams", "4"])
    assert "leave out --nbest" in str(exit_info.value.code)
    with pytest.raises(SystemExit) as exit_info:
        translate.main([*paths, "--ctranslate2", tmp_path])
    assert "holds no CTranslate2 model" in str(exit_info.value.code)
