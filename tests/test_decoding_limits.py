"""How far `generate()` decodes: the paper's source length + 50 by default (section 6.1), never past
`max_position_embeddings`, whether the decoding step runs eagerly or compiled with a static cache."""

import copy

import pytest
import torch
from transformers import CompileConfig, GenerationConfig

from vaswani import VaswaniConfig, VaswaniForConditionalGeneration


def model_of_12_positions(positional_encoding="sinusoidal"):
    torch.manual_seed(0)
    config = VaswaniConfig.from_preset(
        "tiny", vocab_size=40, max_position_embeddings=12, eos_token_id=None, positional_encoding=positional_encoding
    )
    return VaswaniForConditionalGeneration(config).eval()


@pytest.fixture(scope="module")
def short_model():
    return model_of_12_positions()


# What a longer sequence is told: sinusoids extend to any length, learned positions (Table 3, row (E)) do not.
REMEDIES = {
    "sinusoidal": r"raise config.max_position_embeddings \(the sinusoids are computed: no retraining needed\)",
    "learned": r"learned positions cannot be extended past the table they were trained with: truncate the input",
}


def compiled():
    config = CompileConfig(fullgraph=True, mode="default")
    config._compile_all_devices = True  # generate() compiles on accelerators only unless told so
    return {"cache_implementation": "static", "compile_config": config}


SOURCE = torch.tensor([[5, 6, 7, 2]])


@pytest.mark.parametrize("positional_encoding", sorted(REMEDIES))
@pytest.mark.parametrize(
    "path",
    ["eager", pytest.param("static cache, compiled", marks=pytest.mark.slow)],  # torch.compile: 25 s
)
def test_a_limit_past_the_positions_is_refused_before_decoding(positional_encoding, path):
    model = model_of_12_positions(positional_encoding)
    options = compiled() if path != "eager" else {}
    within = model.generate(SOURCE, num_beams=1, max_new_tokens=11, min_new_tokens=11, **options)
    assert within.shape == (1, 12)  # the start token and 11 new ones: all 12 positions
    for limit in ({"max_new_tokens": 12}, {"max_length": 13}):
        with pytest.raises(
            ValueError,
            match=r"Generating up to 13 decoder positions .* max_position_embeddings \(12\); ask for fewer tokens, "
            rf"or {REMEDIES[positional_encoding]}",
        ):
            model.generate(SOURCE, num_beams=1, **limit, **options)
    source = torch.full((1, 13), 5)
    with pytest.raises(
        ValueError, match=rf"Sequence of 13 positions is longer .* \(12\); {REMEDIES[positional_encoding]}"
    ):
        model.generate(source, num_beams=1, max_new_tokens=2)


@pytest.mark.parametrize("where", ["generation_config argument", "model's generation_config"])
def test_a_limit_set_in_a_generation_config_is_checked_and_honoured(short_model, where):
    """Limits may come from a GenerationConfig passed to generate() or kept in model.generation_config."""
    model = copy.deepcopy(short_model)

    def generate(**limit):
        if where == "generation_config argument":
            return model.generate(SOURCE, generation_config=GenerationConfig(num_beams=1, **limit))
        model.generation_config.update(num_beams=1, **limit)
        return model.generate(SOURCE)

    assert generate(max_new_tokens=3, max_length=None).shape == (1, 4)
    for limit in ({"max_new_tokens": 12}, {"max_length": 13, "max_new_tokens": None}):
        with pytest.raises(ValueError, match=r"Generating up to 13 decoder positions"):
            generate(**limit)


def test_the_default_limit_is_the_source_length_plus_50_within_the_positions(short_model):
    """Section 6.1's source + 50, cut to what the positional encoding accepts (here 12 positions)."""
    assert short_model.generate(SOURCE, num_beams=1).shape == (1, 12)
    roomy = VaswaniForConditionalGeneration(
        VaswaniConfig(**{**short_model.config.to_dict(), "max_position_embeddings": 128})
    )
    roomy.load_state_dict(short_model.state_dict())
    assert roomy.eval().generate(SOURCE, num_beams=1).shape == (1, 1 + SOURCE.shape[1] + 50)
    # The source given by keyword, as ids or as embeddings, sets the same default.
    assert roomy.generate(input_ids=SOURCE, num_beams=1).shape == (1, 1 + SOURCE.shape[1] + 50)
    embeddings = roomy.get_input_embeddings()(SOURCE)
    assert roomy.generate(inputs_embeds=embeddings, num_beams=1).shape == (1, 1 + SOURCE.shape[1] + 50)


@pytest.mark.parametrize("num_beams", [1, 4])
def test_a_forced_prefix_takes_positions_from_the_limit(short_model, num_beams):
    """The positions hold the decoder prompt, a forced prefix included, and then the new tokens: the default limit
    leaves the prefix its positions, and a limit that could only be honoured without it is refused before any work."""
    prefix = torch.tensor([[1, 5, 6, 7, 8]])
    options = {"decoder_input_ids": prefix, "num_beams": num_beams}
    assert short_model.generate(SOURCE, **options).shape == (1, 12)
    assert short_model.generate(SOURCE, max_new_tokens=7, **options).shape == (1, 12)
    encoder_runs = []
    hook = short_model.model.encoder.register_forward_hook(lambda *_: encoder_runs.append(1))
    try:
        with pytest.raises(
            ValueError, match=r"^Generating up to 13 decoder positions \(the decoder prompt and the new"
        ):
            short_model.generate(SOURCE, max_new_tokens=8, **options)
    finally:
        hook.remove()
    assert encoder_runs == []
