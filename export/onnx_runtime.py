"""Translate with a vaswani model exported to ONNX (`vaswani.export.onnx.export`), on ONNX Runtime, without torch.

    python onnx-model/translate.py onnx-model < sources.txt > translations.txt
    python onnx-model/translate.py onnx-model --batch_size 32 --threads 4 --input sources.txt --output out.txt

The export copies this file into its folder as translate.py. It needs numpy, onnxruntime and tokenizers, not torch
and not the vaswani package. Greedy decoding: the encoder runs once per batch, then the decoder once per new token,
with the attention caches, until each sentence ends (</s>) or reaches its source length + 50 tokens (section 6.1).
"""

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import onnxruntime
from tokenizers import Tokenizer


class OnnxTranslator:
    """The programs of an export folder (the encoder, the decoder's first and later steps), with its tokenizer and its
    special tokens."""

    def __init__(self, folder, threads: int = 0):
        folder = Path(folder)
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = threads  # 0: ONNX Runtime's default, one thread per core
        self.programs = {
            name: onnxruntime.InferenceSession(str(folder / f"{name}.onnx"), options)
            for name in ("encoder", "decoder_start", "decoder_step")
        }
        self.settings = json.loads((folder / "onnx_config.json").read_text(encoding="utf-8"))
        self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        # A saved tokenizer.json keeps the padding and truncation it was last used with: each sentence goes in whole.
        self.tokenizer.no_padding()
        self.tokenizer.no_truncation()

    def translate(self, sentences: list[str], batch_size: int = 32) -> list[str]:
        """The greedy translation of each sentence, in order; batches of similar length, longest first (less
        padding). A blank sentence gives a blank translation."""
        order = sorted((i for i, text in enumerate(sentences) if text.strip()), key=lambda i: -len(sentences[i]))
        answers = [""] * len(sentences)
        for start in range(0, len(order), batch_size):
            chunk = order[start : start + batch_size]
            for i, answer in zip(chunk, self.translate_batch([sentences[i] for i in chunk])):
                answers[i] = answer
        return answers

    def translate_batch(self, sentences: list[str]) -> list[str]:
        settings = self.settings
        sources = [encoding.ids for encoding in self.tokenizer.encode_batch(sentences)]
        lengths = np.array([len(ids) for ids in sources])
        input_ids = np.full((len(sources), lengths.max()), settings["pad_token_id"], dtype=np.int64)
        for row, ids in enumerate(sources):
            input_ids[row, : len(ids)] = ids
        attention_mask = (np.arange(lengths.max()) < lengths[:, None]).astype(np.int64)
        (hidden,) = self.programs["encoder"].run(None, {"input_ids": input_ids, "attention_mask": attention_mask})
        limits = lengths + settings["extra_output_tokens"]
        tokens = np.full(len(sources), settings["decoder_start_token_id"], dtype=np.int64)
        step = {
            "decoder_input_ids": tokens[:, None],
            "encoder_hidden_states": hidden,
            "attention_mask": attention_mask,
        }
        logits, *caches = self.programs["decoder_start"].run(None, step)
        own, cross = caches[: 2 * settings["decoder_layers"]], caches[2 * settings["decoder_layers"] :]
        step_inputs = [entry.name for entry in self.programs["decoder_step"].get_inputs()]
        active = np.arange(len(sources))  # the sentences still decoding: only they go through the decoder
        outputs = [[] for _ in sources]
        for length in range(1, limits.max() + 1):
            # A sentence at its limit ends now, as generate()'s SourceLengthLimit ends it.
            tokens = np.where(length >= limits[active], settings["eos_token_id"], logits.argmax(-1))
            for row, token in zip(active, tokens):
                outputs[row].append(int(token))
            going = tokens != settings["eos_token_id"]
            if not going.any():
                break
            active, hidden, attention_mask = active[going], hidden[going], attention_mask[going]
            own, cross = [tensor[going] for tensor in own], [tensor[going] for tensor in cross]
            values = [tokens[going][:, None], hidden, attention_mask, *own, *cross]
            logits, *own = self.programs["decoder_step"].run(None, dict(zip(step_inputs, values)))
        return [text.strip() for text in self.tokenizer.decode_batch(outputs, skip_special_tokens=True)]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", help="the export's folder (its .onnx programs, tokenizer.json, onnx_config.json)")
    parser.add_argument("--input", default="-", help="one sentence per line (-: standard input)")
    parser.add_argument("--output", default="-", help="the translations, one per line (-: standard output)")
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--threads", type=int, default=0, help="ONNX Runtime's threads (0: one per core)")
    args = parser.parse_args(argv)
    text = sys.stdin.read() if args.input == "-" else Path(args.input).read_text(encoding="utf-8")
    translations = OnnxTranslator(args.folder, args.threads).translate(text.splitlines(), args.batch_size)
    lines = "".join(line.replace("\n", " ") + "\n" for line in translations)
    if args.output == "-":
        sys.stdout.write(lines)
    else:
        Path(args.output).write_text(lines, encoding="utf-8")


if __name__ == "__main__":
    main()
