"""Memory, start-up time and speed of the training data path at WMT scale.

    python -m benchmarks.data_scale prepare    --dataset_dir BIBLE --workdir WORK [--sizes 100k,1M,4.5M]
    python -m benchmarks.data_scale memory     --dataset_dir BIBLE --workdir WORK [--sizes default,100k,1M,4.5M]
                                               [--processes 1,2]
    python -m benchmarks.data_scale throughput --dataset_dir BIBLE --workdir WORK [--rounds 3] [--processes 2]
    python -m benchmarks.data_scale pipeline   --dataset_dir BIBLE --workdir WORK [--sizes 36M] [--timeout 14400]
    python -m benchmarks.data_scale report

BIBLE is a DatasetDict of scripts/prepare_data.py. WORK receives corpus_N (BIBLE's train split copied to N pairs, each
copy's words shuffled), the BPEs tok4000 and tok8000, and the logs. A measurement is one launch of this checkout's
scripts/train.py with 1 or 2 gloo processes, sampled every 0.2 s (benchmarks.harness.ProcessTree) until the log
holds the steps it needs, then killed. `memory`: peak memory, time to the first step and tokens/s, first run
(tokenizing) and cached; `throughput`: the main job's tokens/s; `pipeline`: a user's path from the Hub's Parquet
layout through prepare_data.py and train_tokenizer.py to vaswani-train's two starts. Results merge into
docs/benchmarks/data_scale.json, keyed by (mode, corpus, processes, cache), and data_scale.md is rewritten from it
with what each column measures.
"""

import argparse
import datetime
import json
import shlex
import shutil
import statistics
import sys
from pathlib import Path

from benchmarks import data_scale_work as work
from benchmarks import harness


RESULTS = harness.REPO / "docs" / "benchmarks" / "data_scale"  # for .json and .md
MEMORY = {"preset": "tiny", "vocab": 4000, "max_steps": 40, "log_every": 1, "steady_after": 10}
THROUGHPUT = {"preset": "small", "vocab": 8000, "max_steps": 40, "log_every": 10, "steady_after": 10}
PIPELINE_CONFIG, PIPELINE_SAMPLE = "en-es", 1_000_000  # the Hub layout's configuration; train_tokenizer's sample
CACHE_ORDER = ("first run", "cached", "as found")


# --- Preparation: the tokenizers and the synthetic corpora. ---


def parse_pairs(text):
    """A number of train pairs: 40000, 100k, 4.5M; or "default", the --dataset_dir corpus itself."""
    if text == "default":
        return text
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


def corpus_path(args, size):
    return args.dataset_dir if size == "default" else args.workdir / f"corpus_{size}"


def corpus_name(size):
    return "default" if size == "default" else f"corpus_{size}"


def train_rows(path):
    from datasets import load_from_disk

    return load_from_disk(str(path))["train"].num_rows


def prepare(args, sizes, vocab_sizes):
    args.workdir.mkdir(parents=True, exist_ok=True)
    for vocab_size in vocab_sizes:
        tokenizer = args.workdir / f"tok{vocab_size}"
        work.built(f"tokenizer, {vocab_size} tokens", tokenizer, work.train_tokenizer, args.dataset_dir, vocab_size)
    for size in sizes:
        if size != "default":
            work.built(f"corpus of {size:,} pairs", corpus_path(args, size), work.build_corpus, args.dataset_dir, size)


# --- The plans. ---


def run_memory(args):
    """Per size and process count: a first run (which tokenizes) and a cached run."""
    prepare(args, args.sizes, [MEMORY["vocab"]])
    tokenizer = args.workdir / f"tok{MEMORY['vocab']}"
    for size in args.sizes:
        corpus, name = corpus_path(args, size), corpus_name(size)
        rows = train_rows(corpus)
        for processes in args.processes:
            for cache in ("first run", "cached"):
                print(f"memory: {rows:,} pairs, {processes} process(es), cache {cache}", flush=True)
                label = f"memory_{name}_{processes}p_{cache.replace(' ', '_')}"
                entry = {"mode": "memory", "corpus": name, "rows": rows, "processes": processes, "cache": cache}
                entry |= work.measure(args, MEMORY, corpus, processes, cache, tokenizer, label)
                save_result(args, entry)
                print("  " + " | ".join(memory_cells(entry)), flush=True)


