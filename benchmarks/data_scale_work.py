"""What benchmarks/data_scale.py builds and runs in WORK: the corpora, the tokenizer, the Hub's layout of a corpus,
the measured launches of scripts/train.py. Not a tool."""

import json
import os
import random
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import harness


PACKAGES = ("torch", "datasets", "accelerate", "transformers", "tokenizers")
LAUNCH = {"preset": "tiny", "vocab": 4000, "max_steps": 40, "steady_after": 10}  # --logging_steps 1
TRAIN_SETTINGS = (  # every launch's, beside its corpus, tokenizer, preset, steps and logging
    "--batch_tokens 2000 --lr_schedule short --peak_lr 1e-3 --warmup_steps 130 --save_steps 100000 --average_last 1 "
    "--save_total_limit 1 --eval_steps 0 --eval_bleu_samples 0 --report_to none"
)


# --- WORK's corpora and tokenizers. ---


def built(what, target, build, *arguments):
    """build(*arguments, TARGET.partial) renamed to `target`, unless `target` exists."""
    if target.exists():
        print(f"{what}: {target} is there, skipped", flush=True)
        return
    start, partial = time.perf_counter(), target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    build(*arguments, partial)
    partial.rename(target)
    print(f"{what}: built {target} in {time.perf_counter() - start:,.0f} s", flush=True)


def train_tokenizer(dataset_dir, vocab_size, target):
    command = ["scripts/train_tokenizer.py", "--dataset_dir", dataset_dir, "--vocab_size", vocab_size]
    command = [sys.executable, *map(str, command), "--output_dir", str(target)]
    subprocess.run(command, cwd=harness.REPO, check=True, stdout=subprocess.DEVNULL)


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


