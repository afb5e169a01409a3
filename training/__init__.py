"""The training recipe of "Attention Is All You Need" (section 5) as a library: `vaswani.training`.

`vaswani.training.data`: translation pairs tokenized once into Arrow, token-bucket batches (section 5.1).
"""

from .data import (
    PairCollator,
    TokenBucketSampler,
    TokenizedSplit,
    load_translation_dataset,
    pair_loader,
    tokenize_split,
)

__all__ = [
    "PairCollator",
    "TokenBucketSampler",
    "TokenizedSplit",
    "load_translation_dataset",
    "pair_loader",
    "tokenize_split",
]
