"""Where a decoding's time goes, per row-step: vaswani's paper beam search and greedy search beside CTranslate2's.

    python -m benchmarks.decoding_steps --model outputs/main_job/model --dataset_dir outputs/main_job/data
                                        [--samples 1111] [--batch_size 32] [--threads 2 1] [--rounds 2]
                                        [--output_dir docs/benchmarks]

Writes `decoding_steps.{json,md}` in --output_dir: for each search and thread count, the decoder's calls, its
row-steps (the rows it computed, summed over its calls), the whole decoding's time and its time per row-step, the share
of it in the model's calls and the rest of it per decoder call (vaswani's); and, at the first thread count, the
operators' shares of the self time of one profiled decoding. How it measures: docs/benchmarks/README.md.
"""

import argparse
import contextlib
import json
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from benchmarks import harness
from benchmarks.decoding import VASWANI_DECODINGS, ctranslate2_job, engine
from vaswani.cli import command, parse_arguments
from vaswani.evaluation.bleu import load_pairs, load_translation_model


BEAM, GREEDY = "vaswani, the paper's beam search (default)", "vaswani, greedy"
CT2_BEAM, CT2_GREEDY = "CTranslate2 float32, beam 4", "CTranslate2 float32, greedy"
VASWANI_ROWS, NAMES = [BEAM, GREEDY], [BEAM, GREEDY, CT2_BEAM, CT2_GREEDY]
# torch's operators in groups, by a part of their names; the rest is "other". CTranslate2's wheel is built without
# its profiler (no `ctranslate2.init_profiling`), so its operators are not broken down.
GROUPS = {
    "matrix products": ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "mkldnn::_linear_pointwise"),
    "attention": ("scaled_dot_product", "vaswani::decoding_attention"),
    "cache reorders and copies": (
        "aten::index_select",
        "aten::index_copy",
        "aten::copy_",
        "aten::cat",
        "vaswani::copy_cache_rows",
    ),
    "topk and log_softmax": ("aten::topk", "vaswani::best_continuations", "log_softmax"),
}
TOP = 12  # operators listed by name
COUNTS = ("decoder_calls", "row_steps", "first_step_rows")


@dataclass
class DecodingStepsArguments:
    model: str = field(metadata={"help": "a trained model folder (scripts/main_job.sh leaves outputs/main_job/model)"})
    dataset_dir: str = field(metadata={"help": "the dataset folder whose test split is translated"})
    source_lang: str = "en"
    target_lang: str = "es"
    samples: int | None = field(default=None, metadata={"help": "the first N test sentences (all by default)"})
    batch_size: int = 32
    threads: list[int] = field(
        default_factory=lambda: [2, 1], metadata={"help": "each run's threads; profiled: the first"}
    )
    rounds: int = field(default=2, metadata={"help": "timed rounds, engines alternating; each row's fastest"})
    output_dir: str = "docs/benchmarks"
    conditions: str = field(default="", metadata={"help": "what else the machine ran meanwhile, for the record"})
    engine: str | None = field(default=None, metadata={"help": argparse.SUPPRESS})  # a measuring process's one engine
    profile: bool = field(default=False, metadata={"help": argparse.SUPPRESS})  # that process profiles its operators


class DecoderSteps:
    """The decoder's calls and row-steps while a model decodes: each call's rows are its batch rows times the positions
    it computes (one a step with a cache). The first call after each encoding (the start token's step) is counted
    too, and its rows apart (`first_step_rows`). The wall time spent in the model's calls (the decoder and the output
    layer) is summed too (`model_seconds`): the rest of a decoding is the search's own work between them, the
    encoder and the tokenizer."""

    def __init__(self, model):
        self.calls = self.row_steps = self.first_rows = 0
        self.first, self.in_model, self.started = False, 0.0, 0.0
        model.model.encoder.register_forward_pre_hook(self.encoded)
        model.model.decoder.register_forward_pre_hook(self.decoded, with_kwargs=True)
        model.register_forward_pre_hook(self.model_starts)
        model.register_forward_hook(self.model_ends)

    def encoded(self, module, args):
        self.first = True

    def decoded(self, module, args, kwargs):
        tokens = kwargs["input_ids"] if kwargs.get("input_ids") is not None else kwargs["inputs_embeds"]
        rows = tokens.shape[0] * tokens.shape[1]
        self.calls, self.row_steps = self.calls + 1, self.row_steps + rows
        if self.first:
            self.first, self.first_rows = False, self.first_rows + rows

    def model_starts(self, module, args):
        self.started = time.perf_counter()

    def model_ends(self, module, args, output):
        self.in_model += time.perf_counter() - self.started

    def counts(self) -> dict:
        return {
            "decoder_calls": self.calls,
            "row_steps": self.row_steps,
            "first_step_rows": self.first_rows,
            "model_seconds": self.in_model,
        }


