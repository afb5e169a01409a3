"""The CPU kernels of a one-token decoding step (vaswani/modeling/decoding_kernels.py): the attention kernel is
torch's attention to within float32 rounding (bfloat16's, from bfloat16 inputs), on the shapes and layouts the paper's
searches give it; the decoder layers' kernel gives the layers' modules' output bit for bit; and what a search does
with them."""

import copy
import functools
import types

import pytest
import torch
import torch.nn.functional as F
from test_paper_decoding import padded_sources
from torch.utils import cpp_extension
from transformers.cache_utils import DynamicCache, EncoderDecoderCache

from vaswani.modeling import decoding_kernels, generation_vaswani


@pytest.fixture(scope="module")
def kernel():
    compiled = decoding_kernels.compiled_kernels()
    if compiled is None:
        pytest.skip("no C++ compiler to build the kernels with")
    return compiled.decoding_attention


def beam_cache(rows, heads, length, size, room=7):
    """Keys or values as the beam search's cache holds them: the filled positions of a buffer with room after them."""
    return torch.randn(rows, heads, length + room, size)[:, :, :length]


@pytest.mark.parametrize("length", [1, 5, 37])
@pytest.mark.parametrize("key_size, value_size", [(8, 8), (8, 12), (64, 64), (48, 80)])
def test_self_attention_step_equals_torchs(kernel, length, key_size, value_size):
    """One query per row against a cache with room after its positions (strided), d_v apart from d_k (Table 3, row
    (B)), with and without a padding mask: torch's kernel's output, as (rows, 1, heads, d_v). Sizes the kernel takes
    sixteen or 64 numbers at a time (the paper's 64), with and without a rest, and sizes below them."""
    query = torch.randn(6, 1, 3 * key_size).view(6, 1, 3, key_size).transpose(1, 2)  # as the projection's view gives
    key, value = beam_cache(6, 3, length, key_size), beam_cache(6, 3, length, value_size)
    mask = torch.rand(6, 1, 1, length) > 0.3
    mask[..., 0] = True
    for attention_mask in (None, mask):
        expected = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, scale=0.3)
        got = kernel(query, key, value, attention_mask, 0.3)
        assert got.shape == (6, 1, 3, value_size) and got.is_contiguous()
        torch.testing.assert_close(got, expected.transpose(1, 2), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mask_rows", [1, 4])
def test_encoder_decoder_attention_of_a_sentences_hypotheses_equals_torchs(kernel, mask_rows):
    """A sentence's 4 hypotheses as one sequence of queries against its encoder output's keys and values
    (projections viewed per head), with a padding mask shared by the hypotheses or one per hypothesis."""
    sentences, length = 5, 11
    query = torch.randn(sentences, 4, 16).view(sentences, 4, 2, 8).transpose(1, 2)
    key = torch.randn(sentences, length, 16).view(sentences, length, 2, 8).transpose(1, 2)
    value = torch.randn(sentences, length, 16).view(sentences, length, 2, 8).transpose(1, 2)
    mask = torch.ones(sentences, 1, mask_rows, length, dtype=torch.bool)
    mask[1, ..., 7:] = False
    mask[3, ..., -1] = False
    expected = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=8**-0.5)
    got = kernel(query, key, value, mask, 8**-0.5)
    torch.testing.assert_close(got, expected.transpose(1, 2), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("size", [8, 64])
def test_bfloat16_attention_is_float32_attention_of_the_same_values_rounded_once(kernel, size):
    """From bfloat16 queries, keys and values, a step's self-attention and a sentence's hypotheses' encoder-decoder
    attention, as the bfloat16 searches give them: float32 attention of the same values, rounded once to bfloat16
    (within that rounding: the float32 sums, added in another order, may fall on either side of it)."""
    query = torch.randn(6, 1, 3 * size).view(6, 1, 3, size).transpose(1, 2).bfloat16()
    key, value = beam_cache(6, 3, 21, size).bfloat16(), beam_cache(6, 3, 21, size + 4).bfloat16()
    cross = torch.randn(3, 4, 2 * size).view(3, 4, 2, size).transpose(1, 2).bfloat16()
    source = torch.randn(3, 9, 2 * size).view(3, 9, 2, size).transpose(1, 2).bfloat16()
    mask = torch.ones(3, 1, 1, 9, dtype=torch.bool)
    mask[1, ..., 5:] = False
    for q, k, v, m in ((query, key, value, None), (cross, source, source, mask)):
        expected = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=m, scale=0.3)
        got = kernel(q, k, v, m, 0.3)
        assert got.dtype == torch.bfloat16 and got.is_contiguous()
        torch.testing.assert_close(got.float(), expected.transpose(1, 2), rtol=2**-8, atol=1e-6)


