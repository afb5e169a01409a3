"""Export to CTranslate2, the fastest inference engine for this architecture, weight for weight.

CTranslate2's Transformer spec has the paper's post-norm layout (`pre_norm=False`) and accepts the positional
table explicitly: the sinusoidal table of section 3.5 is written out (CTranslate2's own would put sines and cosines
in two halves instead of interleaving them), or the learned one (Table 3, row (E)), the embeddings keep their sqrt(d_model) scale (section 3.4), and the
attention projections carry no bias, as in the model (imported checkpoints' biases, positions and separate
embeddings are written as they are).
"""

import math
from pathlib import Path

import ctranslate2
import numpy
import torch
from ctranslate2.specs import common_spec, transformer_spec

from ..checks import UsageError
from ..modeling.generation_vaswani import EXTRA_OUTPUT_TOKENS
from ..modeling.pipeline_vaswani import longest_first


def _array(tensor: torch.Tensor) -> numpy.ndarray:
    """A float32 copy of `tensor` that owns its memory. CTranslate2 quantises the arrays it is given in place
    (`value *= scale` for int8 and int16), and `.float().numpy()` of a float32 parameter is a view of the parameter's
    own storage: the export would rescale the live model's weights."""
    return tensor.detach().to(device="cpu", dtype=torch.float32, copy=True).numpy()


