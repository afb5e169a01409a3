"""The GPU report's sections, measured on a GPU (or, with --quick, anywhere), into JSON as they go, then the page.

    python -m benchmarks.gpu_report_measure [--part 1|2] [--device cuda] [--quick] [--report_dir DIR]
                                            [--corpus_dir .gpu_carry/corpus] [--section NAME ...]

On a GPU machine without network access, `bash .gpu_carry/run.sh DIR [--part 2]` (made by
`benchmarks.gpu_report_prepare`) installs what it needs and runs this. A part's sections (PARTS) run in order within
its deadline, each for at most its share (Sizes), and write SECTION.json into --report_dir after every measurement,
so that a run cut off keeps what it measured; the page, gpu.md, is drawn once the part ends (or anywhere, by
`benchmarks.gpu_report_render`). Each section's JSON also records how long each of its measurements took (`timings`),
which the shares are sized from. --quick: tiny sizes, figures that mean nothing. What each section measures:
docs/benchmarks/README.md, "GPU report".
"""

import json
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
import xml.etree.ElementTree as ElementTree
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path

import torch

from benchmarks import benchmark, gpu_report_training, harness
from benchmarks.gpu_report_render import render
from vaswani.checks import UsageError
from vaswani.cli import command, parse_arguments


# Each part's deadline from its start (run.sh's, the install included), and the most a section takes before the next
# begins (a part's last takes what is left): about a fifth more than each took at the H200's timings of 2026-12-04
# (tests/test_gpu_report_schedule.py replays them), where part 1 took 8.7 minutes and part 2 4.4. There, starting a
# measuring process took about 11 s, compiling a training step 35-60 s more, and time to BLEU 5.2 minutes for its 4
# minutes of training.
PART_MINUTES = {1: 9, 2: 4.5}
SECTION_MINUTES = {
    "correctness": 3,
    "generation": 1.5,
    "training": 1.25,
    "compiled_training": 2.5,
    "profile": 1.5,
}


@dataclass(frozen=True)
class Sizes:
    """The report's sizes: the full report's by default."""

    presets: tuple[str, ...] = ("base", "big")
    batch_tokens: int = 25000  # source tokens of a training batch (target alike): one GPU's share of the paper's step
    train_length: int = 64
    repeats: int = 5
    warmup: int = 3
    compiled_presets: tuple[str, ...] = ("base",)  # compiled training (big's was measured on 2026-12-04: 1.01x)
    chunk_sweep: tuple[int, ...] = (2**24, 2**28)  # the loss's values per chunk (the default, 2^26, is training's)
    generation_preset: str = "base"
    generation_batches: tuple[int, ...] = (1, 64)
    generation_compiled_batches: tuple[int, ...] = (64,)  # static cache + compile: a compilation a batch and search
    generation_length: int = 32
    bleu_preset: str = "base"
    bleu_minutes: float = 4  # training time, BLEU evaluations not counted
    bleu_every_minutes: float = 1
    bleu_batch_tokens: int = 50000  # padded source + target tokens of a training batch: the paper's step
    bleu_pairs: int = 300  # one batch: an evaluation every minute costs seconds, not a minute's share
    bleu_eval_batch: int = 300  # test sentences translated at once
    bleu_calibration_seconds: float = 25  # the least spent timing steps to plan the run (the most: twice that)
    bleu_evaluation_seconds: float = 8  # kept for each evaluation until one is measured
    part_minutes: dict = field(default_factory=PART_MINUTES.copy)
    section_minutes: dict = field(default_factory=SECTION_MINUTES.copy)
    generation_tests: str | None = None  # pytest -k selection of the generation tests (None: all of them)
    ceiling_size: int | None = None  # rows of the matmul the MFU is quoted against (None: the device's default)


FULL = Sizes()
QUICK = Sizes(
    presets=("tiny",),
    batch_tokens=256,
    train_length=16,
    repeats=2,
    warmup=1,
    compiled_presets=("tiny",),
    chunk_sweep=(2**10, 2**14),
    generation_preset="tiny",
    generation_batches=(1, 4),
    generation_compiled_batches=(4,),
    generation_length=5,
    bleu_preset="tiny",
    bleu_minutes=0.5,
    bleu_every_minutes=0.25,
    bleu_batch_tokens=2000,
    bleu_pairs=16,
    bleu_eval_batch=16,
    bleu_calibration_seconds=2,
    bleu_evaluation_seconds=5,
    part_minutes={1: 20, 2: 10},
    section_minutes={
        "correctness": 6,
        "generation": 4,
        "training": 3,
        "compiled_training": 5,
        "profile": 3,
    },
    generation_tests="padded_batch_gives_each_sentence_alone",  # the whole file takes minutes on a CPU
    ceiling_size=512,
)


