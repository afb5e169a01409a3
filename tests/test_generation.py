"""generate(): the paper's decoding defaults (section 6.1), the KV cache, padding, and attention kernels.

The cache and padding tests decode with `trained_tiny_model` (conftest.py), trained to translate a handful of pairs:
its logits change from step to step and from sentence to sentence, so that a decoding bug shows in them (an untrained
model emits nearly the same token at every step, whatever its cache holds). They compare the raw logits of every
step, not only the tokens, against decoding without the shortcut under test: no cache, or each sentence alone.

Runs on the GPU too: `python -m pytest tests/test_generation.py --device cuda --dtype bfloat16` (see conftest.py).
"""

import itertools

import pytest
import torch
from helpers import pad_pairs, word_tokenizer
from transformers import DynamicCache, EncoderDecoderCache

from vaswani import VaswaniForConditionalGeneration


DECODING = {
    "greedy": {"num_beams": 1},
    "paper beam": {"num_beams": 4, "length_penalty": 0.6},
    "transformers beam": {"num_beams": 4, "length_penalty": 0.6, "paper_decoding": False},
    # A high temperature takes the model off the paths it was trained on: the sampled tokens vary with the seed.
    "sample": {"num_beams": 1, "do_sample": True, "top_k": 0, "temperature": 2.0},
}
CACHES = {"dynamic": {}, "static": {"cache_implementation": "static", "disable_compile": True}}
MAX_NEW_TOKENS = 12
SEED = 1234


@pytest.fixture
def model(trained_tiny_model, device, dtype):
    return trained_tiny_model.to(device=device, dtype=dtype)


@pytest.fixture
def padded_batch(translation_pairs, device):
    """Three sources of 4, 7 and 9 tokens as one right-padded batch: (input_ids, attention_mask)."""
    input_ids, attention_mask, _ = pad_pairs([translation_pairs[i] for i in (0, 4, 7)])
    return input_ids.to(device), attention_mask.to(device)


def tolerance(dtype):
    # float32: a cached step multiplies one query by the cached keys, an uncached one every query by every key;
    # sums in another order differ by a few 1e-6 on logits up to about 10.
    return {"atol": 1e-5, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 0.3, "rtol": 3e-2}


def decode(model, input_ids, attention_mask=None, decoding="greedy", **kwargs):
    """generate() with the seed fixed: (sequences, raw logits of every step stacked, shape (steps, rows, vocab))."""
    options = {"max_new_tokens": MAX_NEW_TOKENS, **DECODING[decoding], **kwargs}
    with torch.random.fork_rng():
        torch.manual_seed(SEED)
        out = model.generate(
            input_ids, attention_mask=attention_mask, return_dict_in_generate=True, output_logits=True, **options
        )
    return out.sequences, torch.stack(out.logits)


def assert_same_decoding(tokens, logits, expected_tokens, expected_logits, dtype, beams=1):
    """Logits first, step by step: where they differ tells more than the first differing token does.

    The beams of one sentence are compared as a set: two beams whose scores tie to within rounding may be kept in
    either order, which swaps their rows of logits without changing any hypothesis.
    """
    steps = min(len(logits), len(expected_logits))
    for step in range(steps):
        rows, expected_rows = logits[step].unflatten(0, (-1, beams)), expected_logits[step].unflatten(0, (-1, beams))
        for sentence, (beam_logits, expected_beam_logits) in enumerate(zip(rows, expected_rows)):
            if beams > 1:
                distance = (beam_logits[:, None] - expected_beam_logits[None]).abs().amax(-1)
                order = min(
                    itertools.permutations(range(beams)), key=lambda order: distance[order, range(beams)].max()
                )
                beam_logits = beam_logits[list(order)]
            torch.testing.assert_close(
                beam_logits,
                expected_beam_logits,
                **tolerance(dtype),
                msg=lambda m: f"decoding step {step}, sentence {sentence}: {m}",
            )
    assert len(logits) == len(expected_logits), "a different number of decoding steps"
    assert torch.equal(tokens, expected_tokens)


