"""The time of one decoding step, vaswani beside CTranslate2, at several batch sizes: where the decoding gap lies.

    python -m benchmarks.decoding_step --model outputs/main_job/model [--preset base] [--rows 1 8 32 128]
                                       [--lengths 20 60] [--threads 2] [--repeats 5] [--output_dir docs/benchmarks]

Each engine (vaswani's greedy decoding and paper's beam search, CTranslate2's greedy and beam 4) decodes `rows` copies
of one sentence into exactly each of --lengths tokens, in a fresh process; a step is the difference of the two times
over the difference of the lengths. vaswani's rows also count the torch operators a step calls. With --preset, a
random-weight model of that preset with the folder's tokenizer. Writes `decoding_step_<preset or "model">.{json,md}`
in --output_dir; how it measures: docs/benchmarks/README.md.
"""

import argparse
import json
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from benchmarks import harness
from vaswani.cli import command, parse_arguments


SOURCE = "And God said, Let there be light: and there was light, and God saw the light, that it was good."
ENGINES = {
    "vaswani, greedy": {"num_beams": 1},
    "vaswani, the paper's beam search": {"num_beams": 4, "length_penalty": 0.6},
    "CTranslate2 float32, greedy": {"beam_size": 1},
    "CTranslate2 float32, beam 4": {"beam_size": 4, "length_penalty": 0.6},
}


@dataclass
class DecodingStepArguments:
    model: str = field(metadata={"help": "a trained model folder (scripts/main_job.sh leaves outputs/main_job/model)"})
    preset: str | None = field(default=None, metadata={"help": "decode a random-weight model of this preset instead"})
    rows: list[int] = field(default_factory=lambda: [1, 8, 32, 128], metadata={"help": "sentences per batch"})
    lengths: list[int] = field(default_factory=lambda: [20, 60], metadata={"help": "two forced output lengths"})
    threads: int = 2
    repeats: int = 5
    output_dir: str = "docs/benchmarks"
    engine: str | None = field(default=None, metadata={"help": argparse.SUPPRESS})  # a measuring process's engine


def vaswani_steps(args) -> dict:
    """In this process: seconds of each decoding (rows, length) by one of vaswani's decodings, and the torch
    operators a step calls."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    import vaswani  # noqa: F401  (registers the model with the Auto classes)

    torch.set_num_threads(args.threads)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForSeq2SeqLM.from_pretrained(args.model).eval()
    options = ENGINES[args.engine]

    def decode(rows: int, length: int):
        source = tokenizer([SOURCE] * rows, return_tensors="pt")
        with torch.inference_mode():
            return model.generate(**source, **options, min_new_tokens=length, max_new_tokens=length)

    seconds, operators = {}, {}
    for rows in args.rows:
        for length in args.lengths:
            decode(rows, length)
            times = []
            for _ in range(args.repeats):
                start = time.perf_counter()
                output = decode(rows, length)
                times.append(time.perf_counter() - start)
            assert output.shape[1] == length + 1, output.shape
            seconds[f"{rows},{length}"] = min(times)
        counts = []
        for length in args.lengths:
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                decode(rows, length)
            counts.append(sum(event.count for event in prof.key_averages() if event.key.startswith("aten::")))
        operators[rows] = (counts[1] - counts[0]) / (args.lengths[1] - args.lengths[0])
    return {"seconds": seconds, "operators_per_step": operators}


def ctranslate2_steps(args, folder: Path, name: str) -> dict:
    """Seconds of each decoding (rows, length) by CTranslate2, timed in a fresh process that never imports torch."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(Path(args.model) / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    tokens = tokenizer.encode(SOURCE).tokens
    seconds = {}
    for rows in args.rows:
        for length in args.lengths:
            job = {"model_dir": str(folder / "ct2"), "device": "cpu", "threads": args.threads, "length": length}
            job |= {"decodings": [{"name": name, **ENGINES[name]}], "batches": [[tokens] * rows]}
            measured = harness.time_ctranslate2(job | {"warmup": 1, "repeats": args.repeats}, folder)
            assert not measured["torch_loaded"], "CTranslate2 was timed in a process where torch was loaded"
            seconds[f"{rows},{length}"] = min(measured["decodings"][name]["times"])
    return {"seconds": seconds}


