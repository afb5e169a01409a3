"""Train one byte-pair-encoding vocabulary shared by source and target language.

Section 5.1 of the paper: "Sentences were encoded using byte-pair encoding,
which has a shared source-target vocabulary of about 37000 tokens" (English-
German). Sharing one vocabulary lets the model tie the encoder embeddings, the
decoder embeddings and the output projection (section 3.4). Here the BPE
merges are learned with the `tokenizers` library on both sides of the train
split written by scripts/prepare_data.py, and the result is saved as a
transformers fast tokenizer, so `AutoTokenizer.from_pretrained(OUTPUT_DIR)`
loads it.

Special tokens, fixed ids that the model configuration relies on:
    <pad> = 0   padding
    <s>   = 1   beginning of sequence; the decoder start token
    </s>  = 2   end of sequence
    <unk> = 3   unknown (never produced: every byte has a token of its own)

Every encoded sequence ends in </s> and none starts with <s>: the model
shifts the labels right itself, putting <s> in front. So
`tokenizer(sources, text_target=targets)` gives input_ids and labels that both
end in </s>.

Decoding gives back exactly the text that was encoded, NFC-normalised:
`tokenizer.decode(tokenizer(x).input_ids, skip_special_tokens=True) == x` for
any NFC text x (all prepare_data.py output is NFC), accents, inverted
question marks, runs of spaces and the empty string included.

The sentences stream from the dataset's Arrow files in batches, so a corpus of
any size trains in bounded memory; --max_sentences learns from a random sample
of pairs instead, as is usual for large corpora (the paper's 37,000 tokens for
WMT14 English-German: --vocab_size 37000).

Usage:
  python scripts/train_tokenizer.py --dataset_dir data/bible --vocab_size 8000 --output_dir tokenizer
  python scripts/train_tokenizer.py --dataset_dir data/wmt14 --source_lang en --target_lang de \
      --vocab_size 37000 --max_sentences 2000000 --output_dir tokenizer
"""

import argparse
import statistics
import sys
import tempfile
import time
import unicodedata
from pathlib import Path

import datasets
import numpy as np
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from vaswani.training.data import translation_languages

# Listed in id order: the trainer gives special tokens the first ids.
SPECIAL_TOKENS = ("<pad>", "<s>", "</s>", "<unk>")
PAD_ID, BOS_ID, EOS_ID, UNK_ID = range(len(SPECIAL_TOKENS))


def train_bpe_tokenizer(texts, vocab_size, model_max_length=1024, min_frequency=2, show_progress=False):
    """Learn a byte-level BPE vocabulary of at most `vocab_size` tokens from `texts` (an iterable of strings, or of
    lists of strings, read once).

    Returns a transformers PreTrainedTokenizerFast with the special tokens above.
    A small corpus may run out of merges before reaching `vocab_size`.
    """
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.normalizer = normalizers.NFC()
    # Byte-level pre-tokenization maps every UTF-8 byte to a printable symbol
    # and keeps spaces as part of the following word, so nothing is lost:
    # decoding concatenates the bytes back, which reproduces the input exactly
    # (accents, "¿", "¡", repeated spaces). No prefix space is added, because
    # that would add a space the input did not have. The initial alphabet puts
    # all 256 bytes in the vocabulary, so no text ever needs <unk>.
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=show_progress,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer, length=len(texts) if hasattr(texts, "__len__") else None)
    for expected_id, token in enumerate(SPECIAL_TOKENS):
        assert tokenizer.token_to_id(token) == expected_id, f"{token} got id {tokenizer.token_to_id(token)}"

    # Append </s> to every sequence (and after each of a pair); no <s> in front.
    tokenizer.post_processor = processors.TemplateProcessing(
        single="$A </s>",
        pair="$A </s> $B </s>",
        special_tokens=[("</s>", EOS_ID)],
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        pad_token="<pad>",
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        model_max_length=model_max_length,
        padding_side="right",
        # Decoding must not strip spaces before punctuation ("word ." stays).
        clean_up_tokenization_spaces=False,
    )


def fail(message):
    raise SystemExit(f"train_tokenizer.py: error: {message}")


def load_split(dataset_dir, languages=("en", "es"), split="train"):
    """One split of a prepare_data.py dataset (memory-mapped), checked for its translation column and languages."""
    if not Path(dataset_dir).is_dir():
        fail(f"--dataset_dir {dataset_dir} does not exist; create it with scripts/prepare_data.py.")
    try:
        dataset = datasets.load_from_disk(str(dataset_dir))
    except Exception as error:  # datasets raises FileNotFoundError or its own errors for a foreign folder
        fail(f"--dataset_dir {dataset_dir} is not a dataset saved with save_to_disk ({error}).")
    if not isinstance(dataset, datasets.DatasetDict) or split not in dataset:
        fail(f"--dataset_dir {dataset_dir} has no {split!r} split.")
    try:
        present = translation_languages(dataset[split], f"the {split} split of {dataset_dir}")
    except ValueError as error:
        fail(str(error))
    for language in languages:
        if language not in present:
            fail(f"language {language!r} is not in the translation column (it has {present}); set "
                 "--source_lang/--target_lang.")
    return dataset[split]


