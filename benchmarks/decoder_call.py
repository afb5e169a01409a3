"""What the decoder layers' kernel saves a one-token decoder step on the CPU: the model's call with the layers' modules
beside the same call with the layers as one kernel call.

    python -m benchmarks.decoder_call --model outputs/main_job/model [--rows 1 16 32 88 128] [--cached 20]
                                      [--source_length 40] [--threads 2] [--calls 300] [--rounds 9]
                                      [--output_dir docs/benchmarks]

Writes `decoder_call.{json,md}` in --output_dir. For each number of rows, a step of one token a row, with --cached
positions in the self-attention cache, as the paper's searches take it (packed weights, vaswani's attention kernel),
is timed two ways: the model's call with the layers' modules, and with the layers as one call of vaswani's kernel
(`DecoderLayersStep`), the Python between their operators gone. Both give the same logits bit for bit (checked).
Fastest of alternating rounds of --calls calls each.
"""

import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import AutoModelForSeq2SeqLM
from transformers.cache_utils import DynamicCache, EncoderDecoderCache

from benchmarks import harness
from vaswani.cli import command, parse_arguments
from vaswani.modeling.generation_vaswani import BeamSearchCache, cpu_step_kernels


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

    def model_call(self, layers_kernel: bool = True) -> torch.Tensor:
        """The model's logits for the step; its layers by their modules where `layers_kernel` is false."""
        decoder = self.model.get_decoder()
        kernel = decoder.step_layers
        decoder.step_layers = kernel if layers_kernel else None
        try:
            return self.model(
                decoder_input_ids=self.tokens, encoder_outputs=self.encoder_outputs, cache=self.cache, use_cache=True
            ).logits
        finally:
            decoder.step_layers = kernel


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
    expected = step.model_call(layers_kernel=False)
    step.rewind()
    if not torch.equal(step.model_call(), expected):
        raise AssertionError("the layers kernel gives other logits than the layers' modules")
    ways = {"modules": lambda: step.model_call(layers_kernel=False), "kernel": step.model_call}
    for call in ways.values():  # warm-up
        seconds_a_call(call, step.rewind, 10)
    rounds = harness.alternating_rounds(
        list(ways), args.rounds, lambda way, _: seconds_a_call(ways[way], step.rewind, args.calls)
    )
    return {"rows": rows, **{way: min(times) * 1e3 for way, times in rounds.items()}, "rounds": rounds}


def markdown(results: dict) -> str:
    header = ["rows", "the layers' modules, ms", "the layers kernel, ms", "kernel / modules", "saved a call, ms"]
    cells = [
        [row["rows"], f"{row['modules']:.2f}", f"{row['kernel']:.2f}"]
        + [f"{row['kernel'] / row['modules']:.2f}", f"{row['modules'] - row['kernel']:.2f}"]
        for row in results["rows"]
    ]
    return (
        f"A one-token decoder step of `{results['model']}` on the CPU, {results['cached']} positions cached, a source "
        f"of {results['source_length']} tokens, {results['threads']} threads, packed weights and vaswani's attention "
        f"kernel; fastest of {results['rounds']} alternating rounds of {results['calls']} calls; "
        f"{harness.describe(results)}. Each is the model's call; the layers kernel runs the layers' operators in one "
        f"C++ call and gives their logits bit for bit (benchmarks/decoder_call.py).\n\n{harness.table(header, cells)}\n"
    )


@command
def main(argv=None) -> dict:
    (args,) = parse_arguments([DecoderCallArguments], argv, description=__doc__.split("\n\n")[0])
    torch.set_num_threads(args.threads)
    model = AutoModelForSeq2SeqLM.from_pretrained(args.model).eval()
    results = {**harness.environment("torch", "transformers"), "model": args.model, "cached": args.cached}
    results |= {key: getattr(args, key) for key in ("source_length", "threads", "calls", "rounds")}
    with torch.no_grad(), cpu_step_kernels(model, True):
        if model.get_decoder().step_layers is None:
            raise SystemExit("The decoder layers' kernel does not apply here: no C++ compiler, or not an x86 CPU.")
        results["rows"] = [measure(model, args, rows) for rows in args.rows]
    harness.write_page(Path(args.output_dir) / "decoder_call", results, markdown(results))
    return results


if __name__ == "__main__":
    main()
