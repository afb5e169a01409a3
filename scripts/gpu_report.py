"""The GPU report of `scripts/benchmark.py`: sections that run unattended on a lent GPU, and the page they make.

    here:        python scripts/benchmark.py --prepare                         # .gpu_carry/ (at most 64 MiB)
    the device:  bash .gpu_carry/setup.sh && python scripts/benchmark.py --device cuda --section NAME [NAME ...] \
                     --report_dir $OUT
    here:        python scripts/benchmark.py --assemble --report_dir FOLDER    # docs/benchmarks/gpu.md and its PNGs
    anywhere:    python scripts/benchmark.py --device cpu --quick --section NAME --report_dir FOLDER

A GPU is lent to a session by chance, for about 30 minutes, at most 10 a command, with its own torch and an older
transformers and no `datasets`, `pyarrow`, `sacrebleu` or `ctranslate2`. So everything it needs is prepared here
(`--prepare`): the wheels of this package's newer dependencies, and the default corpus already tokenized into numpy
arrays (pyarrow alone would not fit in the 64 MiB a command carries). Each section writes SECTION.json into
--report_dir within its time budget (Sizes.budget_minutes: 2 + 4.5 + 2.5 + 9 minutes, so that the four fit in 20
device-minutes with the start-up; `--section` takes several names, so that one command, under the 10 minutes a
command may run, can hold more than one); what it could not run is recorded as "not measured, because ...". `--assemble` turns the JSON files into docs/benchmarks/gpu.md and at most 6 PNGs. `--quick` runs every
section on tiny sizes: the code is tested without a GPU (tests/test_benchmark.py), the figures mean nothing.

Sections:
- correctness: the GPU tests (tests/test_gpu.py: half-precision logits against float32, eager, sdpa and flash
  attention, compiled static-cache generation, a bf16 autocast step) and the generation tests on the device in
  bfloat16 and float16 (per-step logits with and without the cache, padded batches, beam search, sampling).
- training: vaswani against MarianMTModel of the same sizes, each preset, eager and torch.compile'd: tokens/s, peak
  memory, model FLOP utilisation against the bf16 matmul peak measured in the same run (benchmark.measure_training:
  bf16 autocast over float32 weights, fused AdamW, one batch of random pairs of one length for both); the sweep of
  the loss's chunk size; a profile of one step of the largest preset.
- generation: greedy and beam 4 at each batch size, eager, with a static cache and torch.compile, and CTranslate2 in
  float16 and int8 on the same weights (benchmark.measure_generation, measure_ctranslate2).
- time_to_bleu: the paper's recipe on the default corpus for a fixed training time, test BLEU every few minutes.
"""

import json
import math
import platform
import shutil
import statistics
import subprocess
import sys
import time
import xml.etree.ElementTree as ElementTree
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch

from vaswani.scripts import benchmark
from vaswani.training.checks import UsageError, tokenizer_ids


REPO_ROOT = Path(__file__).resolve().parent.parent
CARRY_LIMIT = 64 * 2**20
# Newer than the device image's, or missing there, pinned to what this machine tests with; pytest and hypothesis run the
# correctness section. Their dependencies come along, except numpy (the device's torch has it; its wheel is 15 MiB).
CARRIED = ["transformers", "huggingface_hub", "tokenizers", "safetensors", "sacrebleu", "pytest", "hypothesis"]
LEFT_ON_THE_DEVICE = ("numpy-",)
# NVIDIA's fairseq-based recipe (DeepLearningExamples) trains the big model at about 82,000 tokens/s on one A100,
# about a third of its bf16 peak; MLPerf Training's Transformer, with fused kernels, about 100,000 tokens/s per A100.
ANCHORS = (
    "NVIDIA DeepLearningExamples (fairseq), big, 1 A100: ~82,000 tokens/s (~1/3 of peak); MLPerf Transformer: ~100,000 "
    "tokens/s per A100"
)


@dataclass(frozen=True)
class Sizes:
    presets: tuple[str, ...]
    batch_tokens: int  # source tokens of a training batch (target alike)
    train_length: int
    repeats: int
    warmup: int
    chunk_sweep: tuple[int, ...]  # the loss's values per chunk on an accelerator
    generation_preset: str
    generation_batches: tuple[int, ...]
    generation_length: int
    bleu_preset: str
    bleu_minutes: float  # training time, BLEU evaluations not counted
    bleu_every_minutes: float
    bleu_batch_tokens: int  # padded source + target tokens of a training batch
    bleu_pairs: int
    budget_minutes: dict  # each section's time on the device, start-up excluded