def test_default_generation_config_is_the_papers(tiny_model):
    config = tiny_model.generation_config
    assert config.num_beams == 4 and config.length_penalty == 0.6
    # The model's special ids, so that a generation_config.json saved alone describes the same tokens.
    assert (config.bos_token_id, config.decoder_start_token_id, config.eos_token_id, config.pad_token_id) == (
        1,
        1,
        2,
        0,
    )


def test_output_length_is_limited_to_source_length_plus_50(tiny_model, source_batch):
    input_ids, attention_mask = source_batch
    # A random model rarely emits end-of-sentence, so it runs to the limit: the start token + (9 + 50) tokens.
    tiny_model.generation_config.eos_token_id = None
    output = tiny_model.generate(input_ids, attention_mask=attention_mask, num_beams=1)
    assert output.shape == (2, 1 + 9 + 50)
    assert tiny_model.generate(input_ids, attention_mask=attention_mask, max_new_tokens=5).shape == (2, 6)


def test_trained_model_translates_each_pair_differently(trained_tiny_model, translation_pairs):
    """The model the cache tests rely on: right translations, which differ from each other and from step to step."""
    input_ids, attention_mask, labels = pad_pairs(translation_pairs)
    output = trained_tiny_model.generate(input_ids, attention_mask=attention_mask, num_beams=1, max_new_tokens=12)
    translations = [row[1 : row.tolist().index(2) + 1].tolist() for row in output]
    assert translations == [target for _, target in translation_pairs]
    assert len({tuple(translation) for translation in translations}) == len(translations)
    assert all(len(set(translation)) >= len(translation) - 2 for translation in translations)


def skip_transformers_beam_search_in_bfloat16_on_a_cpu(decoding, dtype, device):
    """transformers' own beam search in bfloat16 on a CPU: on CPUs whose bfloat16 matrix products round differently
    (seen on an AMD EPYC), a cached and an uncached step, or a left- and a right-padded batch, differ by a few units in
    the last place, which transformers' beam search carries from step to step past any bfloat16 tolerance. The paper's beam search, greedy decoding and sampling are compared in
    bfloat16 everywhere, transformers' beam search in float32 and on GPUs."""
    if decoding == "transformers beam" and dtype == torch.bfloat16 and device.type == "cpu":
        pytest.skip("transformers' beam search drifts past bfloat16's tolerance on some CPUs (see the docstring)")


@pytest.mark.parametrize("cache", CACHES)
@pytest.mark.parametrize("decoding", DECODING)
def test_cache_gives_the_logits_of_decoding_without_it(model, padded_batch, dtype, decoding, cache, device):
    skip_transformers_beam_search_in_bfloat16_on_a_cpu(decoding, dtype, device)
    input_ids, attention_mask = padded_batch
    expected = decode(model, input_ids, attention_mask, decoding, use_cache=False)
    tokens, logits = decode(model, input_ids, attention_mask, decoding, use_cache=True, **CACHES[cache])
    assert_same_decoding(tokens, logits, *expected, dtype, DECODING[decoding]["num_beams"])


def left_padded(input_ids, attention_mask):
    """The same sentences padded on the left, as tokenizers with padding_side="left" give them."""
    lengths = attention_mask.sum(1)
    order = torch.argsort(attention_mask, dim=1, stable=True)  # padding first, then the tokens in their order
    assert torch.equal(lengths, attention_mask.gather(1, order).sum(1))
    return input_ids.gather(1, order), attention_mask.gather(1, order)