def run_throughput(args):
    """The main job's training speed: per corpus size and process count, the median of --rounds launches."""
    prepare(args, args.sizes, [THROUGHPUT["vocab"]])
    tokenizer = args.workdir / f"tok{THROUGHPUT['vocab']}"
    for size in args.sizes:
        corpus, name = corpus_path(args, size), corpus_name(size)
        for processes in args.processes:
            entry = {"mode": "throughput", "corpus": name, "rows": train_rows(corpus), "processes": processes}
            entry |= {"cache": "as found", "runs": []}
            for index in range(args.rounds):
                print(f"throughput: {name}, {processes} process(es), round {index + 1} of {args.rounds}", flush=True)
                label = f"throughput_{name}_{processes}p_round{index + 1}"
                run = work.measure(args, THROUGHPUT, corpus, processes, "as found", tokenizer, label)
                entry["runs"].append(run)
                rates = [run["tokens_per_sec"] for run in entry["runs"] if run["status"] == "ok"]
                entry["tokens_per_sec"] = statistics.median(rates) if rates else None
                save_result(args, entry | {key: run[key] for key in ("date", "machine", "versions")})
                print(f"  {run['status']}, {fmt_number(run['tokens_per_sec'])} tokens/s", flush=True)


def run_pipeline(args):
    """A user's path per corpus size: prepare_data.py from the Hub's layout, train_tokenizer.py on a sample, then
    vaswani-train's first start (which tokenizes) and its cached start, with 2 processes."""
    prepare(args, args.sizes, [])
    logs, hf_cache = args.workdir / "logs", args.workdir / "hf_cache"
    logs.mkdir(parents=True, exist_ok=True)
    for size in args.sizes:
        hub, corpus = args.workdir / f"hub_{size}", corpus_path(args, size)
        work.built(f"Hub layout of {size:,} pairs", hub, work.write_hub_layout, corpus, PIPELINE_CONFIG)
        prepared, tokenizer = args.workdir / f"prepared_{size}", args.workdir / f"tok_prepared_{size}"
        key = {"mode": "pipeline", "corpus": corpus_name(size), "processes": 2}
        steps = {
            "prepare_data": (
                ["scripts/prepare_data.py", "--dataset", str(hub), "--dataset_config", PIPELINE_CONFIG],
                ["--output_dir", str(prepared)],
                {"HF_DATASETS_CACHE": str(hf_cache)},  # load_dataset's Arrow copy of the Parquet
            ),
            "train_tokenizer": (
                ["scripts/train_tokenizer.py", "--dataset_dir", str(prepared), f"--vocab_size={MEMORY['vocab']}"],
                ["--max_sentences", str(PIPELINE_SAMPLE), "--output_dir", str(tokenizer)],
                {},
            ),
        }
        for step, (command, outputs, environment) in steps.items():
            print(f"pipeline: {step}, {size:,} pairs", flush=True)
            shutil.rmtree(outputs[-1], ignore_errors=True)
            shutil.rmtree(hf_cache, ignore_errors=True)
            log = logs / f"pipeline_{step}_{size}.log"
            measured = harness.run_measured([sys.executable, *command, *outputs], env=environment, log=log)
            entry = {**key, "cache": step, **measured, "bytes": harness.folder_bytes([outputs[-1]])}
            entry |= {"command": shlex.join(["python3", *command, *outputs]), "cwd": str(harness.REPO)}
            save_result(args, entry | {"code_version": work.code_version(), **harness.environment(*work.PACKAGES)})
        rows = train_rows(prepared)
        for cache in ("first run", "cached"):
            print(f"pipeline: vaswani-train, {cache}, {rows:,} pairs", flush=True)
            label = f"pipeline_{corpus_name(size)}_{cache.replace(' ', '_')}"
            entry = {
                **key,
                "rows": rows,
                "cache": cache,
                **work.measure(args, MEMORY, prepared, 2, cache, tokenizer, label),
            }
            save_result(args, entry | {"bytes": sum(path.stat().st_size for path in work.cache_files(prepared))})
        shutil.rmtree(hf_cache, ignore_errors=True)


