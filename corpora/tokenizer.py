"""One byte-pair-encoding vocabulary shared by source and target language, and the checked loading of a tokenizer.

Section 5.1 of the paper: "Sentences were encoded using byte-pair encoding, which has a shared source-target
vocabulary of about 37000 tokens" (English-German). Sharing one vocabulary lets the model tie the encoder embeddings,
the decoder embeddings and the output projection (section 3.4). The BPE merges are learned with the `tokenizers`
library on both sides of a train split, and the result is a transformers fast tokenizer, so that
`AutoTokenizer.from_pretrained(folder)` loads what `save_pretrained(folder)` wrote.

Special tokens, fixed ids that the model configuration relies on:
    <pad> = 0   padding
    <s>   = 1   beginning of sequence; the decoder start token
    </s>  = 2   end of sequence
    <unk> = 3   unknown (never produced: every byte has a token of its own)

Every encoded sequence ends in </s> and none starts with <s>: the model shifts the labels right itself, putting <s>
in front. So `tokenizer(sources, text_target=targets)` gives input_ids and labels that both end in </s>.

Decoding gives back exactly the text that was encoded, NFC-normalised:
`tokenizer.decode(tokenizer(x).input_ids, skip_special_tokens=True) == x` for any NFC text x (all of
`vaswani.corpora.dataset`'s output is NFC), accents, inverted question marks, runs of spaces and the empty string
included.

The sentences stream from the dataset's Arrow files in batches (`SplitSentences`), so a corpus of any size trains in
bounded memory; `sample_pairs` picks a random sample of pairs instead, as is usual for large corpora.
"""

from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from ..checks import UsageError


# Listed in id order: the trainer gives special tokens the first ids.
SPECIAL_TOKENS = ("<pad>", "<s>", "</s>", "<unk>")
PAD_ID, BOS_ID, EOS_ID, UNK_ID = range(len(SPECIAL_TOKENS))


def train_bpe_tokenizer(texts, vocab_size, model_max_length=1024, min_frequency=2, show_progress=False):
    """Learn a byte-level BPE vocabulary of at most `vocab_size` tokens from `texts` (an iterable of strings, or of
    lists of strings, read once).

    Returns a transformers PreTrainedTokenizerFast with the special tokens above. A small corpus may run out of merges
    before reaching `vocab_size`.
    """
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.normalizer = normalizers.NFC()
    # Byte-level pre-tokenization maps every UTF-8 byte to a printable symbol and keeps spaces as part of the
    # following word, so nothing is lost: decoding concatenates the bytes back, which reproduces the input exactly
    # (accents, "¿", "¡", repeated spaces). No prefix space is added by default, because that would add a space the
    # input did not have. The initial alphabet puts all 256 bytes in the vocabulary, so no text ever needs <unk>.
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


class SplitSentences:
    """The sentences of a split, all of the first language and then all of the second, read from Arrow in batches.

    A sentence that is not text (None in a dataset not made by vaswani.corpora.dataset) or that holds U+FFFD, the mark
    of bytes that were not valid UTF-8, is skipped and counted in `skipped`: the vocabulary should not learn broken
    text. `sentences` counts those read. Iterable again; each pass counts anew.
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


def load_tokenizer(path):
    """The shared source-target tokenizer saved in folder `path`, checked: it loads, defines <pad>, <s> and </s>, and
    ends every sequence with </s>."""
    if not Path(path).exists():
        raise UsageError(
            f"--tokenizer {path} does not exist; create it with scripts/train_tokenizer.py --output_dir {path}."
        )
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except Exception as error:  # transformers raises OSError, ValueError or a tokenizers error for a foreign folder
        raise UsageError(f"cannot load a tokenizer from --tokenizer {path} ({error}).") from error
    for name in ("pad_token_id", "bos_token_id", "eos_token_id"):
        if getattr(tokenizer, name) is None:
            raise UsageError(
                f"the tokenizer in {path} has no {name.replace('_id', '')}; the model needs <pad>, <s> (the decoder "
                "start) and </s>."
            )
    sample = tokenizer(["a"], text_target=["a"])
    if sample["labels"][0][-1] != tokenizer.eos_token_id or sample["input_ids"][0][-1] != tokenizer.eos_token_id:
        raise UsageError(
            f"the tokenizer in {path} does not end sequences with </s> (id {tokenizer.eos_token_id}); without it the "
            "model never learns to stop. Give it a post-processor that appends </s>."
        )
    return tokenizer