def build_corpus(dataset_dir, rows, target):
    """The train split repeated to `rows` pairs (copies with shuffled words), validation and test unchanged."""
    from datasets import DatasetDict, concatenate_datasets, load_from_disk

    source = load_from_disk(str(dataset_dir))
    train, scratch = source["train"], target.with_name(target.name + ".map")
    shutil.rmtree(scratch, ignore_errors=True)
    repeated = concatenate_datasets([train] * -(-rows // len(train))).select(range(rows))
    # The map's output goes to a scratch file of its own; by default it would land in the corpus's train folder.
    shuffled = repeated.map(
        shuffle_words,
        batched=True,
        num_proc=2,
        with_indices=True,
        features=train.features,
        fn_kwargs={"rows_per_copy": len(train)},
        cache_file_name=str(scratch / "train.arrow"),
        desc=f"corpus_{rows}",
    )
    DatasetDict(train=shuffled, validation=source["validation"], test=source["test"]).save_to_disk(str(target))
    shutil.rmtree(scratch)


def write_hub_layout(corpus, config, target):
    """corpus_N as the Hub serves a translation dataset: CONFIG/train-00000-of-00036.parquet, ..., 1M rows a shard."""
    from datasets import load_from_disk

    (target / config).mkdir(parents=True)
    for split, dataset in load_from_disk(str(corpus)).items():
        dataset = dataset.select_columns(["translation"])
        shards = -(-len(dataset) // 1_000_000)
        for index in range(shards):
            path = target / config / f"{split}-{index:05d}-of-{shards:05d}.parquet"
            dataset.shard(shards, index, contiguous=True).to_parquet(str(path))


def train_rows(path):
    from datasets import load_from_disk

    return load_from_disk(str(path))["train"].num_rows


def cache_files(corpus):
    """vaswani-train's tokenized cache beside each split of a DatasetDict."""
    return sorted(Path(corpus).glob("*/vaswani-*"))


# --- One measured launch of train.py. ---


def runs_train_script(argv):
    """Whether a command line is `python [-u] .../train.py ...`; the launcher's script is a module (-m)."""
    return Path(next((argument for argument in argv[1:] if not argument.startswith("-")), "")).name == "train.py"


def process_role(pid, now):
    """In a ProcessTree sample: 'training' (runs train.py), 'child' (under a training process) or 'other'."""
    parent = now[pid][0]
    while parent in now:
        if runs_train_script(now[parent][1]):
            return "child"
        parent = now[parent][0]
    return "training" if runs_train_script(now[pid][1]) else "other"


def sample(tree, peaks):
    """One sample into `peaks` (per process, by role); returns the summed RssAnon of all but the launcher."""
    now = tree.sample()
    roles = {pid: process_role(pid, now) for pid in now}
    for pid, role in roles.items():
        peak = peaks.get(pid)
        if peak is None or peak["role"] != role:  # a new process, or one that has just exec'd train.py
            peak = peaks[pid] = {"pid": pid, "role": role, "rss_anon": 0, "rss": 0}
        peak["rss_anon"] = max(peak["rss_anon"], now[pid][3])
        peak["rss"] = max(peak["rss"], now[pid][2], now[pid][4])
    return sum(now[pid][3] for pid, role in roles.items() if role != "other")


def read_records(log_path):
    """The training records of train_log.jsonl written so far."""
    text = log_path.read_text() if log_path.exists() else ""
    lines = text.splitlines()[: text.count("\n")]  # a half-written last line is left for later
    return [record for record in map(json.loads, lines) if "tokens_per_sec" in record]


def provenance(command):
    """A measured command line, where it ran, the machine and versions."""
    return {"command": shlex.join(command), "cwd": str(harness.REPO), **harness.environment(*PACKAGES)}


def measure(args, corpus, processes, cache, tokenizer, label):
    """One launch of train.py, killed at step LAUNCH["max_steps"]: memory peaks, time to step 1, tokens/s, status."""
    if cache == "first run":
        for path in cache_files(corpus):
            path.unlink()
    cache_before = len(cache_files(corpus))
    output_dir = Path(tempfile.mkdtemp(prefix=f"{label}_", dir=args.workdir / "runs"))
    train_args = ["--dataset_dir", str(corpus), "--tokenizer", str(tokenizer), "--output_dir", str(output_dir)]
    train_args += [f"--preset={LAUNCH['preset']}", f"--max_steps={LAUNCH['max_steps']}", "--logging_steps=1"]
    launch = [sys.executable]
    if processes > 1:
        launch += ["-m", "accelerate.commands.launch", "--multi_gpu", f"--num_processes={processes}"]
        launch += "--num_machines 1 --mixed_precision no --dynamo_backend no".split()
        launch += [f"--main_process_port={harness.free_port()}"]
    command = [*launch, "scripts/train.py", *train_args, *TRAIN_SETTINGS.split()]
    environment = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    log_path = args.workdir / "logs" / f"{label}.log"
    first_record_seconds, status, records, peaks, peak_anon_all = None, None, [], {}, 0
    with log_path.open("w") as log:
        start = time.monotonic()
        process = subprocess.Popen(
            command, cwd=harness.REPO, env=environment, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    tree, next_sample = harness.ProcessTree(process.pid), start
    try:
        while status is None:
            if time.monotonic() >= next_sample:
                peak_anon_all = max(peak_anon_all, sample(tree, peaks))
                next_sample = time.monotonic() + harness.SAMPLE_SECONDS
            exited = process.poll() is not None  # asked before the log is read: a record written last still counts
            records = read_records(output_dir / "train_log.jsonl")
            if records and first_record_seconds is None:
                first_record_seconds = time.monotonic() - start
            if any(record["step"] >= LAUNCH["max_steps"] for record in records):
                status = "ok"
            elif exited:
                status = f"failed (exit code {process.returncode})"
            elif time.monotonic() - start > args.timeout:
                status = f"timeout ({args.timeout:,.0f} s)"
            else:
                time.sleep(0.05)  # between two reads of train_log.jsonl
    finally:
        tree.kill(process)
        shutil.rmtree(output_dir, ignore_errors=True)
    training = [peak for peak in peaks.values() if peak["role"] == "training"]
    steady = [record["tokens_per_sec"] for record in records if record["step"] > LAUNCH["steady_after"]]
    return {
        "status": status,
        "seconds_to_first_record": first_record_seconds,
        "tokens_per_sec": statistics.median(steady) if steady else None,
        "peak_rss_anon_per_process": max((peak["rss_anon"] for peak in training), default=None),
        "peak_rss_per_process": max((peak["rss"] for peak in training), default=None),
        "peak_rss_anon_all": peak_anon_all,
        "training_processes": training,
        "child_processes": [peak for peak in peaks.values() if peak["role"] == "child"],
        "cache_files_before": cache_before,
        "cache_files_after": len(cache_files(corpus)),
        "bytes": sum(path.stat().st_size for path in cache_files(corpus)),
        "wall_seconds": time.monotonic() - start,
        "log": str(log_path),
        **provenance(command),
    }
