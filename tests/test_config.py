"""VaswaniConfig: the paper's presets, the ecosystem's names, and clear errors for impossible values."""

import json

import pytest
from huggingface_hub.errors import StrictDataclassFieldValidationError
from transformers import AutoConfig
from transformers.activations import ACT2FN

from vaswani import PRESETS, VaswaniConfig
from vaswani.configuration.configuration_vaswani import INIT_SCHEMES


def test_defaults_are_the_paper_base_model():
    config = VaswaniConfig()
    assert (config.d_model, config.encoder_layers, config.decoder_layers) == (512, 6, 6)
    assert (config.encoder_ffn_dim, config.encoder_attention_heads, config.dropout) == (2048, 8, 0.1)
    assert config.activation_function == "relu"
    assert config.is_encoder_decoder and config.tie_word_embeddings


def test_big_preset_is_table_3():
    config = VaswaniConfig.from_preset("big", vocab_size=37000)
    assert (config.d_model, config.encoder_ffn_dim, config.encoder_attention_heads) == (1024, 4096, 16)
    assert config.dropout == 0.3 and config.vocab_size == 37000


def test_preset_fields_can_be_overridden():
    config = VaswaniConfig.from_preset("base", vocab_size=1000, dropout=0.2)
    assert config.dropout == 0.2 and config.d_model == PRESETS["base"]["d_model"]


def test_unknown_preset_is_named():
    with pytest.raises(ValueError, match="huge"):
        VaswaniConfig.from_preset("huge")


def test_attribute_map_gives_the_generic_names():
    config = VaswaniConfig.from_preset("tiny", vocab_size=100)
    assert config.hidden_size == config.d_model == 64
    assert config.num_attention_heads == config.encoder_attention_heads
    assert config.num_hidden_layers == config.encoder_layers


def test_auto_config_knows_the_model_type():
    config = AutoConfig.for_model("vaswani", d_model=128, encoder_attention_heads=4, decoder_attention_heads=4)
    assert isinstance(config, VaswaniConfig) and config.d_model == 128


@pytest.mark.parametrize(
    "overrides, field",
    [
        ({"d_model": 100, "encoder_attention_heads": 8}, "encoder_attention_heads"),
        ({"d_model": 96, "encoder_attention_heads": 4, "decoder_attention_heads": 5}, "decoder_attention_heads"),
        ({"dropout": -0.1}, "dropout"),
        ({"attention_dropout": 1.5}, "attention_dropout"),
        ({"vocab_size": 2}, "eos_token_id"),
        ({"vocab_size": 100, "pad_token_id": 100}, "pad_token_id"),
        ({"encoder_layers": 0}, "encoder_layers"),
        ({"max_position_embeddings": 0}, "max_position_embeddings"),
    ],
)
def test_invalid_values_raise_a_value_error_naming_the_field(overrides, field):
    with pytest.raises(ValueError, match=field):
        VaswaniConfig(**overrides)


STRING_OPTIONS = {
    "init_scheme": tuple(INIT_SCHEMES),
    "sinusoid_layout": ("interleaved", "concatenated"),
    "activation_function": tuple(ACT2FN),
}


@pytest.mark.parametrize("field, choices", STRING_OPTIONS.items())
def test_a_string_option_refuses_any_other_value_naming_the_field_and_its_choices(field, choices, tmp_path):
    for choice in choices:
        assert getattr(VaswaniConfig.from_preset("tiny", **{field: choice}), field) == choice

    def assert_refused(refused):
        message = str(refused.value)
        assert f"field '{field}'" in message and "swishy" in message
        assert all(repr(choice) in message for choice in choices), message

    with pytest.raises(StrictDataclassFieldValidationError) as refused:  # constructed
        VaswaniConfig.from_preset("tiny", **{field: "swishy"})
    assert_refused(refused)
    config = VaswaniConfig()
    default = getattr(config, field)
    with pytest.raises(StrictDataclassFieldValidationError) as refused:  # assigned
        setattr(config, field, "swishy")
    assert_refused(refused)
    assert getattr(config, field) == default
    config.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**saved, field: "swishy"}))
    with pytest.raises(StrictDataclassFieldValidationError) as refused:  # loaded
        AutoConfig.from_pretrained(tmp_path)
    assert_refused(refused)


def test_config_round_trips_through_json(tmp_path):
    config = VaswaniConfig.from_preset("small", vocab_size=999)
    config.save_pretrained(tmp_path)
    loaded = AutoConfig.from_pretrained(tmp_path)
    assert isinstance(loaded, VaswaniConfig)
    differing = {k for k in config.to_dict() if loaded.to_dict()[k] != config.to_dict()[k]}
    assert differing == {"_name_or_path"}
