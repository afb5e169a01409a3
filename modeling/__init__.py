"""The model (modeling_vaswani), its decoding (generation_vaswani), its translation pipeline (pipeline_vaswani) and
the tokenizer of converted fairseq models (tokenization_fairseq). Names are imported on first use, so that importing
one of these modules (the tokenizer, say) does not import the others."""

from ..lazy_imports import lazy_names


_LAZY = {
    "VaswaniDecoder": ".modeling_vaswani",
    "VaswaniEncoder": ".modeling_vaswani",
    "VaswaniForConditionalGeneration": ".modeling_vaswani",
    "VaswaniModel": ".modeling_vaswani",
    "VaswaniPreTrainedModel": ".modeling_vaswani",
    "label_smoothed_cross_entropy": ".modeling_vaswani",
    "VaswaniTranslationPipeline": ".pipeline_vaswani",
}
__getattr__, __dir__ = lazy_names(
    __name__, _LAZY, submodules=("modeling_vaswani", "generation_vaswani", "pipeline_vaswani", "tokenization_fairseq")
)

__all__ = [
    "VaswaniDecoder",
    "VaswaniEncoder",
    "VaswaniForConditionalGeneration",
    "VaswaniModel",
    "VaswaniPreTrainedModel",
    "VaswaniTranslationPipeline",
    "label_smoothed_cross_entropy",
]
