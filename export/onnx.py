"""ONNX export of a whole translation model: the encoder and a decoder step, each an ONNX program with dynamic batch
and length axes (torch.onnx's exporter), beside the tokenizer and the runner that translates with them on ONNX
Runtime without torch (`onnx_runtime.py`, copied as translate.py). The `onnx` extra brings onnx, onnxscript and
onnxruntime.
"""

import json
import shutil
from pathlib import Path

import torch

from ..modeling.generation_vaswani import EXTRA_OUTPUT_TOKENS


class OnnxEncoder(torch.nn.Module):
    """Section 3.1's encoder stack: the source's hidden states."""

    def __init__(self, model):
        super().__init__()
        self.encoder = model.get_encoder()

    def forward(self, input_ids, attention_mask):
        return self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


class OnnxDecoderStep(torch.nn.Module):
    """The decoder stack and the softmax's logits for the next token, from the target tokens so far and the encoder's
    output (no cache: each step reads the whole target prefix)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, decoder_input_ids, encoder_hidden_states, attention_mask):
        output = self.model(
            encoder_outputs=(encoder_hidden_states,),
            attention_mask=attention_mask,
            decoder_input_ids=decoder_input_ids,
            use_cache=False,
        )
        return output.logits[:, -1]


def export(model, tokenizer, output_dir) -> Path:
    """Write encoder.onnx, decoder.onnx (in the model's dtype), tokenizer.json, onnx_config.json (the special tokens
    and the length limit) and translate.py into `output_dir`; returns it."""
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    config, was_training = model.config, model.training
    model.eval()  # the programs decode: no dropout in them
    sample = tokenizer(["A sentence to trace the programs with.", "Two."], padding=True, return_tensors="pt")
    sample = sample.to(model.device)
    batch, source, target = torch.export.Dim("batch"), torch.export.Dim("source"), torch.export.Dim("target")
    encoder = OnnxEncoder(model)
    with torch.no_grad():
        hidden = encoder(sample["input_ids"], sample["attention_mask"])
    programs = {
        "encoder": (encoder, (sample["input_ids"], sample["attention_mask"]), ["input_ids", "attention_mask"],
                    ["encoder_hidden_states"], ({0: batch, 1: source}, {0: batch, 1: source})),
        "decoder": (OnnxDecoderStep(model), (torch.full((2, 3), config.decoder_start_token_id, device=model.device), hidden,
                    sample["attention_mask"]), ["decoder_input_ids", "encoder_hidden_states", "attention_mask"],
                    ["logits"], ({0: batch, 1: target}, {0: batch, 1: source}, {0: batch, 1: source})),
    }  # fmt: skip
    for name, (module, inputs, input_names, output_names, dynamic_shapes) in programs.items():
        torch.onnx.export(
            module.eval(),
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
    }
    (output_dir / "onnx_config.json").write_text(json.dumps(settings, indent=2) + "\n", encoding="utf-8")
    shutil.copyfile(Path(__file__).with_name("onnx_runtime.py"), output_dir / "translate.py")
    model.train(was_training)
    return output_dir