FULL = Sizes(
    presets=("base", "big"),
    batch_tokens=8192,
    train_length=64,
    repeats=10,
    warmup=3,
    chunk_sweep=(2**22, 2**24, 2**26, 2**28),
    generation_preset="base",
    generation_batches=(1, 64),
    generation_length=32,
    bleu_preset="base",
    bleu_minutes=8,
    bleu_every_minutes=2,
    bleu_batch_tokens=50000,  # the paper's ~25,000 source + 25,000 target tokens a step
    bleu_pairs=500,
    budget_minutes={"correctness": 2, "training": 4.5, "generation": 2.5, "time_to_bleu": 9},
)
QUICK = Sizes(
    presets=("tiny",),
    batch_tokens=256,
    train_length=16,
    repeats=2,
    warmup=1,
    chunk_sweep=(2**10, 2**14),
    generation_preset="tiny",
    generation_batches=(1, 4),
    generation_length=5,
    bleu_preset="tiny",
    bleu_minutes=0.3,
    bleu_every_minutes=0.15,
    bleu_batch_tokens=2000,
    bleu_pairs=16,
    budget_minutes=dict.fromkeys(("correctness", "training", "generation", "time_to_bleu"), 6),
)


class Deadline:
    """A section's time budget: measurements ask how much is left, and are skipped (and said so) once it is gone."""

    def __init__(self, minutes: float):
        self.end = time.monotonic() + 60 * minutes

    def left(self) -> float:
        return self.end - time.monotonic()


def measured(deadline: Deadline, measure) -> dict:
    """`measure()`'s result, or why there is none."""
    if deadline.left() <= 0:
        return {"not_measured": "the section's time budget ran out before it"}
    try:
        return measure(deadline.left())
    except subprocess.TimeoutExpired:
        return {"not_measured": "the section's time budget ran out during it"}
    except (RuntimeError, ImportError) as error:
        return {"not_measured": f"it failed: {str(error).strip().splitlines()[-1][:300]}"}


def environment(device: torch.device) -> dict:
    import transformers

    facts = {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }
    if device.type == "cuda":
        smi = shutil.which("nvidia-smi")
        driver = (
            subprocess.run(
                [smi, "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True, text=True
            ).stdout.strip()
            if smi
            else "unknown (no nvidia-smi)"
        )
        facts.update(device=torch.cuda.get_device_name(), driver=driver, cuda=torch.version.cuda)
    else:
        facts.update(device=f"CPU ({platform.processor() or platform.machine()}), {torch.get_num_threads()} threads")
    return facts


# ---------------------------------------------------------------------------------------------------------------------
# Sections.
# ---------------------------------------------------------------------------------------------------------------------


def correctness(args, sizes: Sizes, deadline: Deadline) -> dict:
    runs = {
        "GPU tests (tests/test_gpu.py)": ["tests/test_gpu.py", "-m", "gpu"],
        **{
            f"generation tests in {dtype}": ["tests/test_generation.py", "--device", args.device, "--dtype", dtype]
            for dtype in ("bfloat16", "float16")
        },
    }
    return {name: measured(deadline, lambda left, a=a: run_pytest(a, left)) for name, a in runs.items()}


def run_pytest(pytest_args: list[str], timeout: float) -> dict:
    """pytest in a subprocess; its JUnit XML gives each test's outcome."""
    report = Path(f"/tmp/vaswani-gpu-report-{time.monotonic_ns()}.xml")
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", f"--junitxml={report}", *pytest_args]
    done = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout)
    if not report.exists():
        raise RuntimeError(
            f"pytest wrote no report (exit {done.returncode}): {done.stdout[-500:]}{done.stderr[-500:]}"
        )
    outcomes = {"passed": 0, "failed": 0, "skipped": 0}
    failures, skip_reasons = [], set()
    for case in ElementTree.parse(report).getroot().iter("testcase"):
        problem = case.find("failure") if case.find("failure") is not None else case.find("error")
        if problem is not None:
            outcomes["failed"] += 1
            failures.append(f"{case.get('name')}: {(problem.get('message') or '').splitlines()[0][:200]}")
        elif case.find("skipped") is not None:
            outcomes["skipped"] += 1
            skip_reasons.add((case.find("skipped").get("message") or "").strip()[:200])
        else:
            outcomes["passed"] += 1
    report.unlink()
    return {**outcomes, "failures": failures, "skip_reasons": sorted(skip_reasons), "command": " ".join(pytest_args)}


