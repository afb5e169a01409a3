"""Convert a fairseq Transformer translation checkpoint into a vaswani model folder.

    python scripts/convert_fairseq.py --checkpoint model.pt --data_dir DIR --output_dir OUT [--source_lang en --target_lang de]
    (or: vaswani-convert-fairseq ...)

fairseq's `transformer`, `transformer_wmt_en_de`, `transformer_vaswani_wmt_en_de_big` and the models of "Scaling
Neural Machine Translation" (Ott et al., 2018) are the paper's model: post-LayerNorm, sinusoidal positions, ReLU.
They differ from this package's default only in details the config can name: the sinusoid table's layout and first
position, biases in the attention projections, the embedding ties, decoding that starts with `</s>` and fairseq's
dictionary order. DIR holds `dict.SRC.txt`, `dict.TGT.txt` (one joined dictionary, as these models use) and the BPE
codes (`bpecodes`, or --bpe_codes): the folder gets vaswani's FairseqMosesTokenizer (modeling/tokenization_fairseq.py,
which loads with AutoTokenizer): fairseq's `--tokenizer moses --bpe subword_nmt` as fairseq runs them, Moses
tokenization without normalisation, `@@` BPE and Moses detokenization (sacremoses), with the Moses options the
checkpoint records (`--moses-no-escape`, `--moses-no-dash-splits`, the languages; fairseq's defaults where it
records no tokenizer), so that raw text gets the tokens fairseq-interactive gives it.
Features fairseq has and the paper's model has not (pre-norm, learned positions, layer drop, other activations,
embedding layer norm, adaptive softmax, ...) are refused by name, not converted approximately.

The checkpoint is read with `torch.load(weights_only=True)`, allowing only argparse.Namespace beyond tensors: a
checkpoint that needs other Python objects to load is refused rather than run.
"""

import argparse
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from vaswani.checks import UsageError, check_writable_dir
from vaswani.cli import command, parse_arguments


if TYPE_CHECKING:  # imported where they are used, after the arguments parse
    import torch

    from vaswani import VaswaniConfig


@dataclass
class ConversionArguments:
    checkpoint: str = field(metadata={"help": "fairseq checkpoint (model.pt, checkpoint_best.pt, ...)"})
    data_dir: str = field(metadata={"help": "folder with dict.SRC.txt and dict.TGT.txt (and bpecodes)"})
    output_dir: str = field(metadata={"help": "the vaswani model folder to write"})
    source_lang: str | None = field(default=None, metadata={"help": "default: the checkpoint's task.source_lang"})
    target_lang: str | None = field(default=None, metadata={"help": "default: the checkpoint's task.target_lang"})
    bpe_codes: str | None = field(default=None, metadata={"help": "subword-nmt codes; default: DATA_DIR/bpecodes"})


# fairseq's Dictionary: four symbols first, then the dictionary file's, then "madeupword" fillers up to a multiple of 8.
FAIRSEQ_SPECIALS = ["<s>", "<pad>", "</s>", "<unk>"]
# fairseq options whose non-default value makes a model that is not the paper's, with the value the paper has.
UNSUPPORTED = {
    "encoder_normalize_before": False,
    "decoder_normalize_before": False,
    "encoder_learned_pos": False,
    "decoder_learned_pos": False,
    "layernorm_embedding": False,
    "no_scale_embedding": False,
    "no_token_positional_embeddings": False,
    "adaptive_softmax_cutoff": None,
    "adaptive_input": False,
    "cross_self_attention": False,
    "encoder_layerdrop": 0.0,
    "decoder_layerdrop": 0.0,
    "encoder_layers_to_keep": None,
    "decoder_layers_to_keep": None,
    "activation_fn": "relu",
    "no_cross_attention": False,
    "tie_adaptive_weights": False,
    "quant_noise_pq": 0.0,
}


