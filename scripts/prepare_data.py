"""Build the parallel corpus the Transformer is trained on, cleaned and split into train / validation / test.

The default corpus is an English-Spanish Bible aligned verse by verse and split by chapter (vaswani.corpora.bible),
fetched from Debian's sword-text-web and sword-text-sparv packages. Other sources get the same cleaning, filters and
output layout (vaswani.corpora.dataset), split by source sentence:
  --files SRC TGT     two plain-text files, one sentence per line, line N of one translating line N of the other.
  --dataset NAME      any Hugging Face dataset with a `translation` column: a Hub name such as wmt/wmt14 (with
                      --dataset_config de-en), a local folder of Parquet or JSON files (in the Hub's layout too: the
                      configuration is its subfolder, de-en/), or a saved DatasetDict.
The result is a DatasetDict saved with save_to_disk(--output_dir), each row {"id", "translation": {lang: text}}.

Usage:
  python scripts/prepare_data.py --output_dir data/bible                 (or: vaswani-prepare-data ...)
  python scripts/prepare_data.py --output_dir data/mine --files train.en train.es
  python scripts/prepare_data.py --output_dir data/wmt14 --dataset wmt/wmt14 --dataset_config de-en --target_lang de
"""

import os
from dataclasses import dataclass, field
from pathlib import Path

from vaswani.checks import UsageError, check_dataset_exists
from vaswani.cli import command, parse_arguments


@dataclass
class PrepareDataArguments:
    output_dir: str = field(metadata={"help": "where the DatasetDict is saved (save_to_disk)"})
    source_lang: str = "en"
    target_lang: str = "es"
    dataset: str | None = field(
        default=None,
        metadata={
            "help": "a Hugging Face translation dataset (Hub name, or local folder of Parquet or JSON files, in the Hub's "
            "layout too) instead of the Bible"
        },
    )
    files: list[str] | None = field(
        default=None,
        metadata={"help": "two line-aligned plain-text files instead of the Bible", "metavar": ("SRC", "TGT")},
    )
    dataset_config: str | None = field(default=None, metadata={"help": "configuration name for --dataset, e.g. de-en"})
    cache_dir: str | None = field(
        default=None,
        metadata={"help": "where the Debian packages are downloaded and unpacked; None: OUTPUT_DIR/sword_cache"},
    )
    max_chars: int = field(default=1000, metadata={"help": "drop pairs with a longer side (characters)"})
    max_ratio: float = field(
        default=2.0, metadata={"help": "drop pairs with (longer + 10) / (shorter + 10) above this (characters)"}
    )
    seed: int = field(default=0, metadata={"help": "salt of the split hash"})
    valid_fraction: float = 0.035
    test_fraction: float = 0.04
    num_proc: int = field(
        default=os.cpu_count() or 1, metadata={"help": "processes that clean --dataset / --files corpora"}
    )

    def __post_init__(self):
        if self.source_lang == self.target_lang:
            raise UsageError("--source_lang and --target_lang must differ")
        if self.dataset is not None and self.files is not None:
            raise UsageError("argument --files: not allowed with argument --dataset")
        if self.files is not None and len(self.files) != 2:
            raise UsageError(f"argument --files: expected 2 files, SRC and TGT, not {len(self.files)}")


def build(args, scratch):
    """The corpus the arguments name -> (DatasetDict, dropped counts, units per split, what the units are)."""
    from vaswani.corpora.bible import bible_dataset
    from vaswani.corpora.dataset import distinct_sources, parallel_files_dataset, prepare_translation_dataset
    from vaswani.training.data import load_translation_dataset

    filters = {"max_chars": args.max_chars, "max_ratio": args.max_ratio}
    split_by = {"seed": args.seed, "valid_fraction": args.valid_fraction, "test_fraction": args.test_fraction}
    if args.files is None and args.dataset is None:
        cache_dir = args.cache_dir or Path(args.output_dir) / "sword_cache"
        dataset, dropped, chapters = bible_dataset(
            cache_dir, args.source_lang, args.target_lang, **split_by, **filters
        )
        return dataset, dropped, chapters, "chapters"
    if args.files is not None:
        source = parallel_files_dataset(*args.files, args.source_lang, args.target_lang, cache_dir=scratch)
    else:
        source = load_translation_dataset(
            args.dataset, args.source_lang, args.target_lang, ("train",), args.dataset_config, flag="--dataset"
        )
    dataset, dropped = prepare_translation_dataset(
        source,
        args.source_lang,
        args.target_lang,
        **split_by,
        **filters,
        num_proc=args.num_proc,
        name=args.dataset or "--files",
    )
    sources = {split: distinct_sources(rows, args.source_lang) for split, rows in dataset.items()}
    return dataset, dropped, sources, "distinct sources"


@command(extra="data", needs=("datasets",))
def main(argv):
    (args,) = parse_arguments([PrepareDataArguments], argv, description=__doc__.split("\n\n")[0])
    if args.dataset is not None:
        check_dataset_exists(args.dataset, "--dataset")
    from vaswani.corpora.dataset import check_splits_not_empty, scratch_dir, summary

    with scratch_dir(args.output_dir) as scratch:
        dataset, dropped, groups, group_label = build(args, scratch)
        print(summary(dataset, dropped, groups, group_label))
        check_splits_not_empty(dataset)
        example = dataset["train"][0]
        print(f"first training pair, {example['id']}:")
        for lang in (args.source_lang, args.target_lang):
            print(f"  {lang}: {example['translation'][lang]}")
        dataset.save_to_disk(args.output_dir)
    print(f"saved to {args.output_dir}")


if __name__ == "__main__":
    main()
