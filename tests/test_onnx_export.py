"""ONNX export through transformers' exporters (docs/exports.md, "ONNX"): the prefill and decode programs, run by ONNX Runtime
through transformers' runners, decode as `generate()` does.

`OnnxExporter().export_for_generation` runs `generate()` once to capture the decoder's first step (prefill: the encoder
output, an empty cache) and a later step (decode: a filled cache), and exports each as a program of fixed shapes. A
static cache keeps the decode step's shapes the same at every step, so that one program serves them all.
"""

import pytest
import torch
from helpers import docs_block, pad_pairs
from transformers.exporters import ExportedModel
from transformers.exporters.utils import decompose_for_generation


pytest.importorskip("onnxscript")
pytest.importorskip("onnxruntime")
# torch's ONNX exporter checks its tree specs the old way, and warns about it: its business, not the model's.
pytestmark = pytest.mark.filterwarnings(r"default:`isinstance\(treespec, LeafSpec\)` is deprecated:FutureWarning")


@pytest.mark.slow  # two ONNX exports and 63 ONNX Runtime steps: about 30 s on 2 shared cores
def test_the_docs_onnx_programs_give_generates_greedy_logits_and_tokens_on_a_padded_batch(
    trained_tiny_model, translation_pairs, tmp_path, monkeypatch
):
    model = trained_tiny_model
    input_ids, attention_mask, _ = pad_pairs(translation_pairs[:3])  # right-padded: 4, 5 and 6 tokens
    monkeypatch.chdir(tmp_path)
    snippet = {"model": model, "inputs": {"input_ids": input_ids, "attention_mask": attention_mask}}
    exec(docs_block("docs/exports.md", "### transformers' exporters"), snippet)
    assert set(snippet["exported"].components) == {"prefill", "decode"}
    exported = ExportedModel.from_pretrained("onnx-model")
    greedy, batch = snippet["greedy"], snippet["batch"]

    cache_length = greedy.max_cache_len
    new_tokens = cache_length - 1
    expected = model.generate(
        **batch,
        num_beams=1,
        max_new_tokens=new_tokens,
        eos_token_id=None,  # every step, so that each one's logits are compared
        return_dict_in_generate=True,
        output_logits=True,
    )
    # The first step's inputs as generate() builds them (the encoder output, the empty static cache, the 4D decoder
    # mask over the cache's slots); each later step feeds the decode program the token chosen and the cache returned.
    step = decompose_for_generation(model, batch, generation_config=greedy)["prefill"][1]
    step = {name: value for name, value in step.items() if name in exported.runners["prefill"].metadata.kwargs}
    sequences = step["decoder_input_ids"]
    slots = torch.arange(cache_length)
    for index in range(new_tokens):
        outputs = exported.runners["prefill" if index == 0 else "decode"](**step)
        logits = outputs.logits[:, -1]
        torch.testing.assert_close(logits, expected.logits[index], atol=1e-4, rtol=1e-4)
        sequences = torch.cat((sequences, logits.argmax(-1, keepdim=True)), dim=-1)
        step["decoder_input_ids"] = sequences[:, -1:]
        step["decoder_attention_mask"] = (slots <= index + 1).expand(len(sequences), 1, 1, cache_length)
        step["cache"] = outputs.cache
    assert torch.equal(sequences, expected.sequences)
    targets = [target for _, target in translation_pairs[:3]]
    assert [row[1 : 1 + len(target)].tolist() for row, target in zip(sequences, targets)] == targets  # it translates