def read_checkpoint(path: str) -> tuple[dict, dict, dict | None, dict]:
    """(model options, task options, tokenizer options or None, state dict) of a fairseq checkpoint, old (`args`) or
    new (`cfg`) style."""
    import torch

    with torch.serialization.safe_globals([argparse.Namespace]):
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as error:  # torch names the Python object it refused to load
            raise UsageError(
                f"{path} cannot be read as a fairseq checkpoint of tensors and options: {error}"
            ) from None
    if "model" not in state:
        raise UsageError(f"{path} has no 'model' entry: not a fairseq checkpoint.")
    if state.get("cfg") is not None:
        model_options, task_options = state["cfg"]["model"], state["cfg"]["task"]
        tokenizer_options = state["cfg"].get("tokenizer")  # {"_name": "moses", ...}, or None
        tokenizer_options = None if tokenizer_options is None else options_dict(tokenizer_options)
    elif state.get("args") is not None:
        model_options = task_options = state["args"]
        # Old style: `--tokenizer moses` and its options sit among all the others.
        tokenizer_options = options_dict(state["args"])
        tokenizer_options["_name"] = tokenizer_options.get("tokenizer")
    else:
        raise UsageError(f"{path} records neither 'cfg' nor 'args': its architecture is unknown.")
    return options_dict(model_options), options_dict(task_options), tokenizer_options, state["model"]


def options_dict(options) -> dict:
    """fairseq's options, an argparse.Namespace in old checkpoints (and in `cfg` of legacy architectures), as a dict."""
    return dict(vars(options)) if isinstance(options, argparse.Namespace) else dict(options)


def read_dictionary(path: Path) -> list[str]:
    """The symbols of a fairseq dict.*.txt file, in id order after the four special ones."""
    symbols = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        fields = line.rstrip().rsplit(" ", 2 if line.rstrip().endswith("#fairseq:overwrite") else 1)
        if len(fields) < 2 or not fields[1].lstrip("-").isdigit():
            raise UsageError(f"{path}:{number} is not 'SYMBOL COUNT': {line!r}")
        symbols.append(fields[0])
    return symbols


def check_supported(options: dict) -> None:
    """Refuse, by name, every option whose value makes a model other than the paper's."""

    def is_the_papers(value, paper):  # fairseq leaves unset options as None or ""
        return value in (None, "") or (value == paper if paper else not value)

    found = [
        f"{name}={options[name]!r}"
        for name, paper in UNSUPPORTED.items()
        if name in options and not is_the_papers(options[name], paper)
    ]
    if options.get("encoder_embed_dim") != options.get("decoder_embed_dim"):
        found.append(f"encoder_embed_dim={options.get('encoder_embed_dim')} != decoder_embed_dim")
    for name in ("decoder_output_dim", "decoder_input_dim"):
        if options.get(name) not in (None, options.get("decoder_embed_dim")):
            found.append(f"{name}={options[name]}")
    if found:
        raise UsageError(
            "This fairseq model is not the paper's Transformer, which is all vaswani converts: "
            + ", ".join(found)
            + ". (Supported: post-norm, sinusoidal positions, ReLU, no layer drop.)"
        )


