"""Numerical safety: finite outputs in every dtype, padding that never leaks into real positions, half precision
close to float32, and a mixed-precision training step.

Masks add the dtype's most negative number rather than -inf, so that a row with nothing to attend to (an all-padding
sentence) stays finite in float16 and bfloat16 instead of turning into NaN.
"""

import functools

import pytest
import torch
from helpers import VOCAB_SIZE, pad_pairs
from hypothesis import given, settings
from hypothesis import strategies as st

from vaswani import VaswaniConfig, VaswaniForConditionalGeneration
from vaswani.modeling.modeling_vaswani import VaswaniSinusoidalPositionalEncoding


VOCAB = 50


@functools.cache
def model_for(dtype: torch.dtype, implementation: str) -> VaswaniForConditionalGeneration:
    torch.manual_seed(0)
    config = VaswaniConfig.from_preset("tiny", vocab_size=VOCAB, max_position_embeddings=64)
    model = VaswaniForConditionalGeneration(config).eval().to(dtype)
    model.set_attn_implementation(implementation)
    return model


@st.composite
def padded_batches(draw):
    batch = draw(st.integers(1, 3))
    source_length = draw(st.integers(1, 12))
    target_length = draw(st.integers(1, 8))
    # Each sentence keeps a prefix of real tokens; a length of 0 is an all-padding sentence.
    lengths = draw(st.lists(st.integers(0, source_length), min_size=batch, max_size=batch))
    seed = draw(st.integers(0, 2**16))
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(3, VOCAB, (batch, source_length), generator=generator)
    attention_mask = (torch.arange(source_length)[None] < torch.tensor(lengths)[:, None]).long()
    decoder_input_ids = torch.randint(3, VOCAB, (batch, target_length), generator=generator)
    decoder_input_ids[:, 0] = 1
    return input_ids, attention_mask, decoder_input_ids


@settings(max_examples=40, deadline=None)
@given(
    batch=padded_batches(),
    dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]),
    implementation=st.sampled_from(["eager", "sdpa"]),
)
def test_outputs_are_finite_and_padding_never_influences_real_positions(batch, dtype, implementation):
    input_ids, attention_mask, decoder_input_ids = batch
    model = model_for(dtype, implementation)
    with torch.no_grad():
        out = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids)
        assert out.logits.isfinite().all() and out.encoder_last_hidden_state.isfinite().all()

        scrambled = torch.where(attention_mask.bool(), input_ids, (input_ids * 7 + 3) % (VOCAB - 3) + 3)
        again = model(input_ids=scrambled, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids)
    has_source = attention_mask.any(dim=1)
    real = attention_mask.bool()
    assert torch.equal(out.encoder_last_hidden_state[real], again.encoder_last_hidden_state[real])
    assert torch.equal(out.logits[has_source], again.logits[has_source])


@settings(max_examples=15, deadline=None)
@given(batch=padded_batches(), dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]))
def test_future_target_tokens_never_influence_earlier_ones(batch, dtype):
    input_ids, attention_mask, decoder_input_ids = batch
    model = model_for(dtype, "sdpa")
    last = decoder_input_ids.shape[1] - 1
    changed = decoder_input_ids.clone()
    changed[:, last] = (changed[:, last] + 1) % (VOCAB - 3) + 3
    with torch.no_grad():
        before = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids)
        after = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=changed)
    assert torch.equal(before.logits[:, :last], after.logits[:, :last])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_half_precision_positional_encoding_is_float32s_rounded_once(dtype):
    """Computed in float32 and only then rounded: in half precision itself, pos / 10000^(2i/d_model) loses about
    0.2 radians at position 100 in bfloat16 (and positions above 2048 are not even integers in float16)."""
    encoding = VaswaniSinusoidalPositionalEncoding(VaswaniConfig.from_preset("tiny", vocab_size=VOCAB))
    positions = torch.arange(1024)
    assert torch.equal(encoding(positions, dtype), encoding(positions, torch.float32).to(dtype))


@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_half_precision_logits_match_float32(trained_tiny_model, translation_pairs, tmp_path, dtype, implementation):
    """Loaded with `dtype=`, the trained model gives float32's logits to within 3 roundings of the largest logit,
    3 * eps(dtype) * max |logit| (0.23 in bfloat16, 0.029 in float16; measured at most 1 rounding, on the pairs it
    was trained on and on 100 random tokens), and the same translations."""
    input_ids, attention_mask, labels = pad_pairs(translation_pairs)
    generator = torch.Generator().manual_seed(5)
    batches = [
        {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "decoder_input_ids": trained_tiny_model.prepare_decoder_input_ids_from_labels(labels),
        },
        {  # positions up to 100, where rounding the positional encoding would show
            "input_ids": torch.randint(3, VOCAB_SIZE, (2, 100), generator=generator),
            "decoder_input_ids": torch.randint(3, VOCAB_SIZE, (2, 100), generator=generator),
        },
    ]
    trained_tiny_model.save_pretrained(tmp_path)
    half = VaswaniForConditionalGeneration.from_pretrained(tmp_path, dtype=dtype, attn_implementation=implementation)
    half.eval()
    assert {p.dtype for p in half.parameters()} == {dtype}
    for batch in batches:
        with torch.no_grad():
            expected = trained_tiny_model(**batch).logits
            logits = half(**batch).logits
        assert logits.dtype == dtype
        tolerance = 3 * torch.finfo(dtype).eps * expected.abs().max().item()
        torch.testing.assert_close(logits.float(), expected, atol=tolerance, rtol=0)
    greedy = {"attention_mask": attention_mask, "num_beams": 1, "max_new_tokens": 12}
    assert torch.equal(half.generate(input_ids, **greedy), trained_tiny_model.generate(input_ids, **greedy))


def test_bfloat16_autocast_training_step_on_the_cpu(tiny_config, translation_pairs):
    """Mixed precision as `accelerate launch --mixed_precision bf16` runs it on a CPU: the matrix products in
    bfloat16 under autocast, the weights, their gradients and the optimizer in float32."""
    input_ids, attention_mask, labels = pad_pairs(translation_pairs)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = VaswaniForConditionalGeneration(tiny_config).train()
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    with torch.no_grad():
        float32_loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels)
    assert out.logits.dtype == torch.bfloat16, "autocast should run the output projection in bfloat16"
    assert out.loss.dtype == torch.float32
    torch.testing.assert_close(out.loss, float32_loss, rtol=1e-2, atol=0)
    out.loss.backward()
    optimizer.step()
    for name, parameter in model.named_parameters():
        assert parameter.grad.dtype == torch.float32 and parameter.grad.isfinite().all(), name
        assert parameter.dtype == torch.float32 and parameter.isfinite().all(), name
        assert not torch.equal(parameter, before[name]), f"{name} did not change"