class Deadline:
    """A section's time: measurements ask how much is left, and are skipped (and said so) once it is gone. `timings`
    records how long each measurement took, by name."""

    def __init__(self, seconds: float):
        self.end = time.monotonic() + seconds
        self.timings = {}

    def left(self) -> float:
        return self.end - time.monotonic()


def measured(deadline: Deadline, measure, name: str) -> dict:
    """`measure()`'s result, or why there is none; its seconds go into `deadline.timings[name]`."""
    if deadline.left() <= 0:
        return {"not_measured": "its section's time ran out before it"}
    started = time.monotonic()
    try:
        return measure(deadline.left())
    except subprocess.TimeoutExpired:
        return {"not_measured": "its section's time ran out during it"}
    except (RuntimeError, ImportError) as error:
        return {"not_measured": f"it failed: {str(error).strip().splitlines()[-1][:300]}"}
    finally:
        deadline.timings[name] = time.monotonic() - started


def environment(device: torch.device) -> dict:
    """The date, the device (the driver and CUDA on a GPU) and the versions the section was measured with."""
    import transformers

    date = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    facts = {"date": date, "python": platform.python_version(), "torch": torch.__version__}
    facts["transformers"] = transformers.__version__
    if device.type != "cuda":
        return facts | {"device": f"CPU ({harness.machine()}), {torch.get_num_threads()} threads"}
    smi = shutil.which("nvidia-smi")
    query = [smi, "--query-gpu=driver_version", "--format=csv,noheader"]
    driver = subprocess.run(query, capture_output=True, text=True).stdout.strip() if smi else "unknown (no nvidia-smi)"
    return facts | {"device": torch.cuda.get_device_name(), "driver": driver, "cuda": torch.version.cuda}


# Sections. Each takes (args, sizes, deadline, publish) and returns its results; it hands `publish` its results so
# far after every measurement, in the same shape.


def correctness(args, sizes: Sizes, deadline: Deadline, publish) -> dict:
    """The GPU tests and the generation tests in bfloat16 on the device, both at once (they time nothing). It runs
    first, within its own share: the gate the figures stand behind, whatever the part has left."""
    runs = {
        "GPU tests (tests/test_gpu.py)": [
            "tests/test_gpu.py",
            "-m",
            "gpu",
            "-n",
            "6",
        ],  # its 5 compiling tests at once
        "generation tests in bfloat16": ["tests/test_generation.py", "--device", args.device, "--dtype", "bfloat16"]
        + (["-k", sizes.generation_tests] if sizes.generation_tests else []),
    }
    results = {}
    with tempfile.TemporaryDirectory(prefix="gpu-report-pytest-") as folder:
        started = {name: PytestRun(arguments, Path(folder) / str(index)) for index, (name, arguments) in
                   enumerate(runs.items())}  # fmt: skip
        try:
            for name, run in started.items():
                results[name] = measured(deadline, run.outcomes, name) | {"command": " ".join(runs[name])}
                publish(results)
        finally:
            for run in started.values():
                run.process.kill()
    return results


class PytestRun:
    """pytest started in a subprocess of the checkout, its output in a file and a JUnit XML report (each test's
    captured output included) beside it."""

    def __init__(self, pytest_args: list[str], stem: Path):
        self.report, self.log = stem.with_suffix(".xml"), stem.with_suffix(".log")
        command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-o", "junit_logging=all"]
        with self.log.open("w") as log:
            self.process = subprocess.Popen(
                [*command, "--junitxml", str(self.report), *pytest_args], cwd=harness.REPO, stdout=log, stderr=log
            )

    def outcomes(self, timeout: float) -> dict:
        """How many tests passed, failed (errors included) and were skipped, why each skipped, and for each failure
        its test, its assertion message and the last lines of its output; waiting at most `timeout` seconds."""
        self.process.wait(timeout)
        if not self.report.exists():
            raise RuntimeError(
                f"pytest wrote no report (exit {self.process.returncode}): {self.log.read_text()[-500:]}"
            )
        outcomes = {"passed": 0, "failed": 0, "skipped": 0, "failures": [], "skip_reasons": set()}
        for case in ElementTree.parse(self.report).getroot().iter("testcase"):
            failure = next((case.find(kind) for kind in ("failure", "error") if case.find(kind) is not None), None)
            if failure is not None:
                outcomes["failed"] += 1
                parts = [failure, case.find("system-out"), case.find("system-err")]
                lines = "\n".join(part.text or "" for part in parts if part is not None).strip().splitlines()
                test = f"{case.get('classname', '').replace('.', '/')}.py::{case.get('name')}"
                message = (failure.get("message") or "")[:3000]
                outcomes["failures"].append({"test": test, "message": message, "output_tail": lines[-40:]})
            elif case.find("skipped") is not None:
                outcomes["skipped"] += 1
                outcomes["skip_reasons"].add((case.find("skipped").get("message") or "")[:200])
            else:
                outcomes["passed"] += 1
        if not outcomes["passed"] + outcomes["failed"] + outcomes["skipped"]:
            raise RuntimeError(f"pytest ran no test (exit {self.process.returncode}): {self.log.read_text()[-500:]}")
        return outcomes | {"skip_reasons": sorted(outcomes["skip_reasons"])}


