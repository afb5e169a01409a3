"""The architecture of section 3, checked against torch.nn.Transformer and against the paper's formulas."""

import math

import pytest
import torch
from torch import nn

from vaswani import VaswaniConfig, VaswaniForConditionalGeneration, VaswaniModel, label_smoothed_cross_entropy


def reference_transformer(model: VaswaniForConditionalGeneration) -> nn.Transformer:
    """`torch.nn.Transformer` (post-norm) holding `model`'s weights, without its extra final stack norms."""
    config = model.config
    reference = nn.Transformer(
        d_model=config.d_model,
        nhead=config.encoder_attention_heads,
        num_encoder_layers=config.encoder_layers,
        num_decoder_layers=config.decoder_layers,
        dim_feedforward=config.encoder_ffn_dim,
        dropout=0.0,
        activation="relu",
        batch_first=True,
        norm_first=False,
    )
    reference.encoder.norm = nn.Identity()
    reference.decoder.norm = nn.Identity()

    def copy_attention(target: nn.MultiheadAttention, source) -> None:
        target.in_proj_weight.copy_(torch.cat([source.q_proj.weight, source.k_proj.weight, source.v_proj.weight]))
        target.in_proj_bias.zero_()  # the paper's projections have no bias
        target.out_proj.weight.copy_(source.out_proj.weight)
        target.out_proj.bias.zero_()

    def copy_feed_forward_and_norms(target, source, norm_names) -> None:
        target.linear1.load_state_dict(source.feed_forward.fc1.state_dict())
        target.linear2.load_state_dict(source.feed_forward.fc2.state_dict())
        for target_norm, source_norm in norm_names:
            getattr(target, target_norm).load_state_dict(getattr(source, source_norm).state_dict())

    with torch.no_grad():
        for target, source in zip(reference.encoder.layers, model.model.encoder.layers):
            copy_attention(target.self_attn, source.self_attn)
            copy_feed_forward_and_norms(
                target, source, [("norm1", "self_attn_layer_norm"), ("norm2", "final_layer_norm")]
            )
        for target, source in zip(reference.decoder.layers, model.model.decoder.layers):
            copy_attention(target.self_attn, source.self_attn)
            copy_attention(target.multihead_attn, source.encoder_attn)
            copy_feed_forward_and_norms(
                target,
                source,
                [
                    ("norm1", "self_attn_layer_norm"),
                    ("norm2", "encoder_attn_layer_norm"),
                    ("norm3", "final_layer_norm"),
                ],
            )
    return reference.eval()


def paper_positional_encoding(length: int, d_model: int) -> torch.Tensor:
    """Section 3.5, element by element with Python's math, independent of the model's vectorised code."""
    table = torch.empty(length, d_model, dtype=torch.float64)
    for pos in range(length):
        for i in range(d_model // 2):
            angle = pos / 10000 ** (2 * i / d_model)
            table[pos, 2 * i] = math.sin(angle)
            table[pos, 2 * i + 1] = math.cos(angle)
    return table


def test_encoder_and_decoder_match_torch_nn_transformer(tiny_model, source_batch):
    input_ids, attention_mask = source_batch
    decoder_input_ids = torch.tensor([[1, 5, 9, 13, 17], [1, 6, 10, 14, 18]])
    reference = reference_transformer(tiny_model)
    model = tiny_model.model

    def embedded(ids):  # the same embedding + positional encoding input for both implementations
        return model.shared(ids) + model.encoder.embed_positions(torch.arange(ids.shape[1]), torch.float32)

    with torch.no_grad():
        ours = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids)
        padding = attention_mask == 0
        memory = reference.encoder(embedded(input_ids), src_key_padding_mask=padding)
        decoded = reference.decoder(
            embedded(decoder_input_ids),
            memory,
            tgt_mask=nn.Transformer.generate_square_subsequent_mask(decoder_input_ids.shape[1]),
            tgt_is_causal=True,
            memory_key_padding_mask=padding,
        )
    real = attention_mask.bool()
    torch.testing.assert_close(ours.encoder_last_hidden_state[real], memory[real], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours.last_hidden_state, decoded, atol=1e-5, rtol=1e-5)


def test_positional_encoding_is_the_paper_formula(tiny_model):
    d_model = tiny_model.config.d_model
    computed = tiny_model.model.encoder.embed_positions(torch.arange(50), torch.float64)
    torch.testing.assert_close(computed, paper_positional_encoding(50, d_model), atol=1e-12, rtol=0)