def operator_shares(events: list[tuple[str, int, float]]) -> dict:
    """(name, calls, self microseconds) of each operator: the top TOP operators and GROUPS' shares of the self time,
    with their calls and microseconds a call."""
    total = sum(us for _, _, us in events)

    def share(calls, us):
        return {"share": us / total, "calls": calls, "us_per_call": us / calls if calls else 0.0}

    grouped = {group: [0, 0.0] for group in [*GROUPS, "other"]}
    for name, calls, us in events:
        group = next((group for group, parts in GROUPS.items() if any(part in name for part in parts)), "other")
        grouped[group][0] += calls
        grouped[group][1] += us
    top = sorted(events, key=lambda event: -event[2])[:TOP]
    return {
        "self_us": total,
        "groups": {group: share(*counted) for group, counted in grouped.items()},
        "top": [{"name": name, **share(calls, us)} for name, calls, us in top],
    }


def vaswani_measure(args) -> dict:
    """One decoding by `args.engine` in this process: its time, the decoder's counts and, with `args.profile`, the
    operators' shares (torch.profiler's self CPU time; the profiled decoding's own time is not the row's)."""
    torch.set_num_threads(args.threads[0])
    model, tokenizer = load_translation_model(args.model, device="cpu")
    sources = load_pairs(args.dataset_dir, "test", args.source_lang, args.target_lang, args.samples)[0]
    decode, steps = engine(args.engine, args, model, tokenizer), DecoderSteps(model)
    profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
    with torch.inference_mode(), profiler if args.profile else contextlib.nullcontext():
        start = time.perf_counter()
        decode(sources.to_pylist())
        measured = {"seconds": time.perf_counter() - start, **steps.counts()}
    if args.profile:
        events = [(event.key, event.count, event.self_cpu_time_total) for event in profiler.key_averages()]
        measured["operators"] = operator_shares(events)
    return measured


def ctranslate2_measure(args, name: str, sentences: list[str], export: Path, threads: int) -> dict:
    """One decoding by CTranslate2 in a fresh process, and the decoder's counts as estimated from its output lengths
    (`estimated_steps`)."""
    job = ctranslate2_job(name, args.model, export, sentences, args.batch_size, threads)
    decoded = harness.time_ctranslate2(job, export.parent)["decodings"][name]
    lengths = [len(tokens) for tokens in decoded["tokens"]]
    return {"seconds": decoded["times"][0], **estimated_steps(lengths, args.batch_size, job["decodings"][0])}


def estimated_steps(lengths: list[int], batch_size: int, decoding: dict) -> dict:
    """CTranslate2 counts no steps. From its best hypotheses' lengths, in the order of its batches: a sentence takes
    its length + 1 steps (the last one writes </s>), on `beam_size` rows, and leaves its batch then; a batch takes
    as many calls as its longest sentence's steps. Estimates: a beam may run on after its best hypothesis ends."""
    steps = [length + 1 for length in lengths]
    chunks = [steps[start : start + batch_size] for start in range(0, len(steps), batch_size)]
    return {
        "decoder_calls": sum(max(chunk) for chunk in chunks),
        "row_steps": decoding["beam_size"] * sum(steps),
        "first_step_rows": decoding["beam_size"] * len(steps),
    }