def generation(args, sizes: Sizes, deadline: Deadline, publish) -> dict:
    """Decoding speed: vaswani eager at each batch size, then with a static cache and torch.compile (greedy and the
    paper's beam search; generate() does not compile transformers' beam search), in one process; Marian eager in
    another. CTranslate2 where it is installed."""
    half = "bfloat16" if args.device == "cuda" else "float32"
    setup = benchmark.BenchmarkArguments(
        device=args.device,
        preset=sizes.generation_preset,
        measure="generate",
        gen_source_length=sizes.generation_length,
        gen_length=sizes.generation_length,
        sweep_lengths=[2 * sizes.generation_length],
        repeats=sizes.repeats,
        warmup=sizes.warmup,
        dtype=half,
    )
    results = {"rows": [], "dtype": half, "preset": sizes.generation_preset, "length": sizes.generation_length}

    def rates(result):
        return {
            f"{search}_{amount}_per_s": harness.summarise(
                result[f"generate_{search}"]["times"], result[f"generate_{search}"][amount]
            )
            for search in ("beam1", "beam4", "paper_beam4")
            if f"generate_{search}" in result
            for amount in ("sentences", "tokens")
        }

    compiled = {"compile": True, "searches": ["beam1", "paper_beam4"]}
    processes = {
        "vaswani": [{"gen_batch": batch} for batch in sizes.generation_batches]
        + [{"gen_batch": batch} | compiled for batch in sizes.generation_compiled_batches],
        "marian": [{"gen_batch": batch} for batch in sizes.generation_batches],
    }
    for implementation, rows in processes.items():
        for row, result in zip(
            rows, worker_rows(deadline, setup, implementation, rows, f"{implementation} generation")
        ):
            engine = "static cache + compile" if row.get("compile") else "eager"
            label = {"batch": row["gen_batch"], "model": implementation, "engine": engine}
            results["rows"].append(label | (result if "not_measured" in result else rates(result)))
        publish(results)
    quantizations = ("float16", "int8_float16") if args.device == "cuda" else ("float32", "int8")
    missing = ctranslate2_missing(args.device)
    for quantization in quantizations:
        for batch in sizes.generation_batches:

            def measure(left, batch=batch, quantization=quantization):
                worker, engine = replace(setup, gen_batch=batch, dtype="float32"), f"ctranslate2:{quantization}"
                with tempfile.TemporaryDirectory(prefix="gpu-report-ct2-") as folder:
                    return rates(benchmark.measure_ctranslate2(worker, engine, Path(folder) / "model", timeout=left))

            row = {"batch": batch, "model": "vaswani", "engine": f"CTranslate2 {quantization}"}
            name = f"CTranslate2 {quantization}, batch {batch}"
            results["rows"].append(row | ({"not_measured": missing} if missing else measured(deadline, measure, name)))
            publish(results)
    return results


def ctranslate2_missing(device: str) -> str | None:
    """Why CTranslate2 cannot be measured here, or None."""
    try:
        import ctranslate2
    except ImportError:
        return (
            "CTranslate2 is not installed here (it is not carried to the GPU machine: its wheel, 41 MiB, loads CUDA "
            "12's cuBLAS, libcublas.so.12, and the machine's torch and libraries are CUDA 13's)"
        )
    if device == "cuda" and ctranslate2.get_cuda_device_count() == 0:
        return "this CTranslate2 sees no CUDA device (a CPU-only build, or one for another CUDA)"
    return None


def training_setup(args, sizes: Sizes) -> benchmark.BenchmarkArguments:
    """The training measurements' worker arguments: bf16 mixed precision on a GPU, float32 on a CPU (slow in bf16)."""
    return benchmark.BenchmarkArguments(
        device=args.device,
        dtype="float32",
        autocast=args.device == "cuda",
        measure="train",
        batch_tokens=sizes.batch_tokens,
        train_length=sizes.train_length,
        sweep_lengths=[sizes.train_length],
        repeats=sizes.repeats,
        warmup=sizes.warmup,
    )


