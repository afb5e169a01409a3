"""The model (modeling_vaswani), its decoding (generation_vaswani), its translation pipeline (pipeline_vaswani) and
the tokenizer of converted fairseq models (tokenization_fairseq)."""

from .modeling_vaswani import (
    VaswaniDecoder,
    VaswaniEncoder,
    VaswaniForConditionalGeneration,
    VaswaniModel,
    VaswaniPreTrainedModel,
    label_smoothed_cross_entropy,
)
from .pipeline_vaswani import VaswaniTranslationPipeline


__all__ = [
    "VaswaniDecoder",
    "VaswaniEncoder",
    "VaswaniForConditionalGeneration",
    "VaswaniModel",
    "VaswaniPreTrainedModel",
    "VaswaniTranslationPipeline",
    "label_smoothed_cross_entropy",
]