@pytest.mark.parametrize("cache", ["none", *CACHES])
@pytest.mark.parametrize("decoding", DECODING)
def test_the_padding_side_never_changes_a_translation(model, padded_batch, dtype, decoding, cache, device):
    """Positions count from each sentence's first token (fairseq's make_positions), not from the batch's."""
    skip_transformers_beam_search_in_bfloat16_on_a_cpu(decoding, dtype, device)
    input_ids, attention_mask = padded_batch
    options = {"use_cache": False} if cache == "none" else CACHES[cache]
    expected = decode(model, input_ids, attention_mask, decoding, **options)
    left = decode(model, *left_padded(input_ids, attention_mask), decoding, **options)
    assert_same_decoding(*left, *expected, dtype, DECODING[decoding]["num_beams"])


def left_padded_prompts(model, translation_pairs):
    """Two sources and their forced target prefixes of 1 and 4 tokens, and the batch of both: the prefixes padded on
    the left, with their mask."""
    device = model.device
    start = model.config.decoder_start_token_id
    sources = [translation_pairs[i][0] for i in (1, 6)]
    prompts = [[start], [start, *translation_pairs[6][1][:3]]]
    width = max(map(len, prompts))
    batch_ids, batch_mask, _ = (t.to(device) for t in pad_pairs([(source, [2]) for source in sources]))
    decoder_input_ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts], device=device)
    decoder_attention_mask = torch.arange(width, device=device) >= width - torch.tensor([1, 4], device=device)[:, None]
    return sources, prompts, width, batch_ids, batch_mask, decoder_input_ids, decoder_attention_mask


@pytest.mark.parametrize("cache", ["none", *CACHES])
def test_a_left_padded_decoder_prompt_decodes_as_each_prompt_alone(model, translation_pairs, dtype, cache):
    """Forced target prefixes of different lengths in one batch: each continues as it does alone."""
    device = model.device
    sources, prompts, width, batch_ids, batch_mask, decoder_input_ids, decoder_attention_mask = left_padded_prompts(
        model, translation_pairs
    )
    options = {"use_cache": False} if cache == "none" else CACHES[cache]
    tokens, logits = decode(
        model,
        batch_ids,
        batch_mask,
        decoder_input_ids=decoder_input_ids,
        decoder_attention_mask=decoder_attention_mask.long(),
        **options,
    )
    for row, (source, prompt) in enumerate(zip(sources, prompts)):
        alone_tokens, alone_logits = decode(
            model, torch.tensor([source], device=device), decoder_input_ids=torch.tensor([prompt], device=device)
        )
        steps = len(alone_logits)
        torch.testing.assert_close(logits[:steps, row], alone_logits[:, 0], **tolerance(dtype))
        assert torch.equal(tokens[row, width - len(prompt) :][: alone_tokens.shape[1]], alone_tokens[0])


@pytest.mark.parametrize("cache", ["none", *CACHES])
def test_the_papers_beam_search_continues_a_left_padded_decoder_prompt_as_each_prompt_alone(
    model, translation_pairs, cache
):
    """The decoder's padding mask and positions grow with every step of the paper's beam search, as in generate()'s
    own decoding methods: forced prefixes of different lengths in one batch each give the translation they give
    alone."""
    device = model.device
    sources, prompts, width, batch_ids, batch_mask, decoder_input_ids, decoder_attention_mask = left_padded_prompts(
        model, translation_pairs
    )
    options = {"use_cache": False} if cache == "none" else CACHES[cache]
    tokens, _ = decode(
        model,
        batch_ids,
        batch_mask,
        "paper beam",
        decoder_input_ids=decoder_input_ids,
        decoder_attention_mask=decoder_attention_mask.long(),
        **options,
    )
    for row, (source, prompt) in enumerate(zip(sources, prompts)):
        alone, _ = decode(
            model,
            torch.tensor([source], device=device),
            decoding="paper beam",
            decoder_input_ids=torch.tensor([prompt], device=device),
        )
        assert torch.equal(tokens[row, width - len(prompt) :][: alone.shape[1]], alone[0])


