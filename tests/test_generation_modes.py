"""generate() off the paper's path: what it accepts works as for a transformers model, or is refused at once.

The model's own decoding methods take over plain beam search and greedy search only (docs/decoding.md, "generate()'s
arguments and modes"); every other mode is transformers' own. The cache they return is a plain `DynamicCache`, a
greedy translation's score counts its tokens up to `</s>`, and FlashAttention is served without sharing an encoder
output among a sentence's hypotheses. Processes in step under `synced_gpus`: tests/test_synced_decoding.py,
tests/test_fsdp.py and tests/test_distributed.py. Every argument, drawn at random: tests/test_decoding_properties.py.
"""

import copy

import pytest
import torch
from helpers import pad_pairs
from transformers import AttentionInterface, AttentionMaskInterface, GenerationConfig
from transformers.generation.streamers import BaseStreamer
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from vaswani import VaswaniConfig, VaswaniForConditionalGeneration, VaswaniTranslationPipeline
from vaswani.scripts import translate


@pytest.fixture
def model(trained_tiny_model):
    return trained_tiny_model


@pytest.fixture
def sources(translation_pairs):
    """Three sources of 4, 7 and 9 tokens as one right-padded batch: (input_ids, attention_mask)."""
    input_ids, attention_mask, _ = pad_pairs([translation_pairs[i] for i in (0, 4, 7)])
    return {"input_ids": input_ids, "attention_mask": attention_mask}


@pytest.fixture
def one_source(translation_pairs):
    input_ids, attention_mask, _ = pad_pairs([translation_pairs[7]])
    return {"input_ids": input_ids, "attention_mask": attention_mask}


@pytest.mark.parametrize(
    "partial", [GenerationConfig(paper_decoding=True, max_new_tokens=5), GenerationConfig(max_new_tokens=5)]
)
def test_a_partial_generation_config_takes_the_models_settings_for_the_rest(model, sources, partial):
    """The decoding method follows the config as generate() merges it: what the given config leaves unset (the beam,
    the penalty, paper_decoding) is the model's, so that it decodes with the paper's beam search."""
    beam_steps = []
    given = model.generate(**sources, generation_config=partial, beam_steps=beam_steps)
    assert beam_steps, "the paper's beam search did not run"
    assert torch.equal(given, model.generate(**sources, max_new_tokens=5))


@pytest.mark.parametrize(
    "mode",
    [
        {"num_beams": 4, "force_words_ids": [[42]]},
        {"num_beams": 4, "num_beam_groups": 2, "diversity_penalty": 0.5},
        {"num_beams": 1, "penalty_alpha": 0.6, "top_k": 4},
        {"num_beams": 1, "dola_layers": "low"},
    ],
    ids=["constrained", "group beam", "contrastive", "DoLa"],
)
def test_modes_the_papers_methods_do_not_serve_are_transformers_own(model, sources, mode):
    """transformers serves these from the Hub (`custom_generate`, with trust_remote_code=True) and says so; they are
    never run as the paper's beam search or greedy search in their place."""
    with pytest.raises(ValueError, match="requires `trust_remote_code=True`"):
        model.generate(**sources, **mode)


@pytest.mark.parametrize(
    "assistance", ["assistant_model", "prompt_lookup_num_tokens"], ids=["assisted", "prompt lookup"]
)
def test_assisted_decoding_is_transformers_and_gives_the_greedy_translation(model, one_source, assistance):
    option = {"assistant_model": copy.deepcopy(model)} if assistance == "assistant_model" else {assistance: 3}
    greedy = model.generate(**one_source, num_beams=1)
    assert torch.equal(model.generate(**one_source, num_beams=1, **option), greedy)


@pytest.mark.parametrize("num_beams", [1, 4])
def test_max_time_ends_the_decoding_at_the_step_it_runs_out(model, sources, num_beams):
    """A stopping criterion (here max_time, run out from the first step) ends every row where it says so."""
    unlimited = model.generate(**sources, num_beams=num_beams)
    ended = model.generate(**sources, num_beams=num_beams, max_time=0.0)
    assert unlimited.shape[1] > 2 and ended.shape == (3, 2)


