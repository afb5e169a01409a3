"""Speed and memory of vaswani next to its peers, measured side by side on the same machine.

    python -m benchmarks.benchmark [--device cpu|cuda] [--preset tiny|small|base|big]
                                   [--dtype float32|bfloat16|float16] [--output_dir docs/benchmarks]

Writes `<device>_<preset>_<dtype>.{json,md}` in --output_dir: vaswani, `MarianMTModel` of the same sizes and
CTranslate2 (generation only) by the recipe's training step (tokens/s, MFU, peak memory) and greedy and beam-4
generation, then the training step against length and batch tokens. How it measures: docs/benchmarks/README.md.
"""

import argparse
import functools
import gc
import json
import re
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Literal

import torch

from benchmarks import harness
from vaswani.checks import UsageError
from vaswani.cli import command, parse_arguments
from vaswani.progress import progress_bar
from vaswani.training.step import recipe_adam, train_step


PEERS = ("vaswani", "marian")  # the implementations the sweeps and the training columns compare
SPECIAL_IDS = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2, "decoder_start_token_id": 1}
VOCAB_SIZE = 32000
LABEL_SMOOTHING = 0.1  # section 5.4, the recipe's


def memory_status(field: str) -> int:
    """A field of /proc/self/status in bytes: VmRSS (resident now) or VmHWM (peak resident since the last reset)."""
    return int(re.search(rf"{field}:\s+(\d+) kB", Path("/proc/self/status").read_text()).group(1)) * 1024


def marian_config(config):
    """transformers' MarianMTModel configured as the paper's model of `config`'s sizes: ReLU, post-norm, sinusoidal
    positions, sqrt(d_model)-scaled embeddings tied across encoder, decoder and output."""
    from transformers import MarianConfig

    same = "vocab_size d_model encoder_layers decoder_layers encoder_attention_heads decoder_attention_heads dropout"
    same += " encoder_ffn_dim decoder_ffn_dim max_position_embeddings pad_token_id bos_token_id eos_token_id"
    sizes = {name: getattr(config, name) for name in [*same.split(), "decoder_start_token_id"]}
    paper = {"activation_function": "relu", "scale_embedding": True, "share_encoder_decoder_embeddings": True}
    return MarianConfig(**sizes, **paper, tie_word_embeddings=True, forced_eos_token_id=None)


def preset_config(preset: str, max_positions: int):
    """The benchmarks' VaswaniConfig of a preset: their vocabulary and special ids."""
    from vaswani import VaswaniConfig

    sizes = {"vocab_size": VOCAB_SIZE, "max_position_embeddings": max_positions}
    return VaswaniConfig.from_preset(preset, **sizes, **SPECIAL_IDS)


def build_model(implementation: str, preset: str, max_positions: int):
    from transformers import MarianMTModel

    from vaswani import VaswaniForConditionalGeneration

    config = preset_config(preset, max_positions)
    if implementation == "vaswani":
        return VaswaniForConditionalGeneration(config)
    return MarianMTModel(marian_config(config))