def training(args, sizes: Sizes, deadline: Deadline) -> dict:
    device = torch.device(args.device)
    ceiling = benchmark.matmul_ceiling(device, torch.bfloat16)
    setup = replace(
        args,
        dtype="float32",
        autocast=True,
        measure="train",
        batch_tokens=sizes.batch_tokens,
        train_length=sizes.train_length,
        sweep_lengths=[sizes.train_length],
        repeats=sizes.repeats,
        warmup=sizes.warmup,
    )

    def train(implementation, **changes):
        def measure(left):
            result = benchmark.run_worker(replace(setup, **changes), implementation, timeout=left)["train"]
            rate = benchmark.summarise(result["times"], result["tokens"])
            flops = statistics.median(result["flops"] / t for t in result["times"])
            return {
                "tokens_per_s": rate,
                "peak_memory_mib": result["peak_memory"] / 2**20,
                "tflops_per_s": flops / 1e12,
                "mfu": flops / ceiling["flops_per_s"],
                "batch": result["batch"],
                "length": result["length"],
            }

        return measured(deadline, measure)

    # In the order of what matters most, since the budget may end the list: the eager comparison, where the time of
    # the largest goes, the compiled comparison (largest first), the loss's chunk size.
    largest = sizes.presets[-1]
    order = [(preset, False) for preset in sizes.presets] + [(preset, True) for preset in reversed(sizes.presets)]
    rows = []
    for index, (preset, compiled) in enumerate(order):
        rows += [
            {"preset": preset, "implementation": implementation, "compiled": compiled}
            | train(implementation, preset=preset, compile_training=compiled)
            for implementation in ("vaswani", "marian")
        ]
        if index == len(sizes.presets) - 1:
            profile = measured(
                deadline,
                lambda left: benchmark.run_worker(
                    replace(setup, preset=largest, measure="profile"), "vaswani", timeout=left
                ),
            )
    chunk_sweep = [
        {"chunk_elements": elements} | train("vaswani", preset=largest, chunk_elements=elements)
        for elements in sizes.chunk_sweep
    ]
    config = benchmark.build_model("vaswani", largest, sizes.train_length + 1).config
    return {
        "matmul_ceiling": ceiling,
        "rows": rows,
        "chunk_sweep": chunk_sweep,
        "profile": profile,
        "profiled": f"vaswani {largest}, eager",
        "flops_per_token": dict(
            zip(("per_source_token", "per_target_token"), benchmark.flops_per_token(config, sizes.train_length)),
            length=sizes.train_length,
        ),
        "sizes": {"batch_tokens": sizes.batch_tokens, "length": sizes.train_length},
    }


def generation(args, sizes: Sizes, deadline: Deadline) -> dict:
    half = "bfloat16" if args.device == "cuda" else "float32"
    setup = replace(
        args,
        preset=sizes.generation_preset,
        measure="generate",
        gen_source_length=sizes.generation_length,
        gen_length=sizes.generation_length,
        sweep_lengths=[2 * sizes.generation_length],
        repeats=sizes.repeats,
        warmup=sizes.warmup,
    )
    quantizations = ("float16", "int8_float16") if args.device == "cuda" else ("float32", "int8")
    engines = [("eager", "vaswani", {"dtype": half}), ("static cache + compile", "vaswani", {"dtype": half})]
    engines += [(f"CTranslate2 {q}", f"ctranslate2:{q}", {}) for q in quantizations]
    rows = []
    for batch in sizes.generation_batches:
        for engine, implementation, changes in engines:
            compiled = engine.startswith("static")

            def measure(left, batch=batch, implementation=implementation, changes=changes, compiled=compiled):
                if implementation.startswith("ctranslate2"):
                    check_ctranslate2(args.device)
                worker = replace(setup, gen_batch=batch, compile=compiled, **changes)
                result = benchmark.run_worker(worker, implementation, timeout=left)
                return {
                    f"beam{beams}_sentences_per_s": benchmark.summarise(
                        result[f"generate_beam{beams}"]["times"], result[f"generate_beam{beams}"]["sentences"]
                    )
                    for beams in (1, 4)
                }

            rows.append({"batch": batch, "engine": engine} | measured(deadline, measure))
    return {"rows": rows, "dtype": half, "preset": sizes.generation_preset, "length": sizes.generation_length}


def check_ctranslate2(device: str):
    try:
        import ctranslate2
    except ImportError as error:
        raise ImportError(
            "ctranslate2 is not installed here (on the lent GPU: its CUDA wheel and cuBLAS do not fit the 64 MiB a "
            "command carries)"
        ) from error
    if device == "cuda" and ctranslate2.get_cuda_device_count() == 0:
        raise RuntimeError("ctranslate2 sees no CUDA device (a CPU-only build, or one for another CUDA)")


