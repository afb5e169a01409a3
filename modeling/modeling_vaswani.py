"""The Transformer of "Attention Is All You Need" (Vaswani et al., 2017) as a `transformers` model.

Read top to bottom, the classes follow the paper: positional encoding (3.5), embeddings (3.4), scaled dot-product and
multi-head attention (3.2), the position-wise feed-forward network (3.3), "Add & Norm" residual connections (3.1, 5.4),
the encoder and decoder stacks (3.1), the label-smoothed loss (5.4), and the two models users load.
"""

import copy
import functools
import math
from collections.abc import Callable

import torch
from torch import distributed, nn
from transformers import GenerationConfig, GenerationMixin, LogitsProcessorList, PreTrainedModel
from transformers import initialization as init
from transformers.activations import ACT2FN
from transformers.cache_utils import Cache, DynamicCache, EncoderDecoderCache
from transformers.generation import GenerationMode
from transformers.integrations import is_deepspeed_zero3_enabled, is_fsdp_managed_module
from transformers.masking_utils import create_bidirectional_mask, create_causal_mask
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import (
    BaseModelOutput,
    BaseModelOutputWithPastAndCrossAttentions,
    Seq2SeqLMOutput,
    Seq2SeqModelOutput,
)
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.processing_utils import Unpack
from transformers.utils import TransformersKwargs, can_return_tuple, is_torchdynamo_compiling, logging
from transformers.utils.deprecation import deprecate_kwarg
from transformers.utils.generic import merge_with_config_defaults
from transformers.utils.output_capturing import OutputRecorder, capture_outputs

from ..configuration.configuration_vaswani import VaswaniConfig
from .generation_vaswani import (
    DecoderPrompt,
    generation_mode,
    gnmt_beam_search,
    greedy_search,
    holds_library_defaults,
    on_host,
    packed_linear_layers,
    section_6_1_limit,
)


logger = logging.get_logger(__name__)

# The source tokens of a generate() call (rows times positions, padding included) from which its encoder computes its
# linear layers from packed weights: packing costs a fixed time per weight, which a batch of the main job's model
# (3 layers of 256) repaid from about 750 tokens (1,056: 34 ms against 45; 35 tokens: 6.1 ms against 3.0).
PACKED_ENCODER_TOKENS = 1024


def shift_tokens_right(labels: torch.Tensor, pad_token_id: int, decoder_start_token_id: int) -> torch.Tensor:
    """The decoder input: the target shifted one position right behind the start token (section 3, "auto-regressive")."""
    shifted = labels.new_full(labels.shape, decoder_start_token_id)
    shifted[:, 1:] = labels[:, :-1]
    return shifted.masked_fill(shifted == -100, pad_token_id)


def check_attention_mask(attention_mask: torch.Tensor | None, expected_shape: tuple[int, int], name: str) -> None:
    """A 2D padding mask must cover every key position of every sequence; a wrong shape would broadcast silently."""
    if attention_mask is not None and attention_mask.dim() == 2 and tuple(attention_mask.shape) != expected_shape:
        raise ValueError(
            f"{name} has shape {tuple(attention_mask.shape)}, but the sequences it masks have shape {expected_shape} "
            "(batch size, sequence length)."
        )


def positions_of(
    attention_mask: torch.Tensor | None, length: int, past_length: int | torch.Tensor, device: torch.device
) -> torch.Tensor:
    """The positions of the last `length` tokens, counted from each sequence's first real token.

    As fairseq's `make_positions`: with a 2D padding mask, padding takes no position (and gets position 0), so a
    sentence is encoded and decoded the same whichever side its batch is padded on. Without one, the positions follow
    the tokens already cached.
    """
    if attention_mask is None or attention_mask.dim() != 2:
        return torch.arange(length, device=device) + past_length
    real = attention_mask.bool()
    return ((real.cumsum(-1) - 1) * real)[:, -length:]


def check_token_ids(input_ids: torch.Tensor, vocab_size: int) -> None:
    """Refuse token ids outside [0, vocab_size), where they can be read for free (`on_host`): an embedding would
    otherwise fail with an index error that names no cause, or on a GPU a device-side assert."""
    if not on_host(input_ids) or not input_ids.numel():
        return
    smallest, largest = torch.stack(torch.aminmax(input_ids)).tolist()
    if smallest < 0 or largest >= vocab_size:
        raise ValueError(
            f"Token ids must be in [0, {vocab_size}) (vocab_size), got ids from {smallest} to {largest}. Do the "
            "tokenizer and the model share the vocabulary?"
        )


def check_labels(labels: torch.Tensor, vocab_size: int, ignore_index: int = -100) -> None:
    """Refuse labels outside [0, vocab_size) that are not `ignore_index`, where they can be read for free (`on_host`)."""
    if not on_host(labels) or not labels.numel():
        return
    # One pass on the way through; the exact range of the labelled tokens is worked out only to report an error.
    smallest, largest = torch.stack(torch.aminmax(labels.masked_fill(labels == ignore_index, 0))).tolist()
    if smallest < 0 or largest >= vocab_size:
        smallest, largest = torch.stack(torch.aminmax(labels[labels != ignore_index])).tolist()
        raise ValueError(
            f"labels must be in [0, {vocab_size}) (vocab_size) or {ignore_index} (ignored), got labels from "
            f"{smallest} to {largest}."
        )


class PositionLimit:
    """The longest sequence a positional encoding has positions for (`max_position_embeddings`), and what to do about
    a longer one (`remedy`)."""

    max_positions: int
    remedy: str

    def check_length(self, num_positions: int) -> None:
        """Refuse sequences longer than `max_positions`; a Python int, so no device sync per step."""
        if num_positions > self.max_positions:
            raise ValueError(
                f"Sequence of {num_positions} positions is longer than max_position_embeddings "
                f"({self.max_positions}); {self.remedy}."
            )


