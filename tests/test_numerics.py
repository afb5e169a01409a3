"""Numerical safety: finite outputs in every dtype, and padding that never leaks into real positions.

Masks add the dtype's most negative number rather than -inf, so that a row with nothing to attend to (an all-padding
sentence) stays finite in float16 and bfloat16 instead of turning into NaN.
"""

import functools

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from vaswani import VaswaniConfig, VaswaniForConditionalGeneration


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