# --- Results: data_scale.json accumulates, data_scale.md is written from all of it. ---


def result_key(entry):
    return entry["mode"], entry["corpus"], entry["processes"], entry["cache"]


def load_results(stem):
    path = Path(f"{stem}.json")
    return json.loads(path.read_text()) if path.exists() else {"invocations": [], "results": []}


def save_result(args, entry):
    """Merge one entry into the JSON (replacing the one with its key) and rewrite the page."""
    data = load_results(args.results)
    if args.invocation not in data["invocations"]:
        data["invocations"].append(args.invocation)
    data["results"] = [old for old in data["results"] if result_key(old) != result_key(entry)] + [entry]
    write_results(args.results, data)


def write_results(stem, data):
    Path(f"{stem}.json").write_text(json.dumps(data, indent=2) + "\n")
    Path(f"{stem}.md").write_text(render_markdown(data))


def fmt_bytes(value):
    return "n/a" if value is None else f"{value / 1e9:.2f} GB"


def fmt_seconds(value):
    return "n/a" if value is None else f"{value:.1f} s" if value < 10 else f"{value:,.0f} s"


def fmt_number(value):
    return "n/a" if value is None else f"{value:,.0f}"


def memory_notes(entry):
    notes = [] if entry["status"] == "ok" else [entry["status"]]
    if len(entry["training_processes"]) != entry["processes"]:
        notes.append(f"{len(entry['training_processes'])} training processes seen")
    if entry["child_processes"]:
        notes.append(f"child processes: {len(entry['child_processes'])}")
    written = entry["cache_files_after"] - entry["cache_files_before"]
    if entry["cache"] == "cached" and not entry["cache_files_before"]:
        notes.append("no cache files found")
    if written > 0:
        notes.append(f"wrote {written} cache files")
    return notes


def memory_cells(entry):
    rows = "default corpus, " * (entry["corpus"] == "default") + f"{entry['rows']:,}"
    peaks = [entry[f"peak_{name}"] for name in ("rss_anon_per_process", "rss_per_process", "rss_anon_all")]
    seconds, notes = fmt_seconds(entry["seconds_to_first_record"]), "; ".join(memory_notes(entry))
    cells = [rows, str(entry["processes"]), entry["cache"], *map(fmt_bytes, peaks), seconds]
    return [*cells, fmt_number(entry["tokens_per_sec"]), notes]