class VaswaniSinusoidalPositionalEncoding(PositionLimit, nn.Module):
    """Section 3.5: PE(pos, 2i) = sin(pos / 10000^(2i/d_model)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d_model)).

    Computed on the fly: it holds no weights, nothing of it is saved, and any length up to
    `max_position_embeddings` works whatever length the model was trained on. Imported checkpoints may lay the
    sines and cosines out in two halves and count positions from an offset (`sinusoid_layout`, `position_offset`).
    """

    remedy = "raise config.max_position_embeddings (the sinusoids are computed: no retraining needed) or truncate"

    def __init__(self, config: VaswaniConfig):
        super().__init__()
        self.d_model = config.d_model
        self.max_positions = config.max_position_embeddings
        self.concatenated = config.sinusoid_layout == "concatenated"
        self.offset = config.position_offset

    @torch.no_grad()
    def forward(self, position_ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        # float32 at least: half precision cannot even represent positions beyond 2048 exactly.
        compute_dtype = torch.promote_types(dtype, torch.float32)
        positions = (position_ids + self.offset).to(compute_dtype)[..., None]
        if self.concatenated:  # tensor2tensor's and fairseq's table: frequencies log-spaced over d_model / 2 - 1
            half = self.d_model // 2
            steps = torch.arange(half, device=position_ids.device, dtype=compute_dtype)
            angles = positions * torch.exp(steps * -(math.log(10000.0) / (half - 1)))
            return torch.cat((angles.sin(), angles.cos()), dim=-1).to(dtype)
        two_i = torch.arange(0, self.d_model, 2, device=position_ids.device, dtype=compute_dtype)
        angles = positions / torch.pow(10000.0, two_i / self.d_model)
        # Interleave so that even dimensions hold the sines and odd dimensions the cosines, as in the formula.
        return torch.stack((angles.sin(), angles.cos()), dim=-1).flatten(-2).to(dtype)


class VaswaniLearnedPositionalEmbedding(PositionLimit, nn.Embedding):
    """Section 3.5 and Table 3, row (E): "learned positional embeddings instead", one trained vector per position.

    A weight of the model, saved with it; a position past the table has no vector, so longer sequences are refused.
    """

    remedy = "learned positions cannot be extended past the table they were trained with: truncate the input"

    def __init__(self, config: VaswaniConfig):
        super().__init__(config.max_position_embeddings, config.d_model)
        self.max_positions = config.max_position_embeddings

    def forward(self, position_ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return super().forward(position_ids).to(dtype)


POSITIONAL_ENCODINGS = {
    "sinusoidal": VaswaniSinusoidalPositionalEncoding,
    "learned": VaswaniLearnedPositionalEmbedding,
}


class VaswaniScaledEmbedding(nn.Embedding):
    """Section 3.4: learned token embeddings, shared by both stacks, "multiplied by sqrt(d_model)"."""

    def __init__(self, config: VaswaniConfig):
        super().__init__(config.vocab_size, config.d_model)
        self.scale = math.sqrt(config.d_model)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        check_token_ids(input_ids, self.num_embeddings)
        return super().forward(input_ids) * self.scale


def eager_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    **kwargs: Unpack[TransformersKwargs],
) -> tuple[torch.Tensor, torch.Tensor]:
    """Section 3.2.1, scaled dot-product attention: softmax(Q K^T / sqrt(d_k)) V, with masked positions at -inf."""
    attn_weights = torch.matmul(query, key.transpose(2, 3)) * scaling
    if attention_mask is not None:
        attn_weights = attn_weights + attention_mask
    # At least float32 (half precision's sums would round), and float64's own: its masks are too large for float32.
    softmax_dtype = torch.promote_types(attn_weights.dtype, torch.float32)
    attn_weights = nn.functional.softmax(attn_weights, dim=-1, dtype=softmax_dtype).to(query.dtype)
    attn_weights = nn.functional.dropout(attn_weights, p=dropout, training=module.training)
    attn_output = torch.matmul(attn_weights, value).transpose(1, 2).contiguous()
    return attn_output, attn_weights


class VaswaniAttention(nn.Module):
    """Section 3.2.2, multi-head attention: Concat(head_1..head_h) W^O, head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V).

    Each head's queries and keys have d_k dimensions and its values d_v, both d_model / h unless the config sets them
    (Table 3, row (B)). The projections carry no bias, as in the paper's equations (imported checkpoints may: `attention_bias`). Used three ways (section 3.2.3): encoder
    self-attention, masked decoder self-attention (`is_causal`) and encoder-decoder attention (`is_cross_attention`).
    """

    def __init__(
        self,
        config: VaswaniConfig,
        num_heads: int,
        layer_idx: int,
        is_causal: bool = False,
        is_cross_attention: bool = False,
    ):
        super().__init__()
        self.config = config
        self.head_dim = config.d_k or config.d_model // num_heads  # d_k: queries and keys
        self.value_head_dim = config.d_v or config.d_model // num_heads
        self.scaling = self.head_dim**-0.5
        self.dropout = config.attention_dropout
        self.layer_idx = layer_idx
        self.is_causal = is_causal
        self.is_cross_attention = is_cross_attention
        key_size, value_size = num_heads * self.head_dim, num_heads * self.value_head_dim
        self.q_proj = nn.Linear(config.d_model, key_size, bias=config.attention_bias)
        self.k_proj = nn.Linear(config.d_model, key_size, bias=config.attention_bias)
        self.v_proj = nn.Linear(config.d_model, value_size, bias=config.attention_bias)
        self.out_proj = nn.Linear(value_size, config.d_model, bias=config.attention_bias)
        # W^Q, W^K, W^V: an initialisation scheme may draw them apart from the other projections (fairseq's, at a
        # smaller gain). A mark, not a subclass: quantization tools replace the modules whose type is nn.Linear.
        for projection in (self.q_proj, self.k_proj, self.v_proj):
            projection.attention_input = True
        # The attention function of one-token decoding steps, where the paper's searches set one
        # (generation_vaswani.decoding_attention_kernel); transformers' attention interface otherwise.
        self.step_attention = None

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        key_value_states: torch.Tensor | None = None,
        cache: EncoderDecoderCache | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        input_shape = hidden_states.shape[:-1]
        query_states = self.q_proj(hidden_states).view(*input_shape, -1, self.head_dim).transpose(1, 2)

        layer_cache = None
        if cache is not None:
            layer_cache = cache.cross_attention_cache if self.is_cross_attention else cache.self_attention_cache
        if self.is_cross_attention and layer_cache is not None and cache.is_updated.get(self.layer_idx):
            # The encoder output does not change while decoding: its keys and values were projected once.
            key_states, value_states = (
                layer_cache.layers[self.layer_idx].keys,
                layer_cache.layers[self.layer_idx].values,
            )
        else:
            source = key_value_states if self.is_cross_attention else hidden_states
            key_states = self.k_proj(source).view(*source.shape[:-1], -1, self.head_dim).transpose(1, 2)
            value_states = self.v_proj(source).view(*source.shape[:-1], -1, self.value_head_dim).transpose(1, 2)
            if layer_cache is not None:
                key_states, value_states = layer_cache.update(key_states, value_states, self.layer_idx)
                if self.is_cross_attention:
                    cache.is_updated[self.layer_idx] = True

        if key_states.shape[0] < query_states.shape[0]:
            # Beam search keeps one encoder output per sentence (generation_vaswani.py): the hypotheses of a sentence
            # attend to it as one sequence of queries, (sentences, heads, hypotheses x length, head_dim).
            hypotheses = query_states.shape[0] // key_states.shape[0]
            query_states = query_states.unflatten(0, (-1, hypotheses)).transpose(1, 2).flatten(2, 3)
            if attention_mask is not None and attention_mask.shape[2] > 1:  # a mask row per query: per hypothesis
                attention_mask = attention_mask.repeat(1, 1, hypotheses, 1)
        attention_interface: Callable = ALL_ATTENTION_FUNCTIONS.get_interface(
            self.config._attn_implementation, eager_attention_forward
        )
        if (
            self.step_attention is not None
            and input_shape[-1] == 1
            and (attention_mask is None or attention_mask.dtype == torch.bool)
        ):
            attention_interface = self.step_attention
        attn_output, attn_weights = attention_interface(
            self,
            query_states,
            key_states,
            value_states,
            attention_mask,
            dropout=self.dropout if self.training else 0.0,
            scaling=self.scaling,
            **kwargs,
        )
        attn_output = self.out_proj(attn_output.reshape(*input_shape, -1).contiguous())
        return attn_output, attn_weights


class VaswaniFeedForward(nn.Module):
    """Section 3.3, position-wise feed-forward network: FFN(x) = max(0, x W_1 + b_1) W_2 + b_2."""

    def __init__(self, config: VaswaniConfig, ffn_dim: int):
        super().__init__()
        self.fc1 = nn.Linear(config.d_model, ffn_dim)
        self.fc2 = nn.Linear(ffn_dim, config.d_model)
        self.activation_fn = ACT2FN[config.activation_function]
        self.activation_dropout = config.activation_dropout

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        hidden_states = self.activation_fn(self.fc1(hidden_states))
        hidden_states = nn.functional.dropout(hidden_states, p=self.activation_dropout, training=self.training)
        return self.fc2(hidden_states)


class VaswaniAddAndNorm(nn.LayerNorm):
    """Sections 3.1 and 5.4, "Add & Norm": LayerNorm(x + Dropout(Sublayer(x))), the post-norm residual connection."""

    def __init__(self, config: VaswaniConfig):
        super().__init__(config.d_model)
        self.dropout = config.dropout

    def forward(self, residual: torch.Tensor, sublayer_output: torch.Tensor) -> torch.Tensor:
        sublayer_output = nn.functional.dropout(sublayer_output, p=self.dropout, training=self.training)
        return super().forward(residual + sublayer_output)


class VaswaniEncoderLayer(GradientCheckpointingLayer):
    """Section 3.1, one encoder layer: self-attention, then the feed-forward network, each followed by Add & Norm."""

    def __init__(self, config: VaswaniConfig, layer_idx: int):
        super().__init__()
        self.self_attn = VaswaniAttention(config, config.encoder_attention_heads, layer_idx)
        self.self_attn_layer_norm = VaswaniAddAndNorm(config)
        self.feed_forward = VaswaniFeedForward(config, config.encoder_ffn_dim)
        self.final_layer_norm = VaswaniAddAndNorm(config)

    def forward(
        self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None, **kwargs: Unpack[TransformersKwargs]
    ) -> torch.Tensor:
        attn_output, _ = self.self_attn(hidden_states, attention_mask=attention_mask, **kwargs)
        hidden_states = self.self_attn_layer_norm(hidden_states, attn_output)
        return self.final_layer_norm(hidden_states, self.feed_forward(hidden_states))


class VaswaniDecoderLayer(GradientCheckpointingLayer):
    """Section 3.1, one decoder layer: masked self-attention, encoder-decoder attention, feed-forward; Add & Norm after each."""

    def __init__(self, config: VaswaniConfig, layer_idx: int):
        super().__init__()
        self.self_attn = VaswaniAttention(config, config.decoder_attention_heads, layer_idx, is_causal=True)
        self.self_attn_layer_norm = VaswaniAddAndNorm(config)
        self.encoder_attn = VaswaniAttention(
            config, config.decoder_attention_heads, layer_idx, is_cross_attention=True
        )
        self.encoder_attn_layer_norm = VaswaniAddAndNorm(config)
        self.feed_forward = VaswaniFeedForward(config, config.decoder_ffn_dim)
        self.final_layer_norm = VaswaniAddAndNorm(config)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None,
        encoder_hidden_states: torch.Tensor,
        encoder_attention_mask: torch.Tensor | None = None,
        cache: EncoderDecoderCache | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> torch.Tensor:
        attn_output, _ = self.self_attn(hidden_states, attention_mask=attention_mask, cache=cache, **kwargs)
        hidden_states = self.self_attn_layer_norm(hidden_states, attn_output)
        attn_output, _ = self.encoder_attn(
            hidden_states,
            attention_mask=encoder_attention_mask,
            key_value_states=encoder_hidden_states,
            cache=cache,
            **kwargs,
        )
        hidden_states = self.encoder_attn_layer_norm(hidden_states, attn_output)
        return self.final_layer_norm(hidden_states, self.feed_forward(hidden_states))


class VaswaniPreTrainedModel(PreTrainedModel):
    """Weight initialisation and the `transformers` capabilities shared by every Vaswani model."""

    config: VaswaniConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _no_split_modules = ["VaswaniEncoderLayer", "VaswaniDecoderLayer"]
    _supports_flash_attn = True
    _supports_sdpa = True
    _supports_flex_attn = True
    _can_compile_fullgraph = True

    def get_expanded_tied_weights_keys(self, all_submodels: bool = False) -> dict:
        """The ties each model's __init__ sets from its config. transformers ties nothing at all when
        `tie_word_embeddings` is False; here that flag unties the output projection only, and
        `share_encoder_decoder_embeddings` decides for the encoder."""
        if all_submodels:
            return super().get_expanded_tied_weights_keys(all_submodels=True)
        return dict(getattr(self, "_tied_weights_keys", None) or {})

    def _init_weights(self, module: nn.Module) -> None:
        # The paper does not state its initialisation; config.init_scheme names one (configuration's INIT_SCHEMES).
        scheme = self.config.init_scheme
        if isinstance(module, nn.Linear):
            # fairseq's query, key and value projections: Glorot-uniform at gain 1/sqrt(2); every other one at 1.
            fairseq_input = scheme == "fairseq" and getattr(module, "attention_input", False)
            self._init_projection(module, 2**-0.5 if fairseq_input else 1.0)
        elif isinstance(module, nn.Embedding):  # tokens, and learned positions as fairseq and Marian draw them
            init.normal_(module.weight, mean=0.0, std=0.02 if scheme == "bart" else self.config.d_model**-0.5)
            padding_row = isinstance(module, VaswaniScaledEmbedding) and self.config.pad_token_id is not None
            if padding_row and scheme != "tensor2tensor":
                # Through the whole matrix: init's functions leave loaded weights alone, which a row's view would not.
                padding = torch.tensor([self.config.pad_token_id], device=module.weight.device)
                init.copy_(module.weight, module.weight.detach().index_fill(0, padding, 0.0))
        elif isinstance(module, nn.LayerNorm):
            init.ones_(module.weight)
            init.zeros_(module.bias)

    def _init_projection(self, projection: nn.Linear, gain: float = 1.0) -> None:
        """One linear projection of the config's init_scheme: N(0, 0.02) for "bart", else Glorot-uniform at `gain`; a
        zero bias."""
        if self.config.init_scheme == "bart":
            init.normal_(projection.weight, mean=0.0, std=0.02)
        else:
            init.xavier_uniform_(projection.weight, gain=gain)
        if projection.bias is not None:
            init.zeros_(projection.bias)


class VaswaniEncoder(VaswaniPreTrainedModel):
    """Section 3.1, the encoder: embeddings plus positional encoding, then a stack of N encoder layers."""

    _can_record_outputs = {"hidden_states": VaswaniEncoderLayer, "attentions": VaswaniAttention}

    def __init__(self, config: VaswaniConfig):
        super().__init__(config)
        self.embed_tokens = VaswaniScaledEmbedding(config)
        self.embed_positions = POSITIONAL_ENCODINGS[config.positional_encoding](config)
        self.dropout = config.dropout
        self.layers = nn.ModuleList([VaswaniEncoderLayer(config, i) for i in range(config.encoder_layers)])
        self.post_init()

    @capture_outputs
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> BaseModelOutput:
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("Pass exactly one of input_ids or inputs_embeds to the encoder.")
        if inputs_embeds is None:
            if input_ids.dim() != 2 or 0 in input_ids.shape:
                raise ValueError(
                    f"input_ids must be a non-empty (batch, length) tensor, got shape {tuple(input_ids.shape)}."
                )
            inputs_embeds = self.embed_tokens(input_ids)
        batch_size, length = inputs_embeds.shape[:2]
        check_attention_mask(attention_mask, (batch_size, length), "attention_mask")

        self.embed_positions.check_length(length)
        positions = self.embed_positions(
            positions_of(attention_mask, length, 0, inputs_embeds.device), inputs_embeds.dtype
        )
        hidden_states = nn.functional.dropout(inputs_embeds + positions, p=self.dropout, training=self.training)
        attention_mask = create_bidirectional_mask(
            config=self.config, inputs_embeds=inputs_embeds, attention_mask=attention_mask
        )
        for layer in self.layers:
            hidden_states = layer(hidden_states, attention_mask, **kwargs)
        return BaseModelOutput(last_hidden_state=hidden_states)


class VaswaniDecoder(VaswaniPreTrainedModel):
    """Section 3.1, the decoder: embeddings plus positional encoding, then N layers that also attend to the encoder."""

    _can_record_outputs = {
        "hidden_states": VaswaniDecoderLayer,
        "attentions": OutputRecorder(VaswaniAttention, index=1, layer_name="self_attn"),
        "cross_attentions": OutputRecorder(VaswaniAttention, index=1, layer_name="encoder_attn"),
    }

    def __init__(self, config: VaswaniConfig):
        super().__init__(config)
        self.embed_tokens = VaswaniScaledEmbedding(config)
        self.embed_positions = POSITIONAL_ENCODINGS[config.positional_encoding](config)
        self.dropout = config.dropout
        self.layers = nn.ModuleList([VaswaniDecoderLayer(config, i) for i in range(config.decoder_layers)])
        # The layers of one-token decoding steps as one kernel call, where the paper's searches on the CPU set one
        # (generation_vaswani.decoder_layers_kernel). It reads the padding masks as given, since a single query's causal
        # mask is its padding mask; it returns None at a step it leaves to the layers' modules.
        self.step_layers = None
        self.post_init()

    @merge_with_config_defaults
    @capture_outputs
    @deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        encoder_hidden_states: torch.Tensor | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        cache: EncoderDecoderCache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> BaseModelOutputWithPastAndCrossAttentions:
        r"""
        position_ids: the positions of the decoder input, by default counted from each sequence's first unmasked
            token (`positions_of`); `generate()` passes a padded prompt's as `decoder_position_ids`
            (`prepare_inputs_for_generation`).
        """
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("Pass exactly one of decoder_input_ids or decoder_inputs_embeds to the decoder.")
        if encoder_hidden_states is None:
            raise ValueError("The decoder attends to the encoder: pass encoder_hidden_states.")
        if inputs_embeds is None:
            if input_ids.dim() != 2 or 0 in input_ids.shape:
                raise ValueError(
                    f"decoder_input_ids must be a non-empty (batch, length) tensor, got shape {tuple(input_ids.shape)}."
                )
            inputs_embeds = self.embed_tokens(input_ids)
        if use_cache and cache is None and not self.training:  # training never reuses keys and values
            cache = EncoderDecoderCache(DynamicCache(config=self.config), DynamicCache(config=self.config))
        batch_size, length = inputs_embeds.shape[:2]
        # A static cache counts its tokens in a tensor: a compiled graph cannot branch on it, so the checks that
        # need its value run eagerly only. Compiled, the cache's size (a Python int) bounds the length instead.
        past_length = cache.get_seq_length() if cache is not None else 0
        if not is_torchdynamo_compiling():
            total_length = int(past_length) + length
            check_attention_mask(attention_mask, (batch_size, total_length), "decoder_attention_mask")
            self.embed_positions.check_length(total_length)
        elif cache is not None:
            self.embed_positions.check_length(max(cache.self_attention_cache.get_max_length(), length))
        check_attention_mask(encoder_attention_mask, tuple(encoder_hidden_states.shape[:2]), "attention_mask")
        if position_ids is None:
            position_ids = positions_of(attention_mask, length, past_length, inputs_embeds.device)
        positions = self.embed_positions(position_ids, inputs_embeds.dtype)
        hidden_states = nn.functional.dropout(inputs_embeds + positions, p=self.dropout, training=self.training)
        if self.step_layers is not None and length == 1:
            stepped = self.step_layers(hidden_states, attention_mask, encoder_attention_mask, cache, **kwargs)
            if stepped is not None:
                return BaseModelOutputWithPastAndCrossAttentions(last_hidden_state=stepped, cache=cache)
        causal_mask = create_causal_mask(
            config=self.config,
            inputs_embeds=inputs_embeds,
            attention_mask=attention_mask,
            cache=cache.self_attention_cache if cache is not None else None,
        )
        encoder_attention_mask = create_bidirectional_mask(
            config=self.config,
            inputs_embeds=inputs_embeds,
            attention_mask=encoder_attention_mask,
            encoder_hidden_states=encoder_hidden_states,
        )
        for layer in self.layers:
            hidden_states = layer(
                hidden_states,
                causal_mask,
                encoder_hidden_states,  # positional, so that gradient checkpointing sees it
                encoder_attention_mask=encoder_attention_mask,
                cache=cache,
                **kwargs,
            )
        return BaseModelOutputWithPastAndCrossAttentions(last_hidden_state=hidden_states, cache=cache)


class VaswaniModel(VaswaniPreTrainedModel):
    """Section 3 and Figure 1: the encoder-decoder, without the output projection; returns the decoder's states."""

    def __init__(self, config: VaswaniConfig):
        super().__init__(config)
        # Section 3.4: one embedding matrix for both stacks; imported checkpoints may give the encoder its own.
        self._tied_weights_keys = {"decoder.embed_tokens.weight": "shared.weight"}
        if config.share_encoder_decoder_embeddings:
            self._tied_weights_keys["encoder.embed_tokens.weight"] = "shared.weight"
        self.shared = VaswaniScaledEmbedding(config)
        self.encoder = VaswaniEncoder(config)
        self.decoder = VaswaniDecoder(config)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.shared

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.shared = self.decoder.embed_tokens = value
        if self.config.share_encoder_decoder_embeddings:
            self.encoder.embed_tokens = value

    @can_return_tuple
    @deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        encoder_outputs: tuple[torch.Tensor] | BaseModelOutput | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        decoder_inputs_embeds: torch.Tensor | None = None,
        decoder_position_ids: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> Seq2SeqModelOutput:
        r"""
        decoder_input_ids: the target shifted right behind `config.decoder_start_token_id`; built from `labels` by
            `VaswaniForConditionalGeneration`. With a `cache`, only the new positions.
        decoder_attention_mask: 2D padding mask of the decoder input; the causal mask is always applied on top.
        decoder_position_ids: positions of the decoder input; by default counted from each sequence's first
            unmasked token, as the source's are.
        """
        if encoder_outputs is None:
            encoder_outputs = self.encoder(
                input_ids=input_ids, attention_mask=attention_mask, inputs_embeds=inputs_embeds, **kwargs
            )
        else:
            encoder_outputs = as_encoder_output(encoder_outputs)
        decoder_outputs = self.decoder(
            input_ids=decoder_input_ids,
            attention_mask=decoder_attention_mask,
            encoder_hidden_states=encoder_outputs.last_hidden_state,
            encoder_attention_mask=attention_mask,
            cache=cache,
            inputs_embeds=decoder_inputs_embeds,
            position_ids=decoder_position_ids,
            use_cache=use_cache,
            **kwargs,
        )
        return Seq2SeqModelOutput(
            last_hidden_state=decoder_outputs.last_hidden_state,
            cache=decoder_outputs.cache,
            decoder_hidden_states=decoder_outputs.hidden_states,
            decoder_attentions=decoder_outputs.attentions,
            cross_attentions=decoder_outputs.cross_attentions,
            encoder_last_hidden_state=encoder_outputs.last_hidden_state,
            encoder_hidden_states=encoder_outputs.hidden_states,
            encoder_attentions=encoder_outputs.attentions,
        )


def as_encoder_output(encoder_outputs: BaseModelOutput | tuple | dict) -> BaseModelOutput:
    """The encoder's output in any form transformers' models take it: a `BaseModelOutput`, a tuple (the last hidden
    state, then the hidden states and attentions) or a dict of those fields."""
    if isinstance(encoder_outputs, BaseModelOutput):
        return encoder_outputs
    if isinstance(encoder_outputs, dict):
        return BaseModelOutput(**encoder_outputs)
    return BaseModelOutput(
        last_hidden_state=encoder_outputs[0],
        hidden_states=encoder_outputs[1] if len(encoder_outputs) > 1 else None,
        attentions=encoder_outputs[2] if len(encoder_outputs) > 2 else None,
    )


class VaswaniLabelSmoothedCrossEntropy(torch.autograd.Function):
    """Section 5.4, label smoothing: per-token cross-entropy against (1 - eps) * one-hot + eps / vocab_size.

    The loss is logsumexp(z) - (1 - eps) * z_target - eps * mean(z), and its gradient softmax(z) - smoothed target is
    written straight from the logits in the backward pass: no log-probabilities are kept between the passes and no
    zero-filled one-hot gradient is built, so a training step holds one logits-sized buffer fewer than
    `F.cross_entropy` and reads it fewer times. Rows are processed in chunks small enough to stay in the CPU's cache.
    """

    @staticmethod
    def forward(ctx, logits: torch.Tensor, labels: torch.Tensor, label_smoothing: float, ignore_index: int):
        labelled = labels != ignore_index
        targets = torch.where(labelled, labels, 0)[:, None]
        compute_dtype = torch.promote_types(logits.dtype, torch.float32)  # sums over the vocabulary need it
        logsumexp = logits.new_empty(labels.shape, dtype=compute_dtype)
        target_logit, mean_logit = torch.empty_like(logsumexp), torch.empty_like(logsumexp)
        for rows in VaswaniLabelSmoothedCrossEntropy.row_chunks(logits):
            chunk = logits[rows].to(compute_dtype)
            logsumexp[rows] = torch.logsumexp(chunk, dim=-1)
            target_logit[rows] = chunk.gather(1, targets[rows]).squeeze(1)
            mean_logit[rows] = chunk.mean(dim=-1)
        nll = (logsumexp - target_logit) * labelled
        loss = (1.0 - label_smoothing) * nll + label_smoothing * (logsumexp - mean_logit) * labelled
        ctx.save_for_backward(logits, targets, labelled, logsumexp)
        ctx.label_smoothing = label_smoothing
        ctx.mark_non_differentiable(nll)
        return loss, nll

    @staticmethod
    def backward(ctx, grad_loss: torch.Tensor, grad_nll: torch.Tensor):
        logits, targets, labelled, logsumexp = ctx.saved_tensors
        smoothing = ctx.label_smoothing
        row_weight = (grad_loss * labelled)[:, None]
        grad = torch.empty_like(logits)
        for rows in VaswaniLabelSmoothedCrossEntropy.row_chunks(logits):
            chunk = torch.sub(logits[rows].to(logsumexp.dtype), logsumexp[rows, None]).exp_()  # softmax(z)
            if smoothing:
                chunk.sub_(smoothing / logits.shape[-1])
            chunk.scatter_add_(1, targets[rows], chunk.new_full(targets[rows].shape, smoothing - 1.0))
            grad[rows] = chunk.mul_(row_weight[rows])
        return grad, None, None, None

    # Values per chunk: 2^21 float32 values (8 MiB) measured fastest on the CPU; on accelerators, where every chunk is
    # a handful of kernel launches, chunks are larger and only bound the float32 temporaries (256 MiB; the GPU report,
    # benchmarks/gpu_report_measure.py's training section, sweeps it).
    cpu_chunk_elements = 2**21
    accelerator_chunk_elements = 2**26

    @staticmethod
    def row_chunks(logits: torch.Tensor) -> list[slice]:
        cls = VaswaniLabelSmoothedCrossEntropy
        elements = cls.cpu_chunk_elements if logits.device.type == "cpu" else cls.accelerator_chunk_elements
        step = max(1, elements // logits.shape[-1])
        return [slice(start, start + step) for start in range(0, logits.shape[0], step)]


def label_smoothed_cross_entropy(
    logits: torch.Tensor, labels: torch.Tensor, label_smoothing: float = 0.0, ignore_index: int = -100
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token losses of `logits` (..., vocab_size) against `labels` (...): the label-smoothed cross-entropy
    (differentiable) and the plain cross-entropy (for logging), both at least float32 and 0 where labels ==
    ignore_index. Half-precision logits (bf16 autocast's) are taken as they are: each chunk of rows is summed in
    float32, so no float32 copy of the whole logits is made."""
    if logits.shape[:-1] != labels.shape:
        raise ValueError(
            f"labels have shape {tuple(labels.shape)}, but the logits have shape {tuple(logits.shape)}: expected "
            f"labels of shape {tuple(logits.shape[:-1])}."
        )
    if not 0.0 <= label_smoothing < 1.0:
        raise ValueError(f"label_smoothing must be in [0, 1), got {label_smoothing}.")
    vocab_size = logits.shape[-1]
    check_labels(labels, vocab_size, ignore_index)
    loss, nll = VaswaniLabelSmoothedCrossEntropy.apply(
        logits.reshape(-1, vocab_size), labels.reshape(-1), label_smoothing, ignore_index
    )
    return loss.view(labels.shape), nll.view(labels.shape)


class VaswaniForConditionalGeneration(VaswaniPreTrainedModel, GenerationMixin):
    """Section 3.4: the encoder-decoder with the pre-softmax linear projection, tied to the embeddings; translates."""

    def __init__(self, config: VaswaniConfig):
        super().__init__(config)
        self.model = VaswaniModel(config)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self._tied_weights_keys = {
            f"model.{key}": f"model.{source}" for key, source in self.model._tied_weights_keys.items()
        }
        if config.tie_word_embeddings:  # section 3.4; imported checkpoints may have their own output projection
            self._tied_weights_keys["lm_head.weight"] = "model.shared.weight"
        self.post_init()
        # Section 6.1: beam search with a beam size of 4 and length penalty alpha = 0.6, decoded as the paper did
        # (generation_vaswani.py; paper_decoding=False gives transformers' own beam search).
        self.generation_config = GenerationConfig(
            num_beams=4,
            length_penalty=0.6,
            paper_decoding=True,
            bos_token_id=config.bos_token_id,
            eos_token_id=config.eos_token_id,
            pad_token_id=config.pad_token_id,
            decoder_start_token_id=config.decoder_start_token_id,
        )

    @can_return_tuple
    @deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        encoder_outputs: tuple[torch.Tensor] | BaseModelOutput | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        decoder_inputs_embeds: torch.Tensor | None = None,
        decoder_position_ids: torch.LongTensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> Seq2SeqLMOutput:
        r"""
        labels: target token ids, -100 where no loss is wanted (padding). The loss is the mean cross-entropy over
            the labelled tokens, or their sum divided by `num_items_in_batch` when Trainer passes it (gradient
            accumulation). Label smoothing belongs to the training recipe: scripts/train.py calls
            `label_smoothed_cross_entropy` on the logits; Trainer has `label_smoothing_factor`.
        """
        if labels is not None:
            use_cache = False
            if decoder_input_ids is None and decoder_inputs_embeds is None:
                decoder_input_ids = self.prepare_decoder_input_ids_from_labels(labels)
        outputs: Seq2SeqModelOutput = self.model(
            input_ids,
            attention_mask=attention_mask,
            decoder_input_ids=decoder_input_ids,
            decoder_attention_mask=decoder_attention_mask,
            encoder_outputs=encoder_outputs,
            cache=cache,
            inputs_embeds=inputs_embeds,
            decoder_inputs_embeds=decoder_inputs_embeds,
            decoder_position_ids=decoder_position_ids,
            use_cache=use_cache,
            **kwargs,
        )
        logits = self.lm_head(outputs.last_hidden_state)
        loss = None
        if labels is not None:
            token_losses, _ = label_smoothed_cross_entropy(logits, labels)
            # Trainer passes the labelled tokens of the whole accumulated step, so that every token weighs the same.
            num_items = kwargs.get("num_items_in_batch")
            if num_items is None:
                num_items = (labels != -100).sum()
            loss = token_losses.sum() / torch.as_tensor(num_items, device=logits.device)
        return Seq2SeqLMOutput(
            loss=loss,
            logits=logits,
            cache=outputs.cache,
            decoder_hidden_states=outputs.decoder_hidden_states,
            decoder_attentions=outputs.decoder_attentions,
            cross_attentions=outputs.cross_attentions,
            encoder_last_hidden_state=outputs.encoder_last_hidden_state,
            encoder_hidden_states=outputs.encoder_hidden_states,
            encoder_attentions=outputs.encoder_attentions,
        )

    def prepare_decoder_input_ids_from_labels(self, labels: torch.Tensor) -> torch.Tensor:
        return shift_tokens_right(labels, self.config.pad_token_id, self.config.decoder_start_token_id)

    @deprecate_kwarg("past_key_values", "6.0.0", new_name="cache")  # as GenerationMixin.generate takes it
    @torch.no_grad()
    def generate(
        self, inputs: torch.Tensor | None = None, generation_config: GenerationConfig | None = None, **kwargs
    ):
        """`GenerationMixin.generate`, with the paper's length limit (section 6.1) when no other is given anywhere.

        With `paper_decoding=True` (the default generation config's; a generate() argument or a config attribute),
        beam search scores finished hypotheses with the GNMT length penalty and each sentence stops at its own
        source length + 50 tokens (generation_vaswani.py). Otherwise `generate()` is transformers' own, and the
        limit is the longest source's length + 50 for the whole batch. A config without the attribute (saved before it
        existed) decodes as transformers does, as it did when it was saved. A config's max_length that is transformers'
        default filled in with all the others (as Seq2SeqTrainer's `predict_with_generate` does to the model's, and
        `save_model` saves) is no limit: `holds_library_defaults`.

        The decoding method follows from the settings as generate() merges them: a given config, the model's where it
        leaves a setting unset, then the arguments (`_decoding_method`). On the CPU the encoder of a source of at least
        `PACKED_ENCODER_TOKENS` tokens computes its linear layers from weights packed for the call
        (`packed_linear_layers`).
        """
        base = copy.deepcopy(generation_config if generation_config is not None else self.generation_config)
        if generation_config is not None:  # as generate() fills a given config: the model's settings where it has none
            base.update(**self.generation_config.to_dict(), defaults_only=True, allow_custom_entries=True)
        merged = copy.deepcopy(base)
        paper_decoding = kwargs.pop("paper_decoding", getattr(base, "paper_decoding", False))
        merged.update(**kwargs)
        if kwargs.get("decoder_inputs_embeds") is not None:  # else refused by the decoder, after the encoder ran
            raise ValueError(
                "generate() decodes from token ids, the start token or decoder_input_ids, and embeds each new token "
                "itself: pass decoder_input_ids rather than decoder_inputs_embeds."
            )
        # Seq2SeqTrainer's predict_with_generate passes the batch's labels along: they are the loss's, and passed on
        # to every decoding step they would turn its cache off.
        kwargs.pop("labels", None)
        if merged.guidance_scale not in (
            None,
            1,
        ):  # transformers' processor would fail in the decoder, after the encoder
            raise ValueError(
                "guidance_scale (classifier-free guidance) decodes a decoder-only model's prompt a second time without "
                "its context, and this encoder-decoder has no such prompt: leave guidance_scale unset."
            )
        if merged.prefill_chunk_size is not None:  # transformers' chunks take the source's mask for the decoder's
            raise ValueError(
                "prefill_chunk_size splits a decoder-only model's long prompt; this model's decoder prompt is its start "
                "token or a forced prefix, read in one pass: leave prefill_chunk_size unset."
            )
        synced_gpus = kwargs.get("synced_gpus")
        if synced_gpus is None:  # as generate() works it out for its own methods
            sharded = is_deepspeed_zero3_enabled() or is_fsdp_managed_module(self)
            synced_gpus = sharded and distributed.is_initialized() and distributed.get_world_size() > 1
        filled_in = base.max_length is not None and holds_library_defaults(base)
        base_max_length = None if filled_in else base.max_length
        limits = (kwargs.get("max_length"), kwargs.get("max_new_tokens"), base_max_length, base.max_new_tokens)
        if kwargs.get("encoder_outputs") is not None:  # the decoding methods read it by its fields
            kwargs["encoder_outputs"] = as_encoder_output(kwargs["encoder_outputs"])
        source = self._source(inputs, kwargs)
        prompt = DecoderPrompt.of(kwargs.get("decoder_input_ids"), kwargs.get("decoder_attention_mask"), merged)
        if all(limit is None for limit in limits) and source is not None:
            source_lengths = self._source_lengths(source, kwargs.get("attention_mask"))
            limit = section_6_1_limit(source_lengths, prompt, merged, paper_decoding, self.config, synced_gpus)
            kwargs["max_new_tokens"] = limit.max_new_tokens
            if limit.per_sentence is not None:
                kwargs["logits_processor"] = LogitsProcessorList(
                    [*(kwargs.get("logits_processor") or []), limit.per_sentence]
                )
        if filled_in and kwargs.get("max_new_tokens") is not None:
            kwargs.setdefault("max_length", None)  # else transformers warns that both limits were set
        # The decoder refuses a position past max_position_embeddings at the step that reaches it; a compiled
        # decoding step cannot raise a clean error, so a limit it could never honour is refused here, before any work.
        new_tokens = kwargs.get("max_new_tokens", base.max_new_tokens)
        longest = prompt.width + new_tokens if new_tokens is not None else kwargs.get("max_length", base_max_length)
        if longest is not None and longest > self.config.max_position_embeddings:
            raise ValueError(
                f"Generating up to {longest} decoder positions (the decoder prompt and the new tokens), more than "
                f"max_position_embeddings ({self.config.max_position_embeddings}); ask for fewer tokens, or "
                f"{self.model.decoder.embed_positions.remedy}."
            )
        cache, decoder_input_ids = kwargs.get("cache"), kwargs.get("decoder_input_ids")
        if cache is not None and cache.get_seq_length():
            self._check_cache_continues(cache, decoder_input_ids, merged.num_beams or 1)
            if kwargs.get("decoder_attention_mask") is None:
                # generate() tells the tokens a cache holds from the new ones by the decoder mask's length, and
                # without a mask would feed them to the decoder again.
                kwargs["decoder_attention_mask"] = torch.ones_like(decoder_input_ids)
        if paper_decoding and kwargs.get("custom_generate") is None:
            method = self._decoding_method(merged, kwargs)
            if method is not None:
                # generate() hands a callable custom_generate none of its own arguments, synced_gpus among them.
                kwargs["custom_generate"] = functools.partial(method, synced_gpus=synced_gpus)
        encoding = source is not None and kwargs.get("encoder_outputs") is None
        encoding = encoding and math.prod(source.shape[:2]) >= PACKED_ENCODER_TOKENS
        with packed_linear_layers(self, [self.get_encoder()], encoding):
            return super().generate(inputs, generation_config=generation_config, **kwargs)

    @staticmethod
    def _decoding_method(config: GenerationConfig, kwargs: dict):
        """The decoding method of `paper_decoding=True` for the mode `config` (merged as generate() merges it) asks
        for: for beam search the paper's (section 6.1), for greedy search a greedy decoding in which a finished sentence
        leaves the batch. None, transformers' own method, for every other mode (sampling, beam sampling, assisted,
        constrained, group beam and contrastive search, DoLa), and for greedy search asked for what only transformers'
        gives (per-step attentions or hidden states, a static cache, a streamer)."""
        mode = generation_mode(config, kwargs.get("assistant_model"))
        if mode == GenerationMode.BEAM_SAMPLE:
            logger.warning_once(
                "The paper's decoding is beam search without sampling (section 6.1): do_sample=True with "
                "num_beams > 1 runs transformers' beam sampling."
            )
        if mode == GenerationMode.BEAM_SEARCH:
            if kwargs.get("streamer") is not None:
                raise ValueError(
                    "A streamer shows one sequence as it grows, and beam search keeps several: pass num_beams=1."
                )
            if config.low_memory:
                raise ValueError(
                    "low_memory=True decoded transformers' former beam search in slices; neither its beam search nor "
                    "the paper's has that mode: leave low_memory unset."
                )
            if config.early_stopping is True:
                raise ValueError(
                    "early_stopping=True ends transformers' beam search at its first num_beams finished hypotheses, "
                    "where the paper's search ends once none can change a sentence's result: pass "
                    "paper_decoding=False for transformers' search."
                )
            return gnmt_beam_search
        if mode != GenerationMode.GREEDY_SEARCH:
            return None
        cache = kwargs.get("cache")
        greedy_only = (
            config.output_attentions
            or config.output_hidden_states
            or config.cache_implementation not in (None, "dynamic")
            or (cache is not None and cache.is_compileable)
            or kwargs.get("streamer") is not None
        )
        return None if greedy_only else greedy_search

    def prepare_inputs_for_generation(self, input_ids, next_sequence_length=None, **kwargs):
        """`GenerationMixin.prepare_inputs_for_generation`, with the positions of a padded decoder prompt taken from its
        2D padding mask, before a static cache turns that mask into a 4D one that the decoder cannot count from."""
        mask = kwargs.get("decoder_attention_mask")
        if mask is not None and mask.dim() == 2 and kwargs.get("decoder_position_ids") is None:
            length = next_sequence_length or input_ids.shape[1]
            kwargs["decoder_position_ids"] = positions_of(mask, length, 0, mask.device)
        return super().prepare_inputs_for_generation(input_ids, next_sequence_length=next_sequence_length, **kwargs)

    @staticmethod
    def _check_cache_continues(cache: Cache, decoder_input_ids: torch.Tensor | None, num_beams: int) -> None:
        """A filled cache continues the greedy or sampled decoding that returned it, from its sequences."""
        if decoder_input_ids is None:
            raise ValueError("Continuing from a filled cache needs the sequences it holds: pass decoder_input_ids.")
        if num_beams > 1:
            raise ValueError(
                "A beam search cannot continue from a cache: a beam search's returned cache holds its last live "
                "beams, not the sequences it returned. Pass decoder_input_ids=earlier.sequences without the cache."
            )
        rows = cache.self_attention_cache.layers[0].keys.shape[0]
        if rows != decoder_input_ids.shape[0]:
            raise ValueError(
                f"The cache holds {rows} sequences, decoder_input_ids {decoder_input_ids.shape[0]}: a cache continues "
                "the decoding that returned it (a beam search's holds its beams; a greedy decoding's, the sentences "
                "still decoded at its last step: pass min_new_tokens, or decode again without the cache)."
            )

    @staticmethod
    def _source(inputs: torch.Tensor | None, kwargs: dict) -> torch.Tensor | None:
        """The source in whichever form generate() was given it (ids, embeddings or the encoder's output), with one
        row per sentence and one column per source position; refuses a padding mask that leaves a sentence nothing."""
        source = inputs if inputs is not None else kwargs.get("input_ids", kwargs.get("inputs_embeds"))
        if source is None and kwargs.get("encoder_outputs") is not None:
            source = kwargs["encoder_outputs"].last_hidden_state
        mask = kwargs.get("attention_mask")
        if mask is not None and mask.dim() == 2 and on_host(mask) and not mask.any(dim=1).all():
            empty = (~mask.any(dim=1)).nonzero().view(-1).tolist()
            raise ValueError(
                f"attention_mask masks every token of the source in rows {empty}: a sentence without tokens has "
                "nothing to translate; leave it out of the batch."
            )
        return source

    def _source_lengths(self, source: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
        """Each source sentence's unpadded length, `</s>` included."""
        if attention_mask is not None:
            return attention_mask.sum(dim=1)
        if source.is_floating_point() or self.config.pad_token_id is None:  # no padding to see without a mask
            return torch.full((source.shape[0],), source.shape[1], device=source.device)
        return (source != self.config.pad_token_id).sum(dim=1)


__all__ = [
    "label_smoothed_cross_entropy",
    "VaswaniEncoder",
    "VaswaniDecoder",
    "VaswaniForConditionalGeneration",
    "VaswaniModel",
    "VaswaniPreTrainedModel",
]
