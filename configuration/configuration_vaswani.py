"""Configuration of the Transformer of "Attention Is All You Need" (Vaswani et al., 2017).

The field names are the ones the `transformers` seq2seq models share (BART, Marian), so that tools written for
them (Trainer, pipelines, generation) find what they look for. The defaults are the paper's base model
(Table 3, row "base"); `VaswaniConfig.from_preset` gives the other rows and two small sizes for CPUs.
"""

import hashlib
import importlib.metadata
from pathlib import Path
from typing import Literal

from huggingface_hub.dataclasses import strict
from transformers import PreTrainedConfig
from transformers.activations import ACT2FN


# Table 3 of the paper, rows "base" and "big", plus two sizes that train on a CPU. "big" uses the
# dropout of the English-German big model (0.3); the English-French big model used 0.1 (section 6.1).
PRESETS = {
    "tiny": {
        "d_model": 64,
        "encoder_layers": 2,
        "decoder_layers": 2,
        "encoder_ffn_dim": 256,
        "decoder_ffn_dim": 256,
        "encoder_attention_heads": 4,
        "decoder_attention_heads": 4,
        "dropout": 0.1,
    },
    "small": {
        "d_model": 256,
        "encoder_layers": 3,
        "decoder_layers": 3,
        "encoder_ffn_dim": 1024,
        "decoder_ffn_dim": 1024,
        "encoder_attention_heads": 4,
        "decoder_attention_heads": 4,
        "dropout": 0.1,
    },
    "base": {
        "d_model": 512,
        "encoder_layers": 6,
        "decoder_layers": 6,
        "encoder_ffn_dim": 2048,
        "decoder_ffn_dim": 2048,
        "encoder_attention_heads": 8,
        "decoder_attention_heads": 8,
        "dropout": 0.1,
    },
    "big": {
        "d_model": 1024,
        "encoder_layers": 6,
        "decoder_layers": 6,
        "encoder_ffn_dim": 4096,
        "decoder_ffn_dim": 4096,
        "encoder_attention_heads": 16,
        "decoder_attention_heads": 16,
        "dropout": 0.3,
    },
}

# The paper does not state how its weights were initialised. The schemes of the implementations it is reproduced with;
# the default, "fairseq", learned fastest per step on average and fast from every seed, in both settings of
# docs/benchmarks/learning_curves (docs/quality.md); "bart" learned faster from the seeds whose draw reads the source
# early and stalled from others, 0.15 to 0.49 nats behind on average at 1,500 steps.
INIT_SCHEMES = {
    # tensor2tensor, the paper's own code: Glorot-uniform projections ("uniform_unit_scaling"), embeddings
    # N(0, d_model^-0.5), so that the sqrt(d_model)-scaled embeddings enter the stacks with unit variance.
    "tensor2tensor": "Glorot-uniform projections, embeddings N(0, d_model^-0.5)",
    # fairseq's transformer_wmt_en_de: the same, except the query, key and value projections (Glorot-uniform with
    # gain 1/sqrt(2)) and the padding token's embedding (zero).
    "fairseq": "as tensor2tensor, query/key/value with gain 1/sqrt(2), padding embedding 0",
    # transformers' BART and Marian (init_std 0.02): every projection and embedding N(0, 0.02), padding embedding 0.
    "bart": "projections and embeddings N(0, 0.02), padding embedding 0",
}

# A saved folder or Hub repo holds the code beside the weights, flat, as `trust_remote_code=True` expects.
AUTO_MAP = {
    "AutoConfig": "configuration_vaswani.VaswaniConfig",
    "AutoModel": "modeling_vaswani.VaswaniModel",
    "AutoModelForSeq2SeqLM": "modeling_vaswani.VaswaniForConditionalGeneration",
}
# transformers 5 has no built-in translation pipeline and refuses the task name unless the model's config declares
# it: the folder brings its own (modeling/pipeline_vaswani.py), which `pipeline("translation", model=folder)` runs
# with trust_remote_code=True, or the installed package's with `pipeline_class=VaswaniTranslationPipeline`.
CUSTOM_PIPELINES = {
    "translation": {
        "impl": "pipeline_vaswani.VaswaniTranslationPipeline",
        "pt": ["AutoModelForSeq2SeqLM"],
        "default": {},
        "type": "text",
    }
}
# This module runs as the installed package's, or as a saved folder's copy (remote code).
INSTALLED = bool(__package__) and __package__.startswith("vaswani.")