def random_model_folder(args, folder: Path) -> str:
    """A model of --preset with random weights and --model's tokenizer, saved into `folder`."""
    import torch
    from transformers import AutoTokenizer

    from vaswani import VaswaniConfig, VaswaniForConditionalGeneration

    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    config = VaswaniConfig.from_preset(args.preset, vocab_size=len(tokenizer))
    VaswaniForConditionalGeneration(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


def markdown(results: dict) -> str:
    lengths, steps = results["arguments"]["lengths"], results["ms_per_step"]
    operators, cells = results["operators_per_step"], []
    for rows in results["arguments"]["rows"]:
        greedy, ct2_greedy = steps["vaswani, greedy"][rows], steps["CTranslate2 float32, greedy"][rows]
        beam, ct2_beam = steps["vaswani, the paper's beam search"][rows], steps["CTranslate2 float32, beam 4"][rows]
        counts = [f"{operators[name][rows]:.0f}" for name in ("vaswani, greedy", "vaswani, the paper's beam search")]
        cells.append([rows, f"{greedy:.2f}", f"{ct2_greedy:.2f}", f"{greedy / ct2_greedy:.2f}x", f"{beam:.2f}"])
        cells[-1] += [f"{ct2_beam:.2f}", f"{beam / ct2_beam:.2f}x", *counts]
    header = ["sentences a batch", "vaswani greedy", "CTranslate2 greedy", "ratio", "vaswani, paper's beam 4"]
    header += ["CTranslate2 beam 4", "ratio", "torch operators a greedy step calls", "a beam step"]
    return (
        f"Milliseconds per decoding step of {results['model']}, each row decoding exactly {lengths[0]} and "
        f"{lengths[1]} tokens (the step: the difference over {lengths[1] - lengths[0]} steps); {results['threads']} "
        f"threads, fastest of {results['repeats']}; {harness.describe(results)}. Each engine alone, in a fresh "
        f"process; CTranslate2 where torch was never loaded.\n\n{harness.table(header, cells)}\n"
    )


@command
def main(argv=None) -> dict:
    (args,) = parse_arguments([DecodingStepArguments], argv, description=__doc__.split("\n\n")[0])
    if args.engine:
        print(json.dumps(vaswani_steps(args)))
        return {}
    (short, long) = args.lengths
    measured = {}
    with tempfile.TemporaryDirectory(prefix="decoding-step-") as folder:
        folder = Path(folder)
        if args.preset:
            args.model = random_model_folder(args, folder / "model")
        harness.export_ctranslate2(args.model, folder / "ct2", "float32")
        for name in ENGINES:
            if name.startswith("CTranslate2"):
                measured[name] = ctranslate2_steps(args, folder, name)
                continue
            forwarded = [f"--model={args.model}", f"--threads={args.threads}", f"--repeats={args.repeats}"]
            forwarded += ["--rows", *map(str, args.rows), "--lengths", *map(str, args.lengths)]
            measured[name] = harness.run_json(["-m", "benchmarks.decoding_step", *forwarded, "--engine", name])
            print(f"{name}: measured", flush=True)
    results = {
        **harness.environment("torch", "transformers"),
        "model": f"a random-weight {args.preset} model" if args.preset else "the trained model",
        "threads": args.threads,
        "repeats": args.repeats,
        "arguments": asdict(args),
        "ms_per_step": {
            name: {
                rows: (result["seconds"][f"{rows},{long}"] - result["seconds"][f"{rows},{short}"])
                / (long - short)
                * 1e3
                for rows in args.rows
            }
            for name, result in measured.items()
        },
        "operators_per_step": {
            name: {int(rows): count for rows, count in result["operators_per_step"].items()}
            for name, result in measured.items()
            if "operators_per_step" in result
        },
        "raw": measured,
    }
    harness.write_page(Path(args.output_dir) / f"decoding_step_{args.preset or 'model'}", results, markdown(results))
    return results


if __name__ == "__main__":
    main()
