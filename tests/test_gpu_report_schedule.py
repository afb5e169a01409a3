"""The GPU report's schedule at a GPU's timings, on any machine: every measurement of `benchmarks.gpu_report_measure`
is replaced by a wait of the time it took on an H200 (H200_SECONDS), 100 times faster, and the report's own code
decides what runs when. Each part must then measure every row of every section within its deadline, and time to BLEU
must train for its minutes on a schedule planned for the steps it takes."""

import subprocess
import time
from dataclasses import replace

import pytest

from benchmarks import benchmark, gpu_report_measure, gpu_report_training


SCALE = 1 / 100  # simulated seconds per H200 second

# Seconds each measurement took on one H200, by the name the report's JSON records its timings under; the
# sections' own costs below them.
H200_SECONDS = {
    "GPU tests (tests/test_gpu.py)": 60,
    "generation tests in bfloat16": 35,
    "vaswani eager": 20,
    "marian eager": 16,
    "vaswani static cache + compile": 34,
    "vaswani preset=base compile_training=False": 13,
    "marian preset=base compile_training=False": 13,
    "vaswani preset=big compile_training=False": 16,
    "marian preset=big compile_training=False": 16,
    "vaswani preset=base compile_training=True": 50,
    "marian preset=base compile_training=True": 50,
    "big compiled": 50,
    "big eager": 16,
    "vaswani preset=big chunk_elements=16777216": 16,
    "vaswani preset=big chunk_elements=268435456": 16,
}
RUN_SH_SECONDS = 30  # run.sh's offline install and check, before the measuring starts
CEILING_SECONDS = 3  # the matmul peak, measured by each training section
PAGE_SECONDS = 2  # gpu.md and its PNGs, drawn when a section ends
# Time to BLEU, base preset: a run's start, its first steps (kernels loading, the allocator's pool growing), the
# steps after them, and one evaluation of 300 test pairs.
BLEU_START_SECONDS, FIRST_STEPS, FIRST_STEP_SECONDS, STEP_SECONDS, EVALUATION_SECONDS = 5, 30, 0.4, 0.062, 6


def wait(seconds: float, timeout: float | None = None) -> None:
    """Sleep `seconds` of H200 time, scaled; past `timeout` (scaled seconds), as subprocess.run does."""
    if timeout is not None and seconds * SCALE > timeout:
        time.sleep(max(timeout, 0))
        raise subprocess.TimeoutExpired("measurement", timeout)
    time.sleep(seconds * SCALE)


def simulated_worker(args, implementation, sweep_point=None, timeout=None, export_dir=None):
    """benchmark.run_worker at the H200's timings, with results of the shape the real one returns."""
    if args.measure == "generate":
        engine = "static cache + compile" if args.compile else "eager"
        wait(H200_SECONDS[f"{implementation} {engine}"], timeout)
        searches = args.searches or ["beam1", "beam4"] + (["paper_beam4"] if implementation == "vaswani" else [])
        timed = {"times": [0.1, 0.1], "sentences": 1, "tokens": 32}
        return {
            "batches": {str(batch): {f"generate_{search}": timed for search in searches} for batch in args.gen_batches}
        }
    if args.measure == "profile":
        wait(H200_SECONDS[f"{args.preset} {'compiled' if args.compile_training else 'eager'}"], timeout)
        return {"profile": {"total_ms": 100.0, "timed": "device time", "shares": {"matrix products": 1.0}, "top": []}}
    setting = (
        f"chunk_elements={args.chunk_elements}" if args.chunk_elements else f"compile_training={args.compile_training}"
    )
    wait(H200_SECONDS[f"{implementation} preset={args.preset} {setting}"], timeout)
    trained = {"times": [0.1, 0.1], "flops": 1e13, "tokens": 50000, "batch": 390, "length": 64}
    return {"train": trained | {"peak_memory": 2**34}}


class SimulatedPytest:
    """gpu_report_measure.PytestRun at the H200's timings: started at once, done after its run's time."""

    class Process:
        def kill(self):
            pass

    def __init__(self, pytest_args, stem):
        self.name = (
            "GPU tests (tests/test_gpu.py)"
            if pytest_args[0] == "tests/test_gpu.py"
            else "generation tests in bfloat16"
        )
        self.started, self.process = time.monotonic(), self.Process()

    def outcomes(self, timeout):
        wait(max(0.0, H200_SECONDS[self.name] - (time.monotonic() - self.started) / SCALE), timeout)
        return {"passed": 10, "failed": 0, "skipped": 0, "failures": [], "skip_reasons": []}