def render_markdown(data):
    results = data["results"]
    memory = sorted(
        (entry for entry in results if entry["mode"] == "memory"),
        key=lambda entry: (entry["rows"], entry["processes"], CACHE_ORDER.index(entry["cache"])),
    )
    throughput = sorted(
        (entry for entry in results if entry["mode"] == "throughput"),
        key=lambda entry: (entry["rows"], entry["processes"]),
    )
    dates = sorted(entry["date"][:10] for entry in results)
    setups = sorted({(entry["machine"], json.dumps(entry["versions"])) for entry in results})
    code_versions = sorted({run["code_version"] for entry in results for run in entry.get("runs", [entry])})
    memory_header = ["train pairs", "processes", "tokenized cache", "peak RssAnon / process", "peak RSS / process"]
    memory_header += ["peak RssAnon, all", "to first step", "tokens/s", "notes"]
    throughput_cells = [
        [f"{entry['rows']:,}", entry["processes"], ", ".join(run_rate(run) for run in entry["runs"])]
        + [fmt_number(entry.get("tokens_per_sec"))]
        for entry in throughput
    ]
    lines = [
        "# Training data path at scale",
        "",
        f"Written {datetime.date.today()} by `benchmarks/data_scale.py` (docs/benchmarks/README.md says how each "
        "figure is measured)" + (f"; measured from {dates[0]} to {dates[-1]}." if dates else "."),
        "",
        "Machines and versions:",
        *(
            f"- {harness.describe({'machine': machine, 'versions': json.loads(packages)})}"
            for machine, packages in setups
        ),
        "",
        "Code measured (this checkout's commits):",
        *(f"- {version}" for version in code_versions),
        "",
        f"## Memory and start-up: {MEMORY['preset']} preset, {MEMORY['vocab']}-token vocabulary, --batch_tokens 2000, "
        f"--logging_steps 1 --max_steps {MEMORY['max_steps']}",
        "",
        "Per process: the highest of the training processes' peaks (the launcher and its children are not training "
        "processes). RssAnon: anonymous memory, without the memory-mapped Arrow files; RSS: VmHWM. All: the summed "
        "RssAnon of the training processes and their children at the worst sample. Time: from the launch to the log "
        f"record of step 1. Tokens/s: median of the per-step rates of steps {MEMORY['steady_after'] + 1} to "
        f"{MEMORY['max_steps']} (source + target tokens, all processes). GB = 10^9 bytes.",
        "",
        harness.table(memory_header, [memory_cells(entry) for entry in memory]),
        "",
        f"## Training speed of the main job's model: {THROUGHPUT['preset']} preset, {THROUGHPUT['vocab']}-token "
        "vocabulary, --batch_tokens 2000",
        "",
        f"--logging_steps {THROUGHPUT['log_every']} --max_steps {THROUGHPUT['max_steps']}; each run: the median "
        "tokens_per_sec of its records after the first.",
        "",
        harness.table(["train pairs", "processes", "runs (tokens/s)", "median tokens/s"], throughput_cells),
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
        *example_commands(results),
        "```",
        "",
    ]
    return "\n".join(lines)


def run_rate(run):
    return fmt_number(run["tokens_per_sec"]) if run["status"] == "ok" else run["status"]


def pipeline_sections(pipeline):
    """Per corpus: a user's path, each step with its time, memory and bytes, and the first tokenization's rate."""
    lines = []
    for corpus in sorted({entry["corpus"] for entry in pipeline}, key=lambda name: int(name.split("_")[1])):
        steps = {entry["cache"]: entry for entry in pipeline if entry["corpus"] == corpus}
        size = int(corpus.split("_")[1])
        lines += [
            f"## A user's path at {size:,} pairs: the Hub's layout to the first training step, 2 processes",
            "",
            f"corpus_{size} written as the Hub serves a translation dataset (Parquet shards, configuration "
            f"{PIPELINE_CONFIG}), then: prepare_data.py (its --num_proc default), train_tokenizer.py on a sample of "
            f"{PIPELINE_SAMPLE:,} pairs ({MEMORY['vocab']} tokens), and vaswani-train ({MEMORY['preset']} preset, 2 "
            "processes) started on the prepared corpus twice: the first start tokenizes it, the second maps the "
            "cache. Time: wall seconds (training: to the record of step 1). Memory: peaks of RssAnon, per process "
            "(training processes) and summed over every process of the step. On disk: what the step wrote (the "
            "training rows: the tokenized cache).",
            "",
        ]
        rows = []
        for name in ("prepare_data", "train_tokenizer", "first run", "cached"):
            entry = steps.get(name)
            if entry is None:
                continue
            if name in ("first run", "cached"):
                seconds, per_process = entry["seconds_to_first_record"], fmt_bytes(entry["peak_rss_anon_per_process"])
                cells = [f"vaswani-train, {name}", fmt_seconds(seconds), per_process]
                cells += [
                    fmt_bytes(entry["peak_rss_anon_all"]),
                    fmt_bytes(entry["bytes"]),
                    "; ".join(memory_notes(entry)),
                ]
            else:
                cells = [f"{name}.py", fmt_seconds(entry["wall_seconds"]), "—", fmt_bytes(entry["peak_anon"])]
                cells += [fmt_bytes(entry["bytes"]), f"CPU {fmt_seconds(entry['cpu_seconds'])}"]
            rows.append(cells)
        header = ["step", "time", "peak RssAnon / process", "peak RssAnon, all", "on disk", "notes"]
        lines += [harness.table(header, rows), ""]
        first, cached = steps.get("first run"), steps.get("cached")
        if first and cached and first["status"] == cached["status"] == "ok":
            seconds = first["seconds_to_first_record"] - cached["seconds_to_first_record"]
            lines += [
                f"The first tokenization: {seconds:,.0f} s for {first['rows']:,} pairs (the first start less the "
                f"cached one), with 2 tokenizing processes: {first['rows'] / seconds / 2:,.0f} pairs per second per "
                "core.",
                "",
            ]
    return lines


