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
import time

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


def corpus_texts(dataset_dir, source_lang="en", target_lang="es", split="train"):
    """All source and target sentences of one split of a prepare_data.py dataset."""
    rows = datasets.load_from_disk(dataset_dir)[split]
    translations = rows["translation"]
    return [pair[source_lang] for pair in translations] + [pair[target_lang] for pair in translations]


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
    texts = corpus_texts(args.dataset_dir, args.source_lang, args.target_lang)
    print(f"training a shared BPE vocabulary of {args.vocab_size} on {len(texts)} sentences "
          f"({args.source_lang} + {args.target_lang}, train split)")
    tokenizer = train_bpe_tokenizer(texts, args.vocab_size, args.model_max_length, show_progress=True)
    tokenizer.save_pretrained(args.output_dir)
    print(f"saved to {args.output_dir} in {time.time() - start:.1f}s; vocabulary size {len(tokenizer)}")

    # Reload the way the training script will, and show what the model sees.
    tokenizer = AutoTokenizer.from_pretrained(args.output_dir)
    half = len(texts) // 2
    for name, sentences in ((args.source_lang, texts[:half]), (args.target_lang, texts[half:])):
        lengths = [len(ids) for ids in tokenizer(sentences).input_ids]
        print(f"{name}: {statistics.mean(lengths):.1f} tokens per sentence on average, "
              f"{max(lengths)} at most (</s> included)")
    for sentence in (texts[0], texts[half]):
        ids = tokenizer(sentence).input_ids
        print(f"\n{sentence}\n  ids    {ids}\n  pieces {[tokenizer.decode([i]) for i in ids]}")
        assert tokenizer.decode(ids, skip_special_tokens=True) == sentence


if __name__ == "__main__":
    main()
