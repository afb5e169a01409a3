"""What the commands write into a model folder: a record is never replaced by a smaller one. vaswani-evaluate keeps
each split's full score (all of its pairs, the weights in float32) and its hypotheses where the model card reads them,
and a partial run beside them under a name that says what it left out."""

import json
import shutil

import pytest
from helpers import PAIRS, exit_message, save_pairs
from huggingface_hub import ModelCard

from vaswani.hub.model_card import render_model_card
from vaswani.scripts import evaluate_bleu, export_ctranslate2


@pytest.fixture
def evaluated(trained_text_model, tmp_path):
    """A copy of the text model (the commands write into it) with its full score on a validation split of 4 pairs,
    and that split's dataset folder."""
    _, _, folder = trained_text_model
    model_dir = shutil.copytree(folder, tmp_path / "model")
    data = save_pairs(tmp_path / "data", [{"en": source, "es": target} for source, target in PAIRS])
    evaluate_bleu.main(["--model", model_dir, "--dataset_dir", data, "--split", "validation"])
    return model_dir, data


def full_records(model_dir):
    return {name: (model_dir / name).read_bytes() for name in ("eval_results.json", "hypotheses.validation.txt")}


@pytest.mark.parametrize(
    ("flags", "name", "sentences", "left_out"),
    [
        (
            ["--max_samples", 2, "--dtype", "bfloat16"],
            "validation.first2.bfloat16",
            2,
            "the first 2 of 4 pairs, bfloat16",
        ),
        (["--int8"], "validation.int8", 4, "int8 linear layers"),
    ],
)
def test_a_partial_evaluation_is_kept_beside_the_full_score_never_in_its_place(
    evaluated, flags, name, sentences, left_out, capsys
):
    model_dir, data = evaluated
    full = full_records(model_dir)
    assert json.loads(full["eval_results.json"])["validation"]["sentences"] == 4
    capsys.readouterr()

    evaluate_bleu.main(["--model", model_dir, "--dataset_dir", data, "--split", "validation", *flags])

    assert full_records(model_dir) == full
    partial_file = model_dir / "partial_eval_results.json"
    record = json.loads(partial_file.read_text())[name]
    assert record["sentences"] == sentences and record["split_pairs"] == 4
    assert len((model_dir / f"hypotheses.{name}.txt").read_text().splitlines()) == sentences
    assert (
        f"A partial run ({left_out}): scores recorded as {name!r} in {partial_file}, leaving eval_results.json's "
        "full scores as they were"
    ) in capsys.readouterr().out.splitlines()
    # The model card gives the full scores alone.
    card = ModelCard(render_model_card(model_dir, "alice/vaswani-en-es"))
    recorded = json.loads(full["eval_results.json"])["validation"]
    scores = {(result.dataset_split, result.metric_type, result.metric_value) for result in card.data.eval_results}
    assert scores == {("validation", "bleu", recorded["bleu"]), ("validation", "chrf", recorded["chrf"])}


def test_a_run_on_every_pair_in_float32_is_the_full_score(evaluated, capsys):
    model_dir, data = evaluated
    capsys.readouterr()
    evaluate_bleu.main(["--model", model_dir, "--dataset_dir", data, "--split", "validation", "--max_samples", 4])
    results = model_dir / "eval_results.json"
    assert f"Scores recorded as 'validation' in {results}, which the model card reads" in capsys.readouterr().out
    assert not (model_dir / "partial_eval_results.json").exists()
    assert json.loads(results.read_text())["validation"]["sentences"] == 4


def test_the_ctranslate2_export_never_replaces_a_folder_that_holds_other_files(trained_text_model, tmp_path):
    """CTranslate2's converter deletes its output folder before writing: the model's own folder, or one above it, is
    refused and left whole; a folder holding an earlier export is replaced."""
    _, _, folder = trained_text_model
    model_dir = shutil.copytree(folder, tmp_path / "runs" / "model")
    files = {path.name: path.read_bytes() for path in model_dir.iterdir()}
    for output_dir in (model_dir, tmp_path / "runs"):
        message = exit_message(export_ctranslate2.main, ["--model", model_dir, "--output_dir", output_dir])
        assert f": error: cannot export into {output_dir}: it holds other files (" in message
        assert message.endswith(
            "and no CTranslate2 model, and the export replaces the whole folder; give a new or empty one."
        )
    assert {path.name: path.read_bytes() for path in model_dir.iterdir()} == files
    export_ctranslate2.main(["--model", model_dir, "--output_dir", tmp_path / "ct2"])
    export_ctranslate2.main(["--model", model_dir, "--output_dir", tmp_path / "ct2", "--quantization", "int8"])
    assert (tmp_path / "ct2" / "model.bin").is_file()