@pytest.mark.parametrize("decoding", ["greedy", "sample"])
def test_generation_continues_from_the_cache_it_returned(model, padded_batch, dtype, decoding):
    """generate(decoder_input_ids=earlier.sequences, cache=earlier.cache) goes on as one longer call would (sampling:
    from the same random stream)."""
    input_ids, attention_mask = padded_batch
    options = {"max_new_tokens": 4, "min_new_tokens": 4, "return_dict_in_generate": True, **DECODING[decoding]}
    with torch.random.fork_rng():
        torch.manual_seed(SEED)
        first = model.generate(input_ids, attention_mask=attention_mask, **options)
        assert first.cache.get_seq_length() == first.sequences.shape[1] - 1
        continued = model.generate(
            input_ids,
            attention_mask=attention_mask,
            decoder_input_ids=first.sequences,
            cache=first.cache,
            output_logits=True,
            **options,
        )
    expected_tokens, expected_logits = decode(
        model, input_ids, attention_mask, decoding, max_new_tokens=8, min_new_tokens=8
    )
    assert torch.equal(continued.sequences, expected_tokens)
    torch.testing.assert_close(torch.stack(continued.logits), expected_logits[4:], **tolerance(dtype))


@pytest.mark.parametrize("cache", CACHES)
@pytest.mark.parametrize("decoding", DECODING)
def test_every_decoding_returns_the_decoder_cache_transformers_returns(model, padded_batch, decoding, cache):
    """What transformers' own generation tests (GenerationTesterMixin, test_generate_compile_model_forward_fullgraph)
    expect of the cache a decoding returns: by default a `DynamicCache` for the decoder's self-attention, one layer
    per decoder layer, not compileable (so that generate() compiles nothing); with cache_implementation="static" a
    compileable cache that is no `DynamicCache`. The encoder-decoder attention's cache is the decoder's other half.
    A greedy or sampled decoding continues from it (test_generation_continues_from_the_cache_it_returned)."""
    input_ids, attention_mask = padded_batch
    out = model.generate(
        input_ids,
        attention_mask=attention_mask,
        max_new_tokens=4,
        return_dict_in_generate=True,
        **DECODING[decoding],
        **CACHES[cache],
    )
    assert isinstance(out.cache, EncoderDecoderCache)
    for half in (out.cache.self_attention_cache, out.cache.cross_attention_cache):
        assert len(half.layers) == model.config.decoder_layers
        assert isinstance(half, DynamicCache) == (cache == "dynamic")
        assert half.is_compileable == (cache == "static")
    assert out.cache.get_seq_length() > 0


@pytest.mark.parametrize("decoding", ["paper beam", "transformers beam"])
def test_a_beam_search_refuses_to_continue_from_a_cache(model, padded_batch, decoding):
    """A beam search's returned cache holds its last live beams, not its answers: continuing from it would decode
    from the wrong keys and values, so it is refused, naming what to pass instead."""
    input_ids, attention_mask = padded_batch
    first = model.generate(
        input_ids, attention_mask=attention_mask, max_new_tokens=4, num_beams=1, return_dict_in_generate=True
    )
    with pytest.raises(ValueError, match="A beam search cannot continue from a cache"):
        model.generate(
            input_ids,
            attention_mask=attention_mask,
            decoder_input_ids=first.sequences,
            cache=first.cache,
            max_new_tokens=4,
            **DECODING[decoding],
        )
    beam = model.generate(input_ids, attention_mask=attention_mask, max_new_tokens=4, return_dict_in_generate=True)
    with pytest.raises(ValueError, match=r"The cache holds 12 sequences, decoder_input_ids 3"):
        model.generate(
            input_ids, attention_mask=attention_mask, decoder_input_ids=beam.sequences, cache=beam.cache, num_beams=1
        )


