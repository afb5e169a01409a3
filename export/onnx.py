"""ONNX export of a whole translation model: the encoder, the decoder's first step and its later steps (the
attention caches as inputs and outputs), each an ONNX program with dynamic batch and length axes (torch.onnx), beside
the tokenizer and the runner that translates with them on ONNX Runtime without torch (`onnx_runtime.py`, copied as
translate.py). The `onnx` extra brings onnx, onnxscript and onnxruntime.
"""

import json
import shutil
from pathlib import Path

import torch
from transformers import DynamicCache, EncoderDecoderCache

from ..modeling.generation_vaswani import EXTRA_OUTPUT_TOKENS


class OnnxEncoder(torch.nn.Module):
    """Section 3.1's encoder stack: the source's hidden states."""

    def __init__(self, model):
        super().__init__()
        self.encoder = model.get_encoder()

    def forward(self, input_ids, attention_mask):
        return self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


def cache_names(kind: str, layers: int) -> list[str]:
    """The names of one cache's tensors as the programs take and give them: every layer's keys, then its values."""
    return [f"{kind}_{part}_{layer}" for part in ("keys", "values") for layer in range(layers)]


class OnnxDecoder(torch.nn.Module):
    """The decoder stack and the logits of the next token, from the previous token and the caches of section 3.2.3's
    two attentions: `past` empty, the first step, which also gives the encoder-decoder attention's keys and values;
    else the self-attention's keys and values of the tokens so far, then the encoder-decoder attention's."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, decoder_input_ids, encoder_hidden_states, attention_mask, *past):
        config, layers = self.model.config, self.model.config.decoder_layers
        cache = EncoderDecoderCache(DynamicCache(config=config), DynamicCache(config=config))
        for layer in range(layers if past else 0):
            cache.self_attention_cache.update(past[layer], past[layers + layer], layer)
            cache.cross_attention_cache.update(past[2 * layers + layer], past[3 * layers + layer], layer)
            cache.is_updated[layer] = True  # the encoder output's projections are in the cache: not again
        output = self.model(
            encoder_outputs=(encoder_hidden_states,),
            attention_mask=attention_mask,
            decoder_input_ids=decoder_input_ids,
            cache=cache,
            use_cache=True,
        )
        caches = [output.cache.self_attention_cache] + ([] if past else [output.cache.cross_attention_cache])
        tensors = [[getattr(c.layers[i], part) for part in ("keys", "values") for i in range(layers)] for c in caches]
        return output.logits[:, -1], *[tensor for kind in tensors for tensor in kind]


def export(model, tokenizer, output_dir) -> Path:
    """Write encoder.onnx, decoder_start.onnx and decoder_step.onnx (in the model's dtype), tokenizer.json,
    onnx_config.json (the special tokens, the length limit, the layers) and translate.py into `output_dir`."""
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    config, was_training = model.config, model.training
    model.eval()  # the programs decode: no dropout in them
    sample = tokenizer(["A sentence to trace the programs with.", "Two."], padding=True, return_tensors="pt")
    sample = sample.to(model.device)
    encoder, decoder, layers = OnnxEncoder(model).eval(), OnnxDecoder(model).eval(), config.decoder_layers
    ids, mask = sample["input_ids"], sample["attention_mask"]
    with torch.no_grad():  # the inputs of a later step, after two steps: a past of 2 tokens traces the general case
        hidden = encoder(ids, mask)
        start = torch.full((len(ids), 1), config.decoder_start_token_id, device=model.device)
        logits, *caches = decoder(start, hidden, mask)
        cross = caches[2 * layers :]
        logits, *own = decoder(logits.argmax(-1, keepdim=True), hidden, mask, *caches)
        next_token = logits.argmax(-1, keepdim=True)
    batch, source, past = torch.export.Dim("batch"), torch.export.Dim("source"), torch.export.Dim("past")
    step_axes = {"decoder_input_ids": {0: batch}, "encoder_hidden_states": {0: batch, 1: source},
                 "attention_mask": {0: batch, 1: source}}  # fmt: skip
    cache_axes = [{0: batch, 2: past}] * (2 * layers) + [{0: batch, 2: source}] * (2 * layers)
    own_names, cross_names = cache_names("self", layers), cache_names("cross", layers)
    programs = {  # name: (module, example inputs, their names, their dynamic axes, the outputs' names)
        "encoder": (encoder, (ids, mask), ["input_ids", "attention_mask"],
                    {"input_ids": {0: batch, 1: source}, "attention_mask": {0: batch, 1: source}},
                    ["encoder_hidden_states"]),
        "decoder_start": (decoder, (start, hidden, mask), list(step_axes), step_axes,
                          ["logits", *own_names, *cross_names]),
        "decoder_step": (decoder, (next_token, hidden, mask, *own, *cross),
                         [*step_axes, *(f"past_{name}" for name in own_names), *cross_names],
                         {**step_axes, "past": tuple(cache_axes)}, ["logits", *own_names]),
    }  # fmt: skip
    for name, (module, inputs, input_names, dynamic_shapes, output_names) in programs.items():
        torch.onnx.export(
            module,
            inputs,
            output_dir / f"{name}.onnx",
            dynamo=True,
            input_names=input_names,
            output_names=output_names,
            dynamic_shapes=dynamic_shapes,
            external_data=False,
        )
    tokenizer.backend_tokenizer.save(str(output_dir / "tokenizer.json"))
    settings = {
        "decoder_start_token_id": config.decoder_start_token_id,
        "eos_token_id": config.eos_token_id,
        "pad_token_id": config.pad_token_id,
        "extra_output_tokens": EXTRA_OUTPUT_TOKENS,
        "decoder_layers": layers,
    }
    (output_dir / "onnx_config.json").write_text(json.dumps(settings, indent=2) + "\n", encoding="utf-8")
    shutil.copyfile(Path(__file__).with_name("onnx_runtime.py"), output_dir / "translate.py")
    model.train(was_training)
    return output_dir
