"""What the model's Python costs a one-token decoder step on the CPU: the model's call beside its operators alone.

    python -m benchmarks.decoder_call --model outputs/main_job/model [--rows 1 16 32 88 128] [--cached 20]
                                      [--source_length 40] [--threads 2] [--calls 300] [--rounds 9]
                                      [--output_dir docs/benchmarks]

Writes `decoder_call.{json,md}` in --output_dir. For each number of rows, a step of one token a row, with --cached
positions in the self-attention cache, as the paper's searches take it (packed weights, vaswani's attention kernel),
is timed two ways: the model's call, and the same operators called one after another with no module, mask, check or
output object between them (`operators_alone`). Both give the same logits (checked). The difference is what a step
without Python between its operators would save a call. Fastest of alternating rounds of --calls calls each.
"""

import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import AutoModelForSeq2SeqLM
from transformers.cache_utils import DynamicCache, EncoderDecoderCache

from benchmarks import harness
from vaswani.cli import command, parse_arguments
from vaswani.modeling.decoding_attention import compiled_kernel
from vaswani.modeling.generation_vaswani import BeamSearchCache, decoding_attention_kernel, packed_linear_layers


@dataclass
class DecoderCallArguments:
    model: str = field(metadata={"help": "a trained model folder (scripts/main_job.sh leaves outputs/main_job/model)"})
    rows: list[int] = field(
        default_factory=lambda: [1, 16, 32, 88, 128],
        metadata={"help": "the decoder's rows a step; the main job's searches average 16 (greedy) and 88 (beam 4)"},
    )
    cached: int = field(default=20, metadata={"help": "positions held in the self-attention cache"})
    source_length: int = 40
    threads: int = 2
    calls: int = field(default=300, metadata={"help": "calls timed a round"})
    rounds: int = field(default=9, metadata={"help": "alternating rounds; each figure is the fastest"})
    output_dir: str = "docs/benchmarks"


class FilledStep:
    """A model mid-search: `rows` rows of random tokens, their encoder output, and a self-attention cache holding
    `cached` positions, which every timed call writes one position past and `rewind` takes back."""

    def __init__(self, model, rows: int, cached: int, source_length: int):
        generator = torch.Generator().manual_seed(0)
        vocab = model.config.vocab_size
        source = torch.randint(4, vocab, (rows, source_length), generator=generator)
        self.model, self.cached = model, cached
        self.encoder_outputs = model.get_encoder()(input_ids=source)
        self.tokens = torch.randint(4, vocab, (rows, 1), generator=generator)
        self.cache = EncoderDecoderCache(BeamSearchCache(), DynamicCache())
        for _ in range(cached):
            self.model_call()

    def rewind(self) -> None:
        for layer in self.cache.self_attention_cache.layers:
            layer.filled = self.cached
            layer.show_filled()

    def model_call(self) -> torch.Tensor:
        return self.model(
            decoder_input_ids=self.tokens, encoder_outputs=self.encoder_outputs, cache=self.cache, use_cache=True
        ).logits

    def operators_alone(self) -> torch.Tensor:
        """The step's operators in the model's order, each linear layer its packed forward, with no module call."""
        decoder, kernel = self.model.get_decoder(), compiled_kernel()
        rows = self.tokens.shape[0]
        positions = torch.full_like(self.tokens, self.cached)
        hidden = torch.nn.functional.embedding(self.tokens, decoder.embed_tokens.weight) * decoder.embed_tokens.scale
        hidden = hidden + decoder.embed_positions.forward(positions, hidden.dtype)

        def heads(states, attention):
            return states.view(rows, 1, -1, attention.head_dim).transpose(1, 2)

        def add_and_norm(residual, output, norm):
            return torch.nn.functional.layer_norm(
                residual + output, norm.normalized_shape, norm.weight, norm.bias, norm.eps
            )

        for index, layer in enumerate(decoder.layers):
            attention, cross = layer.self_attn, layer.encoder_attn
            query = heads(attention.q_proj.forward(hidden), attention)
            keys, values = self.cache.self_attention_cache.layers[index].update(
                heads(attention.k_proj.forward(hidden), attention), heads(attention.v_proj.forward(hidden), attention)
            )
            output = kernel(query, keys, values, None, attention.scaling).view(rows, 1, -1)
            hidden = add_and_norm(hidden, attention.out_proj.forward(output), layer.self_attn_layer_norm)
            held = self.cache.cross_attention_cache.layers[index]
            query = heads(cross.q_proj.forward(hidden), cross)
            output = kernel(query, held.keys, held.values, None, cross.scaling).view(rows, 1, -1)
            hidden = add_and_norm(hidden, cross.out_proj.forward(output), layer.encoder_attn_layer_norm)
            inner = torch.relu(layer.feed_forward.fc1.forward(hidden))
            hidden = add_and_norm(hidden, layer.feed_forward.fc2.forward(inner), layer.final_layer_norm)
        return self.model.get_output_embeddings().forward(hidden)