@pytest.mark.parametrize("num_beams", [1, 4])
def test_chunked_prefill_is_refused_for_the_one_pass_prompt_of_an_encoder_decoder(model, one_source, num_beams):
    """transformers' chunked prefill takes the source's padding mask for the decoder prompt's, and fails deep inside
    the decoder; it is refused before any work instead."""
    with pytest.raises(ValueError, match="leave prefill_chunk_size unset"):
        model.generate(**one_source, num_beams=num_beams, prefill_chunk_size=2)


class RecordingStreamer(BaseStreamer):
    def __init__(self):
        self.tokens = []

    def put(self, value):
        self.tokens += value.view(-1).tolist()

    def end(self):
        pass


def test_a_streamer_with_beam_search_is_refused_before_any_work(model, one_source):
    streamer = RecordingStreamer()
    with pytest.raises(ValueError, match=r"beam search keeps several: pass num_beams=1\.$"):
        model.generate(**one_source, streamer=streamer)
    assert streamer.tokens == []


def test_a_streamer_with_greedy_search_receives_the_translation_token_by_token(model, one_source):
    streamer = RecordingStreamer()
    sequence = model.generate(**one_source, num_beams=1, streamer=streamer)
    assert streamer.tokens == sequence[0].tolist()


def continue_decoding(model, source, prompt, cache=None):
    """Two more tokens after `prompt`, greedy: (sequences, stacked raw logits)."""
    out = model.generate(
        **source,
        decoder_input_ids=prompt,
        cache=cache,
        num_beams=1,
        max_new_tokens=2,
        min_new_tokens=2,
        return_dict_in_generate=True,
        output_logits=True,
    )
    return out.sequences, torch.stack(out.logits)


def test_a_cropped_cache_continues_with_the_logits_of_decoding_without_it(model, one_source):
    """What assisted and prompt-lookup decoding do to a cache: crop it, then continue from the shorter prompt."""
    out = model.generate(**one_source, num_beams=1, return_dict_in_generate=True)
    held = out.sequences.shape[1] - 1  # every token but the last was fed to the decoder
    assert out.cache.get_seq_length() == held
    out.cache.crop(-2)
    assert out.cache.get_seq_length() == held - 2
    prompt = out.sequences[:, :-2]
    sequences, logits = continue_decoding(model, one_source, prompt, out.cache)
    expected_sequences, expected_logits = continue_decoding(model, one_source, prompt)
    assert torch.equal(sequences, expected_sequences)
    torch.testing.assert_close(logits, expected_logits, atol=1e-5, rtol=1e-5)


def test_a_returned_cache_repeats_selects_and_resets_its_rows_as_a_dynamic_cache(model, one_source):
    out = model.generate(**one_source, num_beams=1, return_dict_in_generate=True)
    cache, held = out.cache, out.cache.get_seq_length()
    cache.batch_repeat_interleave(3)
    cache.batch_select_indices(torch.tensor([0, 2]))
    repeated = {name: tensor.repeat(2, 1) for name, tensor in one_source.items()}
    prompt = out.sequences.repeat(2, 1)
    sequences, logits = continue_decoding(model, repeated, prompt, cache)
    expected_sequences, expected_logits = continue_decoding(model, repeated, prompt)
    assert torch.equal(sequences, expected_sequences)
    torch.testing.assert_close(logits, expected_logits, atol=1e-5, rtol=1e-5)
    assert cache.get_seq_length() == held + 2
    cache.reset()
    assert cache.get_seq_length() == 0