def training_ceiling(args, sizes: Sizes) -> dict:
    """The matmul peak MFU is quoted against, in the training's precision, measured here."""
    precision = torch.bfloat16 if args.device == "cuda" else torch.float32
    return benchmark.matmul_ceiling(torch.device(args.device), precision, sizes.ceiling_size)


def worker_rows(deadline: Deadline, setup, implementation: str, rows: list[dict], name: str) -> list[dict]:
    """`rows` (settings replacing `setup`'s) measured one after another in one worker process of `implementation`:
    each row's result, or for every row why there is none. One process per implementation, not per row: starting
    one (Python, torch, transformers, CUDA) takes about 11 s of a part's minutes on the GPU machine."""
    work = replace(setup, rows=rows)
    outcome = measured(deadline, lambda left: benchmark.run_worker(work, implementation, timeout=left), name)
    return outcome["rows"] if "rows" in outcome else [outcome] * len(rows)


def training_figures(result: dict, ceiling: dict) -> dict:
    """A training measurement's speed, memory and MFU, from a worker's `train` result."""
    flops = harness.summarise(result["times"], result["flops"])["median"]
    return {
        "tokens_per_s": harness.summarise(result["times"], result["tokens"]),
        "target_tokens_per_s": harness.summarise(result["times"], result["batch"] * result["length"]),
        "peak_memory_mib": result["peak_memory"] / 2**20,
        "tflops_per_s": flops / 1e12,
        "mfu": flops / ceiling["flops_per_s"],
        "batch": result["batch"],
        "length": result["length"],
        "losses": result["losses"],  # per step, on the same batch from the same weights: compiled against eager
    }


def training_points(args, sizes: Sizes, deadline: Deadline, implementation: str, rows: list[dict], ceiling) -> list:
    """`rows` of training settings measured in one worker of `implementation`: each row with its figures."""
    measured_rows = worker_rows(
        deadline, training_setup(args, sizes), implementation, rows, f"{implementation} training"
    )
    return [
        row | (result if "not_measured" in result else training_figures(result["train"], ceiling))
        for row, result in zip(rows, measured_rows)
    ]


def training_rows(args, sizes: Sizes, deadline: Deadline, publish, presets: tuple[str, ...], compiled: bool) -> dict:
    """vaswani beside MarianMTModel at each of `presets`, eager or through torch.compile."""
    ceiling = training_ceiling(args, sizes)
    config = benchmark.preset_config(presets[-1], sizes.train_length + 1)
    results = {
        "matmul_ceiling": ceiling,
        "precision": "bf16 mixed precision over float32 weights" if args.device == "cuda" else "float32",
        "rows": [],
        "flops_per_token": dict(
            zip(("per_source_token", "per_target_token"), benchmark.flops_per_token(config, sizes.train_length)),
            length=sizes.train_length,
        ),
        "sizes": {"batch_tokens": sizes.batch_tokens, "length": sizes.train_length},
    }
    rows = [{"preset": preset, "compile_training": compiled} for preset in presets]
    for implementation in ("vaswani", "marian"):
        for point in training_points(args, sizes, deadline, implementation, rows, ceiling):
            results["rows"].append(
                {"implementation": implementation, "compiled": point.pop("compile_training")} | point
            )
        results["rows"].sort(key=lambda row: presets.index(row["preset"]))  # each preset's two rows together
        publish(results)
    return results


def training(args, sizes: Sizes, deadline: Deadline, publish) -> dict:
    return training_rows(args, sizes, deadline, publish, sizes.presets, compiled=False)


def compiled_training(args, sizes: Sizes, deadline: Deadline, publish) -> dict:
    return training_rows(args, sizes, deadline, publish, sizes.compiled_presets, compiled=True)


def profile(args, sizes: Sizes, deadline: Deadline, publish) -> dict:
    """Where the time of a training step of the largest preset goes (`profile_training`), compiled then eager."""
    largest, rows = sizes.presets[-1], [{"compile_training": True}, {"compile_training": False}]
    setup = replace(training_setup(args, sizes), preset=largest, measure="profile")
    runs = worker_rows(deadline, setup, "vaswani", rows, f"{largest} profiles")
    results = {"runs": []}
    for row, run in zip(rows, runs):
        row = {"preset": largest, "compiled": row["compile_training"], "batch_tokens": sizes.batch_tokens}
        results["runs"].append(row | run.get("profile", run))
    publish(results)
    return results


