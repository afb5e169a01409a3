"""generate(): the paper's decoding defaults (section 6.1), the KV cache, padding, and attention kernels.

Runs on the GPU too: `python -m pytest tests/test_generation.py --device cuda --dtype bfloat16` (see conftest.py).
"""

import pytest
import torch

from vaswani import VaswaniForConditionalGeneration


DECODING = {"greedy": {"num_beams": 1}, "beam": {"num_beams": 4, "length_penalty": 0.6}}


@pytest.fixture
def model(tiny_model, device, dtype):
    return tiny_model.to(device=device, dtype=dtype)


def tolerance(dtype):
    return {"atol": 1e-5, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 3e-2, "rtol": 3e-2}


def test_default_generation_config_is_the_papers(tiny_model):
    config = tiny_model.generation_config
    assert config.num_beams == 4 and config.length_penalty == 0.6
    assert (config.decoder_start_token_id, config.eos_token_id, config.pad_token_id) == (1, 2, 0)


def test_output_length_is_limited_to_source_length_plus_50(tiny_model, source_batch):
    input_ids, attention_mask = source_batch
    # A random model rarely emits end-of-sentence, so it runs to the limit: the start token + (9 + 50) tokens.
    tiny_model.generation_config.eos_token_id = None
    output = tiny_model.generate(input_ids, attention_mask=attention_mask, num_beams=1)
    assert output.shape == (2, 1 + 9 + 50)
    assert tiny_model.generate(input_ids, attention_mask=attention_mask, max_new_tokens=5).shape == (2, 6)


@pytest.mark.parametrize("decoding", DECODING)
def test_cache_gives_the_same_output(model, source_batch, device, decoding):
    input_ids, attention_mask = (t.to(device) for t in source_batch)
    kwargs = dict(attention_mask=attention_mask, max_new_tokens=12, **DECODING[decoding])
    with_cache = model.generate(input_ids, use_cache=True, **kwargs)
    without_cache = model.generate(input_ids, use_cache=False, **kwargs)
    assert torch.equal(with_cache, without_cache)


@pytest.mark.parametrize("decoding", DECODING)
def test_padded_batch_gives_each_sentence_alone(model, source_batch, device, decoding):
    input_ids, attention_mask = (t.to(device) for t in source_batch)
    kwargs = dict(max_new_tokens=12, **DECODING[decoding])
    batched = model.generate(input_ids, attention_mask=attention_mask, **kwargs)
    for row in range(2):
        length = int(attention_mask[row].sum())
        alone = model.generate(input_ids[row : row + 1, :length], **kwargs)[0]
        produced = batched[row, : alone.shape[0]]
        assert torch.equal(produced, alone)
        assert (batched[row, alone.shape[0] :] == model.config.pad_token_id).all()


@pytest.mark.parametrize("decoding", DECODING)
def test_static_cache_gives_the_same_output(model, source_batch, device, decoding):
    input_ids, attention_mask = (t.to(device) for t in source_batch)
    kwargs = dict(attention_mask=attention_mask, max_new_tokens=12, **DECODING[decoding])
    static = model.generate(input_ids, cache_implementation="static", disable_compile=True, **kwargs)
    assert torch.equal(static, model.generate(input_ids, **kwargs))


def test_static_cache_generation_compiles_to_one_graph(model, source_batch, device):
    """The static-cache path that generate() compiles on GPUs: one graph (fullgraph=True), the same tokens."""
    from transformers import CompileConfig

    input_ids, attention_mask = (t.to(device) for t in source_batch)
    kwargs = {"attention_mask": attention_mask, "max_new_tokens": 8, "num_beams": 1}
    compile_config = CompileConfig(fullgraph=True, mode="default")
    compile_config._compile_all_devices = True  # generate() compiles on accelerators only unless told so
    compiled = model.generate(input_ids, cache_implementation="static", compile_config=compile_config, **kwargs)
    assert torch.equal(compiled, model.generate(input_ids, **kwargs))


def test_cross_attention_keys_are_computed_once(model, source_batch, device):
    input_ids, attention_mask = (t.to(device) for t in source_batch)
    calls = []
    hook = model.model.decoder.layers[0].encoder_attn.k_proj.register_forward_hook(lambda *args: calls.append(1))
    model.generate(input_ids, attention_mask=attention_mask, max_new_tokens=6, num_beams=1, min_new_tokens=6)
    hook.remove()
    assert len(calls) == 1


def test_sdpa_and_eager_agree(tiny_model, source_batch, device, dtype):
    input_ids, attention_mask = (t.to(device) for t in source_batch)
    decoder_input_ids = torch.tensor([[1, 5, 9, 13], [1, 6, 10, 14]], device=device)
    logits = {}
    for implementation in ("eager", "sdpa"):
        tiny_model.set_attn_implementation(implementation)
        model = tiny_model.to(device=device, dtype=dtype)
        with torch.no_grad():
            out = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids)
        logits[implementation] = out.logits.float()
    torch.testing.assert_close(logits["eager"], logits["sdpa"], **tolerance(dtype))


def test_sampling_is_reproducible_with_a_seed(model, source_batch, device):
    input_ids, attention_mask = (t.to(device) for t in source_batch)
    outputs = []
    for _ in range(2):
        torch.manual_seed(123)
        outputs.append(
            model.generate(
                input_ids, attention_mask=attention_mask, do_sample=True, num_beams=1, top_k=20, max_new_tokens=10
            )
        )
    assert torch.equal(*outputs)
    assert outputs[0].shape == (2, 11)


def test_generation_config_round_trips(tiny_model, tmp_path):
    tiny_model.save_pretrained(tmp_path)
    loaded = VaswaniForConditionalGeneration.from_pretrained(tmp_path)
    assert loaded.generation_config.num_beams == 4 and loaded.generation_config.length_penalty == 0.6


def test_translation_pipeline_returns_every_requested_hypothesis(tmp_path):
    """num_return_sequences=n: n answers for one text, and n answers for each text of a list (none dropped)."""
    from test_training import make_tokenizer
    from transformers import AutoTokenizer

    from vaswani import VaswaniConfig, VaswaniTranslationPipeline

    tokenizer = AutoTokenizer.from_pretrained(make_tokenizer(tmp_path / "tokenizer"))
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