def seconds_a_call(call, rewind, calls: int) -> float:
    started = time.perf_counter()
    for _ in range(calls):
        rewind()
        call()
    return (time.perf_counter() - started) / calls


def measure(model, args, rows: int) -> dict:
    """The model's call and its operators alone at `rows` rows: milliseconds a call, each the fastest round."""
    step = FilledStep(model, rows, args.cached, args.source_length)
    step.rewind()
    expected = step.model_call()
    step.rewind()
    difference = (step.operators_alone() - expected).abs().max().item()
    if difference > 1e-4:
        raise AssertionError(f"the operators alone give other logits than the model's call ({difference:.2e})")
    ways = {"model_call": step.model_call, "operators_alone": step.operators_alone}
    for call in ways.values():  # warm-up
        seconds_a_call(call, step.rewind, 10)
    rounds = harness.alternating_rounds(
        list(ways), args.rounds, lambda way, _: seconds_a_call(ways[way], step.rewind, args.calls)
    )
    return {"rows": rows, **{way: min(times) * 1e3 for way, times in rounds.items()}, "rounds": rounds}


def markdown(results: dict) -> str:
    header = ["rows", "the model's call, ms", "its operators alone, ms", "operators alone / call", "saved a call, ms"]
    cells = [
        [row["rows"], f"{row['model_call']:.2f}", f"{row['operators_alone']:.2f}"]
        + [f"{row['operators_alone'] / row['model_call']:.2f}", f"{row['model_call'] - row['operators_alone']:.2f}"]
        for row in results["rows"]
    ]
    return (
        f"A one-token decoder step of `{results['model']}` on the CPU, {results['cached']} positions cached, a source "
        f"of {results['source_length']} tokens, {results['threads']} threads, packed weights and vaswani's attention "
        f"kernel; fastest of {results['rounds']} alternating rounds of {results['calls']} calls; "
        f"{harness.describe(results)}. The operators alone are the model's own, called in its order without its "
        f"modules, and give its logits (benchmarks/decoder_call.py).\n\n{harness.table(header, cells)}\n"
    )


@command
def main(argv=None) -> dict:
    (args,) = parse_arguments([DecoderCallArguments], argv, description=__doc__.split("\n\n")[0])
    torch.set_num_threads(args.threads)
    model = AutoModelForSeq2SeqLM.from_pretrained(args.model).eval()
    results = {**harness.environment("torch", "transformers"), "model": args.model, "cached": args.cached}
    results |= {key: getattr(args, key) for key in ("source_length", "threads", "calls", "rounds")}
    with torch.no_grad(), packed_linear_layers(model, True), decoding_attention_kernel(model, True):
        results["rows"] = [measure(model, args, rows) for rows in args.rows]
    harness.write_page(Path(args.output_dir) / "decoder_call", results, markdown(results))
    return results


if __name__ == "__main__":
    main()
