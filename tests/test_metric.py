"""The package's BLEU as an `evaluate` metric (metrics/vaswani_bleu): loaded offline from its folder, the scores of
`vaswani.evaluation.bleu` (one implementation), and `evaluate.evaluator("translation")` on a vaswani model giving
what `vaswani-evaluate` gives."""

import math
import shutil
import socket
import sys

import datasets
import evaluate
import pytest
import sacrebleu
from helpers import PAIRS

from vaswani import VaswaniTranslationPipeline
from vaswani.evaluation import bleu as evaluation
from vaswani.evaluation.bleu import METRIC_DIR, corpus_bleu, load_metric, tokenized_bleu
from vaswani.scripts import evaluate_bleu


HYPOTHESES = ["the cat-like dog sat.", "a red house stands on the hill", "Jesus wept."]
REFERENCES = ["the cat-like dog sat on the mat.", "the red house stands on a hill", "Jesus wept."]


@pytest.fixture
def offline(monkeypatch):
    """No connection can be opened: a metric that reached for the Hub would fail."""

    def refuse(*args, **kwargs):
        raise OSError("the tests run offline")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


@pytest.mark.parametrize("path", ["folder", "script"])
def test_the_metric_loads_offline_from_the_package_and_scores_as_corpus_bleu(offline, path):
    location = METRIC_DIR if path == "folder" else METRIC_DIR / "vaswani_bleu.py"
    metric = evaluate.load(str(location))
    assert metric.name == "vaswani_bleu" and "Attention Is All You Need" in metric.citation
    assert [set(features) for features in metric.features] == [{"predictions", "references"}] * 2  # with 1 or more
    assert "tokenized_bleu" in metric.inputs_description

    result = metric.compute(predictions=HYPOTHESES, references=REFERENCES)
    score, signature = corpus_bleu(HYPOTHESES, REFERENCES)
    direct = sacrebleu.corpus_bleu(HYPOTHESES, [REFERENCES])
    assert result["score"] == score.score == direct.score and 0 < result["score"] < 100
    assert (result["counts"], result["totals"], result["sys_len"], result["ref_len"]) == (
        direct.counts,
        direct.totals,
        direct.sys_len,
        direct.ref_len,
    )
    assert result["precisions"] == pytest.approx(direct.precisions) and result["bp"] == pytest.approx(direct.bp)
    assert result["signature"] == signature
    assert signature == f"nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:{sacrebleu.__version__}"
    assert "tokenized_bleu" not in result  # no target language, no Moses tokenizer to choose
    # chrF beside it, as WMT reports it: sacreBLEU's own, character 6-grams, beta 2.
    chrf = sacrebleu.corpus_chrf(HYPOTHESES, [REFERENCES])
    assert result["chrf"] == chrf.score and 0 < result["chrf"] < 100 and "chrf" in metric.inputs_description
    assert result["chrf_signature"] == f"nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no|version:{sacrebleu.__version__}"


def test_the_metric_module_calls_the_packages_scoring():
    """One implementation: the module that evaluate imported uses vaswani.evaluation.bleu's functions."""
    module = sys.modules[type(load_metric()).__module__]
    assert module.corpus_bleu is evaluation.corpus_bleu and module.tokenized_bleu is evaluation.tokenized_bleu
    assert module.corpus_chrf is evaluation.corpus_chrf


def test_the_signature_follows_the_options():
    metric = load_metric()
    result = metric.compute(predictions=HYPOTHESES, references=REFERENCES, tokenize="intl", lowercase=True)
    score, signature = corpus_bleu(HYPOTHESES, REFERENCES, tokenize="intl", lowercase=True)
    assert result["score"] == score.score
    assert result["signature"] == signature and "|case:lc|" in signature and "|tok:intl|" in signature
    assert "|case:lc|" in result["chrf_signature"]
    assert (
        result["chrf"]
        == sacrebleu.corpus_chrf([h.lower() for h in HYPOTHESES], [[r.lower() for r in REFERENCES]]).score
    )
    # Several references per translation, as the Hub's sacrebleu metric takes them.
    several = [[reference, hypothesis] for reference, hypothesis in zip(REFERENCES, HYPOTHESES)]
    result = metric.compute(predictions=HYPOTHESES, references=several)
    assert result["signature"].startswith("nrefs:2|") and result["score"] == pytest.approx(100.0)


def test_the_tokenized_bleu_is_the_papers_with_compounds_split():
    """tensor2tensor's get_ende_bleu.sh, as tests/test_paper_decoding.py checks it by hand: the target language is the
    configuration's name or `target_lang`."""
    # Moses tokens: "the cat ##AT##-##AT## like dog sat ." against "the cat ##AT##-##AT## like dog sat on the mat .":
    # precisions 7/7, 5/6, 4/5, 3/4; brevity penalty exp(1 - 10/7).
    expected = 100 * math.exp(1 - 10 / 7) * (1 * 5 / 6 * 4 / 5 * 3 / 4) ** 0.25
    hypothesis, reference = ["the cat-like dog sat."], ["the cat-like dog sat on the mat."]
    by_config = load_metric("en").compute(predictions=hypothesis, references=reference)
    by_argument = load_metric().compute(predictions=hypothesis, references=reference, target_lang="en")
    assert by_config["tokenized_bleu"] == pytest.approx(expected, abs=1e-9)
    assert by_argument["tokenized_bleu"] == by_config["tokenized_bleu"]
    assert by_config["score"] != pytest.approx(expected)  # sacreBLEU's 13a keeps "cat-like" whole: another number
    result = load_metric("es").compute(predictions=HYPOTHESES, references=REFERENCES)
    assert result["tokenized_bleu"] == tokenized_bleu(HYPOTHESES, REFERENCES, "es").score


def test_the_evaluator_on_a_vaswani_model_scores_as_vaswani_evaluate(trained_text_model, tmp_path):
    """evaluate's translation evaluator, on a model or its pipeline, decodes through the package's translation
    pipeline, vaswani-evaluate through `translate()`, both in length-sorted batches. The same model and sentences give
    the same BLEU."""
    model, tokenizer, folder = trained_text_model
    pairs = [*PAIRS, ("God is love.", "Dios es amor."), ("The earth is kind.", "La tierra es benigna.")]
    sources, references = [source for source, _ in pairs], [reference for _, reference in pairs]
    data = datasets.Dataset.from_dict({"text": sources, "label": references})

    evaluator = evaluation.TranslationEvaluator()
    results = evaluator.compute(model_or_pipeline=model, tokenizer=tokenizer, data=data, metric=load_metric("es"))
    translate = VaswaniTranslationPipeline(model=model, tokenizer=tokenizer)
    through_the_pipeline = evaluator.compute(model_or_pipeline=translate, data=data, metric=load_metric("es"))
    assert through_the_pipeline["score"] == results["score"]

    model_dir = shutil.copytree(folder, tmp_path / "model")  # vaswani-evaluate writes its results next to the model
    split = datasets.Dataset.from_dict({"translation": [{"en": source, "es": target} for source, target in pairs]})
    datasets.DatasetDict(test=split).save_to_disk(tmp_path / "data")
    expected = evaluate_bleu.main(
        ["--model", model_dir, "--dataset_dir", tmp_path / "data", "--output", tmp_path / "hypotheses.txt"]
    )
    assert 10 < expected["score"] < 100  # unseen sentences: a score that the decoding decides
    assert results["score"] == pytest.approx(expected["score"], abs=1e-9)
    assert results["tokenized_bleu"] == pytest.approx(expected["tokenized_bleu"], abs=1e-9)
    assert results["signature"] == expected["signature"]