def markdown(results: dict) -> str:
    header = ["engine", "threads", "decoder calls", "row-steps", "seconds", "µs per row-step"]
    header += ["in the model's calls", "the rest, ms per decoder call"]
    cells = [
        [row["engine"], row["threads"], f"{row['decoder_calls']:,}", f"{row['row_steps']:,}"]
        + [f"{row['seconds']:.2f}", f"{row['us_per_row_step']:.0f}"]
        + (
            [f"{row['model_seconds'] / row['seconds']:.0%}", f"{row['rest_ms_per_call']:.2f}"]
            if row["counted"]
            else ["", ""]
        )
        for row in results["rows"]
    ]
    groups, conditions = [*GROUPS, "other"], f"; {results['conditions']}" if results["conditions"] else ""
    shares = [
        [name]
        + [f"{profile['groups'][group]['share']:.0%}" for group in groups]
        + ["; ".join(f"{top['name']} {top['us_per_call']:.0f}" for top in profile["top"][:4])]
        for name, profile in results["operators"].items()
    ]
    return (
        f"Decoding {results['sentences']} test sentences, batches of {results['batch_size']}, fastest of "
        f"{results['rounds']} alternating rounds; {harness.describe(results)}{conditions}. Each decoding "
        "in a fresh process; CTranslate2's in processes where torch was never loaded. vaswani's decoder calls and "
        "row-steps are counted, the start token's step included; CTranslate2's are estimated from its output "
        f"lengths (benchmarks/decoding_steps.py, `estimated_steps`).\n\n{harness.table(header, cells)}\n\n"
        f"The operators' shares of the self time of one profiled decoding, {results['threads'][0]} threads, and the "
        "top operators' microseconds a call:\n\n"
        f"{harness.table(['engine', *groups, 'top operators, µs a call'], shares)}\n"
    )


@command
def main(argv=None) -> dict:
    (args,) = parse_arguments([DecodingStepsArguments], argv, description=__doc__.split("\n\n")[0])
    if args.engine:
        print(json.dumps(vaswani_measure(args)))
        return {}
    sentences = load_pairs(args.dataset_dir, "test", args.source_lang, args.target_lang, args.samples)[0].to_pylist()
    with tempfile.TemporaryDirectory(prefix="decoding-steps-") as folder:
        export = harness.export_ctranslate2(args.model, Path(folder) / "float32", "float32")

        def measure(key, index, profile=False):
            name, threads = key
            if name in VASWANI_DECODINGS:
                options = {"threads": threads, "profile": profile, "engine": name}
                options |= {key: getattr(args, key) for key in ("model", "dataset_dir", "source_lang", "target_lang")}
                options |= {key: getattr(args, key) for key in ("samples", "batch_size") if getattr(args, key)}
                forwarded = [f"--{key}={value}" for key, value in options.items()]
                measured = harness.run_json(["-m", "benchmarks.decoding_steps", *forwarded])
            else:
                measured = ctranslate2_measure(args, name, sentences, export, threads)
            print(
                f"{'profiled' if profile else f'round {index + 1}'}: {name}, {threads} threads: "
                f"{measured['seconds']:.2f} s",
                flush=True,
            )
            return measured

        keys = [(name, threads) for threads in args.threads for name in NAMES]
        rounds = harness.alternating_rounds(keys, args.rounds, measure)
        profiles = {name: measure((name, args.threads[0]), None, profile=True)["operators"] for name in VASWANI_ROWS}
    results = {**harness.environment("torch", "transformers", "ctranslate2"), "conditions": args.conditions}
    results |= {"sentences": len(sentences), "batch_size": args.batch_size, "threads": args.threads}
    results |= {"rounds": args.rounds, "rows": [], "operators": profiles}
    for (name, threads), measured in rounds.items():
        fastest = min(measured, key=lambda m: m["seconds"])
        seconds, counts = fastest["seconds"], {key: fastest[key] for key in COUNTS}
        row = {"engine": name, "threads": threads, "counted": name in VASWANI_DECODINGS, **counts}
        row |= {"seconds": seconds, "times": [m["seconds"] for m in measured]}
        row |= {"us_per_row_step": seconds / counts["row_steps"] * 1e6}
        if row["counted"]:  # vaswani's: the rest of the time, per decoder call
            rest = seconds - fastest["model_seconds"]
            row |= {
                "model_seconds": fastest["model_seconds"],
                "rest_ms_per_call": rest / counts["decoder_calls"] * 1e3,
            }
        results["rows"].append(row)
    harness.write_page(Path(args.output_dir) / "decoding_steps", results, markdown(results))
    return results


if __name__ == "__main__":
    main()
