"""Table 3 of the paper, "Variations on the Transformer architecture", row by row.

Each row is the base model (the first row) with the few settings the paper changes for it, and the figures the paper
reports for it: perplexity per wordpiece and BLEU on the English-German development set (newstest2013, beam search
without checkpoint averaging) and the parameter count. `Table3Row.config` builds the row's `VaswaniConfig`, at the
paper's sizes or scaled down (`width_divisor`, `layer_divisor`) for a reproduction in miniature
(benchmarks/table3.py); `docs/training.md` gives the `vaswani-train` line of each.
"""

from dataclasses import dataclass, field

from .configuration_vaswani import PRESETS, VaswaniConfig


# The fields of Table 3's columns that are widths (divided by `width_divisor`) and layer counts (by `layer_divisor`).
WIDTHS = ("d_model", "encoder_ffn_dim", "decoder_ffn_dim", "d_k", "d_v")
DEPTHS = ("encoder_layers", "decoder_layers")


def heads(h: int) -> dict:
    return {"encoder_attention_heads": h, "decoder_attention_heads": h}


def layers(n: int) -> dict:
    return {"encoder_layers": n, "decoder_layers": n}


def ffn(d_ff: int) -> dict:
    return {"encoder_ffn_dim": d_ff, "decoder_ffn_dim": d_ff}


@dataclass(frozen=True)
class Table3Row:
    """One row of Table 3: what it changes in the base model, and the paper's figures for it.

    `changes` are config fields at the paper's sizes; `label_smoothing` is the recipe's epsilon_ls (section 5.4), the
    one column that is not the model's. `params` is the paper's count in millions, None where the paper leaves the cell
    empty (the base model's 65); `train_steps` its training steps (100K, the big model 300K).
    """

    name: str
    changes: dict = field(default_factory=dict)
    label_smoothing: float = 0.1
    perplexity: float = 0.0
    bleu: float = 0.0
    params: int | None = None
    train_steps: int = 100_000

    @property
    def family(self) -> str:
        """ "base", "(A)" to "(E)", or "big"."""
        return self.name.split(" ")[0]

    def config(self, width_divisor: int = 1, layer_divisor: int = 1, **fields) -> VaswaniConfig:
        """The row's config: the base preset with the row's changes, every width and layer count divided by the
        divisors (to build the table in miniature), and `fields` (vocabulary and special ids) on top."""
        settings = {**PRESETS["base"], **self.changes}
        for name in WIDTHS + DEPTHS:
            divisor = width_divisor if name in WIDTHS else layer_divisor
            if settings.get(name) is not None:
                if settings[name] % divisor:
                    raise ValueError(
                        f"Table 3 row {self.name}: {name}={settings[name]} is not divisible by {divisor}."
                    )
                settings[name] //= divisor
        return VaswaniConfig(**{**settings, **fields})


# Table 3 as printed; a blank cell is the base model's value. Rows (A) change h with d_k = d_v = d_model / h (the
# config's default); row (C)'s d_model rows keep h = 8, so d_k = d_v = d_model / 8, as printed.
TABLE3 = [
    Table3Row("base", perplexity=4.92, bleu=25.8, params=65),
    Table3Row("(A) h=1", heads(1), perplexity=5.29, bleu=24.9),
    Table3Row("(A) h=4", heads(4), perplexity=5.00, bleu=25.5),
    Table3Row("(A) h=16", heads(16), perplexity=4.91, bleu=25.8),
    Table3Row("(A) h=32", heads(32), perplexity=5.01, bleu=25.4),
    Table3Row("(B) d_k=16", {"d_k": 16, "d_v": 64}, perplexity=5.16, bleu=25.1, params=58),
    Table3Row("(B) d_k=32", {"d_k": 32, "d_v": 64}, perplexity=5.01, bleu=25.4, params=60),
    Table3Row("(C) N=2", layers(2), perplexity=6.11, bleu=23.7, params=36),
    Table3Row("(C) N=4", layers(4), perplexity=5.19, bleu=25.3, params=50),
    Table3Row("(C) N=8", layers(8), perplexity=4.88, bleu=25.5, params=80),
    Table3Row("(C) d_model=256", {"d_model": 256}, perplexity=5.75, bleu=24.5, params=28),
    Table3Row("(C) d_model=1024", {"d_model": 1024}, perplexity=4.66, bleu=26.0, params=168),
    Table3Row("(C) d_ff=1024", ffn(1024), perplexity=5.12, bleu=25.4, params=53),
    Table3Row("(C) d_ff=4096", ffn(4096), perplexity=4.75, bleu=26.2, params=90),
    Table3Row("(D) P_drop=0.0", {"dropout": 0.0}, perplexity=5.77, bleu=24.6),
    Table3Row("(D) P_drop=0.2", {"dropout": 0.2}, perplexity=4.95, bleu=25.5),
    Table3Row("(D) eps_ls=0.0", label_smoothing=0.0, perplexity=4.67, bleu=25.3),
    Table3Row("(D) eps_ls=0.2", label_smoothing=0.2, perplexity=5.47, bleu=25.7),
    # tensor2tensor's base model learns positions up to its max_length, 256.
    Table3Row(
        "(E) positional embedding",
        {"positional_encoding": "learned", "max_position_embeddings": 256},
        perplexity=4.92,
        bleu=25.7,
    ),
    Table3Row("big", PRESETS["big"], perplexity=4.33, bleu=26.4, params=213, train_steps=300_000),
]

__all__ = ["TABLE3", "Table3Row"]
