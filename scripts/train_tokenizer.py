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

Usage:
  python scripts/train_tokenizer.py --dataset_dir data/bible --vocab_size 8000 --output_dir tokenizer
"""

import argparse
import statistics
import sys
import tempfile
import time
import unicodedata
from pathlib import Path

import datasets
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

# Listed in id order: the trainer gives special tokens the first ids.
SPECIAL_TOKENS = ("<pad>", "<s>", "</s>", "<unk>")
PAD_ID, BOS_ID, EOS_ID, UNK_ID = range(len(SPECIAL_TOKENS))


def train_bpe_tokenizer(texts, vocab_size, model_max_length=1024, min_frequency=2, show_progress=False):
    """Learn a byte-level BPE vocabulary of at most `vocab_size` tokens from `texts`.

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
    texts = list(texts)
    tokenizer.train_from_iterator(texts, trainer=trainer, length=len(texts))
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


def sentences_by_language(dataset_dir, languages=("en", "es"), split="train"):
    """{language: its sentences} of one split of a prepare_data.py dataset, and how many were skipped.

    A sentence that is not text (None in a dataset not made by prepare_data.py) or that holds U+FFFD, the mark of
    bytes that were not valid UTF-8, is skipped and counted: the vocabulary should not learn broken text.
    """
    if not Path(dataset_dir).is_dir():
        fail(f"--dataset_dir {dataset_dir} does not exist; create it with scripts/prepare_data.py.")
    try:
        dataset = datasets.load_from_disk(str(dataset_dir))
    except Exception as error:  # datasets raises FileNotFoundError or its own errors for a foreign folder
        fail(f"--dataset_dir {dataset_dir} is not a dataset saved with save_to_disk ({error}).")
    if not isinstance(dataset, datasets.DatasetDict) or split not in dataset:
        fail(f"--dataset_dir {dataset_dir} has no {split!r} split.")
    rows = dataset[split]
    if "translation" not in rows.column_names:
        fail(f"the {split} split of {dataset_dir} has no 'translation' column (columns: {rows.column_names}).")
    translations = [pair or {} for pair in rows["translation"]]
    present = sorted(translations[0]) if translations else []
    for language in languages:
        if language not in present:
            fail(f"language {language!r} is not in the translation column (it has {present}); set "
                 "--source_lang/--target_lang.")
    sentences, skipped = {}, 0
    for language in languages:
        texts = [pair.get(language) for pair in translations]
        sentences[language] = [text for text in texts if isinstance(text, str) and "\ufffd" not in text]
        skipped += len(texts) - len(sentences[language])
    if not any(sentences.values()):
        fail(f"the {split} split of {dataset_dir} holds no text to learn a vocabulary from.")
    return sentences, skipped


def corpus_texts(dataset_dir, source_lang="en", target_lang="es", split="train"):
    """All source and target sentences of one split of a prepare_data.py dataset (broken ones skipped)."""
    sentences, _ = sentences_by_language(dataset_dir, (source_lang, target_lang), split)
    return sentences[source_lang] + sentences[target_lang]


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
    args = parser.parse_args(argv)

    start = time.time()
    check_output_dir(args.output_dir)
    sentences, skipped = sentences_by_language(args.dataset_dir, (args.source_lang, args.target_lang))
    texts = sentences[args.source_lang] + sentences[args.target_lang]
    print(f"training a shared BPE vocabulary of {args.vocab_size} on {len(texts)} sentences "
          f"({args.source_lang} + {args.target_lang}, train split; {skipped} skipped: not text, or with U+FFFD)")
    tokenizer = train_bpe_tokenizer(texts, args.vocab_size, args.model_max_length, show_progress=True)
    tokenizer.save_pretrained(args.output_dir)
    print(f"saved to {args.output_dir} in {time.time() - start:.1f}s; vocabulary size {len(tokenizer)}")

    # Reload the way the training script will, and show what the model sees.
    tokenizer = AutoTokenizer.from_pretrained(args.output_dir)
    for name, texts in sentences.items():
        if not texts:
            continue
        lengths = [len(ids) for ids in tokenizer(texts).input_ids]
        print(f"{name}: {statistics.mean(lengths):.1f} tokens per sentence on average, "
              f"{max(lengths)} at most (</s> included)")
        ids = tokenizer(texts[0]).input_ids
        print(f"\n{texts[0]}\n  ids    {ids}\n  pieces {[tokenizer.decode([i]) for i in ids]}\n")
        if tokenizer.decode(ids, skip_special_tokens=True) != unicodedata.normalize("NFC", texts[0]):
            print(f"warning: decoding does not give back {texts[0]!r}", file=sys.stderr)


if __name__ == "__main__":
    main()
