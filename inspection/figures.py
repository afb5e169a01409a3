"""Pictures of what a model computes (matplotlib, drawn without a display): the positional encoding, and a grid of
every layer's and head's attention weights."""

import torch


def pyplot():
    """matplotlib's pyplot, drawing into files and images (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def positional_encoding_figure(encoding: torch.Tensor, kind: str = "sinusoidal"):
    """The encoding as a positions x dimensions heat map, beside a few of its dimensions plotted against the position.
    `kind`: the config's positional_encoding, "sinusoidal" (section 3.5) or "learned" (Table 3, row (E))."""
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
    return fig


def attention_grid_figure(attentions, row_labels: list[str], column_labels: list[str], title: str):
    """One heat map per layer (rows of the grid) and head (columns); `attentions` holds one (heads, queries, keys)
    tensor per layer."""
    layers, heads = len(attentions), attentions[0].shape[0]
    cell = max(2.2, 0.28 * max(len(row_labels), len(column_labels)))
    plt = pyplot()
    fig, axes = plt.subplots(layers, heads, figsize=(cell * heads + 1, cell * layers + 1), squeeze=False)
    for layer, weights in enumerate(attentions):
        for head in range(heads):
            axis = axes[layer][head]
            axis.imshow(weights[head].float().numpy(), cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto")
            axis.set_xticks(range(len(column_labels)), column_labels, rotation=90, fontsize=7)
            axis.set_yticks(range(len(row_labels)), row_labels, fontsize=7)
            axis.set_title(f"layer {layer + 1}, head {head + 1}", fontsize=9)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def save(fig, path, dpi: int = 120):
    """Write `fig` to `path` (PNG) and free it."""
    fig.savefig(path, dpi=dpi)
    pyplot().close(fig)