def test_positional_encoding_is_not_saved_and_loads_right(tiny_model, tmp_path):
    assert not any("position" in key for key in tiny_model.state_dict())
    tiny_model.save_pretrained(tmp_path)
    loaded = VaswaniForConditionalGeneration.from_pretrained(tmp_path)
    for stack in (loaded.model.encoder, loaded.model.decoder):
        computed = stack.embed_positions(torch.arange(20), torch.float64)
        torch.testing.assert_close(computed, paper_positional_encoding(20, loaded.config.d_model), atol=1e-12, rtol=0)


def test_max_positions_can_be_raised_after_training(tiny_model, tmp_path):
    tiny_model.save_pretrained(tmp_path)
    longer = VaswaniForConditionalGeneration.from_pretrained(tmp_path, max_position_embeddings=512).eval()
    input_ids = torch.randint(4, 100, (1, 300))
    with pytest.raises(ValueError, match="max_position_embeddings"):
        tiny_model(input_ids=input_ids, decoder_input_ids=input_ids[:, :3])
    with torch.no_grad():
        assert longer(input_ids=input_ids, decoder_input_ids=input_ids[:, :3]).logits.isfinite().all()
        short = input_ids[:, :20]
        torch.testing.assert_close(
            longer(input_ids=short, decoder_input_ids=short).logits,
            tiny_model(input_ids=short, decoder_input_ids=short).logits,
        )


def test_embeddings_are_scaled_by_sqrt_d_model(tiny_model):
    ids = torch.tensor([[5, 6]])
    embedding = tiny_model.model.shared
    torch.testing.assert_close(embedding(ids), embedding.weight[ids] * math.sqrt(tiny_model.config.d_model))


def test_three_way_weight_tying_after_init_and_after_loading(tiny_model, tmp_path):
    def tied(model):
        shared = model.model.shared.weight
        return all(
            weight.data_ptr() == shared.data_ptr()
            for weight in (
                model.model.encoder.embed_tokens.weight,
                model.model.decoder.embed_tokens.weight,
                model.lm_head.weight,
            )
        )

    assert tied(tiny_model)
    tiny_model.save_pretrained(tmp_path)
    assert tied(VaswaniForConditionalGeneration.from_pretrained(tmp_path))


def test_padded_source_tokens_do_not_influence_anything(tiny_model, source_batch):
    input_ids, attention_mask = source_batch
    decoder_input_ids = torch.tensor([[1, 5, 9], [1, 6, 10]])
    changed = input_ids.clone()
    changed[1, 7:] = torch.tensor([55, 66])  # under the padding mask
    with torch.no_grad():
        before = tiny_model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids)
        after = tiny_model(input_ids=changed, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids)
    torch.testing.assert_close(before.logits, after.logits)


def test_future_target_tokens_do_not_influence_earlier_positions(tiny_model, source_batch):
    input_ids, attention_mask = source_batch
    decoder_input_ids = torch.tensor([[1, 5, 9, 13, 17, 21]])
    for cut in range(1, 6):
        changed = decoder_input_ids.clone()
        changed[0, cut:] = 42
        with torch.no_grad():
            before = tiny_model(input_ids=input_ids[:1], decoder_input_ids=decoder_input_ids).logits
            after = tiny_model(input_ids=input_ids[:1], decoder_input_ids=changed).logits
        torch.testing.assert_close(before[:, :cut], after[:, :cut])
        assert not torch.allclose(before[:, cut:], after[:, cut:])


