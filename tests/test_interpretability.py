"""The interpretability tools researchers already use, on a trained vaswani model, as docs/inspection.md calls them:
BertViz's `model_view` and `head_view` over the encoder, decoder and cross attention, and Inseq's attribution of a
translation to its source tokens, by attention and by a gradient method (saliency)."""

import json

import pytest
import torch
from helpers import PAIRS, docs_block

from vaswani import VaswaniTranslationPipeline


@pytest.fixture(scope="module")
def docs(trained_text_model):
    """What the docs' BertViz and Inseq blocks compute, run on the trained model's folder."""
    _, _, folder = trained_text_model
    bertviz = docs_block("docs/inspection.md", "### BertViz").replace('"outputs/main_job/model"', repr(str(folder)))
    namespace = {}
    exec(bertviz, namespace)  # noqa: S102
    exec(docs_block("docs/inspection.md", "### Inseq"), namespace)  # noqa: S102
    return namespace


def bertviz_data(page) -> dict:
    """The attention and tokens a BertViz view draws: the JSON it embeds in its page."""
    start = page.data.index("const params = ") + len("const params = ")
    return json.JSONDecoder().raw_decode(page.data[start:])[0]


def test_bertviz_draws_every_layer_and_head_of_the_three_attentions_with_the_tokens(docs, trained_text_model):
    model, tokenizer, _ = trained_text_model
    translation = VaswaniTranslationPipeline(model=model, tokenizer=tokenizer)(PAIRS[0][0])[0]["translation_text"]
    # BertViz shows byte-level BPE's word-initial "Ġ" as the space it stands for.
    source = [t.replace("Ġ", " ") for t in tokenizer.convert_ids_to_tokens(tokenizer(PAIRS[0][0]).input_ids)]
    target = tokenizer.convert_ids_to_tokens(tokenizer(text_target=translation).input_ids)
    decoder = ["<s>", *[t.replace("Ġ", " ") for t in target[:-1]]]
    config = model.config
    for page in (docs["model_page"], docs["head_page"]):
        by_name = {entry["name"]: entry for entry in bertviz_data(page)["attention"]}
        assert set(by_name) == {"Encoder", "Decoder", "Cross"}
        assert by_name["Encoder"]["left_text"] == source and by_name["Decoder"]["left_text"] == decoder
        assert by_name["Cross"]["left_text"] == decoder and by_name["Cross"]["right_text"] == source
    # model_view: every layer and head; the weights the model computes, each query's summing to one.
    cross = torch.tensor(bertviz_data(docs["model_page"])["attention"][2]["attn"])
    assert cross.shape == (config.num_hidden_layers, config.num_attention_heads, len(decoder), len(source))
    torch.testing.assert_close(cross, torch.cat(docs["output"].cross_attentions), atol=1e-5, rtol=0)
    torch.testing.assert_close(cross.sum(-1), torch.ones(cross.shape[:-1]), atol=1e-4, rtol=0)


@pytest.mark.parametrize("method", ["attention", "saliency"])
def test_inseq_attributes_the_papers_translation_to_its_source_tokens(docs, trained_text_model, method):
    model, tokenizer, _ = trained_text_model
    expected = VaswaniTranslationPipeline(model=model, tokenizer=tokenizer)(PAIRS[0][0])[0]["translation_text"]
    attribution = docs["attributions"][method].sequence_attributions[0]
    source = [token.token for token in attribution.source]
    target = [token.token for token in attribution.target]
    assert source == tokenizer.convert_ids_to_tokens(tokenizer(PAIRS[0][0]).input_ids)
    words = [token for token in target if token not in tokenizer.all_special_tokens]
    assert target[0] == "<s>" and target[-1] == "</s>" and tokenizer.convert_tokens_to_string(words) == expected
    scores = attribution.source_attributions  # source, generated target, then the method's own dimensions
    assert scores.shape[:2] == (len(source), len(target) - 1) and torch.isfinite(scores).all()  # <s> not generated
    if method == "attention":  # the model's encoder-decoder attention: layers and heads
        assert scores.shape[2:] == (model.config.num_hidden_layers, model.config.num_attention_heads)
        torch.testing.assert_close(scores.sum(0), torch.ones(scores.shape[1:]), atol=1e-4, rtol=0)
    else:  # the gradient of each target token's probability with respect to each source embedding
        assert scores.shape[2] == model.config.d_model and scores.abs().sum() > 0
