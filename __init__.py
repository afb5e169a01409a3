"""vaswani: the Transformer of "Attention Is All You Need" (Vaswani et al., 2017) as a Hugging Face model.

Importing this package registers `model_type="vaswani"` with `AutoConfig`, `AutoModel` and `AutoModelForSeq2SeqLM`.
"""

import importlib.metadata

from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM

from .configuration import PRESETS, VaswaniConfig
from .modeling import (
    VaswaniDecoder,
    VaswaniEncoder,
    VaswaniForConditionalGeneration,
    VaswaniModel,
    VaswaniPreTrainedModel,
    VaswaniTranslationPipeline,
    label_smoothed_cross_entropy,
)


__version__ = importlib.metadata.version("vaswani")

AutoConfig.register("vaswani", VaswaniConfig, exist_ok=True)
AutoModel.register(VaswaniConfig, VaswaniModel, exist_ok=True)
AutoModelForSeq2SeqLM.register(VaswaniConfig, VaswaniForConditionalGeneration, exist_ok=True)

__all__ = [
    "PRESETS",
    "VaswaniConfig",
    "VaswaniDecoder",
    "VaswaniEncoder",
    "VaswaniForConditionalGeneration",
    "VaswaniModel",
    "VaswaniPreTrainedModel",
    "VaswaniTranslationPipeline",
    "label_smoothed_cross_entropy",
]
