"""Memory, start-up time and speed of the training data path at WMT scale: the old code against the new.

    python -m benchmarks.data_scale prepare    --dataset_dir BIBLE --workdir WORK [--sizes 100k,1M,4.5M]
    python -m benchmarks.data_scale memory     --dataset_dir BIBLE --workdir WORK
                                               [--sizes default,100k,1M,4.5M] [--codes old,new] [--processes 1,2]
    python -m benchmarks.data_scale throughput --dataset_dir BIBLE --workdir WORK [--rounds 3]
    python -m benchmarks.data_scale pipeline   --dataset_dir BIBLE --workdir WORK [--sizes 36M] [--timeout 14400]
    python -m benchmarks.data_scale report

Run from the root of a git checkout, with the package installed editable and its `test` extra (psutil samples the
processes; benchmarks/README.md). BIBLE is a DatasetDict saved by scripts/prepare_data.py (the default corpus).

The two codes: "old" is scripts/train.py as of commit 9231e65 (--old_commit), checked out as a git worktree in
WORK/old_code; it imports the installed (editable) `vaswani`, so the model is the same and only the data path
differs. "new" is this checkout's scripts/train.py. Both run with the same settings; the old commit's flags have the
names they had before the training command took transformers' `TrainingArguments` names (OLD_FLAGS). The new code
caches the tokenized data in each split's folder as vaswani-* files: a "first run"
deletes those files before it starts, a "cached" run follows it and keeps them. The old code has no cache.

What is prepared in WORK (each skipped when present; `memory` and `throughput` prepare what they need):
- corpus_N: a DatasetDict whose train split holds N pairs, copies of BIBLE's train split; copy k > 0 has the words of
  each side shuffled (random.Random seeded by copy and row), ids read "c{k}.{id}"; validation and test as in BIBLE.
  Built with datasets alone (concatenate, select, a batched map over 2 processes, save_to_disk), never as Python
  lists. Size "default" is BIBLE itself (27,732 train pairs for the Bible corpus).
- tok4000 (memory rows) and tok8000 (throughput rows, as in scripts/main_job.sh): shared BPE vocabularies trained on
  BIBLE with the old worktree's scripts/train_tokenizer.py, so that concurrent edits cannot change them.

One measurement is one launch of train.py, in a session of its own, with OMP_NUM_THREADS=1 and
TOKENIZERS_PARALLELISM=false: `python3 scripts/train.py ...` for 1 process, `python3 -m accelerate.commands.launch
--multi_gpu --num_processes 2 ...` for 2 (gloo ranks without a GPU). A training process is one whose script is
train.py, not the launcher; the processes it starts (tokenization or data-loader workers) are its children. Every
0.2 s, psutil gives the processes under the launch (`Process(launcher).children(recursive=True)`) and the resident
memory of each: RssAnon (`rss - shared`), RSS, and the kernel's peak, VmHWM (read from /proc/PID/status):
- peak RssAnon per process: the highest RssAnon sampled in any training process. Anonymous memory only: the
  memory-mapped Arrow pages count in RSS but are file-backed and the kernel can drop them;
- peak RSS per process: the highest of VmHWM (the kernel's own peak, last read at most 0.2 s before the kill) and
  the sampled RSS, over the training processes;
- peak RssAnon of all: the highest sum of RssAnon over the training processes and their children at one sample
  (pages shared copy-on-write by a forked child count twice);
- time to the first optimizer step: from the launch until train_log.jsonl holds the record of step 1 (to 0.05 s);
- tokens/s (source + target, all processes): `memory` runs --logging_steps 1 --max_steps 40 and takes the median
  of the per-step tokens_per_sec of steps 11 to 40; `throughput` runs like the main job (small preset, 8k vocabulary,
  2 processes, --logging_steps 10 --max_steps 40), takes each run's median of the records after the first (steps 20, 30,
  40), and the median of --rounds runs per code, run in alternating order.
Within 0.05 s of the last record needed, every process group of the launch gets SIGKILL, so that the final
checkpoint, averaging and validation are not measured; a launch that runs past --timeout is killed the same way and
reported as a timeout. Measurements run one after the other. The OS page cache is not dropped (that needs root).

The old code is not run above --old_max_rows pairs: its row gives a linear extrapolation of peak RSS and time to the
first step from the two largest old-code rows measured with the same number of processes (or, until there are two,
from reference figures of the old code: 100k pairs 1.33 GB / 51 s, 1M pairs 4.75 GB / 275 s).

`pipeline` follows a user of a WMT-sized corpus from the Hub's layout to the first training step, per size: corpus_N
written as Parquet shards in a configuration folder (hub_N/en-es/train-00000-of-000NN.parquet, rows {"translation"}
alone, as wmt14 is served), `prepare_data.py --dataset hub_N --dataset_config en-es` (datasets' Arrow copy of the
Parquet goes to WORK/hf_cache, deleted after), `train_tokenizer.py --max_sentences 1000000` on what it prepared, then
train.py with 2 processes on the prepared corpus and that tokenizer: a first start (no cache) and a cached start,
each measured as above. The two scripts are measured as benchmarks.preprocess measures its steps (wall and CPU
seconds, the peak of their processes' summed anonymous memory, the bytes they wrote); the first tokenization's time
is the first start less the cached one.

Results merge into docs/benchmarks/data_scale.json, keyed by (mode, code, corpus, processes, cache), so that a run
over some sizes adds to earlier ones; docs/benchmarks/data_scale.md is rewritten from all of them. Each launch's
output is kept in WORK/logs.
"""

import argparse
import datetime
import hashlib
import importlib.metadata
import json
import os
import platform
import random
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil


REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "docs" / "benchmarks" / "data_scale"  # for .json and .md
OLD_COMMIT = "9231e65"
MEMORY_PRESET, MEMORY_VOCAB, MEMORY_STEPS, MEMORY_STEADY_AFTER = "tiny", 4000, 40, 10
THROUGHPUT_PRESET, THROUGHPUT_VOCAB, THROUGHPUT_PROCESSES, THROUGHPUT_STEPS, THROUGHPUT_LOG_EVERY = (
    "small",
    8000,
    2,
    40,
    10,
)
PIPELINE_CONFIG, PIPELINE_SAMPLE = "en-es", 1_000_000  # the Hub layout's configuration; train_tokenizer's sample
SAMPLE_SECONDS, POLL_SECONDS = 0.2, 0.05  # memory samples; reads of train_log.jsonl
# Reference figures of the old code (tiny preset): train pairs -> (peak RSS, seconds to the first steps).
OLD_REFERENCE_FIGURES = {100_000: (1.33e9, 51.0), 1_000_000: (4.75e9, 275.0)}
CODE_ORDER = ("old", "new")
# The training command's flags took transformers' `TrainingArguments` names after the old commit: new -> old name.
OLD_FLAGS = {
    "--gradient_accumulation_steps": "--grad_accum",
    "--adam_epsilon": "--adam_eps",
    "--label_smoothing_factor": "--label_smoothing",
    "--save_steps": "--save_every",
    "--save_total_limit": "--keep_checkpoints",
    "--resume_from_checkpoint": "--resume",
    "--eval_steps": "--eval_every",
    "--logging_steps": "--log_every",
    "--generation_num_beams": "--eval_num_beams",
    "--per_device_eval_batch_size": "--eval_batch_size",
    "--use_cpu": "--cpu",
}
CACHE_ORDER = ("none", "first run", "cached", "as found")


# ---------------------------------------------------------------------------------------------------------------------
# Preparation: the old code's worktree, the tokenizers, the synthetic corpora.
# ---------------------------------------------------------------------------------------------------------------------


def parse_size(text):
    """'default' (the --dataset_dir corpus itself) or a number of train pairs (see parse_pairs)."""
    return text if text == "default" else parse_pairs(text)


def parse_pairs(text):
    """A number of train pairs: 40000, 100k, 4.5M."""
    scale = {"k": 1_000, "M": 1_000_000}.get(text[-1:], 1)
    try:
        rows = round(float(text[:-1] if scale > 1 else text) * scale)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of pairs such as 40000, 100k or 4.5M") from None
    if rows < 1:
        raise argparse.ArgumentTypeError(f"a corpus needs at least one pair, not {text!r}")
    return rows


def comma_list(parse):
    return lambda text: [parse(item) for item in text.split(",") if item]


def choice(*allowed):
    def parse(text):
        if text not in allowed:
            raise argparse.ArgumentTypeError(f"{text!r} is not one of {', '.join(allowed)}")
        return text

    return parse


def corpus_path(args, size):
    return args.dataset_dir if size == "default" else args.workdir / f"corpus_{size}"


def corpus_name(size):
    return "default" if size == "default" else f"corpus_{size}"


def train_rows(path):
    from datasets import load_from_disk

    return load_from_disk(str(path))["train"].num_rows


def timed(what, target, build, *arguments):
    """build(*arguments, target) unless `target` exists, saying how long it took."""
    if target.exists():
        print(f"{what}: {target} is there, skipped", flush=True)
        return target
    start = time.perf_counter()
    build(*arguments, target)
    print(f"{what}: built {target} in {time.perf_counter() - start:,.0f} s", flush=True)
    return target


def git(*arguments, cwd):
    return subprocess.run(["git", *arguments], cwd=cwd, capture_output=True, text=True, check=True).stdout.strip()


def old_code_path(args):
    return args.workdir / "old_code"


def add_old_worktree(args, target):
    git("worktree", "add", "--detach", str(target), args.old_commit, cwd=REPO)


def train_tokenizer(args, vocab_size, target):
    """The project's own BPE training (the old worktree's copy), written to TARGET.partial and then renamed."""
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    subprocess.run(
        [
            sys.executable,
            "scripts/train_tokenizer.py",
            "--dataset_dir",
            str(args.dataset_dir),
            "--vocab_size",
            str(vocab_size),
            "--output_dir",
            str(partial),
        ],
        cwd=old_code_path(args),
        check=True,
        stdout=subprocess.DEVNULL,
    )
    partial.rename(target)


def shuffled_words(text, rng):
    words = text.split()
    rng.shuffle(words)
    return " ".join(words)


def shuffle_words(batch, indices, rows_per_copy):
    """Copy k = index // rows_per_copy of a train row: ids prefixed "c{k}.", words shuffled on each side for k > 0."""
    ids, translations = [], []
    for original_id, pair, index in zip(batch["id"], batch["translation"], indices, strict=True):
        copy, row = divmod(index, rows_per_copy)
        if copy:
            rng = random.Random(f"{copy}.{row}")
            pair = {language: shuffled_words(text, rng) for language, text in pair.items()}
        ids.append(f"c{copy}.{original_id}")
        translations.append(pair)
    return {"id": ids, "translation": translations}