def test_loss_ignores_minus_100_and_normalises_by_num_items(tiny_model, source_batch):
    input_ids, attention_mask = source_batch
    labels = torch.tensor([[7, 8, 9, 2], [10, 2, -100, -100]])
    out = tiny_model(input_ids=input_ids, attention_mask=attention_mask, labels=labels)
    logits = out.logits.reshape(-1, tiny_model.config.vocab_size)
    expected_sum = nn.functional.cross_entropy(logits, labels.reshape(-1), ignore_index=-100, reduction="sum")
    torch.testing.assert_close(out.loss, expected_sum / 6)
    # Trainer passes the labelled-token count of the whole accumulated batch; the loss is then a sum over it.
    scaled = tiny_model(input_ids=input_ids, attention_mask=attention_mask, labels=labels, num_items_in_batch=12)
    torch.testing.assert_close(scaled.loss, expected_sum / 12)
    # Without decoder inputs the model shifts the labels right behind the decoder start token.
    shifted = torch.tensor([[1, 7, 8, 9], [1, 10, 2, 0]])
    torch.testing.assert_close(
        tiny_model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=shifted).logits, out.logits
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
@pytest.mark.parametrize("vocab_size", [40, 2**19 + 3])  # the larger spreads 10 rows over chunks of 3 rows
def test_label_smoothed_loss_and_gradient_equal_torch_cross_entropy(dtype, label_smoothing, vocab_size):
    torch.manual_seed(0)
    logits = (3 * torch.randn(2, 5, vocab_size)).to(dtype).requires_grad_()
    labels = torch.randint(0, vocab_size, (2, 5))
    labels[1, 3:] = -100
    smoothed, plain = label_smoothed_cross_entropy(logits, labels, label_smoothing)

    def cross_entropy(dtype, label_smoothing):
        return nn.functional.cross_entropy(
            logits.to(dtype).flatten(0, 1), labels.flatten(), reduction="none", label_smoothing=label_smoothing
        ).view(2, 5)

    # Against float64: over half a million logits, float32 sums in another order differ by a few 1e-6 (and torch's
    # float32 gradient of the smoothing term, which sums -eps / vocab_size over the vocabulary, by several 1e-4).
    tolerance = {"rtol": 1e-5, "atol": 1e-5}
    torch.testing.assert_close(smoothed, cross_entropy(torch.float64, label_smoothing).float(), **tolerance)
    torch.testing.assert_close(plain, cross_entropy(torch.float64, 0.0).float(), **tolerance)
    assert smoothed.dtype == torch.float32 and not plain.requires_grad
    assert (smoothed[1, 3:] == 0).all() and (plain[1, 3:] == 0).all()

    weights = torch.rand(2, 5)  # any reduction: a weighted sum exercises every row's incoming gradient
    (gradient,) = torch.autograd.grad((smoothed * weights).sum(), logits)
    (expected_gradient,) = torch.autograd.grad((cross_entropy(torch.float64, label_smoothing) * weights).sum(), logits)
    assert gradient.dtype == dtype
    torch.testing.assert_close(gradient, expected_gradient)
    assert (gradient[1, 3:] == 0).all()


def test_label_smoothed_loss_gradient_passes_gradcheck_in_float64():
    labels = torch.tensor([[3, 0, 11], [-100, 7, 2]])
    logits = torch.randn(2, 3, 12, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda z: label_smoothed_cross_entropy(z, labels, 0.1)[0], logits)


@pytest.mark.parametrize(
    ("labels", "smoothing", "message"),
    [
        (
            torch.tensor([[1, 12]]),
            0.0,
            r"labels must be in \[0, 12\) \(vocab_size\) or -100 \(ignored\), got labels from 1 to 12",
        ),
        (torch.tensor([[-5, 1]]), 0.0, r"got labels from -5 to 1"),
        (torch.tensor([[1, 2, 3]]), 0.0, r"labels have shape \(1, 3\), but the logits have shape \(1, 2, 12\)"),
        (torch.tensor([[1, 2]]), 1.0, r"label_smoothing must be in \[0, 1\), got 1.0"),
    ],
)
def test_label_smoothed_loss_refuses_bad_labels(labels, smoothing, message):
    with pytest.raises(ValueError, match=message):
        label_smoothed_cross_entropy(torch.randn(1, 2, 12), labels, smoothing)