def time_to_bleu(args, sizes: Sizes, deadline: Deadline) -> dict:
    """The paper's recipe on the default corpus for `sizes.bleu_minutes` of training, test BLEU every few minutes.

    The recipe of scripts/train.py (section 5), over numpy data: token-bucket batches of about 25,000 source and
    25,000 target tokens, Adam (0.9, 0.98, 1e-9), label smoothing 0.1, the preset's dropout, bf16 autocast on a GPU.
    The schedule is the paper's, scaled to the run: the paper warms up for 4,000 of 100,000 steps and peaks at
    d_model^-0.5 x 4000^-0.5; here the warmup is the same 4% of the steps the run will take (counted from the speed of
    10 calibration steps, on weights then thrown away), the peak the same. BLEU: beam 4, length penalty 0.6 (the
    model's default generation), sacreBLEU on the first `bleu_pairs` test pairs; evaluation time is not counted.
    """
    import sacrebleu
    from transformers import AutoTokenizer

    from vaswani import VaswaniConfig, VaswaniForConditionalGeneration, label_smoothed_cross_entropy
    from vaswani.training.batching import TokenBucketSampler
    from vaswani.training.schedule import inverse_sqrt_lr, paper_peak_lr

    corpus_dir = Path(args.carry_dir) / "corpus"
    if not (corpus_dir / "train.npz").exists():
        raise UsageError(f"{corpus_dir} holds no corpus: run `python scripts/benchmark.py --prepare` first.")
    device = torch.device(args.device)
    tokenizer = AutoTokenizer.from_pretrained(corpus_dir / "tokenizer")
    arrays = np.load(corpus_dir / "train.npz")
    sources, targets = (np.split(arrays[side], arrays[f"{side}_offsets"][1:-1]) for side in ("source", "target"))
    test = json.loads((corpus_dir / "test.json").read_text())
    test_sources, references = test["sources"][: sizes.bleu_pairs], test["references"][: sizes.bleu_pairs]
    config = VaswaniConfig.from_preset(sizes.bleu_preset, **tokenizer_ids(tokenizer))
    sampler = TokenBucketSampler([len(s) for s in sources], [len(t) for t in targets], sizes.bleu_batch_tokens, seed=0)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")

    def batches():
        for epoch in range(10**6):
            sampler.set_epoch(epoch)
            for rows in sampler:
                yield pad_batch([sources[r] for r in rows], [targets[r] for r in rows], config, device)

    def fresh_model():
        torch.manual_seed(0)
        model = VaswaniForConditionalGeneration(config).to(device).train()
        optimizer = torch.optim.AdamW(
            model.parameters(), lr=0.0, betas=(0.9, 0.98), eps=1e-9, weight_decay=0.0, fused=device.type == "cuda"
        )
        return model, optimizer

    def step(model, optimizer, batch, learning_rate):
        for group in optimizer.param_groups:
            group["lr"] = learning_rate
        labels = batch.pop("labels")
        with autocast:
            logits = model(**batch).logits
        smoothed, _ = label_smoothed_cross_entropy(logits, labels, 0.1)
        loss = smoothed.sum() / labels.ne(-100).sum()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.item()  # a sync: each step's time is its own

    metric = sacrebleu.metrics.BLEU()
    stream = batches()
    model, optimizer = fresh_model()
    step_times = []
    for _ in range(10):
        start = time.perf_counter()
        step(model, optimizer, next(stream), 1e-4)
        step_times.append(time.perf_counter() - start)
    seconds = 60 * sizes.bleu_minutes
    planned_steps = max(10, int(seconds / statistics.median(step_times[2:])))
    warmup = max(1, round(0.04 * planned_steps))
    peak = paper_peak_lr(config.d_model, 4000)

    model, optimizer = fresh_model()
    stream = batches()
    points, trained, steps, next_evaluation, losses = [], 0.0, 0, 60 * sizes.bleu_every_minutes, []

    def evaluate():
        bleu = bleu_of(model, tokenizer, test_sources, references, autocast, metric)
        points.append(
            {"minutes": trained / 60, "steps": steps, "bleu": bleu, "train_loss": statistics.mean(losses[-50:])}
        )

    # The last evaluation must fit in the budget too: the loop keeps the time the previous one took in reserve.
    evaluation_seconds = 0.0
    while trained < seconds and deadline.left() > evaluation_seconds:
        start = time.perf_counter()
        losses.append(step(model, optimizer, next(stream), inverse_sqrt_lr(steps + 1, warmup, peak)))
        trained += time.perf_counter() - start
        steps += 1
        if trained >= next_evaluation:
            started = time.perf_counter()
            evaluate()
            evaluation_seconds = time.perf_counter() - started
            next_evaluation += 60 * sizes.bleu_every_minutes
    if not points or points[-1]["steps"] != steps:
        evaluate()
    return {
        "points": points,
        "preset": sizes.bleu_preset,
        "batch_tokens": sizes.bleu_batch_tokens,
        "planned_steps": planned_steps,
        "warmup_steps": warmup,
        "peak_lr": peak,
        "test_pairs": len(test_sources),
        "stopped_by_budget": trained < seconds,
        "signature": str(metric.get_signature()) if points else "n/a",
    }