def _linear(spec: common_spec.LinearSpec, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
    spec.weight = _array(weight)
    if bias is not None:
        spec.bias = _array(bias)


def _layer_norm(spec: common_spec.LayerNormSpec, norm: torch.nn.LayerNorm) -> None:
    spec.gamma = _array(norm.weight)
    spec.beta = _array(norm.bias)


def _attention(spec, attention, self_attention: bool) -> None:
    q, k, v = (p.weight for p in (attention.q_proj, attention.k_proj, attention.v_proj))
    # The paper's projections have no bias; imported checkpoints' may (config.attention_bias).
    q_b, k_b, v_b = (p.bias for p in (attention.q_proj, attention.k_proj, attention.v_proj))
    biased = q_b is not None
    if self_attention:  # CTranslate2 fuses Q, K and V of self-attention, and K with V of encoder-decoder attention
        _linear(spec.linear[0], torch.cat([q, k, v]), torch.cat([q_b, k_b, v_b]) if biased else None)
    else:
        _linear(spec.linear[0], q, q_b)
        _linear(spec.linear[1], torch.cat([k, v]), torch.cat([k_b, v_b]) if biased else None)
    _linear(spec.linear[-1], attention.out_proj.weight, attention.out_proj.bias)


def _feed_forward(spec, feed_forward, norm) -> None:
    _linear(spec.linear_0, feed_forward.fc1.weight, feed_forward.fc1.bias)
    _linear(spec.linear_1, feed_forward.fc2.weight, feed_forward.fc2.bias)
    _layer_norm(spec.layer_norm, norm)


def _stack_inputs(spec, stack, embedding_spec) -> None:
    positions = torch.arange(stack.config.max_position_embeddings)
    spec.position_encodings.encodings = _array(stack.embed_positions(positions, torch.float32))
    spec.scale_embeddings = math.sqrt(stack.config.d_model)
    embedding_spec.weight = _array(stack.embed_tokens.weight)


def build_spec(model) -> transformer_spec.TransformerSpec:
    """The CTranslate2 specification holding `model`'s weights."""
    config = model.config
    if config.activation_function != "relu" or config.encoder_attention_heads != config.decoder_attention_heads:
        raise UsageError("CTranslate2's Transformer spec needs ReLU and the same number of heads in both stacks.")
    attention = model.model.encoder.layers[0].self_attn
    if {attention.head_dim, attention.value_head_dim} != {config.d_model / config.encoder_attention_heads}:
        raise UsageError(
            "CTranslate2's attention gives each head d_model / heads dimensions for queries, keys and values alike; "
            f"this model's heads have d_k={attention.head_dim} and d_v={attention.value_head_dim} (Table 3, row (B))."
        )
    spec = transformer_spec.TransformerSpec.from_config(
        (config.encoder_layers, config.decoder_layers), config.encoder_attention_heads, pre_norm=False
    )
    encoder, decoder = model.model.encoder, model.model.decoder
    _stack_inputs(spec.encoder, encoder, spec.encoder.embeddings[0])
    for layer_spec, layer in zip(spec.encoder.layer, encoder.layers):
        _attention(layer_spec.self_attention, layer.self_attn, self_attention=True)
        _layer_norm(layer_spec.self_attention.layer_norm, layer.self_attn_layer_norm)
        _feed_forward(layer_spec.ffn, layer.feed_forward, layer.final_layer_norm)
    _stack_inputs(spec.decoder, decoder, spec.decoder.embeddings)
    for layer_spec, layer in zip(spec.decoder.layer, decoder.layers):
        _attention(layer_spec.self_attention, layer.self_attn, self_attention=True)
        _layer_norm(layer_spec.self_attention.layer_norm, layer.self_attn_layer_norm)
        _attention(layer_spec.attention, layer.encoder_attn, self_attention=False)
        _layer_norm(layer_spec.attention.layer_norm, layer.encoder_attn_layer_norm)
        _feed_forward(layer_spec.ffn, layer.feed_forward, layer.final_layer_norm)
    _linear(spec.decoder.projection, model.lm_head.weight)
    return spec


def vocabulary(model, tokenizer=None) -> list[str]:
    """One token string per id. Without a tokenizer (random-weight benchmarks) the tokens are placeholders, with
    `<unk>` at the first id the special tokens leave free."""
    config = model.config
    if tokenizer is None:
        tokens = [f"t{i}" for i in range(config.vocab_size)]
        for name, token in (("pad", "<pad>"), ("bos", "<s>"), ("eos", "</s>")):
            tokens[getattr(config, f"{name}_token_id")] = token
        tokens[next(i for i, token in enumerate(tokens) if token == f"t{i}")] = "<unk>"
        return tokens
    if len(tokenizer) > config.vocab_size:
        raise UsageError(f"The tokenizer has {len(tokenizer)} tokens but the model only {config.vocab_size}.")
    tokens = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    return tokens + [f"<unused{i}>" for i in range(len(tokens), config.vocab_size)]


class VaswaniConverter(ctranslate2.converters.Converter):
    """CTranslate2's converter interface around `build_spec`: it validates, quantises and writes the model."""

    def __init__(self, model, tokens: list[str], unk_token: str):
        self.model, self.tokens, self.unk_token = model, tokens, unk_token

    def _load(self):
        spec = build_spec(self.model)
        spec.register_source_vocabulary(self.tokens)
        spec.register_target_vocabulary(self.tokens)
        config = self.model.config
        spec.config.bos_token = self.tokens[config.bos_token_id]
        spec.config.eos_token = self.tokens[config.eos_token_id]
        spec.config.decoder_start_token = self.tokens[config.decoder_start_token_id]
        spec.config.unk_token = self.unk_token
        return spec


def export(model, output_dir: str | Path, tokenizer=None, quantization: str | None = None) -> Path:
    """Write `model` as a CTranslate2 model folder (overwriting it), with `tokenizer`'s vocabulary if given. The
    converter deletes the folder first: one that holds other files and no CTranslate2 model (model.bin), such as the
    model's own folder, is refused."""
    output_dir = Path(output_dir)
    others = sorted(path.name for path in output_dir.iterdir()) if output_dir.is_dir() else []
    if others and "model.bin" not in others:
        raise UsageError(
            f"cannot export into {output_dir}: it holds other files ({', '.join(others[:3])}"
            f"{', ...' if len(others) > 3 else ''}) and no CTranslate2 model, and the export replaces the whole "
            "folder; give a new or empty one."
        )
    if tokenizer is not None and tokenizer.unk_token is None:
        raise UsageError(
            "The tokenizer has no unk token; CTranslate2 maps input outside the vocabulary to one. Give "
            "the tokenizer an unk token (its special tokens) and export again."
        )
    converter = VaswaniConverter(
        model.eval(), vocabulary(model, tokenizer), "<unk>" if tokenizer is None else tokenizer.unk_token
    )
    return Path(converter.convert(str(output_dir), quantization=quantization, force=True))


def translate_ids(
    translator: ctranslate2.Translator,
    tokens: list[str],
    batch: list[list[int]],
    beam_size: int = 1,
    length: int | None = None,
) -> list[list[int]]:
    """Translate token-id sequences with CTranslate2; `length` forces an exact output length (benchmarks)."""
    lookup = {token: i for i, token in enumerate(tokens)}
    source = [[tokens[i] for i in ids] for ids in batch]
    options = {"beam_size": beam_size, "max_decoding_length": length or max(map(len, batch)) + EXTRA_OUTPUT_TOKENS}
    if length is not None:
        options["min_decoding_length"] = length
    results = translator.translate_batch(source, **options)
    return [[lookup[token] for token in result.hypotheses[0]] for result in results]


def translate_sentences(
    translator: ctranslate2.Translator,
    tokenizer,
    sentences: list[str],
    batch_size: int = 32,
    max_tokens: int | None = None,
    on_batch=None,
    **options,
) -> list[str]:
    """Translate `sentences` with an exported model, in their order: batches of similar length (longest first, as
    `vaswani.evaluation.bleu.translations` makes them: `batch_size` sentences, or `max_tokens` source tokens with
    their padding), each limited to its longest source + 50 tokens (section 6.1), tokenized and detokenized by the
    model's own `tokenizer`. `options` go to `translate_batch` (beam_size, length_penalty, ...). A blank sentence gives
    a blank translation. `on_batch(indices)` is called with the blank sentences' indices, then after each batch."""
    from ..evaluation.bleu import token_batches

    written = [i for i, text in enumerate(sentences) if text.strip()]
    ids = dict(zip(written, tokenizer([sentences[i] for i in written]).input_ids if written else []))
    if max_tokens is None:
        order = [i for i in longest_first([len(text) for text in sentences]) if i in ids]
        batches = [order[start : start + batch_size] for start in range(0, len(order), batch_size)]
    else:
        batches = token_batches([len(ids[i]) for i in written], max_tokens)
        batches = [[written[position] for position in batch] for batch in batches]
    answers = [""] * len(sentences)
    if on_batch is not None and len(written) < len(sentences):
        on_batch([i for i in range(len(sentences)) if i not in ids])
    for chunk in batches:
        limit = max(len(ids[i]) for i in chunk) + EXTRA_OUTPUT_TOKENS
        results = translator.translate_batch(
            [tokenizer.convert_ids_to_tokens(ids[i]) for i in chunk], max_decoding_length=limit, **options
        )
        for i, result in zip(chunk, results):
            target = tokenizer.convert_tokens_to_ids(result.hypotheses[0])
            answers[i] = tokenizer.decode(target, skip_special_tokens=True).strip()
        if on_batch is not None:
            on_batch(chunk)
    return answers