@strict
class VaswaniConfig(PreTrainedConfig):
    r"""Hyperparameters of the encoder-decoder Transformer (section 3, Table 3).

    Args:
        vocab_size: size of the one vocabulary shared by source and target (section 5.1).
        d_model: width of every sublayer output and of the embeddings.
        encoder_layers, decoder_layers: N, the number of identical layers in each stack (section 3.1).
        encoder_attention_heads, decoder_attention_heads: h, the number of attention heads (section 3.2.2).
        d_k, d_v: the size of each head's queries and keys (d_k) and of its values (d_v), section 3.2.2. None, the
            default, is d_model / h, as in every model of the paper but Table 3's row (B), which shrinks d_k alone.
        encoder_ffn_dim, decoder_ffn_dim: d_ff, the inner width of the feed-forward networks (section 3.3).
        dropout: P_drop, applied to every sublayer output and to the embedding sums (section 5.4).
        attention_dropout: dropout on the attention weights; 0 in the paper.
        activation_dropout: dropout after the feed-forward activation; 0 in the paper.
        activation_function: the feed-forward nonlinearity; "relu" in the paper (section 3.3).
        max_position_embeddings: the longest sequence accepted. The sinusoids are computed, not learned, so this can
            be raised after training without new weights; learned positions have one vector per position up to it.
        positional_encoding: "sinusoidal" (section 3.5) or "learned", the absolute positional embeddings the paper
            compares them with (Table 3, row (E)), one table per stack, saved with the model and never extended.
        tie_word_embeddings: one matrix for the encoder input, the decoder input and the pre-softmax
            projection (section 3.4).
        init_scheme: how a new model's weights are drawn; the paper does not say (`INIT_SCHEMES`). The default,
            "fairseq" (Glorot-uniform, query/key/value at gain 1/sqrt(2), embeddings N(0, d_model^-0.5)), learned
            fastest per step of the three measured.
        sinusoid_layout, position_offset, attention_bias, share_encoder_decoder_embeddings: exist for imported
            checkpoints (scripts/convert_fairseq.py), whose models differ from the paper's equations in these details
            only; the defaults are the paper's. `sinusoid_layout`: "interleaved" (section 3.5: sines in the even
            dimensions, cosines in the odd) or "concatenated" (tensor2tensor and fairseq: sines in the first half,
            cosines in the second, frequencies log-spaced over d_model / 2 - 1). `position_offset`: the position of
            the first token (fairseq counts from its padding id + 1). `attention_bias`: biases in the query, key, value
            and output projections; under the default init_scheme they learn no faster (validation NLL at 1,500
            steps level or up to 0.04 nats behind, every seed measured; up to 0.07 under "tensor2tensor"; under
            "bart" 0.84 nats ahead to 0.14 behind, by the step each draw starts to read its source, and 0.06 and 0.55
            ahead when added at zero to the same draw: docs/quality.md, "Attention biases"). `share_encoder_decoder_embeddings`: one embedding matrix for both stacks
            (fairseq's share_all_embeddings); `tie_word_embeddings` ties the output projection to the decoder's.
        pad_token_id, bos_token_id, eos_token_id, decoder_start_token_id: special ids of the tokenizer;
            the decoder input is the target shifted right behind `decoder_start_token_id`.

    Examples:

    ```python
    >>> from vaswani import VaswaniConfig
    >>> config = VaswaniConfig.from_preset("base", vocab_size=37000)
    >>> config.d_model, config.encoder_layers, config.encoder_attention_heads
    (512, 6, 8)
    ```
    """

    model_type = "vaswani"
    keys_to_ignore_at_inference = ["past_key_values"]
    attribute_map = {
        "hidden_size": "d_model",
        "num_attention_heads": "encoder_attention_heads",
        "num_hidden_layers": "encoder_layers",
    }

    vocab_size: int = 37000
    d_model: int = 512
    encoder_layers: int = 6
    decoder_layers: int = 6
    encoder_attention_heads: int = 8
    decoder_attention_heads: int = 8
    encoder_ffn_dim: int = 2048
    decoder_ffn_dim: int = 2048
    dropout: float | int = 0.1
    attention_dropout: float | int = 0.0
    activation_dropout: float | int = 0.0
    # The string options are Literals: @strict refuses any other value, on construction and on assignment, naming the
    # field and the values it takes.
    activation_function: Literal[tuple(ACT2FN)] = "relu"
    d_k: int | None = None
    d_v: int | None = None
    max_position_embeddings: int = 1024
    positional_encoding: Literal["sinusoidal", "learned"] = "sinusoidal"
    init_scheme: Literal[tuple(INIT_SCHEMES)] = "fairseq"
    sinusoid_layout: Literal["interleaved", "concatenated"] = "interleaved"
    position_offset: int = 0
    attention_bias: bool = False
    share_encoder_decoder_embeddings: bool = True
    pad_token_id: int | None = 0
    bos_token_id: int | None = 1
    eos_token_id: int | list[int] | None = 2
    decoder_start_token_id: int | None = 1
    tie_word_embeddings: bool = True
    use_cache: bool = True
    is_encoder_decoder: bool = True

    def __post_init__(self, **kwargs):
        self._check_values()
        super().__post_init__(**kwargs)

    def _check_values(self):
        """Refuse values no model can be built from, naming the field."""
        for head_size_field in ("d_k", "d_v"):
            head_size = getattr(self, head_size_field)
            if head_size is not None and head_size <= 0:
                raise ValueError(f"{head_size_field} must be positive or None (d_model / heads), got {head_size}.")
        for heads_field in ("encoder_attention_heads", "decoder_attention_heads"):
            heads = getattr(self, heads_field)
            if heads <= 0:
                raise ValueError(f"{heads_field} must be positive, got {heads}.")
            if (self.d_k is None or self.d_v is None) and self.d_model % heads != 0:
                raise ValueError(
                    f"d_model ({self.d_model}) must be divisible by {heads_field} ({heads}), or d_k and d_v set."
                )
        for size_field in (
            "vocab_size",
            "d_model",
            "encoder_layers",
            "decoder_layers",
            "encoder_ffn_dim",
            "decoder_ffn_dim",
            "max_position_embeddings",
        ):
            if getattr(self, size_field) <= 0:
                raise ValueError(f"{size_field} must be positive, got {getattr(self, size_field)}.")
        for rate_field in ("dropout", "attention_dropout", "activation_dropout"):
            rate = getattr(self, rate_field)
            if not 0.0 <= rate < 1.0:
                raise ValueError(f"{rate_field} must be in [0, 1), got {rate}.")
        if self.position_offset < 0:
            raise ValueError(f"position_offset must be 0 or more, got {self.position_offset}.")
        if self.position_offset and self.positional_encoding == "learned":
            raise ValueError(
                f"position_offset ({self.position_offset}) shifts the sinusoids of imported checkpoints; learned "
                "positional embeddings count positions from 0."
            )
        for id_field in ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id"):
            ids = getattr(self, id_field)
            for token_id in ids if isinstance(ids, list) else [ids]:
                if token_id is not None and not 0 <= token_id < self.vocab_size:
                    raise ValueError(
                        f"{id_field} ({token_id}) does not fit in the vocabulary: vocab_size is {self.vocab_size}."
                    )

    @classmethod
    def from_preset(cls, name: str, **overrides) -> "VaswaniConfig":
        """A configuration for one of the sizes in `PRESETS`, with any field overridden."""
        if name not in PRESETS:
            raise ValueError(f"Unknown preset {name!r}; choose one of {sorted(PRESETS)}.")
        return cls(**{**PRESETS[name], **overrides})

    def save_pretrained(self, save_directory, **kwargs):
        """Save `config.json` together with the model's code, so the folder loads with `trust_remote_code=True`.

        This runs inside the model's `save_pretrained` and `push_to_hub`, so the code travels with every saved model.
        The config records which code that is: the package version and the SHA-256 of the code files.
        transformers' `register_for_auto_class` copies a class's file and the files it imports from its own folder;
        the model's code imports this file from another folder (`remote_code_files`), so the copy is written here.
        """
        code = remote_code_files()
        self.auto_map = dict(AUTO_MAP)
        self.custom_pipelines = dict(CUSTOM_PIPELINES)
        self.code_sha256 = hashlib.sha256("".join(code[name] for name in sorted(code)).encode()).hexdigest()
        if INSTALLED:  # the installed package, not a downloaded copy
            self.vaswani_version = importlib.metadata.version("vaswani")
        super().save_pretrained(save_directory, **kwargs)
        for name, text in code.items():
            (Path(save_directory) / name).write_text(text, encoding="utf-8")


