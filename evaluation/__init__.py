"""Evaluation (section 6.1): translate a test set with the paper's beam search and score it with sacreBLEU and
Table 2's tokenized BLEU, and chrF beside them (`bleu`, also the `evaluate` metric `vaswani_bleu`), with the decoding flags the commands
share (`arguments`). `vaswani-evaluate` and `vaswani-translate` run them, and training's validation
(`vaswani.training.validate`) scores through them.
"""

from ..lazy_imports import lazy_names


# Imported on first use, so that importing the room costs nothing until a name is used.
_EXPORTS = {
    "bleu": [
        "TranslationEvaluator",
        "corpus_bleu",
        "corpus_chrf",
        "load_metric",
        "tokenized_bleu",
        "translate",
        "translations",
    ],
    "arguments": ["DecodingArguments"],
}
__getattr__, __dir__, __all__ = lazy_names(__name__, _EXPORTS)
