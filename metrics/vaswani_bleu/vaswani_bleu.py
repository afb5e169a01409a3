"""vaswani_bleu: the BLEU of "Attention Is All You Need" as an `evaluate` metric.

sacreBLEU's corpus BLEU on detokenized text, with its signature, sacreBLEU's chrF beside it, and, given the target
language, the paper's own measure: tokenized BLEU with compounds split (Table 2). The scoring is the `vaswani`
package's (`vaswani.evaluation.bleu.corpus_bleu`, `corpus_chrf` and `tokenized_bleu`), the one that `vaswani-evaluate`, the validation during
training and `vaswani-finetune` use, so that this metric's numbers are theirs.

    import evaluate
    bleu = evaluate.load("path/to/metrics/vaswani_bleu", "es")  # or vaswani.evaluation.bleu.load_metric("es")
    bleu.compute(predictions=["El Señor es mi pastor."], references=["El Señor es mi pastor."])
"""

import datasets
import evaluate

from vaswani.evaluation.bleu import corpus_bleu, corpus_chrf, tokenized_bleu


_CITATION = """\
@inproceedings{vaswani2017attention,
  title = {Attention Is All You Need},
  author = {Vaswani, Ashish and Shazeer, Noam and Parmar, Niki and Uszkoreit, Jakob and Jones, Llion and Gomez, Aidan N.
            and Kaiser, {\\L}ukasz and Polosukhin, Illia},
  booktitle = {Advances in Neural Information Processing Systems},
  volume = {30},
  year = {2017},
  url = {https://arxiv.org/abs/1706.03762}
}
@inproceedings{post-2018-call,
  title = {A Call for Clarity in Reporting {BLEU} Scores},
  author = {Post, Matt},
  booktitle = {Proceedings of the Third Conference on Machine Translation: Research Papers},
  year = {2018},
  address = {Belgium, Brussels},
  publisher = {Association for Computational Linguistics},
  url = {https://www.aclweb.org/anthology/W18-6319},
  pages = {186--191},
}
@inproceedings{popovic-2015-chrf,
  title = {chr{F}: character n-gram {F}-score for automatic {MT} evaluation},
  author = {Popovi{\\'c}, Maja},
  booktitle = {Proceedings of the Tenth Workshop on Statistical Machine Translation},
  year = {2015},
  address = {Lisbon, Portugal},
  publisher = {Association for Computational Linguistics},
  url = {https://aclanthology.org/W15-3049},
  pages = {392--395},
}
"""

_DESCRIPTION = """\
BLEU as the `vaswani` package (the Transformer of "Attention Is All You Need") reports it. `score` is sacreBLEU's corpus
BLEU of the detokenized translations, returned with its `signature` (tokenizer, case, smoothing, version), so that it
can be compared with any other sacreBLEU score; `chrf` is sacreBLEU's chrF (character 6-grams, beta 2), the score
WMT's findings report beside BLEU, with its own `chrf_signature`. With the target language (the metric's configuration name, e.g.
`evaluate.load(path, "de")`, or `target_lang=` in `compute`), `tokenized_bleu` is the paper's own measure, the one its
Table 2 reports: both sides tokenized with the Moses tokenizer of that language, compounds split at their hyphens
("rich-text" as "rich ##AT##-##AT## text", tensor2tensor's get_ende_bleu.sh), then multi-bleu.perl's case-sensitive
corpus BLEU. It is usually higher than sacreBLEU's and is comparable only with Table 2 and with itself.
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions (`list` of `str`): the translations, detokenized.
    references (`list` of `str`, or `list` of `list` of `str`): one reference per translation, or the same number of
        references for every translation.
    tokenize (`str`): sacreBLEU's tokenizer for `score`: "13a" (default), "intl", "zh", "ja-mecab", "char", "none", ...
    lowercase (`bool`): case-insensitive `score` and `chrf` (default False). The tokenized BLEU is always
        case-sensitive.
    target_lang (`str`): the language of the translations, for the Moses tokenizer of `tokenized_bleu`; default: the
        configuration name (`evaluate.load(path, "de")`); without either, `tokenized_bleu` is left out.
Returns:
    score (`float`): sacreBLEU's corpus BLEU, 0 to 100.
    signature (`str`): sacreBLEU's signature of that score, e.g. "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0".
    counts, totals (`list` of `int`): matched and total n-grams, n = 1 to 4.
    precisions (`list` of `float`): the n-gram precisions, in percent.
    bp (`float`): the brevity penalty.
    sys_len, ref_len (`int`): the lengths of the translations and of the references, in sacreBLEU's tokens.
    chrf (`float`): sacreBLEU's corpus chrF, 0 to 100.
    chrf_signature (`str`): its signature, e.g. "nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no|version:2.6.0".
    tokenized_bleu (`float`): with a target language only: the paper's tokenized BLEU, compounds split.
Examples:
    >>> bleu = evaluate.load("metrics/vaswani_bleu", "en")
    >>> result = bleu.compute(predictions=["the cat-like dog sat."], references=["the cat-like dog sat on the mat."])
    >>> round(result["tokenized_bleu"], 2), result["signature"].split("|")[0]
    (54.78, 'nrefs:1')
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class VaswaniBleu(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            homepage="https://github.com/mjpost/sacrebleu",
            codebase_urls=["https://github.com/mjpost/sacrebleu", "https://github.com/tensorflow/tensor2tensor"],
            reference_urls=["https://arxiv.org/abs/1706.03762", "https://www.aclweb.org/anthology/W18-6319"],
            features=[
                datasets.Features(
                    {
                        "predictions": datasets.Value("string", id="sequence"),
                        "references": datasets.Sequence(datasets.Value("string", id="sequence"), id="references"),
                    }
                ),
                datasets.Features(
                    {
                        "predictions": datasets.Value("string", id="sequence"),
                        "references": datasets.Value("string", id="sequence"),
                    }
                ),
            ],
        )

    def _compute(self, predictions, references, tokenize="13a", lowercase=False, target_lang=None):
        score, signature = corpus_bleu(predictions, references, tokenize=tokenize, lowercase=lowercase)
        result = {
            "score": score.score,
            "signature": signature,
            "counts": score.counts,
            "totals": score.totals,
            "precisions": score.precisions,
            "bp": score.bp,
            "sys_len": score.sys_len,
            "ref_len": score.ref_len,
        }
        chrf, result["chrf_signature"] = corpus_chrf(predictions, references, lowercase=lowercase)
        result["chrf"] = chrf.score
        language = target_lang or (self.config_name if self.config_name != "default" else None)
        if language:
            result["tokenized_bleu"] = tokenized_bleu(predictions, references, language).score
        return result