def test_gradient_checkpointing_gives_the_same_gradients(tiny_config, source_batch):
    input_ids, attention_mask = source_batch
    labels = torch.tensor([[7, 8, 9, 2], [10, 11, 2, -100]])
    grads = []
    for checkpointing in (False, True):
        torch.manual_seed(0)
        model = VaswaniForConditionalGeneration(tiny_config).train()
        if checkpointing:
            model.gradient_checkpointing_enable()
        model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss.backward()
        grads.append({name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        torch.testing.assert_close(grads[0][name], grads[1][name], msg=name)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_loading_runs(tiny_model, source_batch, tmp_path, dtype):
    input_ids, attention_mask = source_batch
    tiny_model.save_pretrained(tmp_path)
    half = VaswaniForConditionalGeneration.from_pretrained(tmp_path, dtype=dtype).eval()
    assert {p.dtype for p in half.parameters()} == {dtype}
    with torch.no_grad():
        logits = half(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=input_ids[:, :4]).logits
    assert logits.dtype == dtype and logits.isfinite().all()


def test_preset_parameter_counts_match_the_paper():
    # Table 3: base 65M and big 213M parameters, with the shared 37000-token vocabulary of section 5.1.
    paper = {"base": (65e6, 0.05), "big": (213e6, 0.02)}
    for preset, (expected, tolerance) in paper.items():
        with torch.device("meta"):
            model = VaswaniForConditionalGeneration(VaswaniConfig.from_preset(preset, vocab_size=37000))
        count = model.num_parameters()
        print(f"{preset}: {count / 1e6:.1f}M parameters (paper: {expected / 1e6:.0f}M)")
        assert abs(count - expected) / expected < tolerance


def test_bare_model_and_encoder_decoder_work_on_their_own(tiny_config, source_batch):
    input_ids, attention_mask = source_batch
    model = VaswaniModel(tiny_config).eval()
    with torch.no_grad():
        full = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=input_ids[:, :3])
        encoded = model.get_encoder()(input_ids=input_ids, attention_mask=attention_mask)
        decoded = model.get_decoder()(
            input_ids=input_ids[:, :3],
            encoder_hidden_states=encoded.last_hidden_state,
            encoder_attention_mask=attention_mask,
        )
    torch.testing.assert_close(full.encoder_last_hidden_state, encoded.last_hidden_state)
    torch.testing.assert_close(full.last_hidden_state, decoded.last_hidden_state)


def test_output_attentions_and_hidden_states(tiny_model, source_batch):
    input_ids, attention_mask = source_batch
    tiny_model.set_attn_implementation("eager")
    with torch.no_grad():
        out = tiny_model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            decoder_input_ids=input_ids[:, :4],
            output_attentions=True,
            output_hidden_states=True,
        )
    layers, heads = tiny_model.config.encoder_layers, tiny_model.config.encoder_attention_heads
    assert len(out.encoder_attentions) == layers and out.encoder_attentions[0].shape == (2, heads, 9, 9)
    assert len(out.decoder_attentions) == layers and out.decoder_attentions[0].shape == (2, heads, 4, 4)
    assert len(out.cross_attentions) == layers and out.cross_attentions[0].shape == (2, heads, 4, 9)
    assert len(out.encoder_hidden_states) == layers + 1 and len(out.decoder_hidden_states) == layers + 1
    # Padded source positions get no attention; future target positions get none either.
    assert out.encoder_attentions[0][1, :, :, 7:].abs().max() == 0
    assert torch.triu(out.decoder_attentions[0][0, 0], diagonal=1).abs().max() == 0


@pytest.mark.parametrize(
    "inputs, message",
    [
        ({"input_ids": torch.tensor([[5, 100, 2]]), "decoder_input_ids": torch.tensor([[1]])}, "vocab_size"),
        ({"input_ids": torch.tensor([[5, -3, 2]]), "decoder_input_ids": torch.tensor([[1]])}, "vocab_size"),
        ({"input_ids": torch.tensor([[5, 6, 2]]), "decoder_input_ids": torch.tensor([[1, 100]])}, "vocab_size"),
        (
            {
                "input_ids": torch.tensor([[5, 6, 2]]),
                "attention_mask": torch.ones(1, 4),
                "decoder_input_ids": torch.tensor([[1]]),
            },
            r"attention_mask has shape \(1, 4\)",
        ),
        (
            {
                "input_ids": torch.tensor([[5, 6, 2]]),
                "decoder_input_ids": torch.tensor([[1, 4]]),
                "decoder_attention_mask": torch.ones(2, 2),
            },
            "decoder_attention_mask has shape",
        ),
        ({"input_ids": torch.zeros(0, 5, dtype=torch.long), "decoder_input_ids": torch.tensor([[1]])}, "non-empty"),
        ({"input_ids": torch.zeros(1, 0, dtype=torch.long), "decoder_input_ids": torch.tensor([[1]])}, "non-empty"),
        (
            {"input_ids": torch.tensor([[5, 6, 2]]), "decoder_input_ids": torch.zeros(1, 0, dtype=torch.long)},
            "non-empty",
        ),
    ],
)
def test_bad_input_gets_a_clear_error(tiny_model, inputs, message):
    with pytest.raises(ValueError, match=message):
        tiny_model(**inputs)