# The installed package keeps configuration and modeling in two subpackages, while the library's remote-code
# loader only follows imports between files of one folder; so the one import between them becomes a sibling import.
PACKAGE_CONFIG_IMPORT = "from ..configuration.configuration_vaswani import"
FLAT_CONFIG_IMPORT = "from .configuration_vaswani import"


def remote_code_files() -> dict[str, str]:
    """The code of a saved folder, flat, ready to load remotely: {file name: text}."""
    here = Path(__file__).resolve().parent
    # In a saved or downloaded folder the files already sit together; in the package they sit in modeling/.
    modeling_dir = here if (here / "modeling_vaswani.py").exists() else here.parent / "modeling"
    modeling_file = modeling_dir / "modeling_vaswani.py"
    modeling_code = modeling_file.read_text(encoding="utf-8")
    if modeling_code.count(PACKAGE_CONFIG_IMPORT) + modeling_code.count(FLAT_CONFIG_IMPORT) != 1:
        raise RuntimeError(f"{modeling_file} must import VaswaniConfig exactly once, with {PACKAGE_CONFIG_IMPORT!r}.")
    return {
        "configuration_vaswani.py": Path(__file__).read_text(encoding="utf-8"),
        "modeling_vaswani.py": modeling_code.replace(PACKAGE_CONFIG_IMPORT, FLAT_CONFIG_IMPORT),
        "generation_vaswani.py": (modeling_dir / "generation_vaswani.py").read_text(encoding="utf-8"),
        "decoding_kernels.py": (modeling_dir / "decoding_kernels.py").read_text(encoding="utf-8"),
        "pipeline_vaswani.py": (modeling_dir / "pipeline_vaswani.py").read_text(encoding="utf-8"),
    }


__all__ = ["PRESETS", "VaswaniConfig", "remote_code_files"]