@pytest.mark.parametrize("decoding", DECODING)
def test_a_decoder_prompt_without_the_start_token_decodes_the_same_with_its_mask(model, translation_pairs, decoding):
    """generate() puts the start token in front of a prompt that lacks it, and a 1 in front of its mask: the
    positions taken from the mask follow (transformers' own generation tests pass such prompts)."""
    source = torch.tensor([translation_pairs[6][0]], device=model.device)
    prompt = torch.tensor([translation_pairs[6][1][:2]], device=model.device)
    without = decode(model, source, decoder_input_ids=prompt, decoding=decoding)
    with_mask = decode(
        model, source, decoder_input_ids=prompt, decoder_attention_mask=torch.ones_like(prompt), decoding=decoding
    )
    assert torch.equal(with_mask[0], without[0])
    assert with_mask[0][0, 0].item() == model.config.decoder_start_token_id


@pytest.mark.parametrize("decoding", DECODING)
def test_padded_batch_gives_each_sentence_alone(model, padded_batch, dtype, decoding):
    input_ids, attention_mask = padded_batch
    tokens, logits = decode(model, input_ids, attention_mask, decoding)
    beams = DECODING[decoding]["num_beams"]
    for row in range(len(input_ids)):
        alone = input_ids[row : row + 1, : int(attention_mask[row].sum())]
        replay = {}
        if decoding == "sample":
            # A batch draws other random numbers than one sentence does: replay the batch's draws instead.
            replay["prefix_allowed_tokens_fn"] = lambda _, prefix, row=row: [tokens[row, len(prefix)].item()]
        alone_tokens, alone_logits = decode(model, alone, None, decoding, **replay)
        # The batch decodes until its longest translation ends; this sentence's stops where it stops alone.
        batch_tokens = tokens[row : row + 1, : alone_tokens.shape[1]]
        batch_logits = logits[: len(alone_logits), row * beams : (row + 1) * beams]
        assert_same_decoding(batch_tokens, batch_logits, alone_tokens, alone_logits, dtype, beams)
        # Greedy search and sampling fill with the pad token; beam search with end-of-sentence where the pad id
        # is 0 (transformers' `pad_token_id or eos_token_id`).
        filler = {model.config.pad_token_id, model.config.eos_token_id}
        assert set(tokens[row, alone_tokens.shape[1] :].tolist()) <= filler


@pytest.mark.parametrize("decoding", DECODING)
def test_source_padding_never_reaches_cached_decoding(model, padded_batch, dtype, decoding):
    """Whatever sits under the source mask, every cached decoding step gives the same logits."""
    input_ids, attention_mask = padded_batch
    other_tokens = torch.arange(input_ids.numel(), device=input_ids.device).view_as(input_ids) % 96 + 4
    scrambled = torch.where(attention_mask.bool(), input_ids, other_tokens)
    expected = decode(model, input_ids, attention_mask, decoding)
    scrambled_decoding = decode(model, scrambled, attention_mask, decoding)
    assert_same_decoding(*scrambled_decoding, *expected, dtype, DECODING[decoding]["num_beams"])


@pytest.mark.parametrize("cache", CACHES)
def test_decoder_positions_advance_under_the_cache(model, padded_batch, cache):
    """Step k of cached decoding feeds one token, at position k (section 3.5), not at position 0."""
    input_ids, attention_mask = padded_batch
    positions = []
    hook = model.model.decoder.embed_positions.register_forward_pre_hook(
        lambda module, args: positions.append(args[0].tolist())
    )
    try:
        decode(model, input_ids, attention_mask, min_new_tokens=MAX_NEW_TOKENS, **CACHES[cache])
    finally:
        hook.remove()
    assert positions == [[step] for step in range(MAX_NEW_TOKENS)]