def test_a_greedy_translations_score_is_the_same_alone_and_in_any_batch(trained_text_model, tmp_path):
    """The score sums the log-probabilities of the translation's tokens up to `</s>`; the padding written after it,
    while a longer sentence of the batch was decoded, counts nothing. In the pipeline and in vaswani-translate."""
    model, tokenizer, folder = trained_text_model
    short, long = "Jesus wept.", "In the beginning God created the heavens and the earth."
    pipeline = VaswaniTranslationPipeline(model=model, tokenizer=tokenizer)
    alone = pipeline(short, num_beams=1, return_scores=True)[0]
    in_batch = pipeline([short, long], num_beams=1, return_scores=True)[0]
    assert in_batch["translation_text"] == alone["translation_text"]
    assert in_batch["score"] == pytest.approx(alone["score"], abs=1e-4)
    assert -5 < alone["score"] < 0

    (tmp_path / "in.txt").write_text(f"{short}\n{long}\n", encoding="utf-8")
    paths = ["--model", folder, "--input", tmp_path / "in.txt", "--output", tmp_path / "out.txt"]
    translate.main([*paths, "--device", "cpu", "--num_beams", "1", "--scores"])
    line = (tmp_path / "out.txt").read_text(encoding="utf-8").splitlines()[0]
    assert float(line.split("\t")[2]) == pytest.approx(alone["score"], abs=1e-3)


def test_a_model_without_a_padding_token_keeps_every_embedding_row():
    config = VaswaniConfig.from_preset("tiny", vocab_size=100, pad_token_id=None)
    model = VaswaniForConditionalGeneration(config)
    assert (model.model.shared.weight.abs().sum(dim=1) > 0).all()
    assert model.lm_head.weight is model.model.shared.weight


def flash_attention_as_transformers_masks_it(module, query, key, value, attention_mask, **kwargs):
    """transformers' FlashAttention path in float32 on the CPU: it takes a 2D padding mask of the keys, and masks the
    queries with it too, as it unpads them: the whole mask where queries and keys are as many, its last columns
    where fewer queries than keys come (a single query: none)."""
    if attention_mask is None:
        return sdpa_attention_forward(module, query, key, value, None, **kwargs)
    assert attention_mask.dim() == 2, "FlashAttention takes a 2D padding mask"
    keys_kept = attention_mask.bool()[:, None, None, :]
    queries = query.shape[2]
    if queries == 1:
        queries_kept = torch.ones_like(attention_mask[:, :1], dtype=torch.bool)
    else:
        queries_kept = attention_mask.bool()[:, -queries:]
    output, weights = sdpa_attention_forward(module, query, key, value, keys_kept, **kwargs)
    return output * queries_kept[:, :, None, None], weights


def test_flash_attention_decodes_each_sentence_of_a_padded_batch_as_sdpa_does(model, sources, monkeypatch):
    """A sentence's hypotheses, were they to share its encoder output, would reach FlashAttention as one sequence of
    queries, which it masks with the source's padding mask; under FlashAttention each hypothesis keeps its own copy.
    The real kernel: tests/test_gpu.py."""
    expected = model.generate(**sources, num_beams=4)
    AttentionInterface.register("flash_attention_emulated", flash_attention_as_transformers_masks_it)
    AttentionMaskInterface.register("flash_attention_emulated", AttentionMaskInterface()["flash_attention_2"])
    monkeypatch.setattr(model.config, "_attn_implementation_internal", "flash_attention_emulated")
    assert model.config._attn_implementation == "flash_attention_emulated"
    assert torch.equal(model.generate(**sources, num_beams=4), expected)


def test_a_callers_custom_generate_runs_in_place_of_the_papers(model, sources):
    """A decoding method of the caller's own (`custom_generate`) is what generate() runs, never the paper's."""
    called = []

    def first_tokens(model, input_ids, logits_processor, stopping_criteria, generation_config, **kwargs):
        called.append(generation_config.num_beams)
        return input_ids

    decoded = model.generate(**sources, custom_generate=first_tokens)
    assert called == [4] and decoded.shape == (sources["input_ids"].shape[0] * 4, 1)


def test_the_start_token_given_to_generate_starts_every_sequence(model, sources):
    """generate() starts an encoder-decoder's sequences with decoder_start_token_id: the paper's methods decode from it
    as from the same token given as decoder_input_ids."""
    config = copy.deepcopy(model.generation_config)
    config.update(decoder_start_token_id=7, max_new_tokens=4)
    given = model.generate(**sources, generation_config=config)
    prompt = torch.full((sources["input_ids"].shape[0], 1), 7)
    assert (given[:, 0] == 7).all()
    assert torch.equal(
        given, model.generate(**sources, decoder_input_ids=prompt, decoder_start_token_id=7, max_new_tokens=4)
    )
