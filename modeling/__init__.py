"""The model (modeling_vaswani), its decoding (generation_vaswani), its translation pipeline (pipeline_vaswani) and
the tokenizer of converted fairseq models (tokenization_fairseq). Names are imported on first use, so that importing
one of these modules (the tokenizer, say) does not import the others."""

import importlib


_LAZY = {
    "VaswaniDecoder": ".modeling_vaswani",
    "VaswaniEncoder": ".modeling_vaswani",
    "VaswaniForConditionalGeneration": ".modeling_vaswani",
    "VaswaniModel": ".modeling_vaswani",
    "VaswaniPreTrainedModel": ".modeling_vaswani",
    "label_smoothed_cross_entropy": ".modeling_vaswani",
    "VaswaniTranslationPipeline": ".pipeline_vaswani",
}


def __getattr__(name):
    if name in ("modeling_vaswani", "generation_vaswani", "pipeline_vaswani", "tokenization_fairseq"):
        return importlib.import_module(f".{name}", __name__)
    if name not in _LAZY:
        raise AttributeError(f"module 'vaswani.modeling' has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name], __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted({*globals(), *_LAZY})


__all__ = [
    "VaswaniDecoder",
    "VaswaniEncoder",
    "VaswaniForConditionalGeneration",
    "VaswaniModel",
    "VaswaniPreTrainedModel",
    "VaswaniTranslationPipeline",
    "label_smoothed_cross_entropy",
]