def test_step_by_step_decoding_with_the_cache_gives_the_logits_of_one_full_forward(model, translation_pairs, dtype):
    """Teacher forcing one token at a time through the `cache`, as generate() does, and all at once."""
    input_ids, attention_mask, labels = (t.to(model.device) for t in pad_pairs(translation_pairs[:5]))
    decoder_input_ids = model.prepare_decoder_input_ids_from_labels(labels)
    with torch.no_grad():
        full = model(
            input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids, use_cache=False
        ).logits
        out = model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            decoder_input_ids=decoder_input_ids[:, :1],
            use_cache=True,
        )
        steps = [out.logits[:, 0]]
        for position in range(1, decoder_input_ids.shape[1]):
            out = model(
                encoder_outputs=(out.encoder_last_hidden_state,),
                attention_mask=attention_mask,
                decoder_input_ids=decoder_input_ids[:, position : position + 1],
                cache=out.cache,
                use_cache=True,
            )
            steps.append(out.logits[:, 0])
    for position, logits in enumerate(steps):
        torch.testing.assert_close(
            logits, full[:, position], **tolerance(dtype), msg=lambda m: f"decoder position {position}: {m}"
        )


def test_cross_attention_cache_holds_each_layers_projection_of_the_encoder_output(model, padded_batch):
    """Filled once from the encoder output with the layer's own projections (section 3.2.3), then only read."""
    input_ids, attention_mask = padded_batch
    start = torch.full((len(input_ids), 1), model.config.decoder_start_token_id, device=input_ids.device)
    with torch.no_grad():
        out = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=start, use_cache=True)
        encoded = out.encoder_last_hidden_state
        for _ in range(2):  # two more steps, which must leave the cross-attention cache as it is
            out = model(
                encoder_outputs=(encoded,),
                attention_mask=attention_mask,
                decoder_input_ids=out.logits.argmax(-1)[:, -1:],
                cache=out.cache,
                use_cache=True,
            )
        cache = out.cache
        assert isinstance(cache, EncoderDecoderCache)
        for index, layer in enumerate(model.model.decoder.layers):
            attention = layer.encoder_attn
            shape = (*encoded.shape[:2], -1, attention.head_dim)
            for name, projection in (("keys", attention.k_proj), ("values", attention.v_proj)):
                expected = projection(encoded).view(shape).transpose(1, 2)
                cached = getattr(cache.cross_attention_cache.layers[index], name)
                torch.testing.assert_close(cached, expected, msg=lambda m: f"layer {index} {name}: {m}")


def test_hypotheses_sharing_one_encoder_output_attend_to_it_as_with_their_own_copies(model, padded_batch, dtype):
    """Beam search gives the decoder one encoder output per sentence and several hypotheses per sentence (the
    encoder-decoder attention takes them as one sequence of queries): the logits of decoding with copies of it."""
    input_ids, attention_mask = padded_batch
    hypotheses = 3
    with torch.no_grad():
        encoded = model.model.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        decoder_input_ids = torch.randint(4, model.config.vocab_size, (len(input_ids) * hypotheses, 5))
        decoder_input_ids = decoder_input_ids.to(input_ids.device)
        shared = model(
            encoder_outputs=(encoded,), attention_mask=attention_mask, decoder_input_ids=decoder_input_ids
        ).logits
        copies = model(
            encoder_outputs=(encoded.repeat_interleave(hypotheses, 0),),
            attention_mask=attention_mask.repeat_interleave(hypotheses, 0),
            decoder_input_ids=decoder_input_ids,
        ).logits
    torch.testing.assert_close(shared, copies, **tolerance(dtype))


def test_cross_attention_keys_are_computed_once(model, padded_batch):
    input_ids, attention_mask = padded_batch
    calls = []
    hook = model.model.decoder.layers[0].encoder_attn.k_proj.register_forward_hook(lambda *args: calls.append(1))
    model.generate(input_ids, attention_mask=attention_mask, max_new_tokens=6, num_beams=1, min_new_tokens=6)
    hook.remove()
    assert len(calls) == 1


