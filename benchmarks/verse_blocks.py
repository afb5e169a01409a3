"""The learning-curve study's second setting: the whole Bible in shuffled blocks of verses, and a byte-level BPE that
adds a prefix space.

    python -m benchmarks.verse_blocks [--output_dir outputs/verse_blocks] [--block 30] [--vocab_size 8000]

Every verse pair the corpus's cleaning keeps, in blocks of --block consecutive verses, shuffled (--seed); the last
--test_fraction is the test split, the --valid_fraction before it the validation split. Writes OUTPUT_DIR/data and
OUTPUT_DIR/tokenizer for `benchmarks.learning_curves --dataset_dir ... --tokenizer ...` (docs/benchmarks/README.md).
"""

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from vaswani.checks import UsageError
from vaswani.cli import command, parse_arguments


@dataclass
class VerseBlocksArguments:
    output_dir: str = field(default="outputs/verse_blocks", metadata={"help": "where data/ and tokenizer/ go"})
    cache_dir: str = field(
        default="outputs/main_job/data/sword_cache",
        metadata={"help": "the SWORD modules' cache of scripts/prepare_data.py (fetched there when missing)"},
    )
    block: int = field(default=30, metadata={"help": "consecutive verses per block"})
    seed: int = field(default=0, metadata={"help": "of the blocks' shuffle"})
    valid_fraction: float = 0.02
    test_fraction: float = 0.02
    vocab_size: int = 8000

    def __post_init__(self):
        if self.block < 1:
            raise UsageError(f"--block must be at least 1, not {self.block}")
        if not (0 < self.valid_fraction and 0 < self.test_fraction and self.valid_fraction + self.test_fraction < 1):
            raise UsageError("--valid_fraction and --test_fraction must be above 0 and leave pairs to train on")


def block_split(examples: list, block: int, seed: int, valid_fraction: float, test_fraction: float) -> dict:
    """`examples` in order, cut into blocks of `block` consecutive ones, the blocks shuffled: the last
    `test_fraction` of them by count of examples are "test", the `valid_fraction` before them "validation", the rest
    "train". Each split keeps the shuffled order."""
    blocks = [examples[start : start + block] for start in range(0, len(examples), block)]
    shuffled = [example for i in np.random.default_rng(seed).permutation(len(blocks)) for example in blocks[i]]
    n_test, n_valid = round(test_fraction * len(examples)), round(valid_fraction * len(examples))
    first_test, first_valid = len(examples) - n_test, len(examples) - n_test - n_valid
    return {
        "train": shuffled[:first_valid],
        "validation": shuffled[first_valid:first_test],
        "test": shuffled[first_test:],
    }


@command(extra="data", needs=("datasets",))
def main(argv=None):
    (args,) = parse_arguments([VerseBlocksArguments], argv, description=__doc__.split("\n\n")[0])
    from vaswani.corpora.bible import bible_pairs
    from vaswani.corpora.dataset import to_dataset_dict
    from vaswani.corpora.tokenizer import SplitSentences, train_bpe_tokenizer

    examples, dropped = bible_pairs(args.cache_dir)
    splits = block_split(examples, args.block, args.seed, args.valid_fraction, args.test_fraction)
    dataset = to_dataset_dict(splits, "en", "es")
    output = Path(args.output_dir)
    dataset.save_to_disk(output / "data")
    tokenizer = train_bpe_tokenizer(
        SplitSentences(dataset["train"], ("en", "es")), args.vocab_size, add_prefix_space=True
    )
    tokenizer.save_pretrained(output / "tokenizer")
    print(
        f"{len(examples):,} verse pairs ({sum(dropped.values()):,} dropped by the cleaning) in blocks of {args.block}: "
        + ", ".join(f"{name} {len(rows):,}" for name, rows in splits.items())
        + f"; a BPE of {len(tokenizer):,} tokens with a prefix space; written to {output}/data and {output}/tokenizer"
    )


if __name__ == "__main__":
    main()
