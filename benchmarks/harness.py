"""What every benchmark runs on: a fresh process per measurement, alternating rounds, CTranslate2's timing, the memory
of a process tree, the machine and versions, and the JSON and Markdown page. Not a tool.
"""

import contextlib
import datetime
import importlib.metadata
import json
import os
import platform
import resource
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import psutil


REPO = Path(__file__).resolve().parents[1]
SAMPLE_SECONDS = 0.2  # between two samples of a process tree's memory


def run_json(arguments, timeout=None) -> dict:
    """`python ARGUMENTS` in a fresh process from the checkout's root: the JSON of the last line it prints. A failure
    raises RuntimeError with the end of its standard error; running past `timeout` seconds, TimeoutExpired."""
    command = [sys.executable, *map(str, arguments)]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command[1:4])} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def time_ctranslate2(job: dict, folder: Path, timeout=None) -> dict:
    """A CTranslate2 job (benchmarks/ctranslate2_timing.py says what it holds), written to FOLDER/job.json and timed
    in a fresh process that never imports torch."""
    (Path(folder) / "job.json").write_text(json.dumps(job))
    return run_json(["-m", "benchmarks.ctranslate2_timing", Path(folder) / "job.json"], timeout=timeout)


def export_ctranslate2(model, output_dir: Path, quantization: str) -> Path:
    """`vaswani-export-ctranslate2` of a model folder, in a process of its own, before anything is timed; what it
    prints is dropped, its errors are not."""
    command = ["-m", "vaswani.scripts.export_ctranslate2", "--model", model, "--output_dir", output_dir]
    command = [sys.executable, *map(str, command), "--quantization", quantization]
    subprocess.run(command, check=True, cwd=REPO, stdout=subprocess.DEVNULL)
    return Path(output_dir)


def alternating_rounds(names: list, rounds: int, measure) -> dict:
    """`measure(name, round)` of every name in every round, in order in even rounds and in reverse in odd ones, so
    that a slow spell of a shared machine falls on every name alike: {name: [each round's result]}."""
    results = {name: [] for name in names}
    for index in range(rounds):
        for name in names[:: -1 if index % 2 else 1]:
            results[name].append(measure(name, index))
    return results


class ProcessTree:
    """A process and every process under it, their resident memory sampled with psutil (which knows a process by its
    pid and start time, so that a pid reused after a process ended is never taken for it)."""

    def __init__(self, pid: int):
        self.pid, self.seen, self.peak_rss, self.peak_anon = pid, {}, 0, 0

    def processes(self) -> list:
        """The root and its descendants now, and every process seen under it before."""
        with contextlib.suppress(psutil.NoSuchProcess):
            root = psutil.Process(self.pid)
            self.seen.update((process.pid, process) for process in [root, *root.children(recursive=True)])
        return list(self.seen.values())

    def sample(self) -> dict:
        """{pid: (parent pid, command line, RSS, anonymous `rss - shared`, the kernel's peak RSS VmHWM or 0)} of the
        tree's live processes; the peaks of their summed RSS and anonymous memory are kept."""
        now = {}
        for process in self.processes():
            try:
                with process.oneshot():
                    info, parent, argv = process.memory_info(), process.ppid(), process.cmdline()
                status = Path(f"/proc/{process.pid}/status")
                lines = status.read_text().splitlines() if status.exists() else []
            except (psutil.Error, OSError):  # gone, or a zombie
                continue
            peak = next((int(line.split()[1]) * 1024 for line in lines if line.startswith("VmHWM:")), 0)
            now[process.pid] = (parent, argv, info.rss, info.rss - info.shared, peak)
        self.peak_rss = max(self.peak_rss, sum(sampled[2] for sampled in now.values()))
        self.peak_anon = max(self.peak_anon, sum(sampled[3] for sampled in now.values()))
        return now

    def kill(self, root: subprocess.Popen) -> None:
        """SIGKILL every process group of the tree (a launcher may start each child in a session of its own), then
        wait until all its processes are gone. Only running processes count (a pid reused meanwhile is left alone),
        and the root's own group while the root is not yet waited for (its pid cannot be reused until then)."""
        running = [process for process in self.processes() if alive(process)]
        groups = {root.pid} if root.returncode is None else set()
        for process in running:
            with contextlib.suppress(ProcessLookupError):
                groups.add(os.getpgid(process.pid))
        for group in groups - {os.getpgrp()}:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(group, signal.SIGKILL)
        root.wait()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(alive(process) for process in running):
            time.sleep(0.1)  # orphaned children are reaped by init; their memory is free once they are gone