@pytest.mark.slow  # torch.compile of each decoding: half a minute (.ci/run runs it in float32 and bfloat16)
@pytest.mark.parametrize("decoding", ["greedy", "paper beam"])
def test_static_cache_generation_compiles_to_one_graph(model, padded_batch, dtype, decoding):
    """The static-cache path that generate() compiles on GPUs, for greedy search and for the default decoding (the
    paper's beam search): every step after the first runs one graph (fullgraph=True), with the same logits."""
    from torch._dynamo.utils import counters
    from transformers import CompileConfig

    input_ids, attention_mask = padded_batch
    compile_config = CompileConfig(fullgraph=True, mode="default")
    compile_config._compile_all_devices = True  # generate() compiles on accelerators only unless told so
    torch._dynamo.reset()
    counters.clear()
    compiled = decode(
        model,
        input_ids,
        attention_mask,
        decoding,
        max_new_tokens=8,
        cache_implementation="static",
        compile_config=compile_config,
    )
    assert counters["stats"]["unique_graphs"] == 1, "the decoding steps did not run as one compiled graph"
    expected = decode(model, input_ids, attention_mask, decoding, max_new_tokens=8)
    assert_same_decoding(*compiled, *expected, dtype, DECODING[decoding]["num_beams"])


def test_sdpa_and_eager_agree(trained_tiny_model, translation_pairs, device, dtype):
    input_ids, attention_mask, labels = (t.to(device) for t in pad_pairs(translation_pairs))
    decoder_input_ids = trained_tiny_model.prepare_decoder_input_ids_from_labels(labels)
    logits = {}
    for implementation in ("eager", "sdpa"):
        trained_tiny_model.set_attn_implementation(implementation)
        model = trained_tiny_model.to(device=device, dtype=dtype)
        with torch.no_grad():
            out = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids)
        logits[implementation] = out.logits.float()
    torch.testing.assert_close(logits["eager"], logits["sdpa"], **tolerance(dtype))


def test_sampling_is_reproducible_with_a_seed(model, padded_batch):
    input_ids, attention_mask = padded_batch
    first, second = (decode(model, input_ids, attention_mask, "sample")[0] for _ in range(2))
    assert torch.equal(first, second)
    with torch.random.fork_rng():
        torch.manual_seed(SEED + 1)
        other = model.generate(
            input_ids, attention_mask=attention_mask, max_new_tokens=MAX_NEW_TOKENS, **DECODING["sample"]
        )
    assert not torch.equal(first, other), "sampling at temperature 2 should depend on the seed"


def test_generation_config_round_trips(tiny_model, tmp_path):
    tiny_model.save_pretrained(tmp_path)
    loaded = VaswaniForConditionalGeneration.from_pretrained(tmp_path)
    assert loaded.generation_config.num_beams == 4 and loaded.generation_config.length_penalty == 0.6


def test_translation_pipeline_returns_every_requested_hypothesis(tmp_path):
    """num_return_sequences=n: n answers for one text, and n answers for each text of a list (none dropped)."""
    from transformers import AutoTokenizer

    from vaswani import VaswaniConfig, VaswaniTranslationPipeline

    tokenizer = AutoTokenizer.from_pretrained(word_tokenizer(tmp_path / "tokenizer"))
    torch.manual_seed(0)
    model = VaswaniForConditionalGeneration(VaswaniConfig.from_preset("tiny", vocab_size=len(tokenizer))).eval()
    translate = VaswaniTranslationPipeline(model=model, tokenizer=tokenizer)
    texts = ["the red cat", "a dog sees the big house"]
    options = {"num_beams": 3, "num_return_sequences": 3, "max_new_tokens": 6}
    single = translate(texts[0], **options)
    batch = translate(texts, **options)
    assert len(single) == 3 and all(set(answer) == {"translation_text"} for answer in single)
    assert [len(answers) for answers in batch] == [3, 3] and batch[0] == single
    alone = translate(texts[1], **options)
    assert batch[1] == alone
    one_each = translate(texts, num_beams=3, max_new_tokens=6)
    assert [answer["translation_text"] for answer in one_each] == [
        single[0]["translation_text"],
        alone[0]["translation_text"],
    ]