def pad_batch(sources, targets, config, device) -> dict:
    """Pairs of id arrays (each ending with </s>) as the model's inputs: right-padded sources with their mask, the
    targets as labels (-100 on padding) and as decoder inputs shifted right behind the start token."""

    def padded(arrays, value):
        lengths = np.array([len(ids) for ids in arrays])
        out = np.full((len(arrays), lengths.max()), value, dtype=np.int64)
        out[np.arange(lengths.max()) < lengths[:, None]] = np.concatenate(arrays)  # row by row, in order
        return torch.from_numpy(out)

    input_ids, labels = padded(sources, config.pad_token_id), padded(targets, -100)
    start = torch.full((len(labels), 1), config.decoder_start_token_id)
    decoder_input_ids = torch.cat([start, labels[:, :-1]], dim=1)
    decoder_input_ids[decoder_input_ids == -100] = config.pad_token_id
    batch = {
        "input_ids": input_ids,
        "attention_mask": (input_ids != config.pad_token_id).long(),
        "decoder_input_ids": decoder_input_ids,
        "labels": labels,
    }
    return {key: value.to(device, non_blocking=True) for key, value in batch.items()}


@torch.no_grad()
def bleu_of(model, tokenizer, sources, references, autocast, metric) -> float:
    """The model's default decoding (the paper's: beam 4, GNMT length penalty 0.6, each source's length + 50) in
    batches of similar length."""
    model.eval()
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]), reverse=True)
    hypotheses = [None] * len(sources)
    for start in range(0, len(order), 64):
        chunk = order[start : start + 64]
        encoded = tokenizer([sources[i] for i in chunk], padding=True, return_tensors="pt").to(model.device)
        with autocast:
            output = model.generate(input_ids=encoded["input_ids"], attention_mask=encoded["attention_mask"])
        for i, text in zip(chunk, tokenizer.batch_decode(output, skip_special_tokens=True)):
            hypotheses[i] = text.strip()
    model.train()
    return metric.corpus_score(hypotheses, [references]).score


SECTIONS = {
    "correctness": correctness,
    "training": training,
    "generation": generation,
    "time_to_bleu": time_to_bleu,
}


def run_sections(args) -> dict:
    unknown = [name for name in args.section if name not in SECTIONS]
    if unknown:
        raise UsageError(f"unknown --section {', '.join(unknown)}; the sections are {', '.join(SECTIONS)}")
    sizes = QUICK if args.quick else FULL
    if args.device == "cuda" and args.quick:
        print("--quick on a GPU: tiny sizes, figures that mean nothing", file=sys.stderr)
    report_dir = Path(args.report_dir)
    report_dir.mkdir(parents=True, exist_ok=True)
    results = {}
    for name in args.section:
        deadline = Deadline(sizes.budget_minutes[name])
        started = time.monotonic()
        result = {
            "section": name,
            "quick": args.quick,
            "environment": environment(torch.device(args.device)),
            "sizes": asdict(sizes),
            "results": SECTIONS[name](args, sizes, deadline),
        }
        result["minutes"] = (time.monotonic() - started) / 60
        (report_dir / f"{name}.json").write_text(json.dumps(result, indent=1))
        print(f"{name}: {result['minutes']:.1f} min, written {report_dir / name}.json")
        results[name] = result
    return results


# ---------------------------------------------------------------------------------------------------------------------
# What is carried to the device.
# ---------------------------------------------------------------------------------------------------------------------


def prepare_corpus(dataset_dir, tokenizer_dir, corpus_dir: Path, source_lang="en", target_lang="es", test_pairs=1000):
    """The default corpus's training pairs tokenized into numpy arrays (ids and offsets), the first test pairs as
    text, and the tokenizer: what time_to_bleu reads on a device without `datasets`."""
    from vaswani.training.data import load_translation_dataset, tokenize_split
    from vaswani.training.evaluation import load_pairs
    from vaswani.training.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(tokenizer_dir)
    split = tokenize_split(
        load_translation_dataset(dataset_dir, source_lang, target_lang, splits=("train",))["train"],
        tokenizer,
        source_lang,
        target_lang,
    )
    corpus_dir.mkdir(parents=True, exist_ok=True)
    arrays = {}
    for side, column in (("source", "input_ids"), ("target", "labels")):
        ids = split.pairs.data.column(column).combine_chunks()
        arrays[side] = ids.values.to_numpy().astype(np.int16 if len(tokenizer) < 2**15 else np.int32)
        arrays[f"{side}_offsets"] = ids.offsets.to_numpy()
    np.savez_compressed(corpus_dir / "train.npz", **arrays)
    sources, references, _ = load_pairs(dataset_dir, "test", source_lang, target_lang, max_samples=test_pairs)
    (corpus_dir / "test.json").write_text(
        json.dumps({"sources": sources.to_pylist(), "references": references.to_pylist()})
    )
    tokenizer.save_pretrained(corpus_dir / "tokenizer")
    return corpus_dir