def build_corpus(args, rows, target):
    """BIBLE's train split repeated to `rows` pairs (copies with shuffled words), validation and test unchanged."""
    from datasets import DatasetDict, concatenate_datasets, load_from_disk

    source = load_from_disk(str(args.dataset_dir))
    train = source["train"]
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    (partial / "map").mkdir(parents=True)
    copies = -(-rows // len(train))
    repeated = concatenate_datasets([train] * copies).select(range(rows))
    # The map's output goes to a scratch file of its own; by default it would land in BIBLE's train folder.
    shuffled = repeated.map(
        shuffle_words,
        batched=True,
        num_proc=2,
        with_indices=True,
        features=train.features,
        fn_kwargs={"rows_per_copy": len(train)},
        cache_file_name=str(partial / "map" / "train.arrow"),
        desc=f"corpus_{rows}",
    )
    DatasetDict(train=shuffled, validation=source["validation"], test=source["test"]).save_to_disk(
        str(partial / "corpus")
    )
    (partial / "corpus").rename(target)
    shutil.rmtree(partial)


def prepare(args, sizes, vocab_sizes):
    args.workdir.mkdir(parents=True, exist_ok=True)
    if vocab_sizes:  # trained with the old code's script
        timed(f"old code ({args.old_commit})", old_code_path(args), add_old_worktree, args)
    for vocab_size in vocab_sizes:
        timed(f"tokenizer, {vocab_size} tokens", args.workdir / f"tok{vocab_size}", train_tokenizer, args, vocab_size)
    for size in sizes:
        if size != "default":
            timed(f"corpus of {size:,} pairs", corpus_path(args, size), build_corpus, args, size)


def write_hub_layout(args, size, target):
    """corpus_N's splits as the Hub serves a translation dataset (wmt14: fr-en/train-00000-of-00030.parquet, ...):
    Parquet shards of 1M rows in a configuration folder, each row {"translation": {...}} alone."""
    from datasets import load_from_disk

    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    folder = partial / PIPELINE_CONFIG
    folder.mkdir(parents=True)
    for split, dataset in load_from_disk(str(corpus_path(args, size))).items():
        dataset = dataset.select_columns(["translation"])
        shards = -(-len(dataset) // 1_000_000)
        for index in range(shards):
            shard = dataset.shard(shards, index, contiguous=True)
            shard.to_parquet(str(folder / f"{split}-{index:05d}-of-{shards:05d}.parquet"))
    partial.rename(target)


# ---------------------------------------------------------------------------------------------------------------------
# One measurement: launch train.py, sample the memory of its processes, read its log, kill it.
# ---------------------------------------------------------------------------------------------------------------------


def peak_rss(process):
    """The kernel's own peak of a process's resident memory (VmHWM of /proc/PID/status, which psutil does not
    report), in bytes."""
    try:
        status = Path(f"/proc/{process.pid}/status").read_text()
    except OSError:
        raise psutil.NoSuchProcess(process.pid) from None
    for line in status.splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise psutil.ZombieProcess(process.pid)  # a zombie's status has no memory lines


def runs_train_script(argv):
    """Whether a command line is `python [-u] .../train.py ...`; the launcher's script is a module (-m)."""
    script = next((argument for argument in argv[1:] if not argument.startswith("-")), "")
    return Path(script).name == "train.py"


def process_roles(commands, parents):
    """'training' for a process running train.py, 'child' for any process under one, 'other' (the launcher); from
    each process's command line and parent pid, over the processes of one launch."""
    roles = {}
    for pid, argv in commands.items():
        ancestors, parent = [], parents[pid]
        while parent in commands:
            ancestors.append(parent)
            parent = parents[parent]
        if any(runs_train_script(commands[ancestor]) for ancestor in ancestors):
            roles[pid] = "child"
        else:
            roles[pid] = "training" if runs_train_script(argv) else "other"
    return roles


class MemorySampler:
    """Per-process peaks of the processes under one launch, and the peak of their summed anonymous memory.

    The processes are psutil's: the launcher's tree (`children(recursive=True)`), each known by its pid and start
    time, so that a pid reused after a process ended is never taken for it. RssAnon is psutil's `rss - shared` (the
    resident pages that are neither file-backed nor shared memory)."""

    def __init__(self, root):
        self.root, self.peaks, self.peak_anon_all, self.seen = root, {}, 0, {}

    def launch(self):
        """The launcher and its descendants now, and every process of the launch seen before (for the kill)."""
        try:
            launcher = psutil.Process(self.root)
            self.seen.update((process.pid, process) for process in [launcher, *launcher.children(recursive=True)])
        except psutil.NoSuchProcess:
            pass
        return list(self.seen.values())

    def sample(self):
        commands, parents, memory = {}, {}, {}
        for process in self.launch():
            try:
                with process.oneshot():
                    command, parent, info = process.cmdline(), process.ppid(), process.memory_info()
                    rss = max(info.rss, peak_rss(process))
            except psutil.Error:  # gone, or a zombie (a process that ends between two reads is left out whole)
                continue
            commands[process.pid], parents[process.pid] = command, parent
            memory[process.pid] = (info.rss - info.shared, rss)
        anon_all = 0
        for pid, role in process_roles(commands, parents).items():
            rss_anon, rss = memory[pid]
            peak = self.peaks.get(pid)
            if peak is None or peak["role"] != role:  # a new process, or one that has just exec'd train.py
                peak = self.peaks[pid] = {"pid": pid, "role": role, "rss_anon": 0, "rss": 0}
            peak["rss_anon"] = max(peak["rss_anon"], rss_anon)
            peak["rss"] = max(peak["rss"], rss)
            if role != "other":
                anon_all += rss_anon
        self.peak_anon_all = max(self.peak_anon_all, anon_all)

    def of_role(self, role):
        return [peak for peak in self.peaks.values() if peak["role"] == role]


def kill_launch(launcher, processes):
    """SIGKILL every process group of the launch (accelerate starts each rank in a session of its own), then wait
    until all its processes are gone.

    Only `processes` still running count (psutil compares their start times: a pid reused meanwhile is left alone);
    so does the launcher's own group while the launcher is not yet waited for (its pid cannot be reused until then)."""
    running = [process for process in processes if alive(process)]
    groups = {launcher.pid} if launcher.returncode is None else set()
    for process in running:
        try:
            groups.add(os.getpgid(process.pid))
        except ProcessLookupError:
            pass
    for group in groups - {os.getpgrp()}:
        try:
            os.killpg(group, signal.SIGKILL)
        except ProcessLookupError:
            pass
    launcher.wait()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(alive(process) for process in running):
        time.sleep(0.1)  # orphaned ranks are reaped by init; their memory is free once they are gone


def alive(process):
    """Whether a process still runs under its pid (psutil compares start times) and is not a zombie."""
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def read_records(log_path):
    """The training records of train_log.jsonl written so far (a half-written last line is left for later)."""
    records = []
    if log_path.exists():
        for line in log_path.read_text().splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if "tokens_per_sec" in record:
                records.append(record)
    return records


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def cache_files(corpus):
    return sorted(corpus.glob("*/vaswani-*"))


def code_version(code_dir):
    digest = hashlib.sha256((code_dir / "scripts" / "train.py").read_bytes()).hexdigest()[:12]
    return f"{git('describe', '--always', '--dirty', cwd=code_dir)}, scripts/train.py sha256 {digest}"


def measure(args, *, code, corpus, processes, cache, preset, tokenizer, max_steps, log_every, steady_after, label):
    """One launch of train.py; its memory peaks, time to the first record, tokens/s and how it ended."""
    code_dir = old_code_path(args) if code == "old" else REPO
    if cache == "first run":
        for path in cache_files(corpus):
            path.unlink()
    cache_before = len(cache_files(corpus))
    (args.workdir / "runs").mkdir(parents=True, exist_ok=True)
    (args.workdir / "logs").mkdir(parents=True, exist_ok=True)
    output_dir = Path(tempfile.mkdtemp(prefix=f"{label}_", dir=args.workdir / "runs"))
    train_args = [
        "--dataset_dir",
        str(corpus),
        "--tokenizer",
        str(tokenizer),
        "--output_dir",
        str(output_dir),
        "--preset",
        preset,
        "--max_steps",
        str(max_steps),
        "--batch_tokens",
        "2000",
        "--lr_schedule",
        "short",
        "--peak_lr",
        "1e-3",
        "--warmup_steps",
        "130",
        "--save_steps",
        "100000",
        "--average_last",
        "1",
        "--save_total_limit",
        "1",
        "--eval_steps",
        "0",
        "--eval_bleu_samples",
        "0",
        "--logging_steps",
        str(log_every),
        "--report_to",
        "none",
    ]
    if code == "old":
        train_args = [OLD_FLAGS.get(argument, argument) for argument in train_args]
    if processes == 1:
        command = [sys.executable, "scripts/train.py", *train_args]
    else:
        command = [
            sys.executable,
            "-m",
            "accelerate.commands.launch",
            "--multi_gpu",
            "--num_processes",
            str(processes),
            "--num_machines",
            "1",
            "--mixed_precision",
            "no",
            "--dynamo_backend",
            "no",
            "--main_process_port",
            str(free_port()),
            "scripts/train.py",
            *train_args,
        ]
    environment = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    log_path = args.workdir / "logs" / f"{label}.log"
    first_record_seconds, status, records = None, None, []
    with log_path.open("w") as log:
        start = time.monotonic()
        process = subprocess.Popen(
            command, cwd=code_dir, env=environment, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    sampler, next_sample = MemorySampler(process.pid), start
    try:
        while status is None:
            if time.monotonic() >= next_sample:
                sampler.sample()
                next_sample = time.monotonic() + SAMPLE_SECONDS
            exited = process.poll() is not None  # asked before the log is read: a record written last still counts
            records = read_records(output_dir / "train_log.jsonl")
            if records and first_record_seconds is None:
                first_record_seconds = time.monotonic() - start
            if any(record["step"] >= max_steps for record in records):
                status = "ok"
            elif exited:
                status = f"failed (exit code {process.returncode})"
            elif time.monotonic() - start > args.timeout:
                status = f"timeout ({args.timeout:,.0f} s)"
            else:
                time.sleep(POLL_SECONDS)
    finally:
        kill_launch(process, sampler.launch())
        shutil.rmtree(output_dir, ignore_errors=True)
    wall_seconds = time.monotonic() - start
    training, children = sampler.of_role("training"), sampler.of_role("child")
    steady = [record["tokens_per_sec"] for record in records if record["step"] > steady_after]
    return {
        "status": status,
        "first_record_step": records[0]["step"] if records else None,
        "seconds_to_first_record": first_record_seconds,
        "tokens_per_sec": statistics.median(steady) if steady else None,
        "tokens_per_sec_steps": [record["step"] for record in records if record["step"] > steady_after],
        "peak_rss_anon_per_process": max((peak["rss_anon"] for peak in training), default=None),
        "peak_rss_per_process": max((peak["rss"] for peak in training), default=None),
        "peak_rss_anon_all": sampler.peak_anon_all,
        "training_processes": training,
        "child_processes": children,
        "cache_files_before": cache_before,
        "cache_files_after": len(cache_files(corpus)),
        "wall_seconds": wall_seconds,
        "preset": preset,
        "tokenizer": str(tokenizer),
        "dataset_dir": str(corpus),
        "command": shlex.join(command),
        "cwd": str(code_dir),
        "code_version": code_version(code_dir),
        "log": str(log_path),
        "date": now(),
        "machine": machine_description(),
        "versions": versions(),
    }


# ---------------------------------------------------------------------------------------------------------------------
# The plans.
# ---------------------------------------------------------------------------------------------------------------------


def measure_memory(args, code, corpus, processes, cache, tokenizer, label):
    """One launch as the memory rows are measured: the tiny preset, a record at every step."""
    return measure(
        args,
        code=code,
        corpus=corpus,
        processes=processes,
        cache=cache,
        preset=MEMORY_PRESET,
        tokenizer=tokenizer,
        max_steps=MEMORY_STEPS,
        log_every=1,
        steady_after=MEMORY_STEADY_AFTER,
        label=label,
    )


def run_memory(args):
    """Per size, code and process count: one run of the old code, a first and a cached run of the new."""

    def old_runs(size):
        return size == "default" or size <= args.old_max_rows

    measured_sizes = [size for size in args.sizes if "new" in args.codes or old_runs(size)]
    prepare(args, measured_sizes, [MEMORY_VOCAB])
    tokenizer = args.workdir / f"tok{MEMORY_VOCAB}"
    for size in args.sizes:
        corpus = corpus_path(args, size)
        rows = train_rows(corpus) if size in measured_sizes else size
        for code in args.codes:
            for processes in args.processes:
                key = {
                    "mode": "memory",
                    "code": code,
                    "corpus": corpus_name(size),
                    "rows": rows,
                    "processes": processes,
                }
                if code == "old" and not old_runs(size):
                    save_result(args, {**key, "cache": "none", "status": "not run"}, replace_measured=False)
                    continue
                for cache in ("none",) if code == "old" else ("first run", "cached"):
                    print(f"memory: {code} code, {rows:,} pairs, {processes} process(es), cache {cache}", flush=True)
                    label = f"memory_{code}_{corpus_name(size)}_{processes}p_{cache.replace(' ', '_')}"
                    entry = {
                        **key,
                        "cache": cache,
                        **measure_memory(args, code, corpus, processes, cache, tokenizer, label),
                    }
                    save_result(args, entry)
                    print("  " + " | ".join(memory_cells(entry, [])), flush=True)


def run_throughput(args):
    """The main job's training speed: per corpus size and process count, --rounds launches per code, alternating."""
    prepare(args, [size for size in args.sizes if size != "default"], [THROUGHPUT_VOCAB])
    tokenizer = args.workdir / f"tok{THROUGHPUT_VOCAB}"
    for size in args.sizes:
        corpus = corpus_path(args, size)
        for processes in args.processes:
            entries = {
                code: {
                    "mode": "throughput",
                    "code": code,
                    "corpus": corpus_name(size),
                    "rows": train_rows(corpus),
                    "processes": processes,
                    "cache": "as found",
                    "runs": [],
                }
                for code in args.codes
            }
            for round_index in range(args.rounds):
                for code in args.codes:
                    print(
                        f"throughput: {code} code, {corpus_name(size)}, {processes} process(es), round "
                        f"{round_index + 1} of {args.rounds}",
                        flush=True,
                    )
                    run = measure(
                        args,
                        code=code,
                        corpus=corpus,
                        processes=processes,
                        cache="as found",
                        preset=THROUGHPUT_PRESET,
                        tokenizer=tokenizer,
                        max_steps=THROUGHPUT_STEPS,
                        log_every=THROUGHPUT_LOG_EVERY,
                        steady_after=THROUGHPUT_LOG_EVERY,
                        label=f"throughput_{code}_{corpus_name(size)}_{processes}p_round{round_index + 1}",
                    )
                    entry = entries[code]
                    entry["runs"].append(run)
                    rates = [run["tokens_per_sec"] for run in entry["runs"] if run["status"] == "ok"]
                    entry["tokens_per_sec"] = statistics.median(rates) if rates else None
                    entry.update(date=run["date"], machine=run["machine"], versions=run["versions"])
                    save_result(args, entry)
                    print(f"  {run['status']}, {fmt_number(run['tokens_per_sec'])} tokens/s", flush=True)


def run_pipeline(args):
    """A user's path per corpus size: prepare_data.py from the Hub's layout, train_tokenizer.py on a sample, then
    vaswani-train's first start (which tokenizes) and its cached start, with 2 processes."""
    from benchmarks.preprocess import folder_bytes, run_measured

    prepare(args, args.sizes, [])
    for size in args.sizes:
        hub = timed(f"Hub layout of {size:,} pairs", args.workdir / f"hub_{size}", write_hub_layout, args, size)
        prepared, tokenizer = args.workdir / f"prepared_{size}", args.workdir / f"tok_prepared_{size}"
        key = {"mode": "pipeline", "code": "new", "corpus": corpus_name(size), "processes": 2}
        logs = args.workdir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        steps = {
            "prepare_data": (
                ["scripts/prepare_data.py", "--dataset", str(hub), "--dataset_config", PIPELINE_CONFIG],
                ["--output_dir", str(prepared)],
                prepared,
                {"HF_DATASETS_CACHE": str(args.workdir / "hf_cache")},  # load_dataset's Arrow copy of the Parquet
            ),
            "train_tokenizer": (
                ["scripts/train_tokenizer.py", "--dataset_dir", str(prepared), "--vocab_size", str(MEMORY_VOCAB)],
                ["--max_sentences", str(PIPELINE_SAMPLE), "--output_dir", str(tokenizer)],
                tokenizer,
                {},
            ),
        }
        for step, (command, outputs, output, environment) in steps.items():
            print(f"pipeline: {step}, {size:,} pairs", flush=True)
            shutil.rmtree(output, ignore_errors=True)
            shutil.rmtree(args.workdir / "hf_cache", ignore_errors=True)
            measured = run_measured(
                [sys.executable, *command, *outputs], env=environment, log=logs / f"pipeline_{step}_{size}.log"
            )
            entry = {
                **key,
                "cache": step,
                **measured,
                "bytes": folder_bytes([output]),
                "command": shlex.join(["python3", *command, *outputs]),
                "cwd": str(REPO),
                "code_version": code_version(REPO),
            }
            save_result(args, {**entry, "date": now(), "machine": machine_description(), "versions": versions()})
        rows = train_rows(prepared)
        for cache in ("first run", "cached"):
            print(f"pipeline: vaswani-train, {cache}, {rows:,} pairs", flush=True)
            entry = {
                **key,
                "rows": rows,
                "cache": cache,
                **measure_memory(
                    args,
                    "new",
                    prepared,
                    2,
                    cache,
                    tokenizer,
                    f"pipeline_{corpus_name(size)}_{cache.replace(' ', '_')}",
                ),
                "bytes": sum(path.stat().st_size for path in cache_files(prepared)),
            }
            save_result(args, entry)
        shutil.rmtree(args.workdir / "hf_cache", ignore_errors=True)


def now():
    return datetime.datetime.now().isoformat(timespec="seconds")


# ---------------------------------------------------------------------------------------------------------------------
# Results: data_scale.json accumulates, data_scale.md is written from all of it.
# ---------------------------------------------------------------------------------------------------------------------


def machine_description():
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.machine(),
    )
    memory = psutil.virtual_memory().total
    return f"{cpu}, nproc {len(os.sched_getaffinity(0))}, {memory / 2**30:.1f} GiB memory, Linux {platform.release()}"


def versions():
    packages = ("torch", "datasets", "accelerate", "transformers", "tokenizers")
    return {"python": platform.python_version(), **{name: importlib.metadata.version(name) for name in packages}}


def result_key(entry):
    return entry["mode"], entry["code"], entry["corpus"], entry["processes"], entry["cache"]


def load_results(stem):
    path = stem.with_suffix(".json")
    return json.loads(path.read_text()) if path.exists() else {"invocations": [], "results": []}


def save_result(args, entry, replace_measured=True):
    """Merge one entry into the JSON (replacing the one with its key) and rewrite the Markdown."""
    data = load_results(args.results)
    if args.invocation not in data["invocations"]:
        data["invocations"].append(args.invocation)
    kept = [old for old in data["results"] if result_key(old) != result_key(entry)]
    if not replace_measured and len(kept) < len(data["results"]):
        return  # a "not run" placeholder never replaces a measurement
    data["results"] = kept + [entry]
    write_results(args.results, data)


def write_results(stem, data):
    stem.with_suffix(".json").write_text(json.dumps(data, indent=2) + "\n")
    markdown = render_markdown(data)
    stem.with_suffix(".md").write_text(markdown)
    return markdown


def fmt_bytes(value):
    return "n/a" if value is None else f"{value / 1e9:.2f} GB"


def fmt_seconds(value):
    return "n/a" if value is None else f"{value:.1f} s" if value < 10 else f"{value:,.0f} s"


def fmt_number(value):
    return "n/a" if value is None else f"{value:,.0f}"


def extrapolate_old(results, processes, rows):
    """Peak RSS and time to the first step of the old code at `rows` pairs, on the line through two measured sizes."""
    measured = sorted(
        (entry["rows"], entry["peak_rss_per_process"], entry["seconds_to_first_record"])
        for entry in results
        if entry["mode"] == "memory"
        and entry["code"] == "old"
        and entry["processes"] == processes
        and entry["status"] == "ok"
    )
    if len(measured) >= 2:
        points, source = measured[-2:], "the two largest old rows above"
    else:
        points, source = [(size, *figures) for size, figures in OLD_REFERENCE_FIGURES.items()], "reference 100k and 1M"
    (rows0, memory0, seconds0), (rows1, memory1, seconds1) = points
    fraction = (rows - rows0) / (rows1 - rows0)
    memory, seconds = memory0 + fraction * (memory1 - memory0), seconds0 + fraction * (seconds1 - seconds0)
    return f"not run: extrapolated ~{memory / 1e9:.0f} GB, ~{seconds / 60:.0f} min (from {source})"


def memory_notes(entry):
    notes = [] if entry["status"] == "ok" else [entry["status"]]
    if len(entry["training_processes"]) != entry["processes"]:
        notes.append(f"{len(entry['training_processes'])} training processes seen")
    if entry["child_processes"]:
        notes.append(f"child processes: {len(entry['child_processes'])}")
    written = entry["cache_files_after"] - entry["cache_files_before"]
    if entry["cache"] == "cached" and not entry["cache_files_before"]:
        notes.append("no cache files found")
    if entry["code"] == "new" and written > 0:
        notes.append(f"wrote {written} cache files")
    return notes


def memory_cells(entry, results):
    rows = "default corpus, " * (entry["corpus"] == "default") + f"{entry['rows']:,}"
    cells = [entry["code"], rows, str(entry["processes"]), entry["cache"]]
    if entry["status"] == "not run":
        return cells + ["—"] * 5 + [extrapolate_old(results, entry["processes"], entry["rows"])]
    return cells + [
        fmt_bytes(entry["peak_rss_anon_per_process"]),
        fmt_bytes(entry["peak_rss_per_process"]),
        fmt_bytes(entry["peak_rss_anon_all"]),
        fmt_seconds(entry["seconds_to_first_record"]),
        fmt_number(entry["tokens_per_sec"]),
        "; ".join(memory_notes(entry)),
    ]


def table(header, rows):
    return "\n".join(
        [
            "| " + " | ".join(header) + " |",
            "|" + "---|" * len(header),
            *("| " + " | ".join(row) + " |" for row in rows),
        ]
    )


def render_markdown(data):
    results = data["results"]
    memory = sorted(
        (entry for entry in results if entry["mode"] == "memory"),
        key=lambda entry: (
            entry["rows"],
            CODE_ORDER.index(entry["code"]),
            entry["processes"],
            CACHE_ORDER.index(entry["cache"]),
        ),
    )
    throughput = sorted(
        (entry for entry in results if entry["mode"] == "throughput"),
        key=lambda entry: (entry["rows"], entry["processes"], CODE_ORDER.index(entry["code"])),
    )
    measured = [entry for entry in results if "machine" in entry]
    dates = sorted(entry["date"][:10] for entry in measured)
    setups = sorted({(entry["machine"], json.dumps(entry["versions"])) for entry in measured})
    code_versions = sorted(
        {(run["cwd"], run["code_version"]) for entry in measured for run in entry.get("runs", [entry])}
    )
    lines = [
        "# Training data path at scale: old code against new",
        "",
        f"Written {datetime.date.today()} by `benchmarks/data_scale.py` (its docstring says how each figure is "
        "measured)" + (f"; measured from {dates[0]} to {dates[-1]}." if dates else "."),
        "",
        "Machines and versions:",
        *(
            f"- {machine}; " + ", ".join(f"{name} {version}" for name, version in json.loads(packages).items())
            for machine, packages in setups
        ),
        "",
        "Code measured (old: a worktree of --old_commit, importing the installed `vaswani`; new: this checkout):",
        *(f"- `{cwd}`: {version}" for cwd, version in code_versions),
        "",
        (
            f"## Memory and start-up: {MEMORY_PRESET} preset, {MEMORY_VOCAB}-token vocabulary, "
            f"--batch_tokens 2000, --logging_steps 1 --max_steps {MEMORY_STEPS}"
        ),
        "",
        (
            "Per process: the highest of the training processes' peaks (the launcher and its children are not "
            "training processes). RssAnon: anonymous memory, without the memory-mapped Arrow files; RSS: VmHWM. All: "
            "the summed RssAnon of the training processes and their children at the worst sample. Time: from the launch "
            f"to the log record of step 1. Tokens/s: median of the per-step rates of steps {MEMORY_STEADY_AFTER + 1} to "
            f"{MEMORY_STEPS} (source + target tokens, all processes). GB = 10^9 bytes."
        ),
        "",
        table(
            [
                "code",
                "train pairs",
                "processes",
                "tokenized cache",
                "peak RssAnon / process",
                "peak RSS / process",
                "peak RssAnon, all",
                "to first step",
                "tokens/s",
                "notes",
            ],
            [memory_cells(entry, results) for entry in memory],
        ),
        "",
        (
            f"## Training speed of the main job's model: {THROUGHPUT_PRESET} preset, {THROUGHPUT_VOCAB}-token "
            "vocabulary, --batch_tokens 2000"
        ),
        "",
        (
            f"--logging_steps {THROUGHPUT_LOG_EVERY} --max_steps {THROUGHPUT_STEPS}; each run: the median tokens_per_sec "
            "of its records after the first; the codes' runs alternate (old, new, old, new, ...)."
        ),
        "",
        table(
            ["train pairs", "processes", "code", "runs (tokens/s)", "median tokens/s", "new / old"],
            throughput_rows(throughput),
        ),
        "",
        *pipeline_sections([entry for entry in results if entry["mode"] == "pipeline"]),
        "## Commands",
        "",
        "The benchmark:",
        "",
        "```",
        *data["invocations"],
        "```",
        "",
        "One train.py launch of each kind (only --dataset_dir, --output_dir and the port differ between rows):",
        "",
        "```",
        *example_commands(measured),
        "```",
        "",
    ]
    return "\n".join(lines)


def pipeline_sections(pipeline):
    """Per corpus: a user's path, each step with its time, memory and bytes, and the first tokenization's rate."""
    lines = []
    for corpus in sorted({entry["corpus"] for entry in pipeline}, key=lambda name: int(name.split("_")[1])):
        steps = {entry["cache"]: entry for entry in pipeline if entry["corpus"] == corpus}
        size = int(corpus.split("_")[1])
        lines += [
            f"## A user's path at {size:,} pairs: the Hub's layout to the first training step, 2 processes",
            "",
            (
                f"corpus_{size} written as the Hub serves a translation dataset (Parquet shards, configuration "
                f"{PIPELINE_CONFIG}), then: prepare_data.py (its --num_proc default), train_tokenizer.py on a sample of "
                f"{PIPELINE_SAMPLE:,} pairs ({MEMORY_VOCAB} tokens), and vaswani-train ({MEMORY_PRESET} preset, "
                "2 processes) started on the prepared corpus twice: the first start tokenizes it, the second maps the "
                "cache. Time: wall seconds (training: to the record of step 1). Memory: peaks of RssAnon, per process "
                "(training processes) and summed over every process of the step. On disk: what the step wrote (the "
                "training rows: the tokenized cache)."
            ),
            "",
        ]
        rows = []
        for name in ("prepare_data", "train_tokenizer", "first run", "cached"):
            entry = steps.get(name)
            if entry is None:
                continue
            training = name in ("first run", "cached")
            rows.append(
                [
                    f"vaswani-train, {name}" if training else f"{name}.py",
                    fmt_seconds(entry["seconds_to_first_record"] if training else entry["wall_seconds"]),
                    fmt_bytes(entry["peak_rss_anon_per_process"]) if training else "—",
                    fmt_bytes(entry["peak_rss_anon_all"] if training else entry["peak_anon"]),
                    fmt_bytes(entry["bytes"]),
                    "; ".join(memory_notes(entry)) if training else f"CPU {fmt_seconds(entry['cpu_seconds'])}",
                ]
            )
        lines += [table(["step", "time", "peak RssAnon / process", "peak RssAnon, all", "on disk", "notes"], rows), ""]
        first, cached = steps.get("first run"), steps.get("cached")
        if first and cached and first["status"] == cached["status"] == "ok":
            seconds = first["seconds_to_first_record"] - cached["seconds_to_first_record"]
            lines += [
                (
                    f"The first tokenization: {seconds:,.0f} s for {first['rows']:,} pairs (the first start less the "
                    f"cached one), with 2 tokenizing processes: {first['rows'] / seconds / 2:,.0f} pairs per second "
                    "per core."
                ),
                "",
            ]
    return lines


def throughput_rows(throughput):
    medians = {(entry["rows"], entry["processes"], entry["code"]): entry.get("tokens_per_sec") for entry in throughput}

    def ratio(entry):
        new, old = (medians.get((entry["rows"], entry["processes"], code)) for code in CODE_ORDER[::-1])
        return f"{new / old:.3f}x" if entry["code"] == "new" and new and old else ""

    return [
        [
            f"{entry['rows']:,}",
            str(entry["processes"]),
            entry["code"],
            ", ".join(
                fmt_number(run["tokens_per_sec"]) if run["status"] == "ok" else run["status"] for run in entry["runs"]
            ),
            fmt_number(entry.get("tokens_per_sec")),
            ratio(entry),
        ]
        for entry in throughput
    ]


def example_commands(measured):
    examples = {}
    for entry in sorted(measured, key=lambda entry: entry["date"]):
        for run in entry.get("runs", [entry]):
            step = entry["cache"] if entry["mode"] == "pipeline" else ""
            examples[entry["mode"], entry["code"], entry["processes"], step] = f"(cd {run['cwd']} && {run['command']})"
    return [examples[key] for key in sorted(examples)]


# ---------------------------------------------------------------------------------------------------------------------
# Command line.
# ---------------------------------------------------------------------------------------------------------------------


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--dataset_dir",
        type=Path,
        required=True,
        help="the default corpus: a DatasetDict saved by scripts/prepare_data.py (BIBLE)",
    )
    common.add_argument(
        "--workdir",
        type=Path,
        required=True,
        help="where the corpora, tokenizers, old code worktree, run folders and logs go (WORK)",
    )
    common.add_argument("--old_commit", default=OLD_COMMIT, help="the commit whose scripts/train.py is the old code")
    results = argparse.ArgumentParser(add_help=False)
    results.add_argument(
        "--results",
        type=Path,
        default=RESULTS,
        help="where the results go, as RESULTS.json and RESULTS.md (default: docs/benchmarks/data_scale)",
    )
    launches = argparse.ArgumentParser(add_help=False, parents=[results])
    launches.add_argument(
        "--timeout", type=float, default=1200, help="a launch's time limit in seconds (default: 1200)"
    )
    launches.add_argument(
        "--codes",
        type=comma_list(choice(*CODE_ORDER)),
        default=list(CODE_ORDER),
        help="old, new or both (default: old,new)",
    )
    sizes = argparse.ArgumentParser(add_help=False)
    sizes.add_argument(
        "--sizes",
        type=comma_list(parse_size),
        default=["default", 100_000, 1_000_000, 4_500_000],
        help="corpus sizes in train pairs, comma-separated; 'default' is --dataset_dir itself "
        "(default: default,100k,1M,4.5M)",
    )

    def subcommand(name, parents, summary):
        return commands.add_parser(
            name,
            parents=parents,
            help=summary,
            description=f"{summary}. How each figure is measured: data_scale.py --help.",
        )

    subcommand(
        "prepare",
        [common, sizes],
        "build the old code worktree, both tokenizers and the corpora ahead of "
        "time (memory and throughput build what they lack)",
    )
    memory = subcommand(
        "memory",
        [common, sizes, launches],
        "peak memory, time to the first step and tokens/s for each code, corpus size and number of processes",
    )
    memory.add_argument(
        "--processes", type=comma_list(int), default=[1, 2], help="training processes, comma-separated (default: 1,2)"
    )
    memory.add_argument(
        "--old_max_rows",
        type=parse_pairs,
        default=1_000_000,
        help="larger corpora are not run with the old code, only extrapolated (default: 1M)",
    )
    throughput = subcommand(
        "throughput",
        [common, sizes, launches],
        "the main job's training tokens/s per corpus size and process count, the codes' launches alternating",
    )
    throughput.add_argument("--rounds", type=int, default=3, help="launches per code (default: 3)")
    throughput.add_argument(
        "--processes",
        type=comma_list(int),
        default=[THROUGHPUT_PROCESSES],
        help=f"training processes, comma-separated (default: {THROUGHPUT_PROCESSES})",
    )
    subcommand(
        "pipeline",
        [common, sizes, launches],
        "a user's path: prepare_data.py from the Hub's layout, train_tokenizer.py on a sample, and the first and "
        "cached start of vaswani-train with 2 processes",
    )
    subcommand("report", [results], "rewrite RESULTS.md from RESULTS.json")
    args = parser.parse_args(argv)
    for name in ("dataset_dir", "workdir"):  # train.py runs in other folders
        if hasattr(args, name):
            setattr(args, name, getattr(args, name).resolve())
    if getattr(args, "dataset_dir", None) and not (args.dataset_dir / "dataset_dict.json").is_file():
        parser.error(f"--dataset_dir {args.dataset_dir} is not a DatasetDict saved with save_to_disk")
    args.invocation = shlex.join(["python3", "-m", "benchmarks.data_scale", *(sys.argv[1:] if argv is None else argv)])
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.command == "prepare":
        prepare(args, args.sizes, [MEMORY_VOCAB, THROUGHPUT_VOCAB])
    elif args.command == "memory":
        run_memory(args)
    elif args.command == "throughput":
        run_throughput(args)
    elif args.command == "pipeline":
        run_pipeline(args)
    if args.command != "prepare":
        print(write_results(args.results, load_results(args.results)))
        print(f"Written {args.results.with_suffix('.json')} and .md")


if __name__ == "__main__":
    main()