def vaswani_config(options: dict, vocab_size: int) -> "VaswaniConfig":
    from vaswani import VaswaniConfig

    check_supported(options)
    return VaswaniConfig(
        vocab_size=vocab_size,
        d_model=options["encoder_embed_dim"],
        encoder_layers=options["encoder_layers"],
        decoder_layers=options["decoder_layers"],
        encoder_attention_heads=options["encoder_attention_heads"],
        decoder_attention_heads=options["decoder_attention_heads"],
        encoder_ffn_dim=options["encoder_ffn_embed_dim"],
        decoder_ffn_dim=options["decoder_ffn_embed_dim"],
        dropout=options.get("dropout", 0.1),
        attention_dropout=options.get("attention_dropout", 0.0),
        activation_dropout=options.get("activation_dropout", options.get("relu_dropout", 0.0)),
        # fairseq's tables hold max_positions rows after the padding id's.
        max_position_embeddings=max(
            options.get("max_source_positions", 1024), options.get("max_target_positions", 1024)
        ),
        sinusoid_layout="concatenated",
        position_offset=FAIRSEQ_SPECIALS.index("<pad>") + 1,
        attention_bias=True,
        share_encoder_decoder_embeddings=bool(options.get("share_all_embeddings")),
        tie_word_embeddings=bool(
            options.get("share_all_embeddings") or options.get("share_decoder_input_output_embed")
        ),
        init_scheme="fairseq",
        bos_token_id=FAIRSEQ_SPECIALS.index("<s>"),
        pad_token_id=FAIRSEQ_SPECIALS.index("<pad>"),
        eos_token_id=FAIRSEQ_SPECIALS.index("</s>"),
        decoder_start_token_id=FAIRSEQ_SPECIALS.index("</s>"),  # fairseq decodes from </s>
    )


def vaswani_state_dict(fairseq_state: dict, config: "VaswaniConfig") -> "dict[str, torch.Tensor]":
    """fairseq's tensor names to vaswani's; every fairseq tensor must be used, every vaswani tensor filled."""
    renamed = {}
    for name, tensor in fairseq_state.items():
        if name.endswith(("embed_positions._float_tensor", ".version")):
            continue  # buffers, not weights: the sinusoids are computed
        target = name.replace(".fc1.", ".feed_forward.fc1.").replace(".fc2.", ".feed_forward.fc2.")
        if name == "decoder.embed_tokens.weight":
            target = "shared.weight"
        elif name in ("decoder.output_projection.weight", "decoder.embed_out"):
            target = "lm_head.weight"
        renamed[target if target == "lm_head.weight" else f"model.{target}"] = tensor
    if config.share_encoder_decoder_embeddings:
        renamed.pop("model.encoder.embed_tokens.weight", None)
    if config.tie_word_embeddings:
        renamed.pop("lm_head.weight", None)
    return renamed


def moses_options(tokenizer_options: dict | None, source_lang: str, target_lang: str) -> dict:
    """FairseqMosesTokenizer's options: those of fairseq's moses tokenizer (fairseq/data/encoders/moses_tokenizer.py)
    as the checkpoint records them; where it records no tokenizer (a model trained on pre-tokenized text), fairseq's
    defaults for `fairseq-interactive --tokenizer moses`, with the model's languages."""
    options = tokenizer_options or {}
    name = options.get("_name")
    if name not in (None, "moses"):
        raise UsageError(
            f"The checkpoint was trained with fairseq's --tokenizer {name}; vaswani's converted tokenizer is Moses "
            "(--tokenizer moses, or none recorded)."
        )
    if name is None:
        options = {}
    return {
        "langs": [options.get("source_lang") or source_lang, options.get("target_lang") or target_lang],
        "moses_no_escape": bool(options.get("moses_no_escape")),
        "moses_no_dash_splits": bool(options.get("moses_no_dash_splits")),
    }


def fsmt_vocabulary(symbols: list[str]) -> dict[str, int]:
    """fairseq's `@@` convention ("wor@@ ld") in FSMTTokenizer's end-of-word one ("wor", "ld</w>"); the special
    symbols keep their names (FairseqMosesTokenizer decodes them as words), the "madeupword" fillers are words."""
    vocabulary = {}
    for index, symbol in enumerate(symbols):
        special = index < len(FAIRSEQ_SPECIALS)
        token = symbol if special else symbol[:-2] if symbol.endswith("@@") else symbol + "</w>"
        vocabulary.setdefault(token, index)
    return vocabulary