class Timer:
    """Wall-clock repetitions, synchronised with the device so that queued GPU work is counted."""

    def __init__(self, device: torch.device):
        self.device, self.times = device, []

    def __enter__(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        self.start = time.perf_counter()

    def __exit__(self, *exc):
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        self.times.append(time.perf_counter() - self.start)


def random_ids(batch: int, length: int, device) -> torch.Tensor:
    ids = torch.randint(4, VOCAB_SIZE, (batch, length), device=device)
    ids[:, -1] = SPECIAL_IDS["eos_token_id"]
    return ids


def flops_per_token(config, length: int) -> tuple[int, int]:
    """Model FLOPs of training on one source token and on one target token, in pairs of `length`-token sentences: the
    forward pass's matrix multiplications (2 FLOPs a multiply-add) times 3. Attention counts every key position, the
    causal half included; Marian's biases are left out, so that both are credited with the same work."""
    d = config.d_model
    attention = 2 * length * d  # Q K^T and the weighted sum of V, per query token
    encoder_layer = 4 * d * d + attention + 2 * d * config.encoder_ffn_dim
    # Self-attention (Q, K, V, output), encoder-decoder attention (Q, output), FFN.
    decoder_layer = 4 * d * d + attention + 2 * d * d + attention + 2 * d * config.decoder_ffn_dim
    encoder_keys_values = 2 * d * d
    source = config.encoder_layers * encoder_layer + config.decoder_layers * encoder_keys_values
    target = config.decoder_layers * decoder_layer + d * config.vocab_size
    return 3 * 2 * source, 3 * 2 * target


def training_step_flops(config, batch: int, length: int) -> int:
    """Model FLOPs of one training step on `batch` pairs of `length` source and `length` target tokens."""
    return batch * length * sum(flops_per_token(config, length))


def matmul_ceiling(device: torch.device, dtype: torch.dtype, size: int | None = None) -> dict:
    """The FLOP/s of a square matrix multiplication in `dtype` (`size` rows; 8192 on CUDA, 2048 on the CPU), the best
    of 10: the ceiling MFU is quoted against."""
    size = size or (8192 if device.type == "cuda" else 2048)
    left, right = (torch.randn(size, size, device=device, dtype=dtype) for _ in range(2))
    timer = Timer(device)
    for _ in range(2 + 10):
        with timer:
            left @ right
    return {"size": size, "flops_per_s": 2 * size**3 / min(timer.times[2:])}


def measure_training(model, args, length: int, batch_tokens: int) -> dict:
    """The recipe's training steps (`train_step`, label smoothing 0.1, the recipe's Adam) on one fixed batch of random
    pairs of `length` tokens: the times and each step's loss per target token."""
    from accelerate import Accelerator

    from vaswani.modeling.modeling_vaswani import VaswaniLabelSmoothedCrossEntropy, shift_tokens_right

    device = torch.device(args.device)
    if args.chunk_elements:
        VaswaniLabelSmoothedCrossEntropy.accelerator_chunk_elements = args.chunk_elements
    accelerator = Accelerator(cpu=device.type == "cpu", mixed_precision="bf16" if args.autocast else "no")
    model.to(device=device, dtype=getattr(torch, args.dtype)).train()
    optimizer = recipe_adam(accelerator, model.parameters(), lr=1e-4)
    step_model, optimizer = accelerator.prepare(torch.compile(model) if args.compile_training else model, optimizer)
    batch = max(1, batch_tokens // length)
    source, target = random_ids(batch, length, device), random_ids(batch, length, device)
    decoder_input_ids = shift_tokens_right(target, SPECIAL_IDS["pad_token_id"], SPECIAL_IDS["decoder_start_token_id"])
    pair = {"input_ids": source, "attention_mask": torch.ones_like(source), "labels": target}
    pair["decoder_input_ids"] = decoder_input_ids
    timer, losses = Timer(device), []
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    for _ in range(args.warmup + args.repeats):  # the warm-up also compiles
        with timer:
            result = train_step(accelerator, step_model, optimizer, None, [pair], LABEL_SMOOTHING)
        losses.append(result.loss / result.target_tokens)
    peak = torch.cuda.max_memory_allocated() if device.type == "cuda" else memory_status("VmHWM") - args.baseline_rss
    flops = training_step_flops(model.config, batch, length)
    measured = {"times": timer.times[-args.repeats :], "losses": losses, "tokens": result.tokens, "batch": batch}
    return measured | {"length": length, "peak_memory": peak, "flops": flops}


def measure_generation(model, args, num_beams: int, paper_decoding: bool = False) -> dict:
    device = torch.device(args.device)
    model.to(device=device, dtype=getattr(torch, args.dtype)).eval()
    source = random_ids(args.gen_batch, args.gen_source_length, device)
    # By default the same search for every engine: transformers' beam search, which Marian and CTranslate2 also run;
    # `paper_decoding` times vaswani's default, the paper's GNMT-scored search (benchmarks/decoding.py times it on a
    # trained model's translations).
    options = {"paper_decoding": paper_decoding} if model.config.model_type == "vaswani" else {}
    if args.compile:
        from transformers import CompileConfig

        compile_config = CompileConfig(fullgraph=True)
        compile_config._compile_all_devices = True  # generate() compiles on accelerators only unless told so
        options |= {"cache_implementation": "static", "compile_config": compile_config}
    options |= {"num_beams": num_beams, "length_penalty": 0.6, "attention_mask": torch.ones_like(source)}
    timer = Timer(device)
    for _ in range(args.warmup + args.repeats):  # the warm-up also compiles
        with torch.inference_mode(), timer:
            output = model.generate(source, min_new_tokens=args.gen_length, max_new_tokens=args.gen_length, **options)
    assert output.shape == (args.gen_batch, args.gen_length + 1), output.shape
    amounts = {"sentences": args.gen_batch, "tokens": args.gen_batch * args.gen_length}
    return {"times": timer.times[-args.repeats :], **amounts}


# generate()'s searches: (num_beams, paper_decoding). The paper's beam search is vaswani's alone.
SEARCHES = {"beam1": (1, False), "beam4": (4, False), "paper_beam4": (4, True)}


def measure_searches(model, args) -> dict:
    """`measure_generation` of each search in `args.searches` (default: every search the model has)."""
    names = args.searches or [
        name for name in SEARCHES if model.config.model_type == "vaswani" or not SEARCHES[name][1]
    ]
    return {f"generate_{name}": measure_generation(model, args, *SEARCHES[name]) for name in names}


def export_for_ctranslate2(args, quantization: str) -> dict:
    """The random-weight model exported for CTranslate2 into --export_dir, with the source batch as token strings
    (`source.json`), for `ctranslate2_timing` to time where torch never ran."""
    from vaswani.export.ctranslate2 import export, vocabulary

    model = build_model("vaswani", args.preset, args.max_positions).eval()
    export(model, args.export_dir, quantization=quantization)
    tokens = vocabulary(model)
    source = [[tokens[i] for i in ids] for ids in random_ids(args.gen_batch, args.gen_source_length, "cpu").tolist()]
    (Path(args.export_dir) / "source.json").write_text(json.dumps(source))
    return {}


def measure_ctranslate2(args, implementation: str, folder: Path, timeout=None) -> dict:
    """CTranslate2's greedy and beam-4 generation (`implementation`: "ctranslate2:QUANTIZATION"), the output length
    forced as for the others: exported into `folder` where not yet, then timed where torch never ran."""
    if not (folder / "source.json").exists():
        run_worker(args, implementation, export_dir=folder, timeout=timeout)
    job = {"model_dir": str(folder), "device": args.device, "threads": torch.get_num_threads()}
    job["decodings"] = [{"name": f"generate_beam{beams}", "beam_size": beams} for beams in (1, 4)]
    job |= {"batches": [json.loads((folder / "source.json").read_text())], "length": args.gen_length}
    job |= {"warmup": args.warmup, "repeats": args.repeats}
    measured = harness.time_ctranslate2(job, folder, timeout)
    amounts = {"sentences": args.gen_batch, "tokens": args.gen_batch * args.gen_length}
    results = {}
    for name, decoding in measured["decodings"].items():
        assert all(len(tokens) == args.gen_length for tokens in decoding["outputs"]), decoding["outputs"]
        results[name] = {"times": decoding["times"], **amounts, "torch_loaded": measured["torch_loaded"]}
    return results


def worker(args) -> dict:
    """One fresh process: one implementation's measurements (or one sweep point); with `rows`, one measurement per
    row (its settings replacing these), one after another, each with a model of its own."""
    if args.rows:
        results = []
        for row in args.rows:
            results.append(worker(replace(args, rows=None, **row)))
            gc.collect()  # the row's model and optimizer, before the next row's
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        return {"rows": results}
    Path("/proc/self/clear_refs").write_text("5")  # the peak resident memory (VmHWM) measured afresh from here
    args.baseline_rss = memory_status("VmRSS")
    torch.manual_seed(0)
    if args.implementation.startswith("ctranslate2"):
        return export_for_ctranslate2(args, quantization=args.implementation.split(":")[1])
    model = build_model(args.implementation, args.preset, args.max_positions)
    if args.sweep_point:
        length, batch_tokens = args.sweep_point
        return {"train": measure_training(model, args, length, batch_tokens)}
    if args.measure == "profile":
        from benchmarks.gpu_report_training import profile_training

        measure = functools.partial(measure_training, model, length=args.train_length, batch_tokens=args.batch_tokens)
        return {"profile": profile_training(measure, args)}
    results = {}
    if args.measure in ("all", "generate"):
        results.update(measure_searches(model, args))
    if args.measure in ("all", "train"):  # last: it sets the peak memory
        results["train"] = measure_training(model, args, args.train_length, args.batch_tokens)
    return results


def run_worker(args, implementation: str, sweep_point=None, timeout=None, export_dir=None) -> dict:
    """One measurement in a fresh process (so that memory figures do not leak from one to the next); for a
    CTranslate2 implementation, its export into `export_dir`."""
    one = asdict(replace(args, implementation=implementation, sweep_point=sweep_point, export_dir=export_dir))
    return harness.run_json(["-m", "benchmarks.benchmark", "--worker", json.dumps(one, default=str)], timeout=timeout)


def pool_rounds(measured: list[dict]) -> dict:
    """One implementation's measurements from several processes: all timed repetitions, and the highest peak."""
    pooled = {}
    for name, first in measured[0].items():
        pooled[name] = {**first, "times": [t for result in measured for t in result[name]["times"]]}
        if "peak_memory" in first:
            pooled[name]["peak_memory"] = max(result[name]["peak_memory"] for result in measured)
        if "torch_loaded" in first:
            pooled[name]["torch_loaded"] = any(result[name]["torch_loaded"] for result in measured)
    return pooled


def fmt_ratio(ours: dict | None, theirs: dict | None) -> str:
    return f"{ours['median'] / theirs['median']:.2f}x" if ours and theirs else "n/a"


def summary_row(implementation: str, result: dict, ceiling: dict) -> dict:
    """An implementation's rates (median, lowest, highest), MFU and peak memory, from its pooled measurements."""
    row = {"implementation": implementation}
    if "train" in result:
        train = result["train"]
        row["train_tokens_per_s"] = harness.summarise(train["times"], train["tokens"])
        row["train_flops_per_s"] = harness.summarise(train["times"], train["flops"])
        row["train_mfu"] = row["train_flops_per_s"]["median"] / ceiling["flops_per_s"]
        row["train_peak_memory_mib"] = train["peak_memory"] / 2**20
    for beams in (1, 4):
        generated = result[f"generate_beam{beams}"]
        for amount in ("sentences", "tokens"):
            row[f"beam{beams}_{amount}_per_s"] = harness.summarise(generated["times"], generated[amount])
    return row


def main_table(rows: list[dict]) -> str:
    marian = next(row for row in rows if row["implementation"] == "marian")
    against_marian = ("train_tokens_per_s", "beam1_sentences_per_s", "beam4_sentences_per_s")
    cells = []
    for row in rows:
        trained = "train_mfu" in row
        flops = f"{row['train_flops_per_s']['median'] / 1e12:.3g} ({row['train_mfu']:.1%})" if trained else "n/a"
        memory = f"{row['train_peak_memory_mib']:,.0f}" if trained else "n/a"
        train = harness.fmt_rate(row.get("train_tokens_per_s"))
        rates = [row[f"beam{beams}_{amount}_per_s"] for beams in (1, 4) for amount in ("sentences", "tokens")]
        ratios = [fmt_ratio(row.get(key), marian.get(key)) for key in against_marian]
        cells.append([row["implementation"], train, flops, memory, *map(harness.fmt_rate, rates), *ratios])
    header = ["implementation", "train tokens/s", "train TFLOP/s (MFU)", "train peak MiB", "greedy sent/s"]
    header += ["greedy tok/s", "beam-4 sent/s", "beam-4 tok/s", "train vs Marian", "greedy vs Marian"]
    return harness.table([*header, "beam-4 vs Marian"], cells)


def sweep_table(title: str, sweep: list[dict], axis: str) -> str:
    cells = []
    for point in (p for p in sweep if p["sweep_axis"] == axis):
        times_ms = [t * 1000 for t in point["times"]]
        median = f"{statistics.median(times_ms):,.1f} ({min(times_ms):,.1f}-{max(times_ms):,.1f})"
        memory = f"{point['peak_memory'] / 2**20:,.0f}"
        cells.append([point["implementation"], point["length"], point["batch"], median, memory])
    header = ["implementation", "length", "batch (sentences)", "ms/step (min-max)", "peak MiB"]
    return f"{title}\n\n" + harness.table(header, cells)


def page(args, report: dict) -> str:
    """The page of a report: its settings, the main table, then the training step against length and batch tokens."""
    ceiling = report["matmul_ceiling"]
    header = (
        f"## {args.preset} preset, {args.dtype}, {report['device']}\n\n"
        f"{harness.describe(report)}. Training batch {args.batch_tokens} source + {args.batch_tokens} target "
        f"tokens of length {args.train_length}; generation of {args.gen_batch} sentences of "
        f"{args.gen_source_length} tokens into exactly {args.gen_length} tokens; median (min-max) of "
        f"{args.rounds} processes x {args.repeats} repetitions after {args.warmup} warm-up (main table; the "
        f"sweeps: 1 process each). MFU: model FLOPs of the training step "
        f"(matrix multiplications, forward and backward) per second over the measured {args.dtype} "
        f"matrix-multiply ceiling of this device, {ceiling['flops_per_s'] / 1e12:.3g} TFLOP/s "
        f"({ceiling['size']}x{ceiling['size']} matrices)."
    )
    length_title = f"### Training step against sequence length ({args.batch_tokens} source tokens a batch)"
    tokens_title = f"### Training step against batch tokens (length {args.train_length})"
    sweep = report["sweep"]
    tables = [sweep_table(length_title, sweep, "length"), sweep_table(tokens_title, sweep, "batch_tokens")]
    return "\n\n".join([header, main_table(report["rows"]), *tables]) + "\n"


HIDDEN = {"help": argparse.SUPPRESS}  # a measuring process's arguments, not the user's


@dataclass
class BenchmarkArguments:
    device: Literal["cpu", "cuda"] = "cpu"
    preset: Literal["tiny", "small", "base", "big"] = "small"
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    batch_tokens: int = field(default=4096, metadata={"help": "source tokens per training step (target alike)"})
    train_length: int = field(default=32, metadata={"help": "sentence length of the training batch"})
    gen_batch: int = field(default=16, metadata={"help": "sentences per generate() call"})
    gen_source_length: int = 24
    gen_length: int = field(default=24, metadata={"help": "forced number of generated tokens"})
    repeats: int = field(default=5, metadata={"help": "timed repetitions in each process"})
    rounds: int = field(default=3, metadata={"help": "processes per implementation for the main table"})
    warmup: int = 2
    sweep_lengths: list[int] = field(default_factory=lambda: [32, 64, 128, 256, 512, 1024])
    sweep_batch_tokens: list[int] = field(default_factory=lambda: [1024, 2048, 4096, 8192])
    no_ctranslate2: bool = field(default=False, metadata={"help": "leave out the CTranslate2 rows"})
    output_dir: str = "docs/benchmarks"
    # A measuring process's settings (run_worker), as JSON: which implementation, which sweep point, what to measure.
    worker: str | None = field(default=None, metadata=HIDDEN)
    implementation: str | None = field(default=None, metadata=HIDDEN)
    sweep_point: list[int] | None = field(default=None, metadata=HIDDEN)
    measure: Literal["all", "train", "generate", "profile"] = field(default="all", metadata=HIDDEN)
    compile: bool = field(default=False, metadata=HIDDEN)  # generation: static cache, compiled
    rows: list[dict] | None = field(default=None, metadata=HIDDEN)  # several measurements in one process
    searches: list[str] | None = field(default=None, metadata=HIDDEN)  # generation: these of SEARCHES only
    autocast: bool = field(default=False, metadata=HIDDEN)  # training: bf16 mixed precision over float32 weights
    compile_training: bool = field(default=False, metadata=HIDDEN)  # training: compiled before accelerator.prepare
    chunk_elements: int | None = field(default=None, metadata=HIDDEN)
    export_dir: str | None = field(default=None, metadata=HIDDEN)

    @property
    def max_positions(self):
        return max([*self.sweep_lengths, self.train_length, self.gen_source_length + self.gen_length]) + 1


@command
def main(argv) -> dict:
    (args,) = parse_arguments([BenchmarkArguments], argv, description=__doc__.split("\n\n")[0])
    if args.worker:
        print(json.dumps(worker(BenchmarkArguments(**json.loads(args.worker)))))
        return {}
    if args.device == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda asked for, but torch sees no CUDA device.")
    implementations = ["vaswani", "marian"]
    if not args.no_ctranslate2:
        quantizations = ["float32", "int8"] if args.device == "cpu" else ["float16", "int8_float16"]
        implementations += [f"ctranslate2:{q}" for q in quantizations]
    sweep = [("length", impl, (length, args.batch_tokens)) for length in args.sweep_lengths for impl in PEERS]
    sweep += [("batch_tokens", impl, (args.train_length, n)) for n in args.sweep_batch_tokens for impl in PEERS]

    ceiling = matmul_ceiling(torch.device(args.device), getattr(torch, args.dtype))
    sweep_points = []
    with tempfile.TemporaryDirectory(prefix="benchmark-ct2-") as folder:
        total = args.rounds * len(implementations) + len(sweep)
        with progress_bar(total=total, desc="benchmark", unit="run") as progress:

            def measure(implementation, index):
                progress.set_postfix_str(f"{implementation}, round {index + 1}")
                if implementation.startswith("ctranslate2"):
                    result = measure_ctranslate2(args, implementation, Path(folder) / implementation)
                else:
                    result = run_worker(args, implementation)
                progress.update()
                return result

            rounds = harness.alternating_rounds(implementations, args.rounds, measure)
            for axis, implementation, point in sweep:
                progress.set_postfix_str(f"{implementation} {point}")
                measured = run_worker(args, implementation, point)["train"]
                sweep_points.append({"implementation": implementation, "sweep_axis": axis, **measured})
                progress.update()

    results = {implementation: pool_rounds(measured) for implementation, measured in rounds.items()}
    rows = [summary_row(implementation, result, ceiling) for implementation, result in results.items()]
    device_name = torch.cuda.get_device_name() if args.device == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    report = {"settings": asdict(args), "device": device_name, **harness.environment("torch", "transformers")}
    report |= {"matmul_ceiling": ceiling, "rows": rows, "raw": results, "sweep": sweep_points}
    harness.write_page(Path(args.output_dir) / f"{args.device}_{args.preset}_{args.dtype}", report, page(args, report))
    return report


if __name__ == "__main__":
    main()
