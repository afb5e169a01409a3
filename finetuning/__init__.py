"""Fine-tuning with transformers' `Seq2SeqTrainer` (`trainer`): translation's defaults, this package's BLEU metric
and decoding. `vaswani-finetune` runs it.
"""

from ..lazy_imports import lazy_names


# Imported on first use, so that importing the room costs nothing until a name is used.
_EXPORTS = {
    "trainer": ["FinetuningArguments", "KeepGenerationConfig", "bleu_metrics"],
}
__getattr__, __dir__, __all__ = lazy_names(__name__, _EXPORTS)
