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

# What each measurement took on one H200 on 2026-12-04 (docs/benchmarks/gpu_h200_2026-12-04b/*.json, `timings`; a
# measuring process then measured one row, and starting one took about STARTUP of it): a process's start, then each
# of its rows. Where a row was not measured there, the nearest that was, named beside it.
STARTUP = 11
ROW_SECONDS = {
    ("generate", "vaswani", False): 7.3,  # per batch size: greedy, beam 4, the paper's beam 4
    ("generate", "marian", False): 6.6,
    ("generate", "vaswani", True): 23.1,  # compiling and timing greedy and the paper's beam search
    ("train", "vaswani", "base", False): 3.3,
    ("train", "marian", "base", False): 2.0,
    ("train", "vaswani", "big", False): 8.4,  # the chunk sweep's rows too
    ("train", "marian", "big", False): 5.4,
    ("train", "vaswani", "base", True): 47.0,
    ("train", "marian", "base", True): 60.1,
    ("profile", "vaswani", "big", True): 53.2,
    ("profile", "vaswani", "big", False): 11.0,  # cut off there: the eager training row and the profiler's pass
}
# The two pytest runs of correctness, at once: the GPU tests on 6 workers (their slowest, vaswani-train compiled
# beside eager, about a minute: it failed at its start there, for want of `datasets`), the generation tests in
# bfloat16 (2026-11-27: both runs, one after the other, 76 s).
PYTEST_SECONDS = {"tests/test_gpu.py": 65, "tests/test_generation.py": 45}
RUN_SH_SECONDS = 21  # run.sh's offline install and check, and the measuring's start
CEILING_SECONDS = 3  # the matmul peak, measured by each training section
PAGE_SECONDS = 4  # gpu.md and its PNGs, drawn when the part ends
# Time to BLEU, base preset: a run's start, its first steps (0.40 s: a fresh process's first use of each batch
# shape), the steps after them (0.062 s), and its evaluations of 300 test pairs (12.4 s at 1 minute, then 7.7 and 6.6).
BLEU_START_SECONDS, FIRST_STEPS, FIRST_STEP_SECONDS, STEP_SECONDS = 5, 50, 0.40, 0.062
EVALUATION_SECONDS = [12.4, 7.7, 6.6, 6.6]


def wait(seconds: float, timeout: float | None = None) -> None:
    """Sleep `seconds` of H200 time, scaled; past `timeout` (scaled seconds), as subprocess.run does."""
    if timeout is not None and seconds * SCALE > timeout:
        time.sleep(max(timeout, 0))
        raise subprocess.TimeoutExpired("measurement", timeout)
    time.sleep(seconds * SCALE)


def simulated_worker(args, implementation, sweep_point=None, timeout=None, export_dir=None):
    """benchmark.run_worker of `args.rows` at the H200's timings, with results of the shape the real one returns."""
    rows = [replace(args, rows=None, **row) for row in args.rows]
    costs = []
    for row in rows:
        if row.measure == "generate":
            costs.append(ROW_SECONDS[("generate", implementation, row.compile)])
        else:
            costs.append(ROW_SECONDS[(row.measure, implementation, row.preset, row.compile_training)])
    wait(STARTUP + sum(costs), timeout)
    results = []
    for row in rows:
        if row.measure == "generate":
            searches = row.searches or ["beam1", "beam4"] + (["paper_beam4"] if implementation == "vaswani" else [])
            results.append(
                {f"generate_{search}": {"times": [0.1], "sentences": 1, "tokens": 32} for search in searches}
            )
        elif row.measure == "profile":
            results.append({"profile": {"total_ms": 1.0, "timed": "device time", "shares": {"loss": 1.0}, "top": []}})
        else:
            trained = {"times": [0.1], "flops": 1e13, "tokens": 50000, "batch": 390, "length": 64, "losses": [9.0]}
            results.append({"train": trained | {"peak_memory": 2**34}})
    return {"rows": results}


class SimulatedPytest:
    """gpu_report_measure.PytestRun at the H200's timings: started at once, done after its run's time."""

    class Process:
        def kill(self):
            pass

    def __init__(self, pytest_args, stem):
        self.seconds, self.started, self.process = PYTEST_SECONDS[pytest_args[0]], time.monotonic(), self.Process()

    def outcomes(self, timeout):
        wait(max(0.0, self.seconds - (time.monotonic() - self.started) / SCALE), timeout)
        return {"passed": 10, "failed": 0, "skipped": 0, "failures": [], "skip_reasons": []}


def simulated_time_to_bleu(args, sizes, deadline, publish):
    """The real section's clock (`scheduled_bleu`) over a run that waits the H200's times."""
    steps, evaluations = [], []

    def begin(warmup):
        wait(BLEU_START_SECONDS)

    def step():
        started = time.perf_counter()
        wait(FIRST_STEP_SECONDS if len(steps) < FIRST_STEPS else STEP_SECONDS)
        steps.append(time.perf_counter() - started)
        return 5.0, steps[-1]

    def evaluate():
        wait(EVALUATION_SECONDS[min(len(evaluations), len(EVALUATION_SECONDS) - 1)])
        evaluations.append(1)
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