def test_the_kernel_names_what_it_refuses(kernel):
    query, key = torch.randn(2, 2, 1, 8), torch.randn(2, 2, 3, 8)
    with pytest.raises(RuntimeError, match="must be all float32 or all bfloat16"):
        kernel(query.double(), key.double(), key.double(), None, 1.0)
    with pytest.raises(RuntimeError, match="must be all float32 or all bfloat16"):
        kernel(query, key.bfloat16(), key.bfloat16(), None, 1.0)
    with pytest.raises(RuntimeError, match="bool"):
        kernel(query, key, key, torch.zeros(2, 1, 1, 3), 1.0)
    with pytest.raises(RuntimeError, match="shapes do not match"):
        kernel(query, key, torch.randn(2, 2, 4, 8), None, 1.0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_copy_cache_rows_moves_the_filled_positions_of_the_rows_asked_and_nothing_else(kernel, dtype):
    """Within a cache buffer (a beam search's moved rows) and into another (the rows kept where sentences leave), as
    torch's index_copy_ and index_select do: the filled positions of every head, keys and values; the other rows and
    the room after the filled positions untouched."""
    copy_rows = decoding_kernels.compiled_kernels().copy_cache_rows
    buffer = torch.randn(2, 6, 3, 9, 5).to(dtype)
    expected = buffer.clone()
    sources, targets = torch.tensor([4, 0, 4]), torch.tensor([1, 3, 5])
    expected[:, targets, :, :7] = buffer[:, sources, :, :7]
    copy_rows(buffer, buffer, sources, targets, 7)
    assert torch.equal(buffer, expected)
    kept = torch.tensor([5, 2, 2])
    fewer = torch.zeros(2, 3, 3, 9, 5, dtype=dtype)
    copy_rows(buffer, fewer, kept, torch.arange(3), 7)
    assert torch.equal(fewer[:, :, :, :7], buffer[:, kept, :, :7]) and not fewer[:, :, :, 7:].any()
    with pytest.raises(RuntimeError, match="out of the buffers' rows"):
        copy_rows(buffer, fewer, torch.tensor([6]), torch.tensor([0]), 7)
    with pytest.raises(RuntimeError, match="room"):
        copy_rows(buffer, fewer, kept, torch.arange(3), 10)


def torch_continuations(monkeypatch, *args):
    """`best_continuations` as torch's operators compute it, where the kernels cannot be built."""
    with monkeypatch.context() as patch:
        patch.setattr(generation_vaswani, "compiled_kernels", lambda: None)
        return generation_vaswani.best_continuations(*args)


@pytest.mark.parametrize("width, vocab_size, count", [(4, 8000, 8), (4, 37, 8), (3, 130, 5), (1, 64, 2), (2, 3, 6)])
def test_the_best_continuations_kernel_gives_torchs_scores_rows_and_ids(kernel, monkeypatch, width, vocab_size, count):
    """Without equal scores, the kernel's best continuations are torch's top-k's, ordered as the search orders them:
    the same scores, best first, rows and ids (hypothesis * vocabulary + token), each row extending the hypothesis it
    holds; vocabularies the kernel reads 64 tokens at a time, with and without a rest, and below that."""
    generator = torch.Generator().manual_seed(width * vocab_size + count)
    sentences = 5
    log_probs = torch.randn(sentences, width, vocab_size, generator=generator).log_softmax(-1)
    row_scores = -torch.rand(sentences, width, generator=generator) * 10
    row_scores[0, 1:] = -float("inf")  # the first step: one live hypothesis
    held = torch.stack([torch.randperm(width, generator=generator) for _ in range(sentences)])
    got = generation_vaswani.best_continuations(log_probs, row_scores, held, count)
    expected = torch_continuations(monkeypatch, log_probs, row_scores, held, count)
    for got_tensor, expected_tensor in zip(got, expected, strict=True):
        assert torch.equal(got_tensor, expected_tensor)
    scores, rows, ids = got
    assert torch.equal(held.gather(1, rows), ids // vocab_size)
    sentence = torch.arange(sentences)[:, None]
    assert torch.equal(scores, row_scores[sentence, rows] + log_probs[sentence, rows, ids % vocab_size])
    assert (scores[:, :-1] >= scores[:, 1:]).all()
    # Scores in float64 (torch's default dtype set so) are summed in float64, by torch.
    wide = generation_vaswani.best_continuations(log_probs, row_scores.double(), held, count)
    assert wide[0].dtype == torch.float64 and torch.equal(wide[2], ids)


def test_equal_continuations_come_by_hypothesis_then_token_and_forced_endings_score_minus_infinity(kernel):
    """Where scores are equal, also at the last place kept, the earlier hypothesis, then the lower token, comes first:
    rows that hold the hypotheses in another order do not change it. An ending forced where no processor allowed one
    (the lowest float) is a candidate of no probability: -inf, after every real one, ordered as the others."""
    log_probs = torch.full((1, 3, 5), -1.0)
    held = torch.tensor([[2, 0, 1]])
    scores, rows, ids = generation_vaswani.best_continuations(log_probs, torch.zeros(1, 3), held, 7)
    assert torch.equal(ids, torch.arange(7)[None]) and torch.equal(rows, torch.tensor([[1, 1, 1, 1, 1, 2, 2]]))
    assert torch.equal(scores, torch.full((1, 7), -1.0))
    lowest = torch.finfo(torch.float32).min
    log_probs = torch.tensor([[[-0.5, lowest, -float("inf")], [lowest, -2.0, lowest]]])
    scores, rows, ids = generation_vaswani.best_continuations(log_probs, torch.tensor([[-1.0, 0.0]]), held[:, 1:], 5)
    assert scores.tolist() == [[-1.5, -2.0, -float("inf"), -float("inf"), -float("inf")]]
    assert ids.tolist() == [[0, 4, 1, 3, 5]] and rows.tolist() == [[0, 1, 0, 1, 1]]


def searched(model, input_ids, monkeypatch, kernel_built=True, layers_kernel=True, output_scores=True, **options):
    """generate()'s output, and the shapes of the queries of the attention kernel's calls it made, with the number of
    the layers kernel's calls (from torch's profiler, where the kernels show); `kernel_built=False`: as where they
    cannot be built; `layers_kernel=False`: the layers' modules compute every step."""
    with monkeypatch.context() as patch, torch.profiler.profile(record_shapes=True) as profile:
        if not kernel_built:
            patch.setattr(generation_vaswani, "compiled_kernels", lambda: None)
        if not layers_kernel:
            patch.setattr(generation_vaswani.DecoderLayersStep, "__call__", lambda *args, **kwargs: None)
        output = model.generate(input_ids, return_dict_in_generate=True, output_scores=output_scores, **options)
    events = profile.key_averages(group_by_input_shape=True)
    queries = [
        event.input_shapes[0]
        for event in events
        for _ in range(event.count)
        if event.key == "vaswani::decoding_attention"
    ]
    return output, queries, sum(event.count for event in events if event.key == "vaswani::decoder_layers_step")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("num_beams", [4, 1])
def test_the_paper_searches_attend_with_the_kernel_at_each_step_and_decode_as_with_torchs(
    kernel, trained_tiny_model, translation_pairs, monkeypatch, num_beams, dtype
):
    """The paper's searches on the CPU, in float32 and bfloat16, compute every one-token step's self-attention and
    encoder-decoder attention with the kernel, a sentence's hypotheses together; the translations are those of
    torch's kernel (and in float32 the scores), and the model's attention is transformers' own again after the
    search."""
    input_ids, attention_mask = padded_sources(translation_pairs)
    options = {"attention_mask": attention_mask, "num_beams": num_beams}
    trained_tiny_model = copy.deepcopy(trained_tiny_model).to(dtype)
    with torch.no_grad():
        fast, queries, _ = searched(trained_tiny_model, input_ids, monkeypatch, **options)
        plain, no_queries, no_steps = searched(
            trained_tiny_model, input_ids, monkeypatch, kernel_built=False, **options
        )
    layers = trained_tiny_model.config.decoder_layers
    assert not no_queries and not no_steps and len(queries) == 2 * layers * len(fast.scores)  # the start token's too
    assert {shape[2] for shape in queries} == {1, num_beams}  # one query a row; a sentence's hypotheses together
    assert torch.equal(fast.sequences, plain.sequences)
    if dtype == torch.float32:  # in bfloat16 the two kernels round apart, and the step's scores with them
        torch.testing.assert_close(torch.stack(fast.scores), torch.stack(plain.scores))
    assert all(
        module.step_attention is None for module in trained_tiny_model.modules() if hasattr(module, "step_attention")
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("num_beams", [4, 1])
def test_the_paper_searches_step_the_decoder_layers_in_one_kernel_call_bit_for_bit(
    kernel, trained_tiny_model, translation_pairs, monkeypatch, num_beams, dtype
):
    """Every step after the start token's runs the decoder's layers as one call of the layers kernel, sentences
    leaving the search and the cache growing past its room meanwhile; the translations are those of the layers'
    modules, and the beam search's scores of every step are theirs bit for bit, in float32 and bfloat16 (greedy
    search returns scores for every row, which keeps the batch whole and the layers to their modules); the decoder's
    layers are its modules again after the search."""
    input_ids, attention_mask = padded_sources(translation_pairs)
    options = {"attention_mask": attention_mask, "num_beams": num_beams, "output_scores": num_beams > 1}
    trained_tiny_model = copy.deepcopy(trained_tiny_model).to(dtype)
    monkeypatch.setattr(generation_vaswani.BeamSearchCacheLayer, "room", 2)
    with torch.no_grad():
        fast, _, steps = searched(trained_tiny_model, input_ids, monkeypatch, **options)
        plain, _, no_steps = searched(trained_tiny_model, input_ids, monkeypatch, layers_kernel=False, **options)
    # Greedy search's rows grow by a token a call, the start token's first.
    decoder_calls = len(fast.scores) if num_beams > 1 else fast.sequences.shape[1] - 1
    assert steps == decoder_calls - 1 and no_steps == 0
    assert decoder_calls > 2 * generation_vaswani.BeamSearchCacheLayer.room  # the buffer grew, twice at least
    assert torch.equal(fast.sequences, plain.sequences)
    if num_beams > 1:
        assert all(torch.equal(a, b) for a, b in zip(fast.scores, plain.scores, strict=True))
    assert trained_tiny_model.get_decoder().step_layers is None


def test_a_hook_or_recorded_hidden_states_leave_the_steps_to_the_layers_modules(
    kernel, trained_tiny_model, translation_pairs, monkeypatch
):
    """A forward hook on one of the decoder's modules runs at every step of a search, and a step asked for the layers'
    hidden states returns every layer's: the layers kernel, which would skip both, computes neither step."""
    input_ids, attention_mask = padded_sources(translation_pairs)
    calls = []
    handle = (
        trained_tiny_model.get_decoder()
        .layers[-1]
        .feed_forward.fc1.register_forward_hook(lambda *args: calls.append(1))
    )
    try:
        with torch.no_grad():
            hooked, _, steps = searched(trained_tiny_model, input_ids, monkeypatch, attention_mask=attention_mask)
    finally:
        handle.remove()
    assert steps == 0 and len(calls) == len(hooked.scores)

    cache = EncoderDecoderCache(generation_vaswani.BeamSearchCache(), DynamicCache())
    with torch.no_grad(), generation_vaswani.cpu_step_kernels(trained_tiny_model, True):
        encoder_outputs = trained_tiny_model.get_encoder()(input_ids=input_ids, attention_mask=attention_mask)
        start = torch.ones(input_ids.shape[0], 1, dtype=torch.long)
        step = {
            "encoder_outputs": encoder_outputs,
            "attention_mask": attention_mask,
            "cache": cache,
            "use_cache": True,
        }
        trained_tiny_model(decoder_input_ids=start, **step)
        with torch.profiler.profile() as profile:
            output = trained_tiny_model(decoder_input_ids=start, output_hidden_states=True, **step)
    assert not [event for event in profile.key_averages() if event.key == "vaswani::decoder_layers_step"]
    assert len(output.decoder_hidden_states) == trained_tiny_model.config.decoder_layers + 1


def test_a_step_reads_the_padding_masks_as_the_modules_masks_and_leaves_a_4d_mask_to_them(
    kernel, trained_tiny_model, translation_pairs, monkeypatch
):
    """A one-token step of decoder prompts of unequal lengths (left-padded) against padded sources: the layers kernel
    reads the two padding masks as the causal and encoder masks transformers builds for the modules, so the step's
    logits are the modules' bit for bit. A 4D mask of the caller's own is left to the modules."""
    input_ids, attention_mask = padded_sources(translation_pairs)
    rows = input_ids.shape[0]
    prompts = torch.tensor([[0, 0, 1], [1, 5, 6], [0, 1, 7]])
    prompt_mask = (torch.arange(3) >= torch.tensor([[2], [0], [1]])).long()
    step_mask = torch.cat((prompt_mask, torch.ones(rows, 1, dtype=torch.long)), 1)

    def step(layers_kernel, mask):
        cache = EncoderDecoderCache(generation_vaswani.BeamSearchCache(), DynamicCache())
        with monkeypatch.context() as patch, torch.no_grad():
            if not layers_kernel:
                patch.setattr(generation_vaswani.DecoderLayersStep, "__call__", lambda *args, **kwargs: None)
            with generation_vaswani.cpu_step_kernels(trained_tiny_model, True):
                encoder_outputs = trained_tiny_model.get_encoder()(input_ids=input_ids, attention_mask=attention_mask)
                inputs = {"encoder_outputs": encoder_outputs, "attention_mask": attention_mask, "cache": cache}
                trained_tiny_model(decoder_input_ids=prompts, decoder_attention_mask=prompt_mask, **inputs)
                with torch.profiler.profile() as profile:
                    output = trained_tiny_model(
                        decoder_input_ids=torch.tensor([[8], [9], [10]]), decoder_attention_mask=mask, **inputs
                    )
        calls = sum(event.count for event in profile.key_averages() if event.key == "vaswani::decoder_layers_step")
        return output.logits, calls

    (fast, calls), (plain, no_calls) = step(True, step_mask), step(False, step_mask)
    assert calls == 1 and no_calls == 0 and torch.equal(fast, plain)
    additive = torch.zeros(rows, 1, 1, 4).masked_fill(step_mask[:, None, None, :] == 0, -float("inf"))
    (four_d, calls), (modules, _) = step(True, additive), step(False, additive)
    assert calls == 0 and torch.equal(four_d, modules)


def test_eager_attention_keeps_transformers_attention(trained_tiny_model, translation_pairs, monkeypatch):
    """A model set to eager attention (for its weights) decodes with it, not with the kernel."""
    input_ids, attention_mask = padded_sources(translation_pairs)
    eager = copy.deepcopy(trained_tiny_model)
    eager.set_attn_implementation("eager")
    with torch.no_grad():
        _, queries, _ = searched(eager, input_ids, monkeypatch, attention_mask=attention_mask)
    assert not queries


def test_where_the_kernel_cannot_be_built_decoding_warns_once_and_uses_torchs(
    trained_tiny_model, translation_pairs, monkeypatch
):
    """No compiler (torch's extension builder fails): a warning that names the cause, and the search decodes with
    torch's attention."""

    def no_compiler(*args, **kwargs):
        raise RuntimeError("Error building extension: c++: command not found")

    uncached = functools.cache(decoding_kernels.compiled_kernels.__wrapped__)
    monkeypatch.setattr(cpp_extension, "load_inline", no_compiler)
    monkeypatch.setattr(generation_vaswani, "compiled_kernels", uncached)
    input_ids, attention_mask = padded_sources(translation_pairs)
    with pytest.warns(UserWarning, match="c\\+\\+: command not found"), torch.no_grad():
        output, queries, steps = searched(trained_tiny_model, input_ids, monkeypatch, attention_mask=attention_mask)
    assert not queries and not steps and output.sequences.shape[0] == input_ids.shape[0]


def test_each_torch_version_and_instruction_set_builds_a_kernel_of_its_own(monkeypatch):
    """torch's extension cache tells builds apart by name: a build for another torch (or other CPU instructions,
    where a cache is shared by machines) must never be loaded, so each has a name of its own."""
    names = []

    def recording(name, **kwargs):
        names.append(name)
        return types.SimpleNamespace()

    monkeypatch.setattr(cpp_extension, "load_inline", recording)
    for version, capability in (("2.13.0+cpu", "AVX2"), ("2.15.0+cu128", "AVX2"), ("2.13.0+cpu", "AVX512")):
        monkeypatch.setattr(torch, "__version__", version)
        monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
        decoding_kernels.compiled_kernels.__wrapped__()
    assert len(set(names)) == 3 and all(name.isidentifier() for name in names)