def write_tokenizer(output_dir: Path, symbols: list[str], bpe_codes: Path, moses: dict):
    vocabulary_file = output_dir / "fairseq_vocab.json"
    vocabulary_file.write_text(json.dumps(fsmt_vocabulary(symbols), ensure_ascii=False), encoding="utf-8")
    # subword-nmt writes a "#version" line first; FSMTTokenizer reads every line as a merge. A merge listed twice
    # keeps its first rank, as subword-nmt's (FSMTTokenizer would keep the last).
    lines = [line for line in bpe_codes.read_text(encoding="utf-8").splitlines() if not line.startswith("#version")]
    merges = dict.fromkeys(" ".join(line.split()[:2]) for line in lines)
    merges_file = output_dir / "fairseq_merges.txt"
    merges_file.write_text("".join(merge + "\n" for merge in merges), encoding="utf-8")
    from vaswani import FairseqMosesTokenizer

    tokenizer = FairseqMosesTokenizer(
        src_vocab_file=str(vocabulary_file),
        tgt_vocab_file=str(vocabulary_file),
        merges_file=str(merges_file),
        eos_token="</s>",  # FSMTTokenizer calls it the separator only; generate() and the pipeline look for eos
        **moses,
    )
    tokenizer.save_pretrained(output_dir)
    vocabulary_file.unlink()
    merges_file.unlink()
    return tokenizer


@command(extra="fairseq", needs=("sacremoses",))
def main(argv):
    (args,) = parse_arguments([ConversionArguments], argv, description=__doc__.split("\n\n")[0])
    output_dir = check_writable_dir(args.output_dir)
    model_options, task_options, tokenizer_options, fairseq_state = read_checkpoint(args.checkpoint)
    source_lang = args.source_lang or task_options.get("source_lang")
    target_lang = args.target_lang or task_options.get("target_lang")
    if not source_lang or not target_lang:
        raise UsageError("The checkpoint does not name its languages: pass --source_lang and --target_lang.")
    moses = moses_options(tokenizer_options, source_lang, target_lang)
    data_dir = Path(args.data_dir)
    dictionaries = [data_dir / f"dict.{lang}.txt" for lang in (source_lang, target_lang)]
    for dictionary in dictionaries:
        if not dictionary.is_file():
            raise UsageError(f"{dictionary} does not exist: --data_dir must hold the model's dictionaries.")
    source_symbols, target_symbols = map(read_dictionary, dictionaries)
    if source_symbols != target_symbols:
        raise UsageError(
            f"{dictionaries[0].name} and {dictionaries[1].name} differ: vaswani has one vocabulary for both "
            "languages, so only models with a joined dictionary convert."
        )
    rows = fairseq_state["decoder.embed_tokens.weight"].shape[0]
    symbols = FAIRSEQ_SPECIALS + source_symbols
    if rows < len(symbols):
        raise UsageError(f"The dictionaries hold {len(symbols)} symbols but the embeddings only {rows} rows.")
    symbols += [f"madeupword{i:04d}" for i in range(rows - len(symbols))]  # fairseq's padding to a multiple of 8
    bpe_codes = Path(args.bpe_codes) if args.bpe_codes else data_dir / "bpecodes"
    if not bpe_codes.is_file():
        raise UsageError(f"{bpe_codes} does not exist: pass the model's BPE codes with --bpe_codes.")

    config = vaswani_config(model_options, rows)
    from vaswani import VaswaniForConditionalGeneration

    model = VaswaniForConditionalGeneration(config)
    result = model.load_state_dict(vaswani_state_dict(fairseq_state, config), strict=False)
    tied = set(model.all_tied_weights_keys)
    missing, unexpected = set(result.missing_keys) - tied, result.unexpected_keys
    if missing or unexpected:
        raise UsageError(
            f"The checkpoint's tensors do not map onto the model: missing {sorted(missing)}, unexpected "
            f"{sorted(unexpected)}."
        )
    model.tie_weights()
    model.save_pretrained(output_dir)
    write_tokenizer(output_dir, symbols, bpe_codes, moses)
    print(f"Converted {args.checkpoint} ({source_lang}-{target_lang}, {rows} symbols) into {output_dir}")
    return output_dir


if __name__ == "__main__":
    main()
