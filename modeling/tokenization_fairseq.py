"""The tokenizer of converted fairseq models (scripts/convert_fairseq.py): fairseq's `--tokenizer moses --bpe
subword_nmt`, run as fairseq runs them, with the options the model was trained with.

transformers' FSMTTokenizer reads the same files (the vocabulary in `</w>` form, the subword-nmt merges) but prepares
text as its ports of fairseq's WMT19 models were prepared: Moses punctuation normalisation (curly quotes become
straight quotes, then `&quot;`), removal of non-printing characters, and always HTML escaping and aggressive hyphen
splitting. fairseq's moses tokenizer (fairseq/data/encoders/moses_tokenizer.py) normalises nothing: it encodes with
`MosesTokenizer(source_lang).tokenize(text, aggressive_dash_splits=not moses_no_dash_splits, return_str=True,
escape=not moses_no_escape)` and decodes with `MosesDetokenizer(target_lang).detokenize(text.split())`, which is
what this class does (`langs` = [source_lang, target_lang]). Like fairseq, it reads `</s>` or `<unk>` in raw text as
text, not as special tokens (`split_special_tokens`).

`import vaswani` registers the class for AutoTokenizer; a saved folder carries this file, so that it also loads with
`trust_remote_code=True` where the package is not installed. It imports nothing beyond transformers (FSMTTokenizer
brings sacremoses).
"""

from transformers import FSMTTokenizer


class FairseqMosesTokenizer(FSMTTokenizer):
    """FSMTTokenizer without the normalisation fairseq does not do, and with fairseq's `--moses-no-escape` and
    `--moses-no-dash-splits` options."""

    def __init__(self, *args, moses_no_escape: bool = False, moses_no_dash_splits: bool = False, **kwargs):
        self.moses_no_escape = moses_no_escape
        self.moses_no_dash_splits = moses_no_dash_splits
        kwargs.setdefault("split_special_tokens", True)
        super().__init__(*args, moses_no_escape=moses_no_escape, moses_no_dash_splits=moses_no_dash_splits, **kwargs)

    def moses_pipeline(self, text, lang):
        return text  # fairseq's moses tokenizer neither normalises punctuation nor removes characters

    def moses_tokenize(self, text, lang):
        if lang not in self.cache_moses_tokenizer:
            self.cache_moses_tokenizer[lang] = self.sm.MosesTokenizer(lang=lang)
        moses = self.cache_moses_tokenizer[lang]
        escape, dash_splits = not self.moses_no_escape, not self.moses_no_dash_splits
        return moses.tokenize(text, aggressive_dash_splits=dash_splits, return_str=True, escape=escape).split()

    def convert_tokens_to_string(self, tokens):
        # fairseq's special symbols are words of their own (an `<unk>` in the output stays one, as fairseq writes it);
        # FSMTTokenizer would glue a token without its end-of-word mark `</w>` to the next one.
        special = set(self.all_special_tokens)
        return super().convert_tokens_to_string([token + "</w>" if token in special else token for token in tokens])


# save_pretrained writes this file and the auto_map beside the vocabulary.
FairseqMosesTokenizer.register_for_auto_class("AutoTokenizer")

__all__ = ["FairseqMosesTokenizer"]
