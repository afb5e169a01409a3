"""Table 3's variants from the command line: vaswani-train builds its model from a preset or a config file
(--config_name), with fields set on top (--config_overrides "d_model=128,encoder_ffn_dim=256"), checked by the
config's own validation, recorded in the run's summary and its checkpoints, and refused on resume when they differ."""

import json

import pytest
import torch
from helpers import exit_message, make_dataset, word_tokenizer

from vaswani import VaswaniConfig, VaswaniForConditionalGeneration
from vaswani.scripts import train


VARIANT = "d_model=32,encoder_ffn_dim=48,decoder_ffn_dim=48,encoder_layers=1,decoder_attention_heads=2,dropout=0.2"
SHORT_RUN = ["--max_steps", 2, "--save_steps", 2, "--average_last", 1, "--batch_tokens", 300, "--eval_steps", 0,
             "--eval_bleu_samples", 0, "--report_to", "none", "--lr_schedule", "short"]  # fmt: skip


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("variants")
    return make_dataset(root / "data", {"train": 60, "validation": 6}), word_tokenizer(root / "tokenizer")


def corpus_flags(corpus, output_dir):
    return ["--dataset_dir", corpus[0], "--tokenizer", corpus[1], "--output_dir", output_dir]


def test_overrides_on_a_preset_build_the_variant_and_the_summary_records_it(corpus, tmp_path):
    model = train.main(
        [*corpus_flags(corpus, tmp_path / "run"), "--preset", "tiny", "--config_overrides", VARIANT, *SHORT_RUN]
    )
    config = model.config
    assert (config.d_model, config.encoder_ffn_dim, config.decoder_ffn_dim) == (32, 48, 48)
    assert (config.encoder_layers, config.decoder_layers, config.encoder_attention_heads) == (1, 2, 4)
    assert (config.decoder_attention_heads, config.dropout) == (2, 0.2)
    assert config.vocab_size == 36  # the tokenizer's, whatever the preset says
    saved = VaswaniConfig.from_pretrained(tmp_path / "run")
    assert (saved.d_model, saved.encoder_layers, saved.decoder_attention_heads) == (32, 1, 2)
    summary = json.loads((tmp_path / "run" / "training_summary.json").read_text())
    assert summary["args"]["config_overrides"] == VARIANT and summary["args"]["preset"] == "tiny"
    assert summary["config"]["d_model"] == 32 and summary["config"]["encoder_ffn_dim"] == 48
    assert summary["num_parameters"] == model.num_parameters()

    # Resumed with other overrides: refused, naming the field; with the same ones, it continues.
    resume = [*corpus_flags(corpus, tmp_path / "run"), "--preset", "tiny", *SHORT_RUN, "--resume_from_checkpoint"]
    message = exit_message(train.main, [*resume, "--config_overrides", VARIANT.replace("ffn_dim=48", "ffn_dim=64")])
    assert "was trained with encoder_ffn_dim=48, but this command asks for 64" in message
    assert "--config_overrides" in message
    resumed = train.main([*resume, "--config_overrides", VARIANT, "--max_steps", 4, "--save_steps", 2])
    assert resumed.config.d_model == 32


def test_a_config_file_or_folder_is_the_starting_point(corpus, tmp_path):
    VaswaniConfig.from_preset("tiny", encoder_layers=1, decoder_layers=1, d_model=48).save_pretrained(tmp_path / "cfg")
    model = train.main([*corpus_flags(corpus, tmp_path / "a"), "--config_name", tmp_path / "cfg", *SHORT_RUN])
    assert (model.config.d_model, model.config.encoder_layers, model.config.vocab_size) == (48, 1, 36)
    model = train.main(
        [*corpus_flags(corpus, tmp_path / "b"), "--config_name", tmp_path / "cfg" / "config.json",
         "--config_overrides", "decoder_layers=2", *SHORT_RUN]
    )  # fmt: skip
    assert (model.config.d_model, model.config.decoder_layers) == (48, 2)
    summary = json.loads((tmp_path / "b" / "training_summary.json").read_text())
    assert summary["args"]["config_name"] == str(tmp_path / "cfg" / "config.json") and summary["preset"] is None


def test_rows_b_and_e_of_table_3_from_the_command_line(corpus, tmp_path):
    """Row (B)'s key size apart from the value size, and row (E)'s learned positions: built from --config_overrides,
    trained, saved with the model (the positions' table among its weights) and loaded back."""
    overrides = "d_k=4,d_v=8,positional_encoding=learned,max_position_embeddings=260"
    model = train.main([*corpus_flags(corpus, tmp_path / "run"), "--preset", "tiny", "--config_overrides", overrides,
                        *SHORT_RUN])  # fmt: skip
    attention = model.model.encoder.layers[0].self_attn
    assert (attention.q_proj.out_features, attention.v_proj.out_features, attention.out_proj.in_features) == (
        16,
        32,
        32,
    )
    loaded = VaswaniForConditionalGeneration.from_pretrained(tmp_path / "run")
    assert (loaded.config.d_k, loaded.config.d_v, loaded.config.max_position_embeddings) == (4, 8, 260)
    table = loaded.model.decoder.embed_positions.weight
    assert table.shape == (260, 64) and torch.equal(table, model.model.decoder.embed_positions.weight.cpu())
    summary = json.loads((tmp_path / "run" / "training_summary.json").read_text())
    assert summary["config"]["positional_encoding"] == "learned" and summary["config"]["d_k"] == 4


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--config_overrides", "d_modle=32"], "--config_overrides 'd_modle=32': key d_modle isn't in the original config dict"),
        (["--config_overrides", "d_model=30"], "the model config is not valid (d_model (30) must be divisible by encoder_attention_heads (8), or d_k and d_v set.)"),
        (["--config_overrides", "dropout=1.5"], "the model config is not valid (dropout must be in [0, 1), got 1.5.)"),
        (["--config_overrides", "d_model=big"], "--config_overrides 'd_model=big': invalid literal for int()"),
        (["--config_overrides", "d_model"], '--config_overrides takes "field=value,field=value", not \'d_model\''),
        (["--config_overrides", "d_k=-4"], "the model config is not valid (d_k must be positive or None (d_model / heads), got -4.)"),
        (["--config_overrides", "d_v=sixty"], "--config_overrides 'd_v=sixty': invalid literal for int()"),
        (["--config_overrides", "positional_encoding=learned,max_position_embeddings=200"], "Learned positional embeddings (positional_encoding=learned) cover max_position_embeddings=200 positions, fewer than --max_source_length 256"),
        (["--config_overrides", "vocab_size=9,pad_token_id=3"], "--config_overrides cannot set vocab_size, pad_token_id: the tokenizer decides them."),
        (["--preset", "tiny", "--config_name", "cfg"], "give --preset or --config_name, not both"),
        (["--config_name", "no/such/folder"], "--config_name no/such/folder:"),
        (["--config_name", "bert.json"], "--config_name bert.json is a bert config, not a vaswani one."),
    ],
)  # fmt: skip
def test_a_config_that_cannot_be_built_is_refused_naming_the_field(
    corpus, tmp_path, capsys, monkeypatch, flags, message
):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bert.json").write_text(json.dumps({"model_type": "bert", "hidden_size": 8}))
    error = exit_message(train.main, [*corpus_flags(corpus, tmp_path / "out"), *flags, *SHORT_RUN])
    error = capsys.readouterr().err if error == "2" else error  # argparse's usage error, on stderr
    assert message in error, error
    assert not (tmp_path / "out").exists()  # refused before anything is written
