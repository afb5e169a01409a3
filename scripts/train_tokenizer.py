"""Train one byte-pair-encoding vocabulary shared by source and target language (section 5.1 of the paper).

The merges are learned on both sides of the train split written by scripts/prepare_data.py (vaswani.corpora.tokenizer:
<pad> = 0, <s> = 1, </s> = 2, <unk> = 3, every sequence ending in </s>), and saved as a transformers fast tokenizer,
so that `AutoTokenizer.from_pretrained(OUTPUT_DIR)` loads it. --max_sentences learns from a random sample of pairs
instead of the whole split, as is usual for large corpora (the paper's 37,000 tokens for WMT14 English-German:
--vocab_size 37000).

Usage:
  python scripts/train_tokenizer.py --dataset_dir data/bible --vocab_size 8000 --output_dir tokenizer
  python scripts/train_tokenizer.py --dataset_dir data/wmt14 --source_lang en --target_lang de \\
      --vocab_size 37000 --max_sentences 2000000 --output_dir tokenizer      (or: vaswani-train-tokenizer ...)
"""

import statistics
import sys
import time
import unicodedata
from dataclasses import dataclass, field

from vaswani.checks import UsageError, check_dataset_exists, check_writable_dir
from vaswani.cli import command, parse_arguments
from vaswani.progress import watched


@dataclass
class TrainTokenizerArguments:
    dataset_dir: str = field(metadata={"help": "a DatasetDict saved by scripts/prepare_data.py"})
    output_dir: str = field(metadata={"help": "where the tokenizer is saved (save_pretrained)"})
    vocab_size: int = field(default=8000, metadata={"help": "size of the shared vocabulary"})
    source_lang: str = "en"
    target_lang: str = "es"
    model_max_length: int = 1024
    max_sentences: int | None = field(
        default=None,
        metadata={"help": "learn from this many randomly chosen pairs (both sides) instead of the whole split"},
    )
    seed: int = field(default=0, metadata={"help": "of the --max_sentences sample"})

    def __post_init__(self):
        if self.max_sentences is not None and self.max_sentences < 1:
            raise UsageError("--max_sentences must be at least 1")


@command(extra="data", needs=("datasets",))
def main(argv):
    (args,) = parse_arguments([TrainTokenizerArguments], argv, description=__doc__.split("\n\n")[0])
    check_dataset_exists(args.dataset_dir)
    from vaswani.corpora.tokenizer import SplitSentences, load_tokenizer, sample_pairs, train_bpe_tokenizer
    from vaswani.training.data import load_translation_dataset

    start = time.time()
    languages = (args.source_lang, args.target_lang)
    # The input first, so that a mistake in it leaves no empty output folder behind; both before the training.
    rows = load_translation_dataset(args.dataset_dir, *languages, splits=("train",))["train"]
    check_writable_dir(args.output_dir)
    sample = sample_pairs(rows, args.max_sentences, args.seed)
    print(
        f"training a shared BPE vocabulary of {args.vocab_size} on the {' + '.join(languages)} sentences of "
        f"{len(sample):,} pairs"
        + (f" sampled from {len(rows):,}" if len(sample) < len(rows) else "")
        + " of the train split"
    )
    sentences = SplitSentences(sample, languages)
    # tokenizers' own bar: in a log it would leave blank lines
    tokenizer = train_bpe_tokenizer(sentences, args.vocab_size, args.model_max_length, show_progress=watched())
    if not sentences.sentences:
        raise UsageError(f"the train split of {args.dataset_dir} holds no text to learn a vocabulary from.")
    print(
        f"trained on {sentences.sentences} sentences ({' + '.join(languages)}, train split; {sentences.skipped} "
        "skipped: not text, or with U+FFFD)"
    )
    tokenizer.save_pretrained(args.output_dir)
    print(f"saved to {args.output_dir} in {time.time() - start:.1f}s; vocabulary size {len(tokenizer)}")

    # Reload the way the training script will, and show what the model sees (on the first 10,000 pairs).
    tokenizer = load_tokenizer(args.output_dir)
    head = rows.select(range(min(len(rows), 10_000)))
    for language, texts in zip(languages, SplitSentences(head, languages, batch_size=len(head))):
        if not texts:
            continue
        lengths = [len(ids) for ids in tokenizer(texts).input_ids]
        print(
            f"{language}: {statistics.mean(lengths):.1f} tokens per sentence on average, "
            f"{max(lengths)} at most (</s> included; first {len(texts):,} sentences)"
        )
        ids = tokenizer(texts[0]).input_ids
        print(f"\n{texts[0]}\n  ids    {ids}\n  pieces {[tokenizer.decode([i]) for i in ids]}\n")
        if tokenizer.decode(ids, skip_special_tokens=True) != unicodedata.normalize("NFC", texts[0]):
            print(f"warning: decoding does not give back {texts[0]!r}", file=sys.stderr)


if __name__ == "__main__":
    main()