def prepare(args) -> dict:
    """--carry_dir: the corpus, the wheels for the device's Python (3.12, manylinux x86_64) and setup.sh."""
    import importlib.metadata

    carry = Path(args.carry_dir)
    prepare_corpus(args.dataset_dir, args.tokenizer, carry / "corpus")
    wheels = carry / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    requirements = [f"{name}=={importlib.metadata.version(name)}" for name in CARRIED] + ["setuptools>=69"]
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--only-binary=:all:", "--dest", wheels]
        + ["--python-version", "3.12", "--implementation", "cp", "--abi", "cp312", "--abi", "abi3", "--abi", "none"]
        + [f"--platform={p}" for p in ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")]
        + ["--platform=any", *requirements],
        check=True,
    )
    for wheel in wheels.iterdir():
        if wheel.name.startswith(LEFT_ON_THE_DEVICE):
            wheel.unlink()
    quoted = " ".join(f"'{requirement}'" for requirement in requirements)
    (carry / "setup.sh").write_text(
        "#!/usr/bin/env bash\n"
        "# Run on the device from the repository root: the carried wheels, then this package (no network there).\n"
        "set -euo pipefail\n"
        'carry=$(dirname "$0")\n'
        f'python3 -m pip install --quiet --no-index --find-links "$carry/wheels" {quoted}\n'
        "python3 -m pip install --quiet --no-deps --no-build-isolation -e .\n"
    )
    size = sum(path.stat().st_size for path in carry.rglob("*") if path.is_file())
    if size > CARRY_LIMIT:
        raise UsageError(f"{carry} holds {size / 2**20:.1f} MiB, more than the 64 MiB a device command carries")
    print(f"{carry}: {size / 2**20:.1f} MiB; carry it to the device and run `bash {carry}/setup.sh` there")
    return {"carry_dir": str(carry), "mib": size / 2**20}


# ---------------------------------------------------------------------------------------------------------------------
# The page: docs/benchmarks/gpu.md and its PNGs.
# ---------------------------------------------------------------------------------------------------------------------


def ratio(ours: dict, theirs: dict, key: str) -> float | None:
    if key in ours and key in theirs:
        return ours[key]["median"] / theirs[key]["median"]
    return None


def assemble(args) -> dict:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    report_dir, output_dir = Path(args.report_dir), Path(args.output_dir)
    sections = {
        name: json.loads((report_dir / f"{name}.json").read_text())
        for name in SECTIONS
        if (report_dir / f"{name}.json").exists()
    }
    if not sections:
        raise UsageError(f"{report_dir} holds no section's JSON: run `benchmark.py --section NAME` first")
    output_dir.mkdir(parents=True, exist_ok=True)
    first = next(iter(sections.values()))
    facts = first["environment"]
    lines = [
        "# GPU report",
        "",
        f"{facts['device']}; driver {facts.get('driver', 'n/a')}, CUDA {facts.get('cuda', 'n/a')}; torch "
        f"{facts['torch']}, transformers {facts['transformers']}, Python {facts['python']}; {facts['date']}."
        + (" **Quick mode: tiny sizes, the figures test the code and mean nothing.**" if first["quick"] else ""),
        "",
        "Written by `python scripts/benchmark.py --assemble` from the sections' JSON (`--section NAME`; how each "
        "is measured: `scripts/gpu_report.py`).",
        "",
    ]
    targets = []
    for name in SECTIONS:
        if name not in sections:
            lines += [f"## {name}", "", f"Not measured yet: no session has run `--section {name}` on a GPU.", ""]
            continue
        section = sections[name]
        lines += [f"## {name} ({section['minutes']:.1f} min)", ""]
        render = {"correctness": render_correctness, "training": render_training}.get(name)
        render = render or {"generation": render_generation, "time_to_bleu": render_time_to_bleu}[name]
        text, section_targets = render(section["results"], plt, output_dir)
        lines += [text, ""]
        targets += section_targets
    lines[6:6] = [
        "## Targets",
        "",
        "| target | measured | met |",
        "| --- | --- | --- |",
        *targets,
        "",
        f"Anchors: {ANCHORS}.",
        "",
    ]
    (output_dir / "gpu.md").write_text("\n".join(lines))
    pictures = sorted(path.name for path in output_dir.glob("gpu_*.png"))
    print(f"written {output_dir / 'gpu.md'} and {len(pictures)} PNGs")
    return {"pictures": pictures, "sections": sorted(sections)}