def simulated_time_to_bleu(args, sizes, deadline, publish):
    """The real section's clock (`scheduled_bleu`) over a run that waits the H200's times."""
    steps = []

    def begin(warmup):
        wait(BLEU_START_SECONDS)
        steps.clear()

    def step():
        started = time.perf_counter()
        wait(FIRST_STEP_SECONDS if len(steps) < FIRST_STEPS else STEP_SECONDS)
        steps.append(time.perf_counter() - started)
        return 5.0, steps[-1]

    def evaluate():
        wait(EVALUATION_SECONDS)
        return 10.0, "signature"

    run = gpu_report_training.BleuRun(begin, step, evaluate)
    results = {
        "preset": sizes.bleu_preset,
        "batch_tokens": sizes.bleu_batch_tokens,
        "peak_lr": 7e-4,
        "test_pairs": 300,
    }
    return gpu_report_training.scheduled_bleu(run, sizes, deadline, publish, results)


def scaled(sizes: gpu_report_measure.Sizes) -> gpu_report_measure.Sizes:
    """The report's sizes with every time in them scaled."""
    minutes = {name: value * SCALE for name, value in sizes.section_minutes.items()}
    return replace(
        sizes,
        part_minutes={part: value * SCALE for part, value in sizes.part_minutes.items()},
        section_minutes=minutes,
        bleu_minutes=sizes.bleu_minutes * SCALE,
        bleu_every_minutes=sizes.bleu_every_minutes * SCALE,
        bleu_calibration_seconds=sizes.bleu_calibration_seconds * SCALE,
        bleu_evaluation_seconds=sizes.bleu_evaluation_seconds * SCALE,
    )


@pytest.fixture
def simulated(monkeypatch):
    """Every measurement of the report replaced by a wait of its H200 time, scaled."""
    monkeypatch.setattr(benchmark, "run_worker", simulated_worker)
    monkeypatch.setattr(
        benchmark, "matmul_ceiling", lambda *args: wait(CEILING_SECONDS) or {"size": 8192, "flops_per_s": 7.5e14}
    )
    monkeypatch.setattr(gpu_report_measure, "PytestRun", SimulatedPytest)
    monkeypatch.setattr(gpu_report_measure, "render", lambda *args: wait(PAGE_SECONDS))
    monkeypatch.setitem(gpu_report_measure.SECTIONS, "time_to_bleu", simulated_time_to_bleu)
    monkeypatch.setattr(gpu_report_measure, "ctranslate2_missing", lambda device: "CTranslate2 is not carried there")


@pytest.mark.parametrize("part", [1, 2])
def test_every_section_of_a_part_is_measured_in_its_minutes_at_an_h200s_timings(simulated, part, tmp_path):
    sizes = scaled(gpu_report_measure.FULL)
    args = gpu_report_measure.MeasureArguments(
        part=part, device="cpu", report_dir=str(tmp_path), started_at=time.time() - RUN_SH_SECONDS * SCALE
    )
    started = time.monotonic()
    sections = gpu_report_measure.measure_part(args, sizes)
    took = time.monotonic() - started + RUN_SH_SECONDS * SCALE
    assert list(sections) == list(gpu_report_measure.PARTS[part])
    for name, section in sections.items():
        rows = [row for key in ("rows", "runs", "points") for row in section["results"].get(key, [])]
        rows += [run for run in section["results"].values() if isinstance(run, dict)] if name == "correctness" else []
        starved = [
            row for row in rows if "not_measured" in row and not row.get("engine", "").startswith("CTranslate2")
        ]
        assert rows and not starved, f"{name}: {starved}"
    # Its last section's page is drawn once its deadline has come.
    assert took <= 60 * sizes.part_minutes[part] + PAGE_SECONDS * SCALE, f"part {part} took {took / SCALE:.0f} s"
    if part == 1:
        bleu = sections["time_to_bleu"]["results"]
        assert not bleu["stopped_by_deadline"] and bleu["trained_minutes"] >= sizes.bleu_minutes
        assert bleu["taken_steps"] == pytest.approx(bleu["planned_steps"], rel=0.1)
        assert [round(point["minutes"] / sizes.bleu_every_minutes) for point in bleu["points"]] == [1, 2, 3, 4]