def alive(process: psutil.Process) -> bool:
    """Whether a process still runs under its pid (psutil compares start times) and is not a zombie."""
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def run_measured(command, *, env=None, log=None) -> dict:
    """Run `command` (its output to `log`): its wall seconds, the CPU seconds of all its processes (getrusage of the
    waited children) and the peaks of their summed RSS and anonymous memory, sampled every SAMPLE_SECONDS."""
    before, started = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    with open(log, "w") if log else subprocess.DEVNULL as output:
        process = subprocess.Popen(command, env={**os.environ, **(env or {})}, stdout=output, stderr=subprocess.STDOUT)
        tree = ProcessTree(process.pid)
        while process.poll() is None:
            tree.sample()
            time.sleep(SAMPLE_SECONDS)
    wall, after = time.perf_counter() - started, resource.getrusage(resource.RUSAGE_CHILDREN)
    if process.returncode:
        raise SystemExit(f"{' '.join(map(str, command))} failed with status {process.returncode}; its log: {log}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall_seconds": wall, "cpu_seconds": cpu, "peak_rss": tree.peak_rss, "peak_anon": tree.peak_anon}


def folder_bytes(paths) -> int:
    return sum(path.stat().st_size for root in paths for path in Path(root).rglob("*") if path.is_file())


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def machine() -> str:
    """The CPU's model, the cores this process may use, the memory and the operating system."""
    cpuinfo = Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []
    names = [line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")]
    cpu = names[0] if names else platform.processor() or platform.machine()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    memory = psutil.virtual_memory().total / 2**30
    return f"{cpu}, nproc {cores}, {memory:.1f} GiB memory, {platform.system()} {platform.release()}"


def environment(*packages: str) -> dict:
    """When, where and with what a figure was taken: the date and time, the machine, and the versions of Python and
    of `packages`."""
    versions = {"python": platform.python_version()}
    versions |= {name: importlib.metadata.version(name) for name in packages}
    return {"date": datetime.datetime.now().isoformat(timespec="seconds"), "machine": machine(), "versions": versions}


def describe(facts: dict) -> str:
    """A page's line for `environment()`'s facts (the date where they hold one)."""
    versions = ", ".join(f"{name} {version}" for name, version in facts["versions"].items())
    return (f"{facts['date'][:10]}, " if "date" in facts else "") + f"{facts['machine']}; {versions}"


def summarise(times: list, amount: float) -> dict:
    """The rates of `amount` in each of the times: their median, lowest and highest."""
    rates = [amount / t for t in times]
    return {"median": statistics.median(rates), "low": min(rates), "high": max(rates)}


def fmt_rate(stat: dict | None) -> str:
    return "n/a" if stat is None else f"{stat['median']:,.0f} ({stat['low']:,.0f}-{stat['high']:,.0f})"


def table(header: list, rows: list) -> str:
    """A Markdown table."""
    lines = [header, ["---"] * len(header), *rows]
    return "\n".join("| " + " | ".join(map(str, cells)) + " |" for cells in lines)


def write_page(stem, data: dict, page: str, show: bool = True) -> None:
    """The figures as STEM.json and the page as STEM.md (the folder made if missing); with `show`, the page printed."""
    stem = Path(stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    Path(f"{stem}.json").write_text(json.dumps(data, indent=1) + "\n")
    Path(f"{stem}.md").write_text(page)
    if show:
        print(f"{page}\nWritten {stem}.json and .md")
