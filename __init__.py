"""vaswani: the Transformer of "Attention Is All You Need" (Vaswani et al., 2017) as a Hugging Face model.

Importing this package registers the model with transformers through its public registration calls: `model_type=
"vaswani"` with `AutoConfig`, its models with `AutoModel` and `AutoModelForSeq2SeqLM`, the tokenizer of converted
fairseq models with `AutoTokenizer`, and the translation pipeline with the pipeline registry (which is how a
pipeline's own `save_pretrained` and `push_to_hub` declare it in the config they save). Registering needs the classes,
and transformers' config class imports torch, so `import vaswani` costs what importing transformers and torch costs.
"""

import importlib.metadata

from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM, AutoTokenizer
from transformers.pipelines import PIPELINE_REGISTRY

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

AutoConfig.register(VaswaniConfig.model_type, VaswaniConfig)
AutoModel.register(VaswaniConfig, VaswaniModel)
AutoModelForSeq2SeqLM.register(VaswaniConfig, VaswaniForConditionalGeneration)
# The one tokenizer class of the package: found by the name a converted folder's tokenizer_config.json gives.
AutoTokenizer.register(VaswaniConfig, tokenizer_class=FairseqMosesTokenizer)
# transformers 5 refuses the task name "translation" in `pipeline()` unless the model's config declares the task
# (`custom_pipelines`, which every saved vaswani folder does): the registry entry serves the pipeline's own saving, and
# `pipeline("translation", model=folder, pipeline_class=VaswaniTranslationPipeline)` (docs/sharing.md).
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
