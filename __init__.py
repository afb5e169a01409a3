"""vaswani: the Transformer of "Attention Is All You Need" (Vaswani et al., 2017) as a Hugging Face model.

Importing this package registers `model_type="vaswani"` with `AutoConfig`, `AutoModel` and `AutoModelForSeq2SeqLM`,
its translation pipeline for the task "translation", and the tokenizer of converted fairseq models with `AutoTokenizer`.
"""

import importlib.metadata

from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM
from transformers.models.auto.tokenization_auto import REGISTERED_TOKENIZER_CLASSES
from transformers.pipelines import PIPELINE_REGISTRY, REMOVED_TASKS

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
from .modeling.tokenization_fairseq import FairseqMosesTokenizer


__version__ = importlib.metadata.version("vaswani")

AutoConfig.register("vaswani", VaswaniConfig, exist_ok=True)
AutoModel.register(VaswaniConfig, VaswaniModel, exist_ok=True)
AutoModelForSeq2SeqLM.register(VaswaniConfig, VaswaniForConditionalGeneration, exist_ok=True)
# The tokenizer of converted fairseq models, found by the name its tokenizer_config.json gives. Registered by name
# only: AutoTokenizer.register would also make it the default tokenizer of every vaswani folder that names none.
REGISTERED_TOKENIZER_CLASSES[FairseqMosesTokenizer.__name__] = FairseqMosesTokenizer
# transformers 5 removed its "translation" task and refuses the name before it looks at registered tasks; this
# package brings a translation pipeline, so `pipeline("translation", model=...)` is given back to it.
REMOVED_TASKS.pop("translation", None)
PIPELINE_REGISTRY.register_pipeline(
    "translation", pipeline_class=VaswaniTranslationPipeline, pt_model=AutoModelForSeq2SeqLM, type="text"
)

__all__ = [
    "PRESETS",
    "FairseqMosesTokenizer",
    "VaswaniConfig",
    "VaswaniDecoder",
    "VaswaniEncoder",
    "VaswaniForConditionalGeneration",
    "VaswaniModel",
    "VaswaniPreTrainedModel",
    "VaswaniTranslationPipeline",
    "label_smoothed_cross_entropy",
]
