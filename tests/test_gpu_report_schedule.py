"""The GPU report's schedule at a GPU's timings, on any machine: every measurement of `benchmarks.gpu_report_measure`
takes, on a clock of the test's own, the time it took on an H200, and the report's own code decides what runs when.
Each part must then measure every row of every section within its deadline, and time to BLEU must train for its
minutes on a schedule planned for the steps it takes."""

import subprocess
import types

import pytest

from benchmarks import benchmark, gpu_report_measure, gpu_report_training


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
# Time to BLEU, base preset: a run's start, a fresh process's first steps (0.40 s: the first use of each batch shape),
# the steps after them (0.062 s), and its evaluations of 300 test pairs (12.4 s at 1 minute, then 7.7 and 6.6).
BLEU_START_SECONDS, FIRST_STEPS, FIRST_STEP_SECONDS, STEP_SECONDS = 5, 50, 0.40, 0.062
EVALUATION_SECONDS = [12.4, 7.7, 6.6, 6.6]


class Clock:
    """The report's clock in the test: `time`'s functions the report calls, on seconds that pass only by `wait`."""

    def __init__(self):
        self.now = 1_000_000.0

    def time(self):
        return self.now

    monotonic = perf_counter = time

    def wait(self, seconds: float, timeout: float | None = None) -> None:
        """Let `seconds` pass; past `timeout`, only `timeout` and then TimeoutExpired, as subprocess.run does."""
        if timeout is not None and seconds > timeout:
            self.now += max(timeout, 0)
            raise subprocess.TimeoutExpired("measurement", timeout)
        self.now += seconds


def simulated_worker(clock: Clock):
    def run_worker(args, implementation, sweep_point=None, timeout=None, export_dir=None):
        """benchmark.run_worker of `args.rows` at the H200's timings, with results of the shape the real one returns."""
        rows = [args.__class__(**{**vars(args), "rows": None, **row}) for row in args.rows]
        keys = [
            ("generate", implementation, row.compile)
            if row.measure == "generate"
            else (row.measure, implementation, row.preset, row.compile_training)
            for row in rows
        ]
        clock.wait(STARTUP + sum(ROW_SECONDS[key] for key in keys), timeout)
        results = []
        for row in rows:
            if row.measure == "generate":
                names = row.searches or ["beam1", "beam4"] + (["paper_beam4"] if implementation == "vaswani" else [])
                results.append({f"generate_{name}": {"times": [0.1], "sentences": 1, "tokens": 32} for name in names})
            elif row.measure == "profile":
                results.append(
                    {"profile": {"total_ms": 1.0, "timed": "device time", "shares": {"loss": 1.0}, "top": []}}
                )
            else:
                trained = {"times": [0.1], "flops": 1e13, "tokens": 50000, "batch": 390, "length": 64, "losses": [9.0]}
                results.append({"train": trained | {"peak_memory": 2**34}})
        return {"rows": results}

    return run_worker


def simulated_pytest(clock: Clock):
    class PytestRun:
        """gpu_report_measure.PytestRun at the H200's timings: started at once, done after its run's time."""

        process = types.SimpleNamespace(kill=lambda: None)

        def __init__(self, pytest_args, stem):
            self.seconds, self.started = PYTEST_SECONDS[pytest_args[0]], clock.now

        def outcomes(self, timeout):
            clock.wait(max(0.0, self.started + self.seconds - clock.now), timeout)
            return {"passed": 10, "failed": 0, "skipped": 0, "failures": [], "skip_reasons": []}

    return PytestRun


def simulated_time_to_bleu(clock: Clock):
    def time_to_bleu(args, sizes, deadline, publish):
        """The real section's clock (`scheduled_bleu`) over a run that takes the H200's times."""
        steps, evaluations = [], []

        def step():
            steps.append(FIRST_STEP_SECONDS if len(steps) < FIRST_STEPS else STEP_SECONDS)
            clock.wait(steps[-1])
            return 5.0, steps[-1]

        def evaluate():
            clock.wait(EVALUATION_SECONDS[min(len(evaluations), len(EVALUATION_SECONDS) - 1)])
            evaluations.append(1)
            return 10.0, "signature"

        run = gpu_report_training.BleuRun(lambda warmup: clock.wait(BLEU_START_SECONDS), step, evaluate)
        results = {"preset": sizes.bleu_preset, "batch_tokens": sizes.bleu_batch_tokens, "peak_lr": 7e-4}
        return gpu_report_training.scheduled_bleu(run, sizes, deadline, publish, results | {"test_pairs": 300})

    return time_to_bleu


@pytest.fixture
def clock(monkeypatch):
    """Every measurement of the report replaced by the time it took on an H200, on the report's clock."""
    clock = Clock()
    for module in (gpu_report_measure, gpu_report_training):
        monkeypatch.setattr(module, "time", clock)
    monkeypatch.setattr(benchmark, "run_worker", simulated_worker(clock))
    monkeypatch.setattr(
        benchmark, "matmul_ceiling", lambda *args: clock.wait(CEILING_SECONDS) or {"size": 8192, "flops_per_s": 7e14}
    )
    monkeypatch.setattr(gpu_report_measure, "PytestRun", simulated_pytest(clock))
    monkeypatch.setattr(gpu_report_measure, "render", lambda *args: clock.wait(PAGE_SECONDS))
    monkeypatch.setattr(gpu_report_measure, "ctranslate2_missing", lambda device: "CTranslate2 is not carried there")
    monkeypatch.setitem(gpu_report_measure.SECTIONS, "time_to_bleu", simulated_time_to_bleu(clock))
    return clock


@pytest.mark.parametrize("part", [1, 2])
def test_every_section_of_a_part_is_measured_in_its_minutes_at_an_h200s_timings(clock, part, tmp_path):
    sizes = gpu_report_measure.FULL
    args = gpu_report_measure.MeasureArguments(
        part=part, device="cpu", report_dir=str(tmp_path), started_at=clock.now - RUN_SH_SECONDS
    )
    started = clock.now - RUN_SH_SECONDS
    sections = gpu_report_measure.measure_part(args, sizes)
    assert list(sections) == list(gpu_report_measure.PARTS[part])
    for name, section in sections.items():
        rows = [row for key in ("rows", "runs", "points") for row in section["results"].get(key, [])]
        rows += [run for run in section["results"].values() if isinstance(run, dict)] if name == "correctness" else []
        starved = [
            row for row in rows if "not_measured" in row and not row.get("engine", "").startswith("CTranslate2")
        ]
        assert rows and not starved, f"{name}: {starved}"
    took = clock.now - started
    # Its last section's page is drawn once the part's sections are done.
    assert took <= 60 * sizes.part_minutes[part] + PAGE_SECONDS, f"part {part} took {took:.0f} s"
    if part == 1:
        bleu = sections["time_to_bleu"]["results"]
        assert not bleu["stopped_by_deadline"] and bleu["trained_minutes"] >= sizes.bleu_minutes
        assert bleu["taken_steps"] == pytest.approx(bleu["planned_steps"], rel=0.1)
        assert [round(point["minutes"] / sizes.bleu_every_minutes) for point in bleu["points"]] == [1, 2, 3, 4]