def example_commands(results):
    examples = {}
    for entry in sorted(results, key=lambda entry: entry["date"]):
        for run in entry.get("runs", [entry]):
            step = entry["cache"] if entry["mode"] == "pipeline" else ""
            examples[entry["mode"], entry["processes"], step] = f"(cd {run['cwd']} && {run['command']})"
    return [examples[key] for key in sorted(examples)]


# --- Command line. ---


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--dataset_dir", type=Path, required=True, help="the default corpus: a DatasetDict of prepare_data.py (BIBLE)"
    )
    common.add_argument(
        "--workdir", type=Path, required=True, help="where the corpora, tokenizers, run folders and logs go (WORK)"
    )
    sizes = argparse.ArgumentParser(add_help=False)
    sizes.add_argument(
        "--sizes",
        type=comma_list(parse_pairs),
        default=["default", 100_000, 1_000_000, 4_500_000],
        help="corpus sizes in train pairs, comma-separated; 'default' is --dataset_dir itself "
        "(default: default,100k,1M,4.5M)",
    )
    results = argparse.ArgumentParser(add_help=False)
    results.add_argument(
        "--results",
        type=Path,
        default=RESULTS,
        help="RESULTS.json and RESULTS.md (default: docs/benchmarks/data_scale)",
    )
    launches = argparse.ArgumentParser(add_help=False, parents=[common, sizes, results])
    launches.add_argument("--timeout", type=float, default=1200, help="a launch's time limit in seconds (1200)")

    def subcommand(name, parents, summary):
        description = f"{summary}. How each figure is measured: data_scale.py --help."
        return commands.add_parser(name, parents=parents, help=summary, description=description)

    subcommand("prepare", [common, sizes], "build both tokenizers and the corpora ahead of time")
    memory = subcommand("memory", [launches], "peak memory, time to the first step and tokens/s per corpus size")
    memory.add_argument("--processes", type=comma_list(int), default=[1, 2], help="training processes (1,2)")
    throughput = subcommand("throughput", [launches], "the main job's training tokens/s per corpus size")
    throughput.add_argument("--rounds", type=int, default=3, help="launches per corpus size (default: 3)")
    throughput.add_argument("--processes", type=comma_list(int), default=[2], help="training processes (default: 2)")
    summary = "a user's path: prepare_data.py from the Hub's layout, train_tokenizer.py, vaswani-train's two starts"
    subcommand("pipeline", [launches], summary)
    subcommand("report", [results], "rewrite RESULTS.md (and RESULTS.json) from RESULTS.json")
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
        return prepare(args, args.sizes, [MEMORY["vocab"], THROUGHPUT["vocab"]])
    plans = {"memory": run_memory, "throughput": run_throughput, "pipeline": run_pipeline}
    if args.command in plans:
        plans[args.command](args)
    write_results(args.results, load_results(args.results))
    print(f"Written {args.results}.json and .md")


if __name__ == "__main__":
    main()