def chunk_sweep(args, sizes: Sizes, deadline: Deadline, publish) -> dict:
    """Speed and memory of the largest preset's eager step against the loss's `accelerator_chunk_elements`."""
    ceiling, largest = training_ceiling(args, sizes), sizes.presets[-1]
    rows = [{"preset": largest, "chunk_elements": elements} for elements in sizes.chunk_sweep]
    points = training_points(args, sizes, deadline, "vaswani", rows, ceiling)
    results = {"preset": largest, "batch_tokens": sizes.batch_tokens, "points": points}
    publish(results)
    return results


SECTIONS = {
    "correctness": correctness,
    "generation": generation,
    "training": training,
    "time_to_bleu": gpu_report_training.time_to_bleu,
    "compiled_training": compiled_training,
    "profile": profile,
    "chunk_sweep": chunk_sweep,
}
# The report's two commands: whether the model is right on the device and how fast it decodes, trains and learns;
# then the compiled training beside Marian's and what the next speed-up would be chosen from.
PARTS = {
    1: ("correctness", "generation", "training", "time_to_bleu"),
    2: ("compiled_training", "profile", "chunk_sweep"),
}
LISTED = "; ".join(f"part {part}: {', '.join(names)}" for part, names in PARTS.items())


@dataclass
class MeasureArguments:
    part: int = field(
        default=1, metadata={"help": "1 (9 minutes on a GPU) or 2 (4.5 minutes)", "choices": list(PARTS)}
    )
    section: list[str] | None = field(default=None, metadata={"help": f"only these of the part's sections ({LISTED})"})
    device: str = field(default="cuda", metadata={"help": "cuda, or cpu (with --quick, to test the code)"})
    quick: bool = field(default=False, metadata={"help": "every section on tiny sizes"})
    report_dir: str = field(default="gpu_report", metadata={"help": "where the sections' JSON and gpu.md go"})
    corpus_dir: str = field(default=".gpu_carry/corpus", metadata={"help": "time_to_bleu's corpus (prepare's)"})
    started_at: float | None = field(
        default=None, metadata={"help": "when the run began (seconds since the epoch; none: now)"}
    )

    def __post_init__(self):
        unknown = [name for name in self.section or () if name not in PARTS[self.part]]
        if unknown:
            raise UsageError(f"--section {', '.join(unknown)} is not in part {self.part} ({LISTED})")


@command
def main(argv) -> dict:
    (args,) = parse_arguments([MeasureArguments], argv, description=__doc__.split("\n\n")[0])
    if args.device == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda asked for, but torch sees no CUDA device.")
    if args.device == "cuda" and args.quick:
        print("--quick on a GPU: tiny sizes, figures that mean nothing", file=sys.stderr)
    return measure_part(args, QUICK if args.quick else FULL)


def measure_part(args: MeasureArguments, sizes: Sizes) -> dict:
    """The part's sections in order, each within its share and the part's deadline, each written when measured."""
    end = time.monotonic() + 60 * sizes.part_minutes[args.part] - (time.time() - (args.started_at or time.time()))
    report_dir = Path(args.report_dir)
    report_dir.mkdir(parents=True, exist_ok=True)
    sections = [name for name in PARTS[args.part] if name in (args.section or PARTS[args.part])]
    facts = environment(torch.device(args.device))
    results = {}
    for index, name in enumerate(sections):
        started = time.monotonic()
        share = 60 * sizes.section_minutes[name] if index < len(sections) - 1 else float("inf")
        deadline = Deadline(min(end - started, share))

        def save(section_results, complete=False, name=name, started=started, deadline=deadline):
            result = {
                "section": name,
                "quick": args.quick,
                "complete": complete,
                "environment": facts,
                "sizes": asdict(sizes),
                "minutes": (time.monotonic() - started) / 60,
                "timings": deadline.timings,
                "results": section_results,
            }
            (report_dir / f"{name}.json").write_text(json.dumps(result, indent=1))
            return result

        try:
            section_results = SECTIONS[name](args, sizes, deadline, save)
        except Exception as error:  # the next sections still run; the traceback goes to stderr
            traceback.print_exc()
            section_results = {"not_measured": f"it failed: {error!r}"[:500]}
        results[name] = save(section_results, complete=True)
        print(f"{name}: {results[name]['minutes']:.1f} min, written {report_dir / name}.json")
    render(report_dir, report_dir)
    print(f"written {report_dir / 'gpu.md'}")
    return results


if __name__ == "__main__":
    main()