class SplitSentences:
    """The sentences of a split, all of the first language and then all of the second, read from Arrow in batches.

    A sentence that is not text (None in a dataset not made by prepare_data.py) or that holds U+FFFD, the mark of
    bytes that were not valid UTF-8, is skipped and counted in `skipped`: the vocabulary should not learn broken text.
    `sentences` counts those read. Iterable again; each pass counts anew.
    """

    def __init__(self, rows, languages, batch_size=10_000):
        self.rows, self.languages, self.batch_size = rows.select_columns(["translation"]), languages, batch_size
        self.sentences = self.skipped = 0

    def __len__(self):
        return len(self.rows) * len(self.languages)

    def __iter__(self):
        self.sentences = self.skipped = 0
        for language in self.languages:
            for batch in self.rows.iter(batch_size=self.batch_size):
                texts = [(pair or {}).get(language) for pair in batch["translation"]]
                good = [text for text in texts if isinstance(text, str) and "\ufffd" not in text]
                self.sentences, self.skipped = self.sentences + len(good), self.skipped + len(texts) - len(good)
                yield good


def sample_pairs(rows, max_pairs, seed=0):
    """At most `max_pairs` rows chosen at random (the same ones for the same seed), in corpus order."""
    if max_pairs is None or max_pairs >= len(rows):
        return rows
    chosen = np.sort(np.random.default_rng(seed).choice(len(rows), size=max_pairs, replace=False))
    return rows.select(chosen)


def check_output_dir(path):
    """Fail before the training if `path` cannot be created or written; the check itself leaves nothing behind."""
    path = Path(path).absolute()
    existing = next(folder for folder in (path, *path.parents) if folder.exists())
    if not existing.is_dir():
        fail(f"cannot write to --output_dir {path}: {existing} is a file.")
    try:
        Path(tempfile.mkdtemp(prefix=".write_test_", dir=existing)).rmdir()
    except OSError as error:
        fail(f"cannot write to --output_dir {path} ({error}).")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset_dir", required=True, help="a DatasetDict saved by scripts/prepare_data.py")
    parser.add_argument("--vocab_size", type=int, default=8000, help="size of the shared vocabulary")
    parser.add_argument("--output_dir", required=True, help="where the tokenizer is saved (save_pretrained)")
    parser.add_argument("--source_lang", default="en")
    parser.add_argument("--target_lang", default="es")
    parser.add_argument("--model_max_length", type=int, default=1024)
    parser.add_argument("--max_sentences", type=int, default=None,
                        help="learn from this many randomly chosen pairs (both sides) instead of the whole split")
    parser.add_argument("--seed", type=int, default=0, help="of the --max_sentences sample")
    args = parser.parse_args(argv)
    if args.max_sentences is not None and args.max_sentences < 1:
        parser.error("--max_sentences must be at least 1")

    start = time.time()
    check_output_dir(args.output_dir)
    languages = (args.source_lang, args.target_lang)
    rows = load_split(args.dataset_dir, languages)
    sample = sample_pairs(rows, args.max_sentences, args.seed)
    print(f"training a shared BPE vocabulary of {args.vocab_size} on the {' + '.join(languages)} sentences of "
          f"{len(sample):,} pairs" + (f" sampled from {len(rows):,}" if len(sample) < len(rows) else "")
          + " of the train split")
    sentences = SplitSentences(sample, languages)
    tokenizer = train_bpe_tokenizer(sentences, args.vocab_size, args.model_max_length, show_progress=True)
    if not sentences.sentences:
        fail(f"the train split of {args.dataset_dir} holds no text to learn a vocabulary from.")
    print(f"trained on {sentences.sentences} sentences ({' + '.join(languages)}, train split; {sentences.skipped} "
          "skipped: not text, or with U+FFFD)")
    tokenizer.save_pretrained(args.output_dir)
    print(f"saved to {args.output_dir} in {time.time() - start:.1f}s; vocabulary size {len(tokenizer)}")

    # Reload the way the training script will, and show what the model sees (on the first 10,000 pairs).
    tokenizer = AutoTokenizer.from_pretrained(args.output_dir)
    head = rows.select(range(min(len(rows), 10_000)))
    for language, texts in zip(languages, SplitSentences(head, languages, batch_size=len(head))):
        if not texts:
            continue
        lengths = [len(ids) for ids in tokenizer(texts).input_ids]
        print(f"{language}: {statistics.mean(lengths):.1f} tokens per sentence on average, "
              f"{max(lengths)} at most (</s> included; first {len(texts):,} sentences)")
        ids = tokenizer(texts[0]).input_ids
        print(f"\n{texts[0]}\n  ids    {ids}\n  pieces {[tokenizer.decode([i]) for i in ids]}\n")
        if tokenizer.decode(ids, skip_special_tokens=True) != unicodedata.normalize("NFC", texts[0]):
            print(f"warning: decoding does not give back {texts[0]!r}", file=sys.stderr)


if __name__ == "__main__":
    main()
