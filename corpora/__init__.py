"""Corpora and tokenizers: a translation dataset built from parallel text (`dataset`: cleaning, deduplication,
splits, as `datasets` saves it), the default corpus from Debian's SWORD Bibles (`bible`), and the shared BPE
vocabulary of source and target (`tokenizer`, section 5.1). `vaswani-prepare-data` and `vaswani-train-tokenizer` run
them; the `data` extra brings what they need.
"""

from ..lazy_imports import lazy_names


# Imported on first use, so that importing the room costs nothing until a name is used.
_EXPORTS = {
    "dataset": ["parallel_files_dataset", "prepare_translation_dataset"],
    "bible": ["bible_dataset"],
    "tokenizer": ["load_tokenizer", "train_bpe_tokenizer"],
}
__getattr__, __dir__, __all__ = lazy_names(__name__, _EXPORTS)