def render_correctness(results, plt, output_dir):
    lines = ["| run | passed | failed | skipped | failures, skip reasons |", "| --- | --- | --- | --- | --- |"]
    for name, run in results.items():
        if "not_measured" in run:
            lines.append(f"| {name} | not measured, because {run['not_measured']} | | | |")
            continue
        notes = "; ".join(run["failures"] + [f"skipped: {reason}" for reason in run["skip_reasons"]])
        lines.append(f"| {name} | {run['passed']} | {run['failed']} | {run['skipped']} | {notes} |")
    return "\n".join(lines), []


def saved(figure, plt, output_dir: Path, name: str, title: str) -> str:
    """Write the figure as output_dir/name; the Markdown that shows it."""
    figure.tight_layout()
    figure.savefig(output_dir / name, dpi=110)
    plt.close(figure)
    return f"\n![{title}]({name})"


def render_training(results, plt, output_dir):
    ceiling = results["matmul_ceiling"]["flops_per_s"] / 1e12
    per_token = results["flops_per_token"]
    lines = [
        f"Batches of {results['sizes']['batch_tokens']:,} source + as many target tokens, pairs of "
        f"{results['sizes']['length']} tokens; bf16 autocast over float32 weights, fused AdamW. MFU: model FLOPs "
        f"(matrix products, forward and backward: 3 x the forward's 2 x multiply-adds; attention over every key) per "
        f"second over the bf16 matmul peak measured in the same run, {ceiling:.3g} TFLOP/s. Per pair of "
        f"{per_token['length']}-token sentences of the largest preset: {per_token['per_source_token'] / 1e6:,.1f} "
        f"MFLOP per source token, {per_token['per_target_token'] / 1e6:,.1f} MFLOP per target token (output "
        "projection included).",
        "",
        "| preset | implementation | torch.compile | tokens/s | vs Marian | peak memory MiB | TFLOP/s | MFU |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    targets = []
    by_key = {(r["preset"], r["implementation"], r["compiled"]): r for r in results["rows"]}
    for row in results["rows"]:
        key = (row["preset"], row["implementation"], row["compiled"])
        if "not_measured" in row:
            lines.append(f"| {key[0]} | {key[1]} | {key[2]} | not measured, because {row['not_measured']} | | | | |")
            continue
        marian = by_key[(row["preset"], "marian", row["compiled"])]
        speedup = ratio(row, marian, "tokens_per_s")
        lines.append(
            f"| {key[0]} | {key[1]} | {'yes' if key[2] else 'no'} | {benchmark.fmt_rate(row['tokens_per_s'])} | "
            f"{f'{speedup:.2f}x' if speedup else 'n/a'} | {row['peak_memory_mib']:,.0f} | {row['tflops_per_s']:.3g} "
            f"| {row['mfu']:.1%} |"
        )
        if row["implementation"] == "vaswani":
            label = f"{row['preset']} training, {'compiled' if row['compiled'] else 'eager'}: >= 1.2x Marian"
            met = speedup is not None and speedup >= 1.2
            targets.append(f"| {label} | {f'{speedup:.2f}x' if speedup else 'n/a'} | {'yes' if met else 'no'} |")
            if row["preset"] == "big":
                targets.append(
                    f"| big, {'compiled' if row['compiled'] else 'eager'}: >= 50% MFU | {row['mfu']:.1%} "
                    f"({benchmark.fmt_rate(row['tokens_per_s'])} tokens/s) | {'yes' if row['mfu'] >= 0.5 else 'no'} |"
                )
    lines += ["", "The loss's chunk size (values per chunk on the device; the default is 2^26):", ""]
    lines += ["| values per chunk | tokens/s | peak memory MiB |", "| --- | --- | --- |"]
    for point in results["chunk_sweep"]:
        size = f"2^{int(math.log2(point['chunk_elements']))}"
        if "not_measured" in point:
            lines.append(f"| {size} | not measured, because {point['not_measured']} | |")
        else:
            lines.append(f"| {size} | {benchmark.fmt_rate(point['tokens_per_s'])} | {point['peak_memory_mib']:,.0f} |")
    profile = results["profile"]
    profile_text = profile.get("profile") or f"not measured, because {profile['not_measured']}"
    lines += ["", f"Where the time of one step goes ({results['profiled']}):", "", "```", profile_text, "```"]

    measured_rows = [r for r in results["rows"] if "tokens_per_s" in r]
    figure, axis = plt.subplots(figsize=(8, 4))
    labels = [
        f"{r['preset']}\n{r['implementation']}\n{'compiled' if r['compiled'] else 'eager'}" for r in measured_rows
    ]
    axis.bar(
        labels,
        [r["tokens_per_s"]["median"] for r in measured_rows],
        color=["C0" if r["implementation"] == "vaswani" else "C1" for r in measured_rows],
    )
    axis.set(ylabel="training tokens/s (source + target)", title="Training speed, bf16 autocast")
    return "\n".join(lines + [saved(figure, plt, output_dir, "gpu_training.png", "training speed")]), targets


def render_generation(results, plt, output_dir):
    lines = [
        f"The {results['preset']} preset ({results['dtype']} for eager and compiled), random weights (the same for "
        f"every engine), {results['length']}-token sources, exactly {results['length']} generated tokens.",
        "",
        "| batch | engine | greedy sentences/s | vs eager | beam-4 sentences/s | vs eager |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    targets = []
    eager = {row["batch"]: row for row in results["rows"] if row["engine"] == "eager"}
    for row in results["rows"]:
        if "not_measured" in row:
            lines.append(f"| {row['batch']} | {row['engine']} | not measured, because {row['not_measured']} | | | |")
            continue
        speedups = [ratio(row, eager[row["batch"]], f"beam{beams}_sentences_per_s") for beams in (1, 4)]
        cells = [f"{s:.2f}x" if s else "n/a" for s in speedups]
        lines.append(
            f"| {row['batch']} | {row['engine']} | {benchmark.fmt_rate(row['beam1_sentences_per_s'])} | {cells[0]} | "
            f"{benchmark.fmt_rate(row['beam4_sentences_per_s'])} | {cells[1]} |"
        )
        if row["engine"] == "static cache + compile" and row["batch"] == 1:
            met = speedups[0] is not None and speedups[0] >= 1.5
            targets.append(
                f"| static cache + compile >= 1.5x eager at batch 1 | greedy {cells[0]}, beam 4 {cells[1]} | "
                f"{'yes' if met else 'no'} |"
            )
        if row["engine"].startswith("CTranslate2"):
            targets.append(
                f"| {row['engine']} over eager, batch {row['batch']} (reported) | greedy {cells[0]}, "
                f"beam 4 {cells[1]} | - |"
            )
    rows = [row for row in results["rows"] if "beam1_sentences_per_s" in row]
    figure, axes = plt.subplots(1, 2, figsize=(10, 4))
    for axis, beams in zip(axes, (1, 4)):
        axis.bar(
            [f"{r['engine']}\nbatch {r['batch']}" for r in rows],
            [r[f"beam{beams}_sentences_per_s"]["median"] for r in rows],
        )
        axis.set(title="greedy" if beams == 1 else "beam 4", ylabel="sentences/s", yscale="log")
        axis.tick_params(axis="x", labelsize=7, rotation=45)
    return "\n".join(lines + [saved(figure, plt, output_dir, "gpu_generation.png", "generation speed")]), targets


def render_time_to_bleu(results, plt, output_dir):
    lines = [
        f"The {results['preset']} preset, batches of about {results['batch_tokens']:,} padded tokens, the paper's "
        f"schedule scaled to the run ({results['planned_steps']:,} steps planned, warmup {results['warmup_steps']}, "
        f"peak learning rate {results['peak_lr']:.2e}); BLEU of beam 4 on {results['test_pairs']} test pairs, "
        f"`{results['signature']}`"
        + (" (stopped early by the section's time budget)" if results["stopped_by_budget"] else "")
        + ".",
        "",
        "| training minutes | steps | training loss | test BLEU |",
        "| --- | --- | --- | --- |",
    ]
    lines += [
        f"| {p['minutes']:.1f} | {p['steps']:,} | {p['train_loss']:.3f} | {p['bleu']:.2f} |" for p in results["points"]
    ]
    last = results["points"][-1] if results["points"] else None
    reached = f"{last['bleu']:.2f} after {last['minutes']:.1f} min" if last else "n/a"
    targets = [f"| time to BLEU (recorded) | {reached} | - |"]
    figure, axis = plt.subplots(figsize=(6, 4))
    axis.plot([p["minutes"] for p in results["points"]], [p["bleu"] for p in results["points"]], marker="o")
    axis.set(xlabel="training minutes", ylabel="test BLEU", title=f"{results['preset']} preset, default corpus")
    axis.grid(alpha=0.3)
    return "\n".join(lines + [saved(figure, plt, output_dir, "gpu_time_to_bleu.png", "BLEU against minutes")]), targets
