"""The model as a graph: `torch.export`, transformers' exporters and `torch.compile` give the eager outputs.

Each test runs on `trained_tiny_model` (conftest.py), whose logits differ from position to position and from sentence
to sentence, so that a graph that dropped the mask, the positions or the cache would show in them.
"""

import pytest
import torch
from helpers import pad_pairs
from transformers import EncoderDecoderCache
from transformers.exporters.configs import DynamoConfig
from transformers.exporters.exporter_dynamo import DynamoExporter
from transformers.integrations.executorch import Seq2SeqLMExportableModule


@pytest.fixture
def batch(trained_tiny_model, translation_pairs):
    """A right-padded batch of five pairs with its decoder input: the keyword arguments of a forward pass."""
    input_ids, attention_mask, labels = pad_pairs(translation_pairs[:5])
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "decoder_input_ids": trained_tiny_model.prepare_decoder_input_ids_from_labels(labels),
    }


def test_torch_export_of_the_forward_gives_the_eager_logits(trained_tiny_model, batch):
    inputs = {**batch, "use_cache": False}
    with torch.no_grad():
        expected = trained_tiny_model(**inputs).logits
        program = torch.export.export(trained_tiny_model, (), kwargs=inputs)
        torch.testing.assert_close(program.module()(**inputs).logits, expected, atol=1e-6, rtol=1e-6)
        # Another batch size and length through the same graph.
        shorter = {key: value[:3, :-1] if key != "use_cache" else value for key, value in inputs.items()}
        exported_dynamic = torch.export.export(
            trained_tiny_model,
            (),
            kwargs=inputs,
            dynamic_shapes={
                "input_ids": {0: torch.export.Dim("batch"), 1: torch.export.Dim.AUTO},
                "attention_mask": {0: torch.export.Dim("batch"), 1: torch.export.Dim.AUTO},
                "decoder_input_ids": {0: torch.export.Dim("batch"), 1: torch.export.Dim.AUTO},
                "use_cache": None,
            },
        )
        torch.testing.assert_close(
            exported_dynamic.module()(**shorter).logits, trained_tiny_model(**shorter).logits, atol=1e-6, rtol=1e-6
        )


def test_transformers_dynamo_exporter_gives_the_eager_logits_and_cache(trained_tiny_model, batch):
    """With the cache the eval-mode forward returns (transformers registers the cache classes with torch.export)."""
    with torch.no_grad():
        expected = trained_tiny_model(**batch, use_cache=True)
    exported = DynamoExporter().export(trained_tiny_model, dict(batch), DynamoConfig())
    with torch.no_grad():
        outputs = exported(**batch)
    torch.testing.assert_close(outputs.logits, expected.logits, atol=1e-6, rtol=1e-6)
    assert isinstance(outputs.cache, EncoderDecoderCache)
    for mine, theirs in zip(outputs.cache.self_attention_cache.layers, expected.cache.self_attention_cache.layers):
        torch.testing.assert_close(mine.keys, theirs.keys)
        torch.testing.assert_close(mine.values, theirs.values)


def test_transformers_seq2seq_export_for_generation_decodes_as_generate(trained_tiny_model, translation_pairs):
    """`Seq2SeqLMExportableModule`: the encoder and a static-cache decoder step, exported, driven greedily.

    Its own `generate()` starts every translation from token 0 (T5's start token); a vaswani model starts from
    `decoder_start_token_id`, so the loop here drives the exported programs from that token, as a runtime would.
    """
    model = trained_tiny_model
    source = torch.tensor([translation_pairs[6][0]])
    max_new_tokens = 10
    exportable = Seq2SeqLMExportableModule(model, batch_size=1, max_hidden_seq_length=64, max_cache_length=32)
    exportable.export(encoder_input_ids=source)
    expected = model.generate(
        source,
        num_beams=1,
        max_new_tokens=max_new_tokens,
        eos_token_id=None,  # every step, so that each one's logits are compared
        return_dict_in_generate=True,
        output_logits=True,
    )
    with torch.no_grad():
        encoded = exportable.exported_encoder.module()(source)
        token = torch.tensor([[model.config.decoder_start_token_id]])
        for step in range(max_new_tokens):
            logits = exportable.exported_decoder.module()(token, encoded, torch.tensor([step]))[:, -1]
            torch.testing.assert_close(logits, expected.logits[step], atol=1e-5, rtol=1e-5)
            token = logits.argmax(-1, keepdim=True)
            assert token.item() == expected.sequences[0, step + 1].item()


@pytest.mark.skipif(
    torch.__version__ < (2, 13),
    reason="torch 2.11 cannot compile the deep copy of the config with which the forward's own DynamicCache starts",
)
def test_compiled_eval_forward_gives_the_eager_logits(trained_tiny_model, batch):
    compiled = torch.compile(trained_tiny_model, backend="eager", fullgraph=True)
    with torch.no_grad():
        expected = trained_tiny_model(**batch)
        outputs = compiled(**batch)
    torch.testing.assert_close(outputs.logits, expected.logits, atol=1e-6, rtol=1e-6)
    assert outputs.cache.get_seq_length() == batch["decoder_input_ids"].shape[1]
