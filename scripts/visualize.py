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


def pyplot():
    """matplotlib's pyplot, drawing into files (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def positional_encoding(model, num_positions):
    """The (num_positions, d_model) matrix the model adds to its embeddings, computed by the model itself."""
    import torch

    positions = model.get_encoder().embed_positions  # learned ones (Table 3, row (E)) stop at their table's end
    with torch.no_grad():
        return positions(torch.arange(min(num_positions, positions.max_positions)), torch.float32)


def plot_positional_encoding(encoding, path, kind="sinusoidal"):
    """`kind`: the config's positional_encoding, "sinusoidal" (section 3.5) or "learned" (Table 3, row (E))."""
    num_positions, d_model = encoding.shape
    plt = pyplot()
    fig, (heat, curves) = plt.subplots(1, 2, figsize=(14, 5), gridspec_kw={"width_ratios": [3, 2]})
    scale = 1.0 if kind == "sinusoidal" else encoding.abs().max().item()
    image = heat.imshow(encoding.numpy(), aspect="auto", cmap="RdBu", vmin=-scale, vmax=scale, interpolation="nearest")
    heat.set(
        xlabel="dimension i", ylabel="position", title=f"{kind.capitalize()} positional encoding (d_model = {d_model})"
    )
    fig.colorbar(image, ax=heat)
    for dimension in sorted({2, 4, d_model // 8, d_model // 4, d_model // 2} - {0}):  # even: sines, slower and slower
        if dimension < d_model and dimension % 2 == 0:
            curves.plot(encoding[:, dimension].numpy(), label=f"dim {dimension}")
    title = "Wavelengths from 2*pi to 10000*2*pi (section 3.5)" if kind == "sinusoidal" else "Learned, Table 3 row (E)"
    curves.set(xlabel="position", ylabel="PE(pos, i)", title=title)
    curves.legend(fontsize=8)
    curves.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_attention_grid(attentions, row_labels, column_labels, title, path):
    """One heat map per layer (rows of the grid) and head (columns); `attentions` is a tuple of (1, heads, q, k)."""
    layers, heads = len(attentions), attentions[0].shape[1]
    cell = max(2.2, 0.28 * max(len(row_labels), len(column_labels)))
    plt = pyplot()
    fig, axes = plt.subplots(layers, heads, figsize=(cell * heads + 1, cell * layers + 1), squeeze=False)
    for layer, weights in enumerate(attentions):
        for head in range(heads):
            axis = axes[layer][head]
            axis.imshow(weights[0, head].float().numpy(), cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto")
            axis.set_xticks(range(len(column_labels)), column_labels, rotation=90, fontsize=7)
            axis.set_yticks(range(len(row_labels)), row_labels, fontsize=7)
            axis.set_title(f"layer {layer + 1}, head {head + 1}", fontsize=9)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def attention_maps(model, tokenizer, text, target):
    """Attention weights of every layer and head for one (source, target) pair, and the token labels of both."""
    import torch

    encoded = tokenizer([text], text_target=[target], return_tensors="pt")
    with torch.no_grad():
        output = model(
            input_ids=encoded["input_ids"],
            attention_mask=encoded["attention_mask"],
            labels=encoded["labels"],
            output_attentions=True,
        )
    source_tokens = tokenizer.convert_ids_to_tokens(encoded["input_ids"][0].tolist())
    decoder_input = model.prepare_decoder_input_ids_from_labels(encoded["labels"])[0].tolist()
    decoder_tokens = tokenizer.convert_ids_to_tokens(decoder_input)
    return output, source_tokens, decoder_tokens


def readable(tokens):
    """Byte-level BPE marks a leading space with "Ġ"; show it as "_" so the labels stay legible."""
    return [token.replace("Ġ", "_").replace("▁", "_") for token in tokens]


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

    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer or args.model)
    # The fused attention kernels never form the weight matrix; the eager implementation returns it.
    model = AutoModelForSeq2SeqLM.from_pretrained(args.model, attn_implementation="eager", use_safetensors=True)
    model.eval()
    target = args.target if args.target is not None else translate(model, tokenizer, [args.text], num_beams=1)[0]
    print(f"source: {args.text}\ntarget: {target}" + ("" if args.target is not None else "  (greedy translation)"))

    written = []
    path = output_dir / "positional_encoding.png"
    plot_positional_encoding(positional_encoding(model, args.num_positions), path, model.config.positional_encoding)
    written.append(path)

    output, source_tokens, decoder_tokens = attention_maps(model, tokenizer, args.text, target)
    source_tokens, decoder_tokens = readable(source_tokens), readable(decoder_tokens)
    for name, attentions, rows, columns, title in (
        ("encoder_self", output.encoder_attentions, source_tokens, source_tokens, "Encoder self-attention"),
        ("decoder_self", output.decoder_attentions, decoder_tokens, decoder_tokens, "Decoder masked self-attention"),
        (
            "encoder_decoder",
            output.cross_attentions,
            decoder_tokens,
            source_tokens,
            "Encoder-decoder attention (rows: decoder input, columns: source)",
        ),
    ):
        path = output_dir / f"attention_{name}.png"
        plot_attention_grid(attentions, rows, columns, title, path)
        written.append(path)
    for path in written:
        print(f"wrote {path}")
    return written


if __name__ == "__main__":
    main()
