"""Draw what a trained Transformer computes: its positional encoding and its attention weights for one sentence pair.

Writes into --output_dir:
  positional_encoding.png        PE(pos, i) of section 3.5 as a positions x dimensions heat map, with a few of its
                                 sinusoids plotted against the position;
  attention_encoder_self.png     encoder self-attention, a grid of layers x heads (section 3.2.3, first use);
  attention_decoder_self.png     masked decoder self-attention: each position sees only earlier ones;
  attention_encoder_decoder.png  encoder-decoder attention: which source tokens each target position reads.
Rows of a map are the querying positions, columns the attended ones; the decoder rows are labelled with the decoder
input (the target shifted right behind <s>), so row t is the state that predicts target token t. The paper's
figures 3-5 show such maps for layer 5 of 6.

Usage:
  python scripts/visualize.py --model OUT --text "In the beginning, God created the heavens and the earth." \
      --output_dir OUT/figures [--target "En el principio..."]
Without --target, the model's own greedy translation of --text is used.
"""

from dataclasses import dataclass, field

from vaswani.checks import (
    check_model_folder,
    check_safetensors_weights,
    check_tokenizer_folder,
    check_writable_dir,
)
from vaswani.cli import command, parse_arguments


@dataclass
class VisualizeArguments:
    model: str = field(metadata={"help": "folder written by scripts/train.py"})
    text: str = field(metadata={"help": "source sentence"})
    output_dir: str = field(metadata={"help": "where the pictures go"})
    tokenizer: str | None = field(default=None, metadata={"help": "default: the tokenizer saved with the model"})
    target: str | None = field(
        default=None, metadata={"help": "target sentence; default: the model's greedy translation"}
    )
    num_positions: int = field(default=100, metadata={"help": "positions shown in the encoding plot"})


@command(extra="train", needs=("matplotlib", "datasets", "sacrebleu", "sacremoses"))
def main(argv):
    (args,) = parse_arguments([VisualizeArguments], argv, description=__doc__.split("\n\n")[0])
    check_model_folder(args.model, model_types={"vaswani"})
    check_safetensors_weights(args.model)
    if args.tokenizer is not None:
        check_tokenizer_folder(args.tokenizer)
    output_dir = check_writable_dir(args.output_dir)
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    import vaswani  # noqa: F401  (registers model_type "vaswani" with the Auto classes)
    from vaswani.evaluation.bleu import translate
    from vaswani.inspection.figures import attention_grid_figure, positional_encoding_figure, save
    from vaswani.inspection.maps import attention_maps, positional_encoding

    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer or args.model)
    # The fused attention kernels never form the weight matrix; the eager implementation returns it.
    model = AutoModelForSeq2SeqLM.from_pretrained(args.model, attn_implementation="eager", use_safetensors=True)
    model.eval()
    target = args.target if args.target is not None else translate(model, tokenizer, [args.text], num_beams=1)[0]
    print(f"source: {args.text}\ntarget: {target}" + ("" if args.target is not None else "  (greedy translation)"))

    written = []
    path = output_dir / "positional_encoding.png"
    encoding = positional_encoding(model, args.num_positions)
    save(positional_encoding_figure(encoding, model.config.positional_encoding), path)
    written.append(path)

    maps = attention_maps(model, tokenizer, args.text, target)
    for (kind, (attentions, rows, columns)), name in zip(
        maps.kinds().items(), ("encoder_self", "decoder_self", "encoder_decoder")
    ):
        title = kind.capitalize() + (" (rows: decoder input, columns: source)" if name == "encoder_decoder" else "")
        path = output_dir / f"attention_{name}.png"
        save(attention_grid_figure(attentions, rows, columns, title), path, dpi=110)
        written.append(path)
    for path in written:
        print(f"wrote {path}")
    return written


if __name__ == "__main__":
    main()
